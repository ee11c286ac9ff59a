package shardkv_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestLinearizabilityReconfig: 10 clients (one client.Client each) do
// random Get/Put/Append on a few keys through the Go client while client and
// group-to-group RPCs lose 10% of requests and 10% of replies and are delayed
// by up to 30 ms, and groups join and leave; porcupine then checks the
// history against a per-key register model.

const (
	slinClients    = 10
	slinRunFor     = 15 * time.Second
	slinOpTimeout  = 4 * time.Second // one client call, retries included
	slinCheckLimit = 60 * time.Second
	slinMinOK      = 200 // successful operations
	slinMinReads   = 50
	slinMinWrites  = 50
	slinMinConfigs = 4 // config changes during the run
)

var slinKeys = []string{"lin-a", "lin-b", "lin-c", "lin-d", "lin-e", "lin-f"}

type slinOp uint8

const (
	slinGet slinOp = iota
	slinPut
	slinAppend
)

func (o slinOp) String() string { return [...]string{"get", "put", "append"}[o] }

type slinInput struct {
	Op    slinOp
	Key   string
	Value string
}

// slinOutput: a get's value; writes return nothing. Unknown marks a write
// whose call failed: it may or may not have taken effect.
type slinOutput struct {
	Value   string
	Unknown bool
}

func slinModel() porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			for _, op := range h {
				k := op.Input.(slinInput).Key
				by[k] = append(by[k], op)
			}
			var out [][]porcupine.Operation
			for _, k := range slinKeys {
				if len(by[k]) > 0 {
					out = append(out, by[k])
				}
			}
			return out
		},
		Init: func() any { return "" },
		Step: func(state, input, output any) (bool, any) {
			st, in, out := state.(string), input.(slinInput), output.(slinOutput)
			switch in.Op {
			case slinGet:
				return !out.Unknown && out.Value == st, st
			case slinPut:
				return true, in.Value
			default:
				return true, st + in.Value
			}
		},
		Equal: func(a, b any) bool { return a.(string) == b.(string) },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			h.Write([]byte(s.(string)))
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(slinInput), output.(slinOutput)
			res := "ok"
			if out.Unknown {
				res = "unknown"
			}
			if in.Op == slinGet {
				return fmt.Sprintf("get(%s) -> %q", in.Key, out.Value)
			}
			return fmt.Sprintf("%s(%s, %q) -> %s", in.Op, in.Key, in.Value, res)
		},
		DescribeState: func(s any) string { return fmt.Sprintf("%q", s.(string)) },
	}
}

type slinHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	notes []porcupine.Annotation

	okReads, okWrites, unknown, failedReads atomic.Int64
}

func (h *slinHistory) now() int64 { return int64(time.Since(h.start)) }

func (h *slinHistory) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *slinHistory) note(start int64, desc string) {
	h.mu.Lock()
	h.notes = append(h.notes, porcupine.Annotation{Tag: "config", Start: start, End: h.now(), Description: desc})
	h.mu.Unlock()
}

func slinClient(c *client.Client, h *slinHistory, id int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		in := slinInput{Key: slinKeys[rng.IntN(len(slinKeys))]}
		switch p := rng.IntN(10); {
		case p < 4:
			in.Op = slinGet
		case p < 6:
			in.Op, in.Value = slinPut, fmt.Sprintf("%d.%d", id, seq)
		default:
			in.Op, in.Value = slinAppend, fmt.Sprintf("%d.%d;", id, seq)
		}
		ctx, cancel := context.WithTimeout(context.Background(), slinOpTimeout)
		call := h.now()
		var out slinOutput
		var err error
		switch in.Op {
		case slinGet:
			out.Value, _, err = c.Get(ctx, in.Key)
		case slinPut:
			err = c.Put(ctx, in.Key, in.Value)
		default:
			err = c.Append(ctx, in.Key, in.Value)
		}
		ret := h.now()
		cancel()
		switch {
		case err == nil && in.Op == slinGet:
			h.okReads.Add(1)
		case err == nil:
			h.okWrites.Add(1)
		case in.Op == slinGet:
			h.failedReads.Add(1) // a failed read changes nothing: leave it out
			continue
		default:
			// The write may take effect at any time from its call on, even
			// after everything else: its return is infinitely late.
			h.unknown.Add(1)
			out, ret = slinOutput{Unknown: true}, math.MaxInt64
		}
		h.add(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret,
			Metadata: fmt.Sprintf("err: %v", err)})
	}
}

