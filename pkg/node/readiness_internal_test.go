package node

import (
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
)

func TestReadiness(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	fresh := readinessFacts{group: true, latestConfigAt: now.Add(-time.Second), now: now}
	follower := raftgroup.Status{ID: 2, Leader: 1, Role: "follower", Commit: 5000, Applied: 5000, LeaderCommit: 5000,
		HeardLeaderAgo: 100 * time.Millisecond}
	for _, c := range []struct {
		name string
		edit func(*raftgroup.Status, *readinessFacts)
		want string // "" for ready
	}{
		{"caught-up follower", func(*raftgroup.Status, *readinessFacts) {}, ""},
		{"leader", func(st *raftgroup.Status, _ *readinessFacts) { st.ID, st.Role, st.HeardLeaderAgo = 1, "leader", 0 }, ""},
		{"a learner caught up", func(st *raftgroup.Status, _ *readinessFacts) { st.Role = "learner" }, ""},
		// Its own commit lags with its log: only the leader's shows it.
		{"lagging in replication", func(st *raftgroup.Status, _ *readinessFacts) {
			st.Commit, st.Applied, st.LeaderCommit = 3000, 3000, 5000
		}, "applying its log (applied 3000 of the leader's 5000)"},
		{"within the lag bound", func(st *raftgroup.Status, _ *readinessFacts) { st.Applied = 4000 }, ""},
		{"behind in applying", func(st *raftgroup.Status, _ *readinessFacts) { st.Applied = 3999 },
			"applying its log (applied 3999 of the leader's 5000)"},
		{"leader silent", func(st *raftgroup.Status, _ *readinessFacts) { st.HeardLeaderAgo = 4 * time.Second },
			"has not heard from its leader for 4s"},
		{"no leader", func(st *raftgroup.Status, _ *readinessFacts) { st.Leader, st.HeardLeaderAgo = 0, -1 }, "no leader known"},
		{"joining", func(st *raftgroup.Status, _ *readinessFacts) { st.Role = "joining" }, "not yet a member of its group"},
		{"removed", func(st *raftgroup.Status, _ *readinessFacts) { st.Role = "removed" }, "removed from its group"},
		{"controller not heard", func(_ *raftgroup.Status, f *readinessFacts) { f.latestConfigAt = now.Add(-11 * time.Second) },
			"has not reached the controller"},
		{"stopping", func(_ *raftgroup.Status, f *readinessFacts) { f.stopping = true }, "shutting down"},
		{"stranded", func(_ *raftgroup.Status, f *readinessFacts) { f.stranded = "stranded at config 0" }, "stranded at config 0"},
	} {
		st, f := follower, fresh
		c.edit(&st, &f)
		got := strings.Join(readiness(st, f), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: readiness %q, want %q", c.name, got, c.want)
		}
	}
}
