package shardkv

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// A config step refused at apply is not proposed again at once: the same
// step from the same config waits a doubling delay (capped), a step that
// applied or a stale refusal (the group stepped meanwhile) holds nothing
// back, and another step is not held by an earlier one's refusal.
func TestStepRefusalBacksOff(t *testing.T) {
	g := &Group{sm: NewStateMachine(1), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var r stepRefusal
	no := errors.New("config 7 does not follow 0")

	r.record(g, stepOutcome{from: 0, to: 7}) // applied (or undecided)
	if r.holds(0, 7) {
		t.Fatal("held after a step that was not refused")
	}
	r.record(g, stepOutcome{from: 0, to: 7, refused: no})
	if !r.holds(0, 7) || r.delay != stepRetryMin {
		t.Fatalf("after one refusal: holds=%v delay=%v", r.holds(0, 7), r.delay)
	}
	if r.holds(0, 8) || r.holds(1, 7) {
		t.Fatal("another step held by this one's refusal")
	}
	for range 20 {
		r.record(g, stepOutcome{from: 0, to: 7, refused: no})
	}
	if r.delay != stepRetryMax || time.Until(r.until) < stepRetryMax/2 {
		t.Fatalf("after repeated refusals: delay %v, until in %v; want the cap %v", r.delay, time.Until(r.until), stepRetryMax)
	}
	// A stale refusal: the group is at another config now.
	g.sm.config = &shardkvpb.Config{Num: 3}
	var s stepRefusal
	s.record(g, stepOutcome{from: 2, to: 3, refused: no})
	if s.delay != 0 || s.holds(2, 3) || s.holds(3, 4) {
		t.Fatalf("a stale refusal holds back: %+v", s)
	}
}

// stepPlan offers exactly the steps nextConfig accepts: the next config,
// or across a compacted gap only when the group owns nothing on either
// side; any other gap strands the group, with the reason.
func TestStepPlan(t *testing.T) {
	conf := func(num uint64, shards ...uint64) *shardkvpb.Config {
		return &shardkvpb.Config{Num: num, Shards: shards}
	}
	for _, tc := range []struct {
		name     string
		cur      *shardkvpb.Config
		known    []*shardkvpb.Config
		want     uint64 // 0: none
		stranded string // a part of the reason ("": not stranded)
	}{
		{"nothing known", conf(3, 1, 2), nil, 0, ""},
		{"next", conf(3, 1, 2), []*shardkvpb.Config{conf(4, 2, 2), conf(5, 1, 1)}, 4, ""},
		{"stale ones ignored", conf(3, 1, 2), []*shardkvpb.Config{conf(2, 1, 1), conf(4, 2, 2)}, 4, ""},
		{"new group jumps", conf(0), []*shardkvpb.Config{conf(7, 2, 2), conf(8, 2, 1)}, 7, ""},
		{"idle group jumps", conf(3, 2, 2), []*shardkvpb.Config{conf(7, 2, 2)}, 7, ""},
		{"wiped group", conf(0), []*shardkvpb.Config{conf(7, 1, 2), conf(8, 2, 2)}, 0, "holds none of them"},
		{"restored group", conf(3, 1, 2), []*shardkvpb.Config{conf(7, 2, 2)}, 0, "older than the configs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Group{sm: NewStateMachine(1), known: map[uint64]*shardkvpb.Config{}}
			g.sm.config = tc.cur
			for _, c := range tc.known {
				g.known[c.Num] = c
			}
			next, why := g.stepPlan()
			var got uint64
			if next != nil {
				got = next.Num
			}
			if got != tc.want {
				t.Fatalf("next = %d, want %d (why %q)", got, tc.want, why)
			}
			if (tc.stranded == "") != (why == "") || !strings.Contains(why, tc.stranded) {
				t.Fatalf("why = %q, want it to contain %q", why, tc.stranded)
			}
			if next != nil {
				// What apply's nextConfig decides for the same step: accepted.
				if !stepFollows(1, tc.cur, next) {
					t.Fatalf("stepPlan offers %d from %d, which nextConfig refuses", next.Num, tc.cur.Num)
				}
			}
		})
	}
}
