package shardkv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Issue 14, case 1: one command that passed the checks before proposing and
// then failed in badger at apply stopped every replica of its group, and
// every restart replayed it and stopped again. Each form of it must now get
// a clear error, leave every replica running and every other key as it was,
// and the group must serve on and come back after a restart.

const hostileGID = 100

// hostileWorld is one data group owning every shard, with a few keys
// written through the Go client.
func hostileWorld(t *testing.T) (*kvtest.World, map[string]string) {
	t.Helper()
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(hostileGID)
	w.Join(hostileGID)
	w.WaitSettled(20 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := w.Client()
	keep := map[string]string{}
	for i := range 20 {
		k, v := fmt.Sprintf("keep-%d", i), fmt.Sprintf("value-%d", i)
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		keep[k] = v
	}
	return w, keep
}

// stillServing fails the test if a replica stopped, a kept key changed, or
// the group does not take a write; then it restarts the group and checks
// the same again.
func stillServing(t *testing.T, w *kvtest.World, keep map[string]string) {
	t.Helper()
	check := func(when string) {
		t.Helper()
		for _, id := range w.Groups[hostileGID].IDs() {
			r := w.Groups[hostileGID].Replica(id)
			if r == nil {
				t.Fatalf("%s: replica %d is down", when, id)
			}
			if err := r.Err(); err != nil {
				msg := err.Error()
				t.Fatalf("%s: replica %d stopped: %.300s", when, id, msg)
			}
		}
		// Generous: a liveness bound, not a speed check. A group just
		// restarted under -race on a loaded machine took over 20 s to
		// answer the 13,220 keys of TestHostileDelManyKeys.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := w.Client()
		// One MultiGet: thousands of kept keys read one by one outlast any
		// deadline on a slow (race-instrumented) run.
		keys := make([]string, 0, len(keep))
		for k := range keep {
			keys = append(keys, k)
		}
		got, err := c.MultiGet(ctx, keys)
		if err != nil {
			t.Fatalf("%s: MultiGet of the %d kept keys: %v", when, len(keys), err)
		}
		for k, v := range keep {
			if g, ok := got[k]; !ok || g != v {
				t.Fatalf("%s: %s = %q (present %v), want %q", when, k, g, ok, v)
			}
		}
		if err := c.Put(ctx, "canary", when); err != nil {
			t.Fatalf("%s: the group takes no write: %v", when, err)
		}
		if got, _, err := c.Get(ctx, "canary"); err != nil || got != when {
			t.Fatalf("%s: canary = %q, %v", when, got, err)
		}
	}
	// Let every replica apply what was committed.
	time.Sleep(300 * time.Millisecond)
	check("after the command")
	w.StopGroup(hostileGID)
	w.RestartGroup(hostileGID)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Groups[hostileGID].WaitLeader(20 * time.Second)
	}()
	<-done
	time.Sleep(300 * time.Millisecond)
	check("after a restart")
}

// wantRefused checks a WriteBatch error: invalid input (nothing executed),
// a size refusal, a short message.
func wantRefused(t *testing.T, outs []shardkv.WriteOutcome, err error) {
	t.Helper()
	if err == nil {
		for i, o := range outs {
			if o.Err == nil && o.Result.GetError() == "" {
				t.Fatalf("op %d: executed (%v), want a refusal", i, o.Result)
			}
		}
		return
	}
	var ref *shardkvpb.Refusal
	if errors.As(err, &ref) || errors.Is(err, shardkvpb.ErrOutcomeUnknown) {
		t.Fatalf("got %.300v, want invalid input (a size limit)", err)
	}
	if len(err.Error()) > 400 {
		t.Errorf("error of %d bytes: %.200s…", len(err.Error()), err)
	}
	t.Logf("refused: %v", err)
}

// batch runs ops as one WriteBatch on the leader, again while it is
// refused as not executed (an election).
func batch(t *testing.T, w *kvtest.World, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
	t.Helper()
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		outs, err := leaderGroup(t, w, hostileGID).WriteBatch(ctx, ops)
		cancel()
		var ref *shardkvpb.Refusal
		if !errors.As(err, &ref) || try == 20 {
			return outs, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestHostileSetLongKey(t *testing.T) {
	w, keep := hostileWorld(t)
	key := []byte(strings.Repeat("k", 65000))
	outs, err := batch(t, w, []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: key, Value: []byte("v")}})
	wantRefused(t, outs, err)
	stillServing(t, w, keep)
}

func TestHostileSetLongKeyWithExpiry(t *testing.T) {
	w, keep := hostileWorld(t)
	// Its value record fits badger; its expiry index entry does not.
	key := []byte(strings.Repeat("k", 64995))
	exp := time.Now().Add(time.Hour).UnixMilli()
	outs, err := batch(t, w, []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: key, Value: []byte("v"), ExpireAtMs: exp}})
	wantRefused(t, outs, err)
	stillServing(t, w, keep)
}

// MSET of 27,000 keys of one hash tag, as pkg/resp proposes it.
func TestHostileMSetManyKeys(t *testing.T) {
	w, keep := hostileWorld(t)
	var ops []*shardkvpb.WriteOp
	for i := range 27000 {
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: fmt.Appendf(nil, "{t}%d", i), Value: []byte("v")})
	}
	outs, err := batch(t, w, ops)
	wantRefused(t, outs, err)
	stillServing(t, w, keep)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, ok, err := w.Client().Get(ctx, "{t}0"); err != nil || ok {
		t.Fatalf("a key of the refused MSET exists (%v, %v)", ok, err)
	}
}

