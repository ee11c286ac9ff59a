package raftgroup_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

// engMembers renders a Status's members as "1 2 4L" (L: learner).
func engMembers(ms []raftgroup.Member) string {
	s := ""
	for _, m := range ms {
		if s != "" {
			s += " "
		}
		s += fmt.Sprint(m.ID)
		if m.Learner {
			s += "L"
		}
	}
	return s
}

func engWaitMembers(t *testing.T, c *rgtest.Cluster, id uint64, want string) {
	t.Helper()
	engWaitFor(t, fmt.Sprintf("replica %d to see members %q", id, want), func() bool {
		return engMembers(c.Replica(id).Status().Members) == want
	})
}

func engWaitRole(t *testing.T, c *rgtest.Cluster, id uint64, role string) {
	t.Helper()
	engWaitFor(t, fmt.Sprintf("replica %d to report role %q (has %q)", id, role, c.Replica(id).Status().Role), func() bool {
		return c.Replica(id).Status().Role == role
	})
}

// TestMembershipChangesUnderLoad: while clients write, a new replica joins
// as a learner, catches up, is promoted; an original follower is removed;
// leadership moves to the new replica and the old leader is removed. No
// acknowledged write is lost and the new member holds everything.
func TestMembershipChangesUnderLoad(t *testing.T) {
	c := rgtest.NewCluster(t, 3, engSnapCfg(40, 10))
	l := c.WaitLeader(engHang)
	w := engStartWriters(t, c, 4, "m")
	w.waitAcked(50)
	ctx := engCtx(t, 3*engHang)

	nd := c.AddNode(4)
	if role := c.Replica(4).Status().Role; role != "joining" {
		t.Fatalf("new replica's role before being added: %q", role)
	}
	leader := c.Replica(l)
	if st := leader.Status(); st.FirstIndex <= 1 {
		t.Fatalf("leader has not compacted its log (first index %d): the learner would not need a snapshot", st.FirstIndex)
	}
	if err := leader.AddLearner(ctx, 4, nd.Addr); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	if err := leader.AddLearner(ctx, 4, nd.Addr); err == nil || !raftgroup.IsNotExecuted(err) {
		t.Fatalf("adding the learner twice: %v", err)
	}
	engWaitMembers(t, c, l, "1 2 3 4L")
	engWaitRole(t, c, 4, "learner")
	engWaitFor(t, "the learner to catch up", func() bool {
		return c.Replica(4).AppliedIndex()+20 >= leader.AppliedIndex()
	})
	if c.Replica(4).Metrics().SnapshotsReceived.Load() == 0 {
		t.Fatal("the learner caught up without a snapshot although the leader's log was compacted")
	}
	if err := leader.Promote(ctx, 4); err != nil {
		t.Fatalf("promote: %v", err)
	}
	engWaitMembers(t, c, l, "1 2 3 4")
	engWaitFor(t, "replica 4 to be a voter", func() bool {
		r := c.Replica(4).Status().Role
		return r == "follower" || r == "leader"
	})
	w.waitAcked(w.n.Load() + 30)

	// Remove an original follower.
	var f uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != l {
			f = id
			break
		}
	}
	if err := leader.RemoveMember(ctx, f); err != nil {
		t.Fatalf("remove follower %d: %v", f, err)
	}
	remaining := []uint64{}
	for _, id := range []uint64{1, 2, 3, 4} {
		if id != f {
			remaining = append(remaining, id)
		}
	}
	want := fmt.Sprint(remaining[0], " ", remaining[1], " ", remaining[2])
	engWaitMembers(t, c, l, want)
	engWaitMembers(t, c, 4, want)
	engWaitRole(t, c, f, "removed")
	w.waitAcked(w.n.Load() + 30)

	// The leader cannot remove itself; move leadership to 4 first.
	err := leader.RemoveMember(ctx, l)
	if err == nil || !raftgroup.IsNotExecuted(err) {
		t.Fatalf("leader removing itself: %v", err)
	}
	if !leader.IsLeader() {
		t.Fatalf("refused self-removal changed leadership")
	}
	engWaitMembers(t, c, l, want)
	engWaitApplied(t, c, 4, leader.AppliedIndex())
	if err := leader.TransferLeadership(ctx, 4); err != nil {
		t.Fatalf("transfer to 4: %v", err)
	}
	nl := c.Replica(4)
	engWaitFor(t, "replica 4 to lead", nl.IsLeader)
	if err := nl.RemoveMember(ctx, l); err != nil {
		t.Fatalf("remove old leader %d: %v", l, err)
	}
	var last uint64
	for _, id := range remaining {
		if id != l && id != 4 {
			last = id
		}
	}
	want = fmt.Sprint(min(last, 4), " ", max(last, 4))
	engWaitMembers(t, c, 4, want)
	engWaitMembers(t, c, last, want)
	engWaitRole(t, c, l, "removed")
	w.waitAcked(w.n.Load() + 30)
	acked := w.stop()

	if len(acked) == 0 {
		t.Fatal("no writes acknowledged")
	}
	// Writes the stopped clients gave up on may still commit: a barrier
	// write orders them all before the comparison below.
	engPropose(t, c, rgtest.EncodePut("barrier", "1"))
	data := engSameData(t, c, 4, last)
	engCheckAcked(t, 4, data, acked)
	// The removed replicas keep their data up to their removal, and are out
	// of the group for good: they do not lead, and a write through the group
	// does not reach them.
	for _, id := range []uint64{f, l} {
		r := c.Replica(id)
		if r.IsLeader() {
			t.Fatalf("removed replica %d leads", id)
		}
		if st := r.Status(); slices.ContainsFunc(st.Members, func(m raftgroup.Member) bool { return m.ID == id }) {
			t.Fatalf("removed replica %d still lists itself: %v", id, engMembers(st.Members))
		}
	}
	// A removed replica that restarts stays out of the group and knows it.
	c.Crash(f)
	c.Start(f)
	engWaitRole(t, c, f, "removed")
	engPropose(t, c, rgtest.EncodePut("after-restart", "1"))
	if d := engSameData(t, c, 4, last); d["after-restart"] != "1" {
		t.Fatal("write after restarting a removed replica lost")
	}
	if c.Replica(f).IsLeader() {
		t.Fatal("restarted removed replica leads")
	}
	t.Logf("%d writes acknowledged; final members %s", len(acked), want)
}

