package controllers

import "testing"

func TestOrdinals(t *testing.T) {
	for addr, want := range map[string]int{
		"rg-0.rg.ns.svc:7000":   0,
		"rg-12.rg.ns.svc:7000":  12,
		"rg-1.other.ns.svc:700": -1,
		"rg-x.rg.ns.svc:7000":   -1,
		"rg-01.rg.ns.svc:7000":  -1,
		"10.0.0.1:7000":         -1,
		"rg-1-0.rg.ns.svc:7000": -1,
	} {
		if got := ordinalOf("rg", "ns", addr); got != want {
			t.Errorf("ordinalOf(%q) = %d, want %d", addr, got, want)
		}
	}
	if got := pvcOrdinal("rg", "data-rg-3"); got != 3 {
		t.Errorf("pvcOrdinal = %d", got)
	}
	if got := pvcOrdinal("rg", "data-rg-1-0"); got != -1 {
		t.Errorf("pvcOrdinal of another group's claim = %d", got)
	}
}
