package controllers

// Rolling updates restart one pod at a time in one order, for the
// controller group and for data groups alike: followers first, from the
// highest ordinal down (a StatefulSet's own order), the Raft leader last,
// so that leadership moves once per update rather than once per pod.

// rollout is the next restart of a rolling update.
type rollout struct {
	// Next is the ordinal to restart next (-1: no pod is outdated).
	Next int
	// Leader: Next is the leader's pod (every follower is up to date).
	Leader bool
	// Outdated counts the pods still to restart, Next included.
	Outdated int
}

// nextRollout picks the pod to restart next among the ordinals 0..n-1 for
// which outdated holds; leader is the leader's ordinal (-1: not known, then
// every pod counts as a follower).
func nextRollout(n int, outdated func(ordinal int) bool, leader int) rollout {
	r := rollout{Next: -1}
	leaderOutdated := false
	for i := n - 1; i >= 0; i-- {
		if !outdated(i) {
			continue
		}
		r.Outdated++
		switch {
		case i == leader:
			leaderOutdated = true
		case r.Next < 0:
			r.Next = i
		}
	}
	if r.Next < 0 && leaderOutdated {
		r.Next, r.Leader = leader, true
	}
	return r
}