// DEL of 13,200 existing keys of one hash tag is refused (2 records each: 26,400, past badger's 26,214); DEL of 4,700 (a
// count its records fit: 5 each in the worst case, with the change index entry of a planned move and the dead-version
// mark of a collection it may delete) deletes them all.
func TestHostileDelManyKeys(t *testing.T) {
	w, keep := hostileWorld(t)
	key := func(i int) []byte { return fmt.Appendf(nil, "{d}%d", i) }
	for from := 0; from < 13200; from += 1100 {
		var ops []*shardkvpb.WriteOp
		for i := from; i < from+1100; i++ {
			ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: key(i), Value: []byte("v")})
		}
		if _, err := batch(t, w, ops); err != nil {
			t.Fatal(err)
		}
	}
	del := func(n int) ([]shardkv.WriteOutcome, error) {
		var ops []*shardkvpb.WriteOp
		for i := range n {
			ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: key(i)})
		}
		return batch(t, w, ops)
	}
	outs, err := del(13200)
	wantRefused(t, outs, err)
	for i := range 13200 {
		keep[string(key(i))] = "v"
	}
	stillServing(t, w, keep)

	outs, err = del(4700)
	if err != nil {
		t.Fatalf("DEL of 4,700 keys: %v", err)
	}
	for i, o := range outs {
		if o.Err != nil || !o.Result.GetOk() {
			t.Fatalf("DEL op %d: %v %v", i, o.Err, o.Result)
		}
	}
	for i := range 4700 {
		delete(keep, string(key(i)))
	}
	stillServing(t, w, keep)
}

// A MultiPut of 13,200 keys of one group through the gRPC API: one
// MultiWrite of one session, as the Go client sends it, over keys deleted
// before, so each put writes its record and drops its tombstone index
// entry: 26,400 records, past badger's 26,214. (The Go client itself spends
// longer than its per-attempt timeout building such a request: its session
// ack is quadratic in the keys in flight.)
func TestHostileMultiPutManyKeys(t *testing.T) {
	w, keep := hostileWorld(t)
	const n = 13200
	key := func(i int) []byte { return fmt.Appendf(nil, "{m}%d", i) }
	for from := 0; from < n; from += 1100 {
		var puts, dels []*shardkvpb.WriteOp
		for i := from; i < from+1100; i++ {
			puts = append(puts, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: key(i), Value: []byte("v")})
			dels = append(dels, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: key(i)})
		}
		for _, ops := range [][]*shardkvpb.WriteOp{puts, dels} {
			if _, err := batch(t, w, ops); err != nil {
				t.Fatal(err)
			}
		}
	}
	req := &shardkvpb.MultiWriteRequest{}
	for i := range n {
		req.Ops = append(req.Ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: key(i), Value: []byte("v"),
			Session: &shardkvpb.Session{ClientId: 77, Seq: uint64(i + 1)}})
	}
	leader := w.Groups[hostileGID].WaitLeader(10 * time.Second)
	cc, err := grpc.NewClient(w.Groups[hostileGID].Nodes[leader].Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := shardkvpb.NewKVClient(cc).MultiWrite(ctx, req)
	if err == nil {
		t.Fatalf("MultiWrite of %d keys of one shard: %d results, want a size refusal", n, len(rep.Results))
	}
	if shardkvpb.Reason(err) != shardkvpb.ReasonTooLarge || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("MultiWrite: %.300v, want a size refusal (INVALID_ARGUMENT, TOO_LARGE)", err)
	}
	t.Logf("refused: %v", err)
	stillServing(t, w, keep)
	// Its own deadline: stillServing restarts the group, which can take
	// most of the MultiWrite's 10 s on a loaded race-instrumented run.
	gctx, gcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer gcancel()
	if _, ok, err := w.Client().Get(gctx, string(key(0))); err != nil || ok {
		t.Fatalf("a key of the refused MultiWrite exists (%v, %v)", ok, err)
	}
}

// APPEND checked only the appended piece: three 200 KiB APPENDs under a
// 512 KiB value limit made a 600 KiB value. The final size is checked at
// apply; the op that would pass the limit changes nothing.
func TestAppendFinalSize(t *testing.T) {
	w, keep := hostileWorld(t)
	piece := []byte(strings.Repeat("a", shardkv.DefaultMaxValueBytes*2/5))
	var last *shardkvpb.WriteResult
	for i := range 3 {
		outs, err := batch(t, w, []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("log"), Value: piece}})
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		last = outs[0].Result
	}
	if last.GetError() != shardkvpb.OpErrValueTooLarge {
		t.Fatalf("third append: %v, want error %s", last, shardkvpb.OpErrValueTooLarge)
	}
	// A bound on liveness only: a 3 MiB write under -race on a loaded
	// 2-core machine took more than 10 s.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The Go client says so too (it used to return nil).
	var oe *client.OpError
	if err := w.Client().Append(ctx, "log", string(piece)); !errors.As(err, &oe) || oe.Code != shardkvpb.OpErrValueTooLarge {
		t.Fatalf("client Append past the limit: %v, want an OpError %s", err, shardkvpb.OpErrValueTooLarge)
	}
	v, _, err := w.Client().Get(ctx, "log")
	if err != nil || len(v) != 2*len(piece) {
		t.Fatalf("log holds %d bytes (%v), want %d", len(v), err, 2*len(piece))
	}
	keep["log"] = string(piece) + string(piece)
	stillServing(t, w, keep)
}