// TestLearnerCatchesUpViaSnapshot: a learner added after the leader has
// compacted its log catches up from a streamed snapshot, with no further
// writes needed to get it going.
func TestLearnerCatchesUpViaSnapshot(t *testing.T) {
	c := rgtest.NewCluster(t, 3, engSnapCfg(30, 5))
	l := c.WaitLeader(engHang)
	for i := range 150 {
		engPropose(t, c, rgtest.EncodePut(fmt.Sprintf("k%d", i%40), fmt.Sprint(i)))
	}
	engPropose(t, c, rgtest.EncodeAppend("a", "x"))
	leader := c.Replica(c.WaitLeader(engHang))
	if st := leader.Status(); st.FirstIndex <= 2 {
		t.Fatalf("leader did not compact: first index %d", st.FirstIndex)
	}
	ctx := engCtx(t, engHang)
	nd := c.AddNode(4)
	if err := leader.AddLearner(ctx, 4, nd.Addr); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	engWaitApplied(t, c, 4, leader.AppliedIndex())
	engWaitRole(t, c, 4, "learner")
	if got := c.Replica(4).Metrics().SnapshotsReceived.Load(); got == 0 {
		t.Fatal("learner caught up without receiving a snapshot")
	}
	// The sender counts a snapshot once the receiver acknowledged it, which
	// may be after the receiver has already applied it.
	engWaitFor(t, "the leader to count a sent snapshot", func() bool { return leader.Metrics().SnapshotsSent.Load() > 0 })
	engWaitMembers(t, c, 4, "1 2 3 4L")
	// Replication continues from the log.
	engPropose(t, c, rgtest.EncodeAppend("a", "y"))
	data := engSameData(t, c, 4, 1, 2, 3)
	if data["a"] != "xy" || len(data) != 41 {
		t.Fatalf("learner data: a=%q, %d keys", data["a"], len(data))
	}
	// The learner restarts from the restored snapshot and keeps following.
	c.Crash(4)
	c.Start(4)
	engWaitRole(t, c, 4, "learner")
	engPropose(t, c, rgtest.EncodeAppend("a", "z"))
	if d := engSameData(t, c, 4, 1, 2, 3); d["a"] != "xyz" {
		t.Fatalf("after learner restart: a=%q", d["a"])
	}
	_ = l
}

// TestStatusHeardAgo: a leader reports how long ago each member last spoke
// to it: fresh for live followers, growing for a crashed one (whose match
// index raft keeps), fresh again once it is back.
func TestStatusHeardAgo(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(engHang)
	var down uint64
	for _, id := range c.IDs() {
		if id != l {
			down = id
			break
		}
	}
	heard := func(id uint64) time.Duration {
		for _, m := range c.Replica(l).Status().Members {
			if m.ID == id {
				return m.HeardAgo
			}
		}
		t.Fatalf("member %d not in the leader's status", id)
		return 0
	}
	engWaitFor(t, "every member heard lately", func() bool {
		for _, id := range c.IDs() {
			if heard(id) > 500*time.Millisecond {
				return false
			}
		}
		return true
	})
	for _, m := range c.Replica(down).Status().Members {
		if m.HeardAgo != -1 {
			t.Fatalf("follower %d reports heard-ago %v for %d; only a leader knows", down, m.HeardAgo, m.ID)
		}
	}
	c.Crash(down)
	engWaitFor(t, fmt.Sprintf("member %d silent for 1.5s", down), func() bool { return heard(down) > 1500*time.Millisecond })
	c.Start(down)
	engWaitFor(t, fmt.Sprintf("member %d heard again", down), func() bool { return heard(down) < 500*time.Millisecond })
}

// TestStatusLeaderCommit: a follower knows the leader's commit index and
// when it last heard from the leader; the leader reports its own.
func TestStatusLeaderCommit(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(engHang)
	for i := range 20 {
		engPropose(t, c, rgtest.EncodeAppend("k", fmt.Sprint(i)))
	}
	if st := c.Replica(l).Status(); st.HeardLeaderAgo != 0 || st.LeaderCommit != st.Commit {
		t.Fatalf("leader: heard %v, leader commit %d, commit %d", st.HeardLeaderAgo, st.LeaderCommit, st.Commit)
	}
	engWaitFor(t, "followers know the leader's commit and heard it lately", func() bool {
		commit := c.Replica(l).Status().Commit
		for _, id := range c.IDs() {
			st := c.Replica(id).Status()
			if id != l && (st.LeaderCommit < commit || st.HeardLeaderAgo < 0 || st.HeardLeaderAgo > 500*time.Millisecond) {
				return false
			}
		}
		return true
	})
}
