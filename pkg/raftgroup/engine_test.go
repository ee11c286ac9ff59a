package raftgroup_test

// Engine tests: catch-up through snapshots, durability across crashes and
// restarts, data-dir identity, leadership transfer and error reporting.
// Helpers shared by this file, membership_test.go, read_test.go and
// transport_test.go are prefixed "eng" to keep clear of other test files.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// engHang is the deadline used only to keep a broken engine from hanging a
// test; nothing asserts on how long anything takes.
const engHang = 30 * time.Second

func engCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// engWaitFor polls cond until it holds, failing the test after engHang.
func engWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(engHang)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// engPropose proposes through the cluster's leader and fails the test on
// any error.
func engPropose(t *testing.T, c *rgtest.Cluster, cmd []byte) any {
	t.Helper()
	v, err := c.Propose(engCtx(t, engHang), cmd)
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	return v
}

// engReadIndex runs a linearizable read barrier on replica id, retrying
// failures (elections) until engHang.
func engReadIndex(t *testing.T, c *rgtest.Cluster, id uint64) {
	t.Helper()
	deadline := time.Now().Add(engHang)
	for {
		r := c.Replica(id)
		if r == nil {
			t.Fatalf("replica %d is not running", id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.ReadIndex(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("read index on replica %d: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// engDump returns replica id's whole KV state after a linearizable barrier.
func engDump(t *testing.T, c *rgtest.Cluster, id uint64) map[string]string {
	t.Helper()
	engReadIndex(t, c, id)
	d, err := c.KV(id).Dump()
	if err != nil {
		t.Fatalf("dump replica %d: %v", id, err)
	}
	return d
}

// engSameData asserts that the replicas in ids hold identical KV state, and
// returns it.
func engSameData(t *testing.T, c *rgtest.Cluster, ids ...uint64) map[string]string {
	t.Helper()
	ref := engDump(t, c, ids[0])
	for _, id := range ids[1:] {
		d := engDump(t, c, id)
		if !maps.Equal(ref, d) {
			t.Fatalf("replica %d holds %d keys, replica %d holds %d keys; contents differ:\n%s",
				ids[0], len(ref), id, len(d), engDiff(ref, d))
		}
	}
	return ref
}

func engDiff(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, fmt.Sprintf("  %q: %q vs %q (present %v)", k, v, w, ok))
		}
	}
	for k, w := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("  %q: missing vs %q", k, w))
		}
	}
	slices.Sort(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("  ... %d more", len(out)-20))
	}
	return strings.Join(out, "\n")
}

