package resp_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// defaultWorld is one data group (3 replicas, 16 shards) whose RESP servers
// run with the default configuration, as `node local` does: the timeouts
// and limits under test are the shipped ones.
func defaultWorld(t *testing.T) (*kvtest.World, string) {
	w := kvtest.New(t, kvtest.Options{Shards: 16,
		RaftConfig: func(c *raftgroup.Config) { c.ElectionTicks = 100 },
		RESP: func(addr string, g *shardkv.Group) func() {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Errorf("listen %s: %v", addr, err)
				return func() {}
			}
			s := resp.New(resp.Config{Logger: rgtest.Logger()}, g)
			go s.Serve(ln)
			return func() { s.Close() }
		}})
	w.StartGroup(gA)
	w.Join(gA)
	w.WaitSettled(60 * time.Second)
	return w, w.RESPAddr(gA, w.Groups[gA].WaitLeader(10*time.Second))
}

// TestPipelineExactlyOnce is issue 14 case 4: a stock go-redis
// ClusterClient (default options: 3s read timeout, whole-pipeline resend on
// an I/O error) sends one pipeline of (GET, INCR, APPEND unique-token)
// triples to one slot. Every APPEND must be applied at most once, exactly
// once if it was answered with success, and never if it was answered "not
// executed"; no command may see an I/O timeout. Before reads joined write
// batches (two rounds per triple), 3,000 triples outlasted go-redis's 3s,
// it resent the pipeline, and half the appends were applied twice.
func TestPipelineExactlyOnce(t *testing.T) {
	_, addr := defaultWorld(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	defer rdb.Close()
	ctx := context.Background()
	ctr, logKey := "{case4}ctr", "{case4}log"
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	const n = 3000
	token := func(i int) string { return fmt.Sprintf("<%d>", i) }
	start := time.Now()
	cmds, _ := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			p.Get(ctx, ctr)
			p.Incr(ctx, ctr)
			p.Append(ctx, logKey, token(i))
		}
		return nil
	})
	elapsed := time.Since(start)

	// Read the log on a fresh client (one that never timed out).
	check := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: slow})
	defer check.Close()
	log, err := check.Get(ctx, logKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("read the log: %v", err)
	}
	counts := map[string]int{}
	for _, tok := range strings.SplitAfter(log, ">") {
		if tok != "" {
			counts[tok]++
		}
	}

	var ok, notExecuted, other, timeouts, twice, lost int
	errs := map[string]int{}
	for i, c := range cmds {
		err := c.Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || strings.Contains(err.Error(), "i/o timeout") {
				timeouts++
			}
			msg := err.Error()
			if len(msg) > 60 {
				msg = msg[:60]
			}
			errs[msg]++
		}
		if i%3 != 2 {
			continue
		}
		tok := token(i / 3)
		switch got := counts[tok]; {
		case got > 1:
			twice++
		case err == nil:
			ok++
			if got != 1 {
				lost++
			}
		case strings.HasPrefix(err.Error(), "TRYAGAIN"):
			notExecuted++
			if got != 0 {
				t.Errorf("APPEND %s answered %q was applied", tok, err)
			}
		default:
			other++
		}
	}
	t.Logf("%d triples in %v: %d appends ok, %d not executed, %d other errors, %d applied twice; errors: %v",
		n, elapsed, ok, notExecuted, other, twice, errs)
	if twice > 0 {
		t.Errorf("%d appends were applied twice (%d tokens in the log, %d distinct)", twice, len(strings.SplitAfter(log, ">"))-1, len(counts))
	}
	if lost > 0 {
		t.Errorf("%d appends answered OK are not in the log", lost)
	}
	if timeouts > 0 {
		t.Errorf("%d commands saw an I/O timeout", timeouts)
	}
	// Liveness: the pipeline is answered, not refused. (Before replies
	// streamed and reads joined write batches, none of it was.) How much
	// of it runs before go-redis's 3s is up depends on the machine's
	// speed: under the race detector with other packages' tests running
	// (CI), 3,000 triples took 2-4s and as few as 273 appends ran before
	// the deadline (the rest refused, not executed), where without it they
	// take 0.05-0.25s. So the race build checks progress, and the build
	// without it (make test runs it too) that half the pipeline succeeds.
	if ok == 0 {
		t.Errorf("none of %d appends succeeded", n)
	}
	if !raceEnabled && ok < n/2 {
		t.Errorf("only %d of %d appends succeeded", ok, n)
	}
}

