package resp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestRESPOutputMemory: what a node's Redis clients can make it hold of
// their output is bounded: values per read round and per write batch
// (MaxReplyBytes), and all connections together (OutputBudgetBytes), with
// a clear error past the budget and nothing held once clients leave.
func TestRESPOutputMemory(t *testing.T) {
	e := newInputEnv(t)
	// Values of 900 KB in one slot, and one more in the log of each test.
	val := func(i int) string { return strings.Repeat(string(rune('a'+i)), 900<<10) }
	c := dial(t, e.w.leaderAddr(gA))
	defer c.c.Close()
	for i := range 8 {
		expect(t, c.do("set", fmt.Sprintf("{o}k%d", i), val(i)), status("OK"))
	}
	t.Run("read rounds", func(t *testing.T) { testReadRounds(t, e, val) })
	t.Run("write batch results", func(t *testing.T) { testBatchResults(t, e, val) })
	t.Run("budget", func(t *testing.T) { testOutputBudget(t, e, val) })
}

// A pipeline of GETs of 8 distinct 900 KB keys (7 MB) is read in rounds of
// at most MaxReplyBytes (2 MiB) of values, each round's replies sent
// before the next is read. Before, one ReadKeys read all 7 MB, and a round
// of 1024 keys of 8 MiB would have held 8 GiB.
func testReadRounds(t *testing.T, e *inputEnv, val func(int) string) {
	const maxReply = 2 << 20
	k := &keptBackend{Backend: e.g}
	s, addr := extraServer(t, resp.Config{MaxReplyBytes: maxReply}, k)
	c := dial(t, addr)
	defer c.c.Close()
	var frames []byte
	for i := range 8 {
		frames = append(frames, encode("get", fmt.Sprintf("{o}k%d", i))...)
	}
	c.write(frames)
	for i := range 8 {
		expectBig(t, c.read(), val(i), fmt.Sprintf("GET {o}k%d", i))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.most > maxReply {
		t.Errorf("one read round kept %d bytes of values, over MaxReplyBytes %d", k.most, maxReply)
	}
	if k.calls < 4 {
		t.Errorf("8 GETs of 900 KB took %d read rounds, want at least 4 under a 2 MiB bound", k.calls)
	}
	waitOutput(t, s, 0)
}

// keptBackend records the values each read returned to the server.
type keptBackend struct {
	resp.Backend
	mu    sync.Mutex
	most  int // the largest total of one ReadKeys call
	calls int
}

func (k *keptBackend) ReadKeys(ctx context.Context, keys [][]byte, f bool, reserve func(int) bool) ([]shardkv.ValueEntry, error) {
	vals, err := k.Backend.ReadKeys(ctx, keys, f, reserve)
	n := 0
	for _, v := range vals {
		n += len(v.Value)
	}
	k.mu.Lock()
	k.most = max(k.most, n)
	k.calls++
	k.mu.Unlock()
	return vals, err
}

// A pipeline of (SET, GET of a 900 KB key) pairs: a GET after a write is
// made in the write batch, but a batch returns at most MaxReplyBytes of
// values (here 4 MiB), so the pairs take several batches. Before, all 30
// pairs were one batch returning 27 MB, and a thousand GETs of an 8 MiB
// key made every replica hold 8 GiB (the leader's RSS grew by 2.3 GB for
// 200 of them).
func testBatchResults(t *testing.T, e *inputEnv, val func(int) string) {
	const maxReply = 4 << 20
	h := &hookBackend{Backend: e.g}
	var mu sync.Mutex
	most := 0
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		outs, err := e.g.WriteBatch(ctx, ops)
		n := 0
		for _, o := range outs {
			n += len(o.Result.GetPrev())
		}
		mu.Lock()
		most = max(most, n)
		mu.Unlock()
		return outs, err
	})
	s, addr := extraServer(t, resp.Config{MaxReplyBytes: maxReply}, h)
	c := dial(t, addr)
	defer c.c.Close()
	// The connection learns the size first, as a client that read the key
	// before would have: unknown sizes count as the value limit (8 MiB),
	// more than one batch may return here.
	expectBig(t, c.do("get", "{o}k1"), val(1), "GET")
	var frames []byte
	for i := range 30 {
		frames = append(frames, encode("set", "{o}n", fmt.Sprint(i))...)
		frames = append(frames, encode("get", "{o}k1")...)
	}
	c.write(frames)
	for i := range 30 {
		expect(t, c.read(), status("OK"), "SET", i)
		expectBig(t, c.read(), val(1), fmt.Sprintf("GET %d", i))
	}
	mu.Lock()
	defer mu.Unlock()
	if most > maxReply {
		t.Errorf("one write batch returned %d bytes of values, over MaxReplyBytes %d", most, maxReply)
	}
	if most < 900<<10 {
		t.Errorf("no GET was made in a write batch (largest batch result %d bytes)", most)
	}
	waitOutput(t, s, 0)
}