// engCheckAcked asserts every acknowledged Put is in data.
func engCheckAcked(t *testing.T, id uint64, data, acked map[string]string) {
	t.Helper()
	lost := 0
	for k, v := range acked {
		if data[k] != v {
			if lost < 10 {
				t.Errorf("replica %d: acknowledged write %q=%q lost (holds %q)", id, k, v, data[k])
			}
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("replica %d lost %d of %d acknowledged writes", id, lost, len(acked))
	}
}

// engWaitApplied waits until replica id has applied at least index.
func engWaitApplied(t *testing.T, c *rgtest.Cluster, id, index uint64) {
	t.Helper()
	engWaitFor(t, fmt.Sprintf("replica %d to apply index %d", id, index), func() bool {
		r := c.Replica(id)
		return r != nil && r.AppliedIndex() >= index
	})
}

func engFollower(c *rgtest.Cluster, leader uint64) uint64 {
	for _, id := range c.IDs() {
		if id != leader && c.Replica(id) != nil {
			return id
		}
	}
	return 0
}

// engWriters are clients that Put unique keys through the cluster's leader
// until stopped and remember every acknowledged write.
type engWriters struct {
	t      *testing.T
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	acked  map[string]string
	n      atomic.Int64
	bad    atomic.Int64 // errors that are neither success nor a clean failure
}

func engStartWriters(t *testing.T, c *rgtest.Cluster, clients int, prefix string) *engWriters {
	ctx, cancel := context.WithCancel(context.Background())
	w := &engWriters{t: t, cancel: cancel, acked: map[string]string{}}
	for i := range clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for j := 0; ctx.Err() == nil; j++ {
				k, v := fmt.Sprintf("%s/%d/%d", prefix, i, j), fmt.Sprintf("v%d.%d", i, j)
				octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := c.Propose(octx, rgtest.EncodePut(k, v))
				ocancel()
				if err == nil {
					w.mu.Lock()
					w.acked[k] = v
					w.mu.Unlock()
					w.n.Add(1)
					continue
				}
				if !raftgroup.IsNotExecuted(err) && !raftgroup.IsOutcomeUnknown(err) && ctx.Err() == nil {
					w.bad.Add(1)
					t.Errorf("client %d: unclassified error: %v", i, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	t.Cleanup(func() { cancel(); w.wg.Wait() })
	return w
}

func (w *engWriters) waitAcked(n int64) {
	w.t.Helper()
	engWaitFor(w.t, fmt.Sprintf("%d acknowledged writes", n), func() bool { return w.n.Load() >= n })
}

func (w *engWriters) stop() map[string]string {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.acked)
}

func engSnapCfg(snapEvery, trailing uint64) rgtest.Options {
	return rgtest.Options{Config: func(c *raftgroup.Config) {
		c.SnapshotEntries, c.TrailingEntries = snapEvery, trailing
	}}
}

// TestSnapshotCatchUpAfterCompaction: a follower that was down while the
// leader compacted its log past the follower's last entry catches up through
// a streamed snapshot and ends with exactly the leader's data.
func TestSnapshotCatchUpAfterCompaction(t *testing.T) {
	c := rgtest.NewCluster(t, 3, engSnapCfg(40, 10))
	l := c.WaitLeader(engHang)
	for i := range 20 {
		engPropose(t, c, rgtest.EncodePut(fmt.Sprintf("early%d", i), fmt.Sprint(i)))
	}
	f := engFollower(c, l)
	engWaitApplied(t, c, f, c.Replica(l).AppliedIndex())
	fLast := c.Replica(f).Status().LastIndex
	c.Crash(f)

	// Overwrite keys (so the snapshot must carry the latest values, not the
	// first ones) and append to one key (so a lost or doubled entry shows).
	for i := range 300 {
		engPropose(t, c, rgtest.EncodePut(fmt.Sprintf("k%d", i%50), fmt.Sprint(i)))
		if i%10 == 0 {
			engPropose(t, c, rgtest.EncodeAppend("log", fmt.Sprintf("%d,", i)))
		}
	}
	l = c.WaitLeader(engHang)
	for _, id := range c.IDs() {
		if id == f {
			continue
		}
		if st := c.Replica(id).Status(); st.FirstIndex <= fLast+1 {
			t.Fatalf("replica %d did not compact past the crashed follower: first index %d, follower's last %d", id, st.FirstIndex, fLast)
		}
	}
	sentBefore := uint64(0)
	for _, id := range c.IDs() {
		if id != f {
			sentBefore += c.Replica(id).Metrics().SnapshotsSent.Load()
		}
	}

	c.Start(f)
	engWaitApplied(t, c, f, c.Replica(l).AppliedIndex())
	data := engSameData(t, c, c.IDs()...)
	if data["k49"] != "299" || data["k0"] != "250" {
		t.Fatalf("unexpected final values k0=%q k49=%q", data["k0"], data["k49"])
	}
	var want strings.Builder
	for i := 0; i < 300; i += 10 {
		fmt.Fprintf(&want, "%d,", i)
	}
	if data["log"] != want.String() {
		t.Fatalf("appended log = %q, want %q", data["log"], want.String())
	}
	if len(data) != 20+50+1 {
		t.Fatalf("got %d keys, want 71", len(data))
	}

	sentNow := func() uint64 {
		sent := uint64(0)
		for _, id := range c.IDs() {
			if id != f {
				sent += c.Replica(id).Metrics().SnapshotsSent.Load()
			}
		}
		return sent
	}
	fr := c.Replica(f)
	if got := fr.Metrics().SnapshotsReceived.Load(); got == 0 {
		t.Fatalf("restarted follower received no snapshot")
	}
	// The sender counts a snapshot once the receiver acknowledged it, which
	// may be after the receiver has already applied it.
	engWaitFor(t, "a sent snapshot to be counted", func() bool { return sentNow() > sentBefore })
	sent := sentNow()
	if st := fr.Status(); st.SnapshotIndex <= fLast {
		t.Fatalf("follower snapshot index %d not past its old last index %d", st.SnapshotIndex, fLast)
	}

	// Replication from the log resumes after the snapshot.
	engPropose(t, c, rgtest.EncodeAppend("log", "end"))
	engReadIndex(t, c, f)
	if v, _ := c.KV(f).Get("log"); v != want.String()+"end" {
		t.Fatalf("after snapshot, follower log = %q", v)
	}
	// Restarting from the restored snapshot works too.
	c.Crash(f)
	c.Start(f)
	if v, _ := c.KV(f).Get("log"); v != want.String()+"end" {
		t.Fatalf("after restarting the follower, its log = %q", v)
	}
	engPropose(t, c, rgtest.EncodeAppend("log", "!"))
	engSameData(t, c, c.IDs()...)
	t.Logf("follower %d: old last %d, snapshot index %d, snapshots sent %d received %d",
		f, fLast, fr.Status().SnapshotIndex, sent, fr.Metrics().SnapshotsReceived.Load())
}

// TestDurabilityAllReplicasCrash: concurrent clients Put and Append; every
// acknowledged write survives a crash of every replica, and no append is
// applied twice.
func TestDurabilityAllReplicasCrash(t *testing.T) {
	c := rgtest.NewCluster(t, 3, engSnapCfg(100, 20))
	c.WaitLeader(engHang)

	const clients = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu         sync.Mutex
		ackedPut   = map[string]string{}
		ackedToken = map[string]bool{} // append tokens acknowledged
		n          atomic.Int64
		wg         sync.WaitGroup
	)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ctx.Err() == nil; j++ {
				var cmd []byte
				var k, v string
				if j%2 == 0 {
					k, v = fmt.Sprintf("p%d-%d", i, j), fmt.Sprintf("val-%d-%d", i, j)
					cmd = rgtest.EncodePut(k, v)
				} else {
					k, v = fmt.Sprintf("acc%d", i%2), fmt.Sprintf("<%d.%d>", i, j)
					cmd = rgtest.EncodeAppend(k, v)
				}
				octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := c.Propose(octx, cmd)
				ocancel()
				if err != nil {
					continue // not acknowledged: may or may not be there
				}
				mu.Lock()
				if j%2 == 0 {
					ackedPut[k] = v
				} else {
					ackedToken[v] = true
				}
				mu.Unlock()
				n.Add(1)
			}
		}()
	}
	engWaitFor(t, "200 acknowledged writes", func() bool { return n.Load() >= 200 })
	// Crash everything while clients are still writing.
	for _, id := range c.IDs() {
		c.Crash(id)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()

	for _, id := range c.IDs() {
		c.Start(id)
	}
	c.WaitLeader(engHang)
	data := engSameData(t, c, c.IDs()...)
	for _, id := range c.IDs() {
		engCheckAcked(t, id, data, ackedPut)
	}
	// Every acknowledged token is present once; no token (acknowledged or
	// not, each was proposed once) appears twice.
	all := data["acc0"] + data["acc1"]
	for tok := range ackedToken {
		if !strings.Contains(all, tok) {
			t.Errorf("acknowledged append %s lost", tok)
		}
	}
	for _, tok := range strings.SplitAfter(all, ">") {
		if tok != "" && strings.Count(all, tok) != 1 {
			t.Errorf("append %s applied %d times", tok, strings.Count(all, tok))
		}
	}
	t.Logf("%d puts and %d appends acknowledged before the crash; %d keys after restart", len(ackedPut), len(ackedToken), len(data))
}

// TestRestartResumesFromLogAndState: a restarted replica resumes from its
// stored state and applied index, and does not apply its log again (Append
// would show a doubled value).
func TestRestartResumesFromLogAndState(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{}) // no compaction: the whole log replays on restart
	l := c.WaitLeader(engHang)
	var want strings.Builder
	for i := range 60 {
		engPropose(t, c, rgtest.EncodeAppend("a", fmt.Sprintf("%d;", i)))
		fmt.Fprintf(&want, "%d;", i)
	}
	// Restart a follower, then the leader.
	for round, id := range []uint64{engFollower(c, l), l} {
		top := c.Replica(c.WaitLeader(engHang)).AppliedIndex()
		for _, o := range c.IDs() {
			engWaitApplied(t, c, o, top)
		}
		before := c.Replica(id).AppliedIndex()
		if v, _ := c.KV(id).Get("a"); v != want.String() {
			t.Fatalf("replica %d before restart: %q", id, v)
		}
		c.Crash(id)
		c.Start(id)
		r := c.Replica(id)
		// Straight from disk, before it hears from anyone.
		if got := r.AppliedIndex(); got < before {
			t.Fatalf("round %d: replica %d applied index went back from %d to %d on restart", round, id, before, got)
		}
		if v, _ := c.KV(id).Get("a"); v != want.String() {
			t.Fatalf("round %d: replica %d state after restart = %q, want %q", round, id, v, want.String())
		}
		c.WaitLeader(engHang)
		tok := fmt.Sprintf("r%d;", round)
		engPropose(t, c, rgtest.EncodeAppend("a", tok))
		want.WriteString(tok)
		engReadIndex(t, c, id)
		if v, _ := c.KV(id).Get("a"); v != want.String() {
			t.Fatalf("round %d: replica %d after one more append = %q, want %q", round, id, v, want.String())
		}
		// The log holds > 60 entries; replaying them would count them.
		if n := r.Metrics().AppliedEntries.Load(); n > 5 {
			t.Fatalf("round %d: replica %d applied %d entries after restart; expected only the new ones", round, id, n)
		}
		if st := r.Status(); st.FirstIndex != 1 || st.LastIndex < before {
			t.Fatalf("round %d: replica %d log after restart: first %d last %d (applied before %d)", round, id, st.FirstIndex, st.LastIndex, before)
		}
	}
}

