package resp

import (
	"testing"
	"time"
)

// TestLateMargin: a command needs a quarter of the pipeline timeout left
// to be started, more once write batches have been slow (twice their
// time, up to half the timeout), and less again as they speed up.
func TestLateMargin(t *testing.T) {
	const timeout = 2 * time.Second
	for _, c := range []struct {
		recent, want time.Duration
	}{
		{0, 500 * time.Millisecond},
		{100 * time.Millisecond, 500 * time.Millisecond},
		{400 * time.Millisecond, 800 * time.Millisecond},
		{3 * time.Second, time.Second},
	} {
		if got := lateMargin(timeout, c.recent); got != c.want {
			t.Errorf("lateMargin(%v, %v) = %v, want %v", timeout, c.recent, got, c.want)
		}
	}
	s := &Server{cfg: Config{PipelineTimeout: timeout}}
	now := time.Now()
	items := func() []*item {
		return []*item{{deadline: now.Add(600 * time.Millisecond)}, {deadline: now.Add(1500 * time.Millisecond)}}
	}
	if left := s.late(items()); len(left) != 2 {
		t.Fatalf("fast batches: %d of 2 items started, want both", len(left))
	}
	s.noteWrite(450 * time.Millisecond) // a slow batch: 900 ms kept free
	its := items()
	if left := s.late(its); len(left) != 1 || its[0].out == nil {
		t.Fatalf("after a 450 ms batch: %d of 2 items started, the first answered %v; want only the second started", len(left), its[0].out)
	}
	for range 20 {
		s.noteWrite(10 * time.Millisecond)
	}
	if left := s.late(items()); len(left) != 2 {
		t.Fatalf("after fast batches again: %d of 2 items started, want both", len(left))
	}
}