// holdingBackend is gA's leader with every backend call after the first
// held until release is closed (or 5s, or the call's context ends).
func (e *env) holdingBackend() (h *hookBackend, release chan struct{}) {
	h = &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	release = make(chan struct{})
	var calls atomic.Int64
	hold := func(ctx context.Context) {
		if calls.Add(1) > 1 {
			select {
			case <-release:
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		hold(ctx)
		return h.Backend.WriteBatch(ctx, ops)
	})
	h.setRead(func(ctx context.Context, keys [][]byte, f bool) ([]shardkv.ValueEntry, error) {
		hold(ctx)
		return h.Backend.ReadKeys(ctx, keys, f, nil)
	})
	return h, release
}

// testStreaming: replies leave as each round of a pipeline completes, not
// once the whole pipeline has run. The pipeline's rounds after the first
// are held until the client has its first reply; it must arrive.
func (e *env) testStreaming(t *testing.T) {
	h, release := e.holdingBackend()
	_, addr := extraServer(t, resp.Config{}, h)
	k := e.keyIn(gA, "stream:")
	c := dial(t, addr)
	defer c.c.Close()
	var b []byte
	for range 100 {
		b = append(b, encode("incr", k)...)
		b = append(b, encode("get", k)...)
	}
	c.write(b)
	got := make(chan any, 1)
	go func() {
		v, err := c.tryRead()
		if err != nil {
			v = err
		}
		got <- v
	}()
	select {
	case v := <-got:
		expect(t, v, int64(1), "first reply")
	case <-time.After(8 * time.Second):
		close(release)
		t.Fatal("no reply within 8s while the pipeline's later rounds were held: replies wait for the whole pipeline")
	}
	close(release)
	expect(t, c.read(), "1")
	for i := 2; i <= 100; i++ {
		expect(t, c.read(), int64(i), "INCR ", i)
		expect(t, c.read(), strconv.Itoa(i), "GET ", i)
	}
}

// testReadsRideFullBatches: in a pipeline that mixes reads and writes,
// a read that finds the write batch full opens the next batch instead of
// waiting for a ReadIndex round of its own. 4,000 (GET, INCR, APPEND)
// triples fill at least three batches of 4,096 ops; only the first GET,
// before any write, reads outside the log. Before, every batch boundary
// that fell on a GET cost one more round (with batches of 1,024 ops,
// 1,000 triples took 3 reads outside the log).
func (e *env) testReadsRideFullBatches(t *testing.T) {
	h := &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	var reads, writes atomic.Int64
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		writes.Add(1)
		return h.Backend.WriteBatch(ctx, ops)
	})
	h.setRead(func(ctx context.Context, keys [][]byte, f bool) ([]shardkv.ValueEntry, error) {
		reads.Add(1)
		return h.Backend.ReadKeys(ctx, keys, f, nil)
	})
	_, addr := extraServer(t, resp.Config{}, h)
	tag := e.keyIn(gA, "ride:") // a key's slot is its tag's
	ctr, log := "{"+tag+"}ctr", "{"+tag+"}log"
	c := dial(t, addr)
	defer c.c.Close()
	const n = 4000
	var b []byte
	for range n {
		b = append(b, encode("get", ctr)...)
		b = append(b, encode("incr", ctr)...)
		b = append(b, encode("append", log, "x")...)
	}
	c.write(b)
	for i := range n {
		if i == 0 {
			expect(t, c.read(), nil, "GET 0")
		} else {
			expect(t, c.read(), strconv.Itoa(i), "GET ", i)
		}
		expect(t, c.read(), int64(i+1), "INCR ", i)
		expect(t, c.read(), int64(i+1), "APPEND ", i)
	}
	if r, w := reads.Load(), writes.Load(); r != 1 || w < 3 {
		t.Errorf("%d triples took %d read rounds and %d write batches; want 1 read round (the first GET) and at least 3 batches", n, r, w)
	}
}

// testDeadline: a pipeline's commands not started when their deadline is
// near are refused with TRYAGAIN and never executed; the one that was
// started is answered with its result.
func (e *env) testDeadline(t *testing.T) {
	h := &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	h.setWrite(func(_ context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		// A slow round that does apply.
		time.Sleep(600 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), slow)
		defer cancel()
		return h.Backend.WriteBatch(ctx, ops)
	})
	_, addr := extraServer(t, resp.Config{PipelineTimeout: 400 * time.Millisecond}, h)
	k, k2 := e.keyIn(gA, "dl:"), e.keyIn(gA, "dl2:")
	c := dial(t, addr)
	defer c.c.Close()
	b := encode("incr", k)
	for range 10 {
		b = append(b, encode("incr", k2)...)
	}
	c.write(b)
	expect(t, c.read(), int64(1), "the first INCR (started in time)")
	for i := range 10 {
		r, ok := c.read().(rerr)
		if !ok || !strings.HasPrefix(string(r), "TRYAGAIN not executed") {
			t.Errorf("late INCR %d: %v, want TRYAGAIN not executed", i, r)
		}
	}
	if n := h.writes.Load(); n != 1 {
		t.Errorf("%d WriteBatch calls, want 1 (late commands are never proposed)", n)
	}
	h.setWrite(nil)
	expect(t, e.do("get", k2), nil, "no late INCR ran")
	expect(t, c.do("incr", k2), int64(1), "a new pipeline runs")
}

