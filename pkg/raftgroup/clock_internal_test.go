package raftgroup

import (
	"testing"
	"time"
)

// TestGroupTimeIsTheLowerMedian: one voter's clock jumping by any amount,
// either way, leaves the group's time within the other clocks' range; a
// leader without a quorum of reports has no group time.
func TestGroupTimeIsTheLowerMedian(t *testing.T) {
	var off time.Duration
	c := newGroupClock(1, func() time.Time { return time.Now().Add(off) })
	voters := []uint64{1, 2, 3}
	if _, ok := c.groupTime(voters); ok {
		t.Fatal("group time without any peer's report")
	}
	now := time.Now()
	c.report(2, now.UnixNano())
	if _, ok := c.groupTime(voters); !ok {
		t.Fatal("no group time with a quorum (self and one peer)")
	}
	c.report(3, now.Add(-time.Second).UnixNano())
	for _, tc := range []struct {
		off  time.Duration
		want time.Time // the lower median
	}{
		{0, now},
		{time.Hour, now},
		{-time.Hour, now.Add(-time.Second)},
		{24 * time.Hour * 365, now},
	} {
		off = tc.off
		got, ok := c.groupTime(voters)
		if d := got.Sub(tc.want); !ok || d < 0 || d > 100*time.Millisecond {
			t.Errorf("own clock off by %v: group time %v, want %v (+ the time since the reports)", tc.off, got, tc.want)
		}
	}
	// Stamps never go back, whatever the group's time does.
	off = 0
	first := c.stamp(voters)
	c.report(2, now.Add(-time.Hour).UnixNano())
	c.report(3, now.Add(-time.Hour).UnixNano())
	if second := c.stamp(voters); second.Before(first) {
		t.Fatalf("stamp went back from %v to %v", first, second)
	}
}