// TestDataDirIdentity: a data dir opened under another replica id or group
// id is refused with an error naming both identities, and stays usable by
// its owner.
func TestDataDirIdentity(t *testing.T) {
	c := rgtest.NewCluster(t, 1, rgtest.Options{})
	c.WaitLeader(engHang)
	engPropose(t, c, rgtest.EncodePut("x", "1"))
	nd := c.Nodes[1]
	c.Crash(1)

	open := func(group, id uint64) error {
		r, err := raftgroup.Open(raftgroup.Config{
			GroupID: group, ID: id, Addr: nd.Addr, Dir: nd.Dir,
			Peers: []raftgroup.Peer{{ID: 1, Addr: nd.Addr}, {ID: 2, Addr: "127.0.0.1:1"}}, Logger: rgtest.Logger(),
		}, &rgtest.KV{})
		if err == nil {
			r.Close()
		}
		return err
	}
	err := open(1, 2)
	if err == nil {
		t.Fatal("opening replica 1's dir as replica 2 succeeded")
	}
	if !strings.Contains(err.Error(), "belongs to group 1 replica 1") || !strings.Contains(err.Error(), "not group 1 replica 2") {
		t.Fatalf("unclear error for wrong replica id: %v", err)
	}
	err = open(7, 1)
	if err == nil {
		t.Fatal("opening group 1's dir as group 7 succeeded")
	}
	if !strings.Contains(err.Error(), "belongs to group 1 replica 1") || !strings.Contains(err.Error(), "not group 7 replica 1") {
		t.Fatalf("unclear error for wrong group id: %v", err)
	}
	// The refused opens changed nothing.
	c.Start(1)
	c.WaitLeader(engHang)
	engReadIndex(t, c, 1)
	if v, _ := c.KV(1).Get("x"); v != "1" {
		t.Fatalf("after refused opens, x = %q", v)
	}
}