func TestLinearizabilityReconfig(t *testing.T) {
	const nshards = 16
	w := kvtest.New(t, kvtest.Options{Shards: nshards})
	gids := []uint64{100, 101, 102}
	for _, g := range gids {
		w.StartGroup(g)
	}
	w.Join(100, 101)
	first := w.WaitSettled(30 * time.Second)
	for _, k := range slinKeys {
		t.Logf("key %s: shard %d", k, routing.ShardOf([]byte(k), nshards))
	}

	h := &slinHistory{start: time.Now()}
	w.Faults.Set(0.1, 0.1, 30*time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range slinClients {
		c := w.Client()
		wg.Go(func() { slinClient(c, h, i, stop) })
	}

	// Reconfigure in the test goroutine (World's Join and Leave may
	// t.Fatal): one group joins or leaves every ~1.5 s, at least one group
	// stays.
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	in := map[uint64]bool{100: true, 101: true}
	var changes []string
	deadline := time.Now().Add(slinRunFor)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(time.Second))))
		gid := gids[rng.IntN(len(gids))]
		start := h.now()
		if in[gid] && len(in) > 1 {
			conf := w.Leave(gid)
			delete(in, gid)
			changes = append(changes, fmt.Sprintf("leave %d -> config %d %v", gid, conf.Num, conf.Shards))
		} else if !in[gid] {
			conf := w.Join(gid)
			in[gid] = true
			changes = append(changes, fmt.Sprintf("join %d -> config %d %v", gid, conf.Num, conf.Shards))
		} else {
			continue
		}
		h.note(start, changes[len(changes)-1])
	}
	close(stop)
	wg.Wait()
	t.Logf("reconfigurations:\n%s", strings.Join(changes, "\n"))

	// Heal, let every move finish, then read every key once more: the
	// final reads join the history.
	w.Faults.Set(0, 0, 0)
	last := w.WaitSettled(60 * time.Second)
	fc := w.Client()
	for _, k := range slinKeys {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		call := h.now()
		v, _, err := fc.Get(ctx, k)
		ret := h.now()
		cancel()
		if err != nil {
			t.Fatalf("final read of %s after healing: %v", k, err)
		}
		h.add(porcupine.Operation{ClientId: slinClients, Input: slinInput{Op: slinGet, Key: k}, Call: call,
			Output: slinOutput{Value: v}, Return: ret, Metadata: "final read"})
	}
	t.Logf("history: %d operations: %d reads ok, %d writes ok, %d writes with unknown outcome, %d reads failed; configs %d -> %d",
		len(h.ops), h.okReads.Load(), h.okWrites.Load(), h.unknown.Load(), h.failedReads.Load(), first.Num, last.Num)

	model := slinModel()
	checkStart := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, slinCheckLimit)
	t.Logf("porcupine: %s in %v", res, time.Since(checkStart).Round(time.Millisecond))
	if res != porcupine.Ok || os.Getenv("LINEARIZABILITY_VIZ") != "" {
		info.AddAnnotations(h.notes)
		viz := slinVisualize(t, model, info)
		switch res {
		case porcupine.Illegal:
			t.Fatalf("history is not linearizable; visualisation: %s", viz)
		case porcupine.Unknown:
			t.Fatalf("linearizability check timed out after %v (result unknown, treated as a failure); visualisation: %s", slinCheckLimit, viz)
		}
	}

	if n := h.okReads.Load() + h.okWrites.Load(); n < slinMinOK {
		t.Errorf("only %d operations succeeded, want at least %d", n, slinMinOK)
	}
	if n := h.okReads.Load(); n < slinMinReads {
		t.Errorf("only %d reads succeeded, want at least %d", n, slinMinReads)
	}
	if n := h.okWrites.Load(); n < slinMinWrites {
		t.Errorf("only %d writes succeeded, want at least %d", n, slinMinWrites)
	}
	if len(changes) < slinMinConfigs {
		t.Errorf("only %d reconfigurations during the run, want at least %d", len(changes), slinMinConfigs)
	}
}

func slinVisualize(t *testing.T, model porcupine.Model, info porcupine.LinearizationInfo) string {
	f, err := os.CreateTemp("", "shardkv-linearizability-*.html")
	if err != nil {
		return "(none: " + err.Error() + ")"
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		return f.Name() + " (incomplete: " + err.Error() + ")"
	}
	t.Logf("visualisation written to %s", f.Name())
	return f.Name()
}
