package kvcheck_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/kvcheck"
)

// get, put and appendOp build an operation from call to ret (small
// integers are fine: only their order matters).
func get(c int, key, out string, call, ret int64) kvcheck.Op {
	return kvcheck.Op{Client: c, Kind: kvcheck.Get, Key: key, Output: out, Call: call, Return: ret}
}

func put(c int, key, v string, call, ret int64) kvcheck.Op {
	return kvcheck.Op{Client: c, Kind: kvcheck.Put, Key: key, Value: v, Call: call, Return: ret}
}

func appendOp(c int, key, v string, call, ret int64) kvcheck.Op {
	return kvcheck.Op{Client: c, Kind: kvcheck.Append, Key: key, Value: v, Call: call, Return: ret}
}

func unknown(o kvcheck.Op) kvcheck.Op {
	o.Unknown, o.Error = true, "context deadline exceeded"
	return o
}

func check(t *testing.T, ops []kvcheck.Op) kvcheck.Result {
	t.Helper()
	res, err := kvcheck.Check(ops, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLinearizable(t *testing.T) {
	ops := []kvcheck.Op{
		get(0, "a", "", 0, 5), // before anything: the initial ""
		put(0, "a", "x", 10, 20),
		get(1, "a", "", 12, 15),  // concurrent with the put: old value is fine
		get(2, "a", "x", 14, 30), // concurrent with the put: new value is fine
		appendOp(1, "a", "y;", 21, 25),
		get(1, "a", "xy;", 26, 27),
		put(0, "b", "z", 0, 1), // another key is independent
		get(2, "b", "z", 31, 32),
		appendOp(0, "c", "1;", 0, 10),
		appendOp(1, "c", "2;", 0, 10),
		get(2, "c", "2;1;", 11, 12),
	}
	res := check(t, ops)
	if !res.Linearizable || res.CheckResult != kvcheck.ResultOK {
		t.Fatalf("want linearizable: %s", res)
	}
	if res.Ops != len(ops) || res.Keys != 3 || res.OK != len(ops) || res.OKGets != 6 || res.OKWrites != 5 || res.Unknown != 0 {
		t.Fatalf("counts: %+v", res)
	}
}

func TestStaleRead(t *testing.T) {
	ops := []kvcheck.Op{
		put(0, "a", "x", 0, 10),
		put(0, "a", "y", 11, 20),
		get(1, "a", "x", 21, 22), // "y" was written before this get started
		put(0, "b", "ok", 0, 1),
		get(1, "b", "ok", 2, 3),
	}
	res := check(t, ops)
	if res.Linearizable || res.CheckResult != kvcheck.ResultIllegal {
		t.Fatalf("want illegal: %s", res)
	}
	if !slices.Equal(res.IllegalKeys, []string{"a"}) {
		t.Fatalf("illegal keys %q, want [a]", res.IllegalKeys)
	}
	if !strings.Contains(res.String(), "not linearizable: a") {
		t.Fatalf("summary: %s", res)
	}
	path := filepath.Join(t.TempDir(), "viz.html")
	if err := res.VisualizePath(path, kvcheck.Note{Tag: "cluster", Start: 5, End: 12, Description: "pod deleted"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "pod deleted") {
		t.Fatalf("visualization: %v, %d bytes", err, len(b))
	}
}

func TestUnknownWrite(t *testing.T) {
	// An unknown put that shows up much later (after its failed call
	// returned, even after other writes) is fine.
	ops := []kvcheck.Op{
		unknown(put(0, "a", "x", 0, 10)),
		put(1, "a", "y", 20, 30),
		get(1, "a", "y", 31, 32),
		get(2, "a", "x", 40, 41),
		unknown(appendOp(0, "a", "z;", 50, 60)), // never took effect
		get(2, "a", "x", 70, 71),
		unknown(get(3, "a", "nonsense", 0, 100)), // a failed get is ignored
	}
	res := check(t, ops)
	if !res.Linearizable {
		t.Fatalf("want linearizable: %s", res)
	}
	if res.Unknown != 2 || res.FailedGets != 1 || res.Ops != 6 || res.OK != 4 {
		t.Fatalf("counts: %+v", res)
	}
	// But it cannot take effect before its call.
	ops = []kvcheck.Op{
		get(1, "a", "x", 0, 5),
		unknown(put(0, "a", "x", 10, 20)),
	}
	res = check(t, ops)
	if res.Linearizable || res.CheckResult != kvcheck.ResultIllegal {
		t.Fatalf("a write seen before its call: %s", res)
	}
	// The visualization copes with the infinitely late return.
	if err := res.VisualizePath(filepath.Join(t.TempDir(), "viz.html")); err != nil {
		t.Fatal(err)
	}
}

func TestNeverWritten(t *testing.T) {
	ops := []kvcheck.Op{
		put(0, "a", "x", 0, 10),
		unknown(put(0, "a", "y", 11, 20)),
		get(1, "a", "w", 0, 30),
	}
	if res := check(t, ops); res.Linearizable || res.CheckResult != kvcheck.ResultIllegal {
		t.Fatalf("want illegal: %s", res)
	}
	// A lost append: the read misses an acknowledged append.
	ops = []kvcheck.Op{
		appendOp(0, "a", "1;", 0, 10),
		appendOp(0, "a", "2;", 11, 20),
		get(1, "a", "2;", 21, 30),
	}
	if res := check(t, ops); res.Linearizable {
		t.Fatalf("want illegal: %s", res)
	}
}

func TestMalformed(t *testing.T) {
	if _, err := kvcheck.Check([]kvcheck.Op{{Kind: "del", Key: "a"}}, 0); err == nil {
		t.Fatal("unknown kind accepted")
	}
	if _, err := kvcheck.Check([]kvcheck.Op{put(0, "a", "x", 10, 5)}, 0); err == nil {
		t.Fatal("return before call accepted")
	}
	res, err := kvcheck.Check(nil, 0)
	if err != nil || !res.Linearizable {
		t.Fatalf("empty history: %v %s", err, res)
	}
}

func TestRecorder(t *testing.T) {
	rec := kvcheck.NewRecorder()
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := range 50 {
				v := string(rune('a'+c)) + string(rune('0'+i%10))
				p := rec.Start(c, kvcheck.Put, "k", v)
				if i%10 == 9 {
					p.Fail(errors.New("timeout"))
				} else {
					p.Ok("")
				}
				rec.Start(c, kvcheck.Get, "k", "").Ok("")
			}
		})
	}
	wg.Wait()
	h := rec.History()
	st := h.Stats
	if st.Ops != 400 || st.OK != 380 || st.Unknown != 20 || st.OKGets != 200 || st.OKWrites != 180 || st.InFlight != 0 || st.LastError != "timeout" {
		t.Fatalf("stats: %+v", st)
	}
	if len(h.Ops) != 400 || h.Stopped.Before(h.Started) {
		t.Fatalf("history: %d ops, %v..%v", len(h.Ops), h.Started, h.Stopped)
	}
	for _, o := range h.Ops {
		if o.Return < o.Call || o.Call < h.Started.UnixNano() || o.Return > h.Stopped.UnixNano() {
			t.Fatalf("bad times: %+v (started %d)", o, h.Started.UnixNano())
		}
	}
	// JSON round trip: what the workload serves decodes into a History.
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back kvcheck.History
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	bs, hs := back.Stats, h.Stats
	bs.LastErrorAt, hs.LastErrorAt = time.Time{}, time.Time{}
	if !slices.Equal(back.Ops, h.Ops) || bs != hs || !back.Stats.LastErrorAt.Equal(h.Stats.LastErrorAt) || !back.Started.Equal(h.Started) {
		t.Fatalf("round trip changed the history")
	}
	// The reads all returned "" while puts happened: not linearizable,
	// but well-formed.
	if _, err := kvcheck.Check(back.Ops, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p := rec.Start(9, kvcheck.Get, "k", "")
	if st := rec.Stats(); st.InFlight != 1 {
		t.Fatalf("in flight: %+v", st)
	}
	p.Fail(nil)
	if st := rec.Stats(); st.InFlight != 0 || st.FailedGets != 1 {
		t.Fatalf("after a failed get: %+v", st)
	}
}

func hop(c int, kind kvcheck.Kind, key, field, v string, call, ret int64) kvcheck.Op {
	o := kvcheck.Op{Client: c, Kind: kind, Key: key, Field: field, Call: call, Return: ret}
	if kind == kvcheck.HGet || kind == kvcheck.HGetAll {
		o.Output = v
	} else {
		o.Value = v
	}
	return o
}

// TestHashModel: the hash model accepts a history whose hgetall sees
// every completed hset and hdel, and rejects one whose hgetall misses a
// field set before it, or sees two concurrent writers' fields in an order
// no sequence gives.
func TestHashModel(t *testing.T) {
	all := func(kv ...string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return kvcheck.EncodeHash(m)
	}
	ok := []kvcheck.Op{
		hop(1, kvcheck.HSet, "h", "a", "1", 0, 10),
		hop(2, kvcheck.HSet, "h", "b", "2", 5, 15),
		hop(1, kvcheck.HGetAll, "h", "", all("a", "1", "b", "2"), 20, 30),
		hop(2, kvcheck.HDel, "h", "a", "", 31, 40),
		hop(1, kvcheck.HGet, "h", "a", "", 41, 50),
		hop(1, kvcheck.HGetAll, "h", "", all("b", "2"), 51, 60),
	}
	if res := check(t, ok); !res.Linearizable {
		t.Fatalf("a linearizable hash history was refused: %v", res)
	}
	stale := slices.Clone(ok)
	stale[2] = hop(1, kvcheck.HGetAll, "h", "", all("b", "2"), 20, 30) // a's hset had returned
	if res := check(t, stale); res.Linearizable || !slices.Equal(res.IllegalKeys, []string{"h"}) {
		t.Fatalf("a read missing a completed hset passed: %v", res)
	}
	// Two readers see a and b appear in opposite orders.
	split := []kvcheck.Op{
		hop(1, kvcheck.HSet, "h", "a", "1", 0, 100),
		hop(2, kvcheck.HSet, "h", "b", "2", 0, 100),
		hop(3, kvcheck.HGetAll, "h", "", all("a", "1"), 10, 20),
		hop(4, kvcheck.HGetAll, "h", "", all("b", "2"), 30, 40),
	}
	if res := check(t, split); res.Linearizable {
		t.Fatalf("reads seeing fields appear in two orders passed: %v", res)
	}
}
