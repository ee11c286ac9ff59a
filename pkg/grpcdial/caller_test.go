package grpcdial_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func newCaller(t *testing.T) (*grpcdial.Caller, *grpcdial.Pool) {
	p := grpcdial.NewPool()
	t.Cleanup(func() { p.Close() })
	return grpcdial.NewCaller(p), p
}

// getter is an Attempt that calls Get and records where it answered.
func getter(answered *string) grpcdial.Attempt {
	return func(ctx context.Context, addr string, cc *grpc.ClientConn) error {
		v, err := get(ctx, cc)
		if err == nil {
			if v != addr {
				return errors.New("answered by " + v + ", called " + addr)
			}
			*answered = v
		}
		return err
	}
}

func notLeader(leader string) func(int) error {
	return func(int) error { return shardkvpb.NotLeaderError("not the leader", 7, leader) }
}

func unavailable(int) error { return status.Error(codes.Unavailable, "down") }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A follower's NOT_LEADER hint is followed at once (before the other
// replicas), and the leader is tried first from then on.
func TestCallerFollowsHint(t *testing.T) {
	a, b, c := startReplica(t), startReplica(t), startReplica(t)
	a.set(notLeader(c.addr))
	b.set(unavailable)
	rs, _ := newCaller(t)
	ctx := testCtx(t)
	addrs := []string{a.addr, b.addr, c.addr}

	var at string
	if err := rs.Round(ctx, 1, addrs, grpcdial.CallOptions{}, getter(&at)); err != nil || at != c.addr {
		t.Fatalf("round: answered by %q, %v; want %s", at, err, c.addr)
	}
	if a.count() != 1 || b.count() != 0 || c.count() != 1 {
		t.Fatalf("calls a=%d b=%d c=%d, want 1 0 1", a.count(), b.count(), c.count())
	}
	if l := rs.Leader(1); l != c.addr {
		t.Fatalf("Leader(1) = %q, want %s", l, c.addr)
	}
	if err := rs.Round(ctx, 1, addrs, grpcdial.CallOptions{}, getter(&at)); err != nil || at != c.addr {
		t.Fatalf("second round: %q, %v", at, err)
	}
	if a.count() != 1 || c.count() != 2 {
		t.Fatalf("second round did not go to the leader first: a=%d c=%d", a.count(), c.count())
	}
	// Another group's leader is its own.
	if l := rs.Leader(2); l != "" {
		t.Fatalf("Leader(2) = %q", l)
	}
}

// Unreachable and unavailable replicas are skipped in order.
func TestCallerRotates(t *testing.T) {
	b, c := startReplica(t), startReplica(t)
	b.set(unavailable)
	rs, _ := newCaller(t)
	addrs := []string{deadAddr(t), b.addr, c.addr}
	var at string
	if err := rs.Round(testCtx(t), 0, addrs, grpcdial.CallOptions{AttemptTimeout: 5 * time.Second}, getter(&at)); err != nil || at != c.addr {
		t.Fatalf("round: answered by %q, %v", at, err)
	}
	if b.count() != 1 || rs.Leader(0) != c.addr {
		t.Fatalf("b called %d times, leader %q", b.count(), rs.Leader(0))
	}

	// A round where every replica fails returns the last error.
	c.set(func(int) error { return status.Error(codes.Unavailable, "c is down too") })
	err := rs.Round(testCtx(t), 0, addrs, grpcdial.CallOptions{AttemptTimeout: 5 * time.Second}, getter(&at))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "down") {
		t.Fatalf("failed round: %v", err)
	}
	if c.count() != 2 || b.count() != 2 {
		t.Fatalf("failed round: b=%d c=%d calls, want 2 2", b.count(), c.count())
	}
}

// A Final error ends the round: no other replica is tried.
func TestCallerFinal(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	a.set(func(int) error { return status.Error(codes.InvalidArgument, "bad") })
	rs, _ := newCaller(t)
	opts := grpcdial.CallOptions{Final: func(err error) bool { return status.Code(err) == codes.InvalidArgument }}
	var at string
	err := rs.Call(testCtx(t), 0, []string{a.addr, b.addr}, opts, getter(&at))
	if status.Code(err) != codes.InvalidArgument || b.count() != 0 || a.count() != 1 {
		t.Fatalf("call: %v; a=%d b=%d calls", err, a.count(), b.count())
	}
}

// Call backs off and retries rounds until an attempt succeeds, or until
// ctx ends.
func TestCallerBacksOffUntilCtx(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	a.set(unavailable)
	b.set(func(n int) error {
		if n <= 3 {
			return unavailable(n)
		}
		return nil
	})
	rs, _ := newCaller(t)
	opts := grpcdial.CallOptions{Backoff: grpcdial.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}}
	var at string
	if err := rs.Call(testCtx(t), 0, []string{a.addr, b.addr}, opts, getter(&at)); err != nil || at != b.addr {
		t.Fatalf("call: %q, %v", at, err)
	}
	if b.count() != 4 || a.count() != 4 {
		t.Fatalf("calls a=%d b=%d, want 4 rounds", a.count(), b.count())
	}

	// Never succeeding: the deadline ends it, naming the last error.
	b.set(unavailable)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	before := a.count()
	start := time.Now()
	err := rs.Call(ctx, 0, []string{a.addr, b.addr}, opts, getter(&at))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "(last error: ") {
		t.Fatalf("call past its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("call returned %v after its deadline", d)
	}
	if a.count()-before < 3 {
		t.Fatalf("only %d rounds before the deadline", a.count()-before)
	}
}