// testFirstRefused: when the first command of a pipeline is refused with a
// retry error, go-redis resends the whole pipeline; so every later keyed
// command of it is refused too, and the resent pipeline applies each write
// once.
func (e *env) testFirstRefused(t *testing.T) {
	h := &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	var refuse atomic.Bool
	refuse.Store(true)
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		if refuse.Swap(false) {
			return nil, &shardkvpb.Refusal{Reason: shardkvpb.ReasonNotReady, Msg: "shard 3 is arriving"}
		}
		return h.Backend.WriteBatch(ctx, ops)
	})
	_, addr := extraServer(t, resp.Config{}, h)
	tag := "{" + e.keyIn(gA, "fr:") + "}"
	c := dial(t, addr)
	defer c.c.Close()
	c.write(append(append(append(encode("incr", tag+"a"), encode("incr", tag+"b")...), encode("get", tag+"b")...), encode("ping")...))
	for i, want := range []any{rerr("TRYAGAIN shard 3 is arriving"), rerr(errFirstRefused), rerr(errFirstRefused), status("PONG")} {
		expect(t, c.read(), want, "reply ", i)
	}
	expect(t, e.do("get", tag+"b"), nil, "the refused INCR did not run")
	// The next pipeline runs.
	c.write(append(encode("incr", tag+"a"), encode("incr", tag+"b")...))
	expect(t, c.read(), int64(1))
	expect(t, c.read(), int64(1))

	// go-redis clients, plain and cluster, resend the whole pipeline: each
	// INCR applies once.
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: slow})
	defer rdb.Close()
	cc := e.cluster(&redis.ClusterOptions{Addrs: []string{addr},
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		}})
	a, b := int64(1), int64(1)
	for _, client := range []redis.Cmdable{rdb, cc} {
		client.Ping(ctx)
		refuse.Store(true)
		cmds, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Incr(ctx, tag+"a")
			p.Incr(ctx, tag+"b")
			p.Incr(ctx, tag+"b")
			return nil
		})
		if err != nil {
			t.Fatalf("%T pipeline: %v", client, err)
		}
		for i, want := range []int64{a + 1, b + 1, b + 2} {
			expect(t, cmds[i].(*redis.IntCmd).Val(), want, fmt.Sprintf("%T INCR %d", client, i))
		}
		if refuse.Load() {
			t.Errorf("%T: the refusal was not given", client)
		}
		a, b = a+1, b+2
	}
}

const errFirstRefused = "TRYAGAIN not executed: the first command of this pipeline was refused; resend the pipeline"

// TestMGetOfOneLargeKeyRepeated: a read's reply is bounded (MaxReplyBytes):
// MGET of one 4 MiB key 100 times is refused with a clear error instead of
// building a 400 MiB reply, the connection and the server go on, and a
// smaller MGET of the same key is answered.
func TestMGetOfOneLargeKeyRepeated(t *testing.T) {
	w, addr := defaultWorld(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: slow})
	defer rdb.Close()
	ctx := context.Background()
	big := strings.Repeat("x", 4<<20)
	// Written with the Go client, whose sessions make a retry safe: a
	// 4 MiB SET under -race on a loaded machine (CI runs packages in
	// parallel) can outlast the front end's 2 s write timeout and be
	// answered "outcome unknown", which is not what this test is about.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := w.Client().Put(wctx, "{big}k", big); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "{big}k"
	}
	_, err := rdb.MGet(ctx, keys...).Result()
	if err == nil || !strings.Contains(err.Error(), "over the limit of") {
		t.Fatalf("MGET of 100 x 4 MiB: %v, want the reply-size error", err)
	}
	vals, err := rdb.MGet(ctx, keys[:10]...).Result()
	if err != nil || len(vals) != 10 || vals[9] != big {
		t.Fatalf("MGET of 10 x 4 MiB after the refusal: %d values, %v", len(vals), err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after: %v", err)
	}
}