// TestTransferLeadership: leadership moves to the chosen voter, every
// replica follows it, and it accepts writes; bad targets are refused.
func TestTransferLeadership(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(engHang)
	engPropose(t, c, rgtest.EncodePut("x", "1"))
	ctx := engCtx(t, engHang)

	if err := c.Replica(l).TransferLeadership(ctx, 9); err == nil || !raftgroup.IsNotExecuted(err) {
		t.Fatalf("transfer to a non-member: %v", err)
	}
	f := engFollower(c, l)
	var nl *raftgroup.NotLeaderError
	if err := c.Replica(f).TransferLeadership(ctx, f); !errors.As(err, &nl) {
		t.Fatalf("transfer called on a follower: %v", err)
	}

	for _, target := range []uint64{f, l} { // there and back
		from := c.WaitLeader(engHang)
		engWaitApplied(t, c, target, c.Replica(from).AppliedIndex())
		if err := c.Replica(from).TransferLeadership(ctx, target); err != nil {
			t.Fatalf("transfer %d -> %d: %v", from, target, err)
		}
		if !c.Replica(target).IsLeader() {
			engWaitFor(t, fmt.Sprintf("replica %d to lead", target), c.Replica(target).IsLeader)
		}
		engWaitFor(t, "every replica to follow the new leader", func() bool {
			for _, id := range c.IDs() {
				if lead, _ := c.Replica(id).Leader(); lead != target {
					return false
				}
			}
			return true
		})
		if c.Replica(from).IsLeader() {
			t.Fatalf("old leader %d still leads", from)
		}
		v := fmt.Sprintf("to%d", target)
		if _, err := c.Replica(target).Propose(ctx, rgtest.EncodePut("x", v)); err != nil {
			t.Fatalf("propose on new leader %d: %v", target, err)
		}
		_, err := c.Replica(from).Propose(ctx, rgtest.EncodePut("x", "stale"))
		if !errors.As(err, &nl) || nl.Leader != target {
			t.Fatalf("propose on old leader %d: %v", from, err)
		}
		if d := engSameData(t, c, c.IDs()...); d["x"] != v {
			t.Fatalf("x = %q, want %q", d["x"], v)
		}
	}
}

