package raftgroup

import (
	"errors"
	"strings"
	"testing"
)

// A fatal error's log line must not quote a whole key: badger's error for a
// key over its limit hex-dumps it (issue 14).
func TestShortError(t *testing.T) {
	dump := "Key with size 65004 exceeded 65000 limit. Key:\n" + strings.Repeat("00000000  6b 6b 6b 6b  |kkkk|\n", 4000)
	got := shortError(errors.New("state machine apply [26,26]: " + dump))
	if len(got) > maxErrorText+20 || strings.Contains(got, "\n") || !strings.HasSuffix(got, "(cut)") {
		t.Fatalf("shortError = %q (%d bytes)", got, len(got))
	}
	if long := strings.Repeat("x", 5000); len(shortError(errors.New(long))) > maxErrorText+20 {
		t.Fatal("a long line is not cut")
	}
	if got := shortError(errors.New("disk I/O error")); got != "disk I/O error" {
		t.Fatalf("shortError = %q", got)
	}
}