// With every connection's output counted against one budget (4 MiB), a
// client that stops reading its replies fills it, and then a read that
// needs more gets the budget error rather than the node holding more;
// once that client leaves, everything it held is given back and the read
// is served.
func testOutputBudget(t *testing.T, e *inputEnv, val func(int) string) {
	const budget = 4 << 20
	s, addr := extraServer(t, resp.Config{OutputBudgetBytes: budget, MaxOutputBytes: 1 << 20, MaxReplyBytes: 2 << 20}, e.g)
	var hogs []*rconn
	defer func() {
		for _, h := range hogs {
			h.c.Close()
		}
	}()
	// Clients that send GETs of 900 KB values and read nothing: once the
	// socket buffers are full, their replies wait in the server.
	var frames []byte
	for i := range 64 {
		frames = append(frames, encode("get", fmt.Sprintf("{o}k%d", i%8))...)
	}
	deadline := time.Now().Add(slow)
	for s.Stats().OutputBytes < budget {
		if time.Now().After(deadline) {
			t.Fatalf("output held %d bytes with %d clients not reading; want the budget %d reached", s.Stats().OutputBytes, len(hogs), budget)
		}
		if len(hogs) < 8 {
			h := dial(t, addr)
			hogs = append(hogs, h)
			go h.c.Write(frames)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c := dial(t, addr)
	defer c.c.Close()
	want := rerr(fmt.Sprintf("ERR the server's output buffers are full (limit %d bytes); try again later", budget))
	if r := c.do("mget", "{o}k0", "{o}k1"); r != want {
		t.Fatalf("MGET while the budget is spent: %.200v, want %q", r, want)
	}
	expect(t, c.do("ping"), status("PONG"), "PING while the budget is spent")
	if st := s.Stats(); st.OutputRefusals == 0 {
		t.Errorf("output refusals %d, want at least 1", st.OutputRefusals)
	}
	// Past the budget by at most one reply per connection (a connection
	// with no reply waiting may always add one).
	if peak, most := s.Stats().OutputPeakBytes, int64(budget+(len(hogs)+1)*(2<<20+64)); peak > most {
		t.Errorf("output peaked at %d bytes, want at most %d", peak, most)
	}
	for _, h := range hogs {
		h.c.Close()
	}
	hogs = nil
	waitOutput(t, s, 0)
	r := c.do("mget", "{o}k0", "{o}k1")
	if vals, ok := r.([]any); !ok || len(vals) != 2 || vals[1] != val(1) {
		t.Fatalf("MGET after the clients left: %.100v", r)
	}
}

// waitOutput waits until the server's output holds want bytes.
func waitOutput(t *testing.T, s *resp.Server, want int64) {
	t.Helper()
	deadline := time.Now().Add(slow)
	for s.Stats().OutputBytes != want {
		if time.Now().After(deadline) {
			t.Fatalf("output holds %d bytes, want %d", s.Stats().OutputBytes, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