// TestProposeErrors: a follower refuses with a NotLeaderError naming the
// leader and its address; an oversized command is refused as not executed.
func TestProposeErrors(t *testing.T) {
	const limit = 4096
	c := rgtest.NewCluster(t, 3, rgtest.Options{Config: func(c *raftgroup.Config) { c.MaxCommandBytes = limit }})
	l := c.WaitLeader(engHang)
	engPropose(t, c, rgtest.EncodePut("x", "1"))
	f := engFollower(c, l)
	engWaitFor(t, "the follower to know the leader", func() bool { id, _ := c.Replica(f).Leader(); return id == l })
	ctx := engCtx(t, engHang)

	_, err := c.Replica(f).Propose(ctx, rgtest.EncodePut("x", "2"))
	if err == nil {
		t.Fatal("propose on a follower succeeded")
	}
	if !raftgroup.IsNotExecuted(err) || raftgroup.IsOutcomeUnknown(err) {
		t.Fatalf("follower refusal is not a clean not-executed error: %v", err)
	}
	var nl *raftgroup.NotLeaderError
	if !errors.As(err, &nl) {
		t.Fatalf("follower refusal is not a NotLeaderError: %T %v", err, err)
	}
	if nl.Leader != l || nl.Addr != c.Nodes[l].Addr {
		t.Fatalf("NotLeaderError names %d at %q, want %d at %q", nl.Leader, nl.Addr, l, c.Nodes[l].Addr)
	}
	if !strings.Contains(err.Error(), c.Nodes[l].Addr) {
		t.Fatalf("message does not name the leader's address: %v", err)
	}

	// Size limit: one byte over is refused, exactly at the limit is fine.
	over := rgtest.EncodePut("big", strings.Repeat("z", limit))
	_, err = c.Replica(l).Propose(ctx, over)
	if err == nil || !raftgroup.IsNotExecuted(err) {
		t.Fatalf("oversized command: %v", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("command of %d bytes exceeds the limit of %d bytes", len(over), limit)) {
		t.Fatalf("oversized command error is unclear: %v", err)
	}
	if r := shardkvpb.Reason(raftgroup.GRPCError(err)); r != shardkvpb.ReasonTooLarge {
		t.Fatalf("oversized command maps to gRPC reason %q", r)
	}
	exact := rgtest.EncodePut("big", "")
	exact = rgtest.EncodePut("big", strings.Repeat("y", limit-len(exact)))
	if len(exact) != limit {
		t.Fatalf("test bug: %d", len(exact))
	}
	if _, err := c.Replica(l).Propose(ctx, exact); err != nil {
		t.Fatalf("command of exactly the limit: %v", err)
	}
	d := engSameData(t, c, c.IDs()...)
	if d["x"] != "1" || len(d["big"]) != limit-len(rgtest.EncodePut("big", "")) || strings.Contains(d["big"], "z") {
		t.Fatalf("refused commands changed state: x=%q big has %d bytes", d["x"], len(d["big"]))
	}
}

// TestAdminService: over gRPC, a follower answers membership changes with
// NOT_LEADER and a leader hint, and Status reports the members.
func TestAdminService(t *testing.T) {
	c := rgtest.NewCluster(t, 3, rgtest.Options{})
	l := c.WaitLeader(engHang)
	engPropose(t, c, rgtest.EncodePut("x", "1"))
	f := engFollower(c, l)
	engWaitFor(t, "the follower to know the leader", func() bool { id, _ := c.Replica(f).Leader(); return id == l })
	ctx := engCtx(t, engHang)

	conn, err := grpc.NewClient(c.Nodes[f].Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm := shardkvpb.NewAdminClient(conn)

	checkNotLeader := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s on a follower succeeded", what)
		}
		if shardkvpb.Reason(err) != shardkvpb.ReasonNotLeader || status.Code(err) != codes.Unavailable {
			t.Fatalf("%s on a follower: %v (reason %q)", what, err, shardkvpb.Reason(err))
		}
		id, addr, ok := shardkvpb.LeaderHint(err)
		if !ok || id != l || addr != c.Nodes[l].Addr {
			t.Fatalf("%s: leader hint %d %q %v, want %d %q", what, id, addr, ok, l, c.Nodes[l].Addr)
		}
		if !shardkvpb.Retryable(err) {
			t.Fatalf("%s: NOT_LEADER is not retryable", what)
		}
	}
	_, err = adm.AddLearner(ctx, &shardkvpb.AddLearnerRequest{Id: 9, Addr: "127.0.0.1:1"})
	checkNotLeader("AddLearner", err)
	_, err = adm.RemoveMember(ctx, &shardkvpb.RemoveMemberRequest{Id: l})
	checkNotLeader("RemoveMember", err)
	_, err = adm.Promote(ctx, &shardkvpb.PromoteRequest{Id: 2})
	checkNotLeader("Promote", err)
	_, err = adm.TransferLeader(ctx, &shardkvpb.TransferLeaderRequest{To: f})
	checkNotLeader("TransferLeader", err)

	st, err := adm.Status(ctx, &shardkvpb.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetId() != f || st.GetGroupId() != 1 || st.GetRole() != "follower" || st.GetLeader() != l || st.GetLeaderAddr() != c.Nodes[l].Addr {
		t.Fatalf("Status of follower: %+v", st)
	}
	if len(st.GetMembers()) != 3 {
		t.Fatalf("Status lists %d members: %v", len(st.GetMembers()), st.GetMembers())
	}
	for i, m := range st.GetMembers() {
		id := uint64(i + 1)
		if m.GetId() != id || m.GetAddr() != c.Nodes[id].Addr || m.GetLearner() {
			t.Fatalf("member %d: %+v, want id %d addr %s voter", i, m, id, c.Nodes[id].Addr)
		}
	}
	if st.GetApplied() == 0 || st.GetCounters().GetAppliedEntries() == 0 {
		t.Fatalf("Status shows nothing applied: %+v", st)
	}

	// The leader's admin service refuses to remove the leader itself.
	lconn, err := grpc.NewClient(c.Nodes[l].Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer lconn.Close()
	_, err = shardkvpb.NewAdminClient(lconn).RemoveMember(ctx, &shardkvpb.RemoveMemberRequest{Id: l})
	if err == nil || shardkvpb.Reason(err) != shardkvpb.ReasonNotExecuted || !strings.Contains(err.Error(), "transfer leadership") {
		t.Fatalf("removing the leader through its admin service: %v (reason %q)", err, shardkvpb.Reason(err))
	}
	lst, err := shardkvpb.NewAdminClient(lconn).Status(ctx, &shardkvpb.StatusRequest{})
	if err != nil || lst.GetRole() != "leader" || len(lst.GetMembers()) != 3 {
		t.Fatalf("leader Status: %v %+v", err, lst)
	}
}