// A remembered leader outside the address list (a hint) is tried first
// while the list stays the same, and dropped when the list changes.
func TestCallerLeaderAndMembership(t *testing.T) {
	a, b, d := startReplica(t), startReplica(t), startReplica(t)
	a.set(notLeader(d.addr))
	b.set(notLeader(d.addr))
	rs, _ := newCaller(t)
	ctx := testCtx(t)
	var at string
	if err := rs.Round(ctx, 5, []string{a.addr, b.addr}, grpcdial.CallOptions{}, getter(&at)); err != nil || at != d.addr {
		t.Fatalf("round: %q, %v", at, err)
	}
	if err := rs.Round(ctx, 5, []string{a.addr, b.addr}, grpcdial.CallOptions{}, getter(&at)); err != nil || at != d.addr || a.count() != 1 {
		t.Fatalf("same list: %q, %v, a called %d times (want d first)", at, err, a.count())
	}
	// New membership without d: start from the list again.
	a.set(nil)
	if err := rs.Round(ctx, 5, []string{a.addr, b.addr, "127.0.0.1:1"}, grpcdial.CallOptions{}, getter(&at)); err != nil || at != a.addr {
		t.Fatalf("new list: %q, %v", at, err)
	}
	if d.count() != 2 || rs.Leader(5) != a.addr {
		t.Fatalf("d called %d times, leader %q", d.count(), rs.Leader(5))
	}
}

// Hints that point at each other end the round once each has been tried.
func TestCallerHintLoop(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	a.set(notLeader(b.addr))
	b.set(notLeader(a.addr))
	rs, _ := newCaller(t)
	var at string
	err := rs.Round(testCtx(t), 0, []string{a.addr, b.addr}, grpcdial.CallOptions{}, getter(&at))
	if shardkvpb.Reason(err) != shardkvpb.ReasonNotLeader || a.count() != 1 || b.count() != 1 {
		t.Fatalf("round: %v; a=%d b=%d", err, a.count(), b.count())
	}
}

// Forgetting a connection under a Caller: the next call dials again.
func TestCallerAfterForgetAndClose(t *testing.T) {
	a := startReplica(t)
	rs, p := newCaller(t)
	ctx := testCtx(t)
	var at string
	for range 2 {
		if err := rs.Call(ctx, 0, []string{a.addr}, grpcdial.CallOptions{}, getter(&at)); err != nil {
			t.Fatal(err)
		}
		p.Forget(a.addr)
	}
	if err := rs.Call(ctx, 0, nil, grpcdial.CallOptions{}, getter(&at)); !errors.Is(err, grpcdial.ErrNoReplicas) {
		t.Fatalf("call without addresses: %v", err)
	}
	p.Close()
	if err := rs.Call(ctx, 0, []string{a.addr}, grpcdial.CallOptions{}, getter(&at)); !errors.Is(err, grpcdial.ErrClosed) {
		t.Fatalf("call on a closed pool: %v", err)
	}
}

// The attempt timeout bounds each attempt, not the call.
func TestCallerAttemptTimeout(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	a.set(func(int) error { time.Sleep(time.Second); return nil })
	rs, _ := newCaller(t)
	var at string
	start := time.Now()
	err := rs.Round(testCtx(t), 0, []string{a.addr, b.addr}, grpcdial.CallOptions{AttemptTimeout: 100 * time.Millisecond}, getter(&at))
	if err != nil || at != b.addr || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("round: %q, %v after %v", at, err, time.Since(start))
	}
}

// TestCallerAttemptTimeoutGrows: a request every replica needs longer
// than AttemptTimeout for (a large batch on a loaded machine) succeeds once
// the budget has grown, instead of timing out on every retry until the
// caller's deadline.
func TestCallerAttemptTimeoutGrows(t *testing.T) {
	a := startReplica(t)
	a.set(func(int) error { time.Sleep(300 * time.Millisecond); return nil })
	rs, _ := newCaller(t)
	var at string
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := grpcdial.CallOptions{AttemptTimeout: 50 * time.Millisecond, Backoff: grpcdial.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond}}
	if err := rs.Call(ctx, 0, []string{a.addr}, opts, getter(&at)); err != nil || at != a.addr {
		t.Fatalf("call of a replica that takes 300ms, attempts of 50ms at first: %q, %v", at, err)
	}
}

// A leader hinted from elsewhere (another group's WRONG_GROUP refusal,
// shardkvpb.OwnerHint) is tried first in the group's next round, even the
// group's first: the client goes straight to the new owner's leader.
func TestCallerHintFromOwnerRefusal(t *testing.T) {
	a, b, c := startReplica(t), startReplica(t), startReplica(t)
	rs, _ := newCaller(t)
	ctx := testCtx(t)
	refusal := &shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, ConfigNum: 9, Shard: 3, Owner: 5, Leader: 2, LeaderAddr: c.addr}
	gid, addr := shardkvpb.OwnerHint(status.Convert(refusal).Err())
	if gid != 5 || addr != c.addr {
		t.Fatalf("OwnerHint = %d %q; want 5 %s", gid, addr, c.addr)
	}
	if g, _ := shardkvpb.OwnerHint(shardkvpb.NotLeaderError("not the leader", 2, c.addr)); g != 0 {
		t.Fatalf("OwnerHint of NOT_LEADER = %d; want none", g)
	}
	rs.Hint(gid, addr)
	var at string
	if err := rs.Round(ctx, gid, []string{a.addr, b.addr, c.addr}, grpcdial.CallOptions{}, getter(&at)); err != nil || at != c.addr {
		t.Fatalf("round: answered by %q, %v; want the hinted %s", at, err, c.addr)
	}
	if a.count() != 0 || b.count() != 0 {
		t.Fatalf("calls a=%d b=%d before the hinted leader; want none", a.count(), b.count())
	}
}
