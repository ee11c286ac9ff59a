package controllers

import (
	"slices"
	"testing"
)

// TestNextRollout: followers from the highest ordinal down, the leader
// last; and the order a whole update takes, restarting each pick.
func TestNextRollout(t *testing.T) {
	cases := []struct {
		n        int
		outdated []int
		leader   int
		want     rollout
	}{
		{3, nil, 0, rollout{Next: -1}},
		{3, []int{0, 1, 2}, 0, rollout{Next: 2, Outdated: 3}},
		{3, []int{0, 1, 2}, 2, rollout{Next: 1, Outdated: 3}},
		{3, []int{0, 2}, 2, rollout{Next: 0, Outdated: 2}},
		{3, []int{1}, 1, rollout{Next: 1, Leader: true, Outdated: 1}},
		{3, []int{0, 1, 2}, -1, rollout{Next: 2, Outdated: 3}}, // no known leader
		{1, []int{0}, 0, rollout{Next: 0, Leader: true, Outdated: 1}},
		{2, []int{0, 1, 5}, 1, rollout{Next: 0, Outdated: 2}}, // beyond n: not counted
	}
	for _, c := range cases {
		got := nextRollout(c.n, func(i int) bool { return slices.Contains(c.outdated, i) }, c.leader)
		if got != c.want {
			t.Errorf("nextRollout(%d, outdated %v, leader %d) = %+v, want %+v", c.n, c.outdated, c.leader, got, c.want)
		}
	}

	outdated := map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true}
	var order []int
	for {
		r := nextRollout(5, func(i int) bool { return outdated[i] }, 1)
		if r.Next < 0 {
			break
		}
		if r.Leader != (r.Next == 1) || r.Outdated != len(outdated) {
			t.Fatalf("step %d: %+v with %d outdated", len(order), r, len(outdated))
		}
		order = append(order, r.Next)
		delete(outdated, r.Next)
	}
	if want := []int{4, 3, 2, 0, 1}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
}
