package raftgroup_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
)

// The linearizability test drives a five-replica group with concurrent
// clients while a nemesis partitions the network, isolates the leader, makes
// the network lossy and crashes replicas (the leader included), then checks
// the recorded history with porcupine against a sequential key-value model.

const (
	linReplicas   = 5
	linClients    = 6
	linRunFor     = 12 * time.Second
	linOpTimeout  = time.Second // one attempt's budget (propose or read)
	linOpDeadline = 2 * time.Second
	linCheckLimit = 20 * time.Second // porcupine time budget
	linMinOK      = 100              // successful (acknowledged) operations
	linMinWrites  = 30               // of which writes
	linMinReads   = 30               // of which reads
	linVizEnv     = "LINEARIZABILITY_VIZ"
)

var linKeys = []string{"a", "b", "c", "d"}

type kvOpKind uint8

const (
	kvGet kvOpKind = iota
	kvPut
	kvAppend
)

func (k kvOpKind) String() string {
	switch k {
	case kvGet:
		return "get"
	case kvPut:
		return "put"
	default:
		return "append"
	}
}

type kvInput struct {
	Op    kvOpKind
	Key   string
	Value string // put / append argument
}

// kvOutput is what an operation returned. Value is the key's value for a
// get and the previous value for a put or append (rgtest.KV returns it).
// Unknown marks a write whose outcome is unknown: it may or may not have
// taken effect, and its output is meaningless.
type kvOutput struct {
	Value   string
	Unknown bool
}

// kvModel is a per-key register with put and append; its state is one key's
// value (the history is partitioned by key).
func kvModel() porcupine.Model {
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range history {
				k := op.Input.(kvInput).Key
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(order))
			for _, k := range order {
				out = append(out, byKey[k])
			}
			return out
		},
		PartitionEvent: func(history []porcupine.Event) [][]porcupine.Event {
			byKey := map[string][]porcupine.Event{}
			keyOf := map[int]string{} // event id -> key, from the call event
			var order []string
			for _, ev := range history {
				var k string
				if ev.Kind == porcupine.CallEvent {
					k = ev.Value.(kvInput).Key
					keyOf[ev.Id] = k
				} else {
					k = keyOf[ev.Id]
				}
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], ev)
			}
			out := make([][]porcupine.Event, 0, len(order))
			for _, k := range order {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() any { return "" },
		Step: func(state, input, output any) (bool, any) {
			st := state.(string)
			in := input.(kvInput)
			out := output.(kvOutput)
			switch in.Op {
			case kvGet:
				return !out.Unknown && out.Value == st, st
			case kvPut:
				return out.Unknown || out.Value == st, in.Value
			case kvAppend:
				return out.Unknown || out.Value == st, st + in.Value
			}
			return false, st
		},
		Equal: func(a, b any) bool { return a.(string) == b.(string) },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			h.Write([]byte(s.(string)))
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in := input.(kvInput)
			out := output.(kvOutput)
			res := fmt.Sprintf("%q", out.Value)
			if out.Unknown {
				res = "unknown"
			}
			switch in.Op {
			case kvGet:
				return fmt.Sprintf("get(%s) -> %s", in.Key, res)
			default:
				return fmt.Sprintf("%s(%s, %q) -> %s", in.Op, in.Key, in.Value, res)
			}
		},
		DescribeState: func(s any) string { return fmt.Sprintf("%q", s.(string)) },
	}
}

// linHistory records operations from many goroutines.
type linHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	notes []porcupine.Annotation

	okReads, okWrites, unknown, notExec, failedReads atomic.Int64
}

func (h *linHistory) now() int64 { return int64(time.Since(h.start)) }

func (h *linHistory) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *linHistory) note(start, end int64, desc string) {
	h.mu.Lock()
	h.notes = append(h.notes, porcupine.Annotation{Tag: "nemesis", Start: start, End: end, Description: desc})
	h.mu.Unlock()
}

// linWrite proposes cmd to whichever replica leads, retrying while the
// command provably did not execute. It reports ok with the result, or
// unknown (the command may have executed), or neither (it did not execute).
func linWrite(c *rgtest.Cluster, cmd []byte, deadline time.Time) (result any, meta string, ok, unknown bool) {
	var lastErr error
	for time.Now().Before(deadline) {
		id := c.Leader()
		r := c.Replica(id)
		if id == 0 || r == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), linOpTimeout)
		v, err := r.Propose(ctx, cmd)
		cancel()
		if err == nil {
			return v, fmt.Sprintf("replica %d", id), true, false
		}
		if !raftgroup.IsNotExecuted(err) {
			return nil, fmt.Sprintf("replica %d: %v", id, err), false, true
		}
		lastErr = err
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Sprint(lastErr), false, false
}

// linRead does ReadIndex then KV.Get on one replica (a follower is fine).
// crashMu is held for writing while the nemesis crashes a replica, so the
// test never reads a badger DB that is being closed under it.
func linRead(c *rgtest.Cluster, crashMu *sync.RWMutex, id uint64, key string) (string, error) {
	r := c.Replica(id)
	kv := c.KV(id)
	if r == nil || kv == nil || c.Replica(id) != r {
		return "", fmt.Errorf("replica %d is down or restarting", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), linOpTimeout)
	defer cancel()
	if err := r.ReadIndex(ctx); err != nil {
		return "", err
	}
	crashMu.RLock()
	defer crashMu.RUnlock()
	if c.Replica(id) != r {
		return "", fmt.Errorf("replica %d crashed during the read", id)
	}
	return kv.Get(key)
}

func linClient(c *rgtest.Cluster, crashMu *sync.RWMutex, h *linHistory, client int, stop <-chan struct{}, errs chan<- error) {
	rng := rand.New(rand.NewPCG(uint64(client), uint64(time.Now().UnixNano())))
	ids := c.IDs()
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		key := linKeys[rng.IntN(len(linKeys))]
		in := kvInput{Key: key}
		switch p := rng.IntN(10); {
		case p < 4:
			in.Op = kvGet
		case p < 6:
			in.Op = kvPut
			in.Value = fmt.Sprintf("%d.%d", client, seq)
		default:
			in.Op = kvAppend
			in.Value = fmt.Sprintf("%d.%d;", client, seq)
		}
		call := h.now()
		if in.Op == kvGet {
			id := ids[rng.IntN(len(ids))]
			v, err := linRead(c, crashMu, id, key)
			ret := h.now()
			if err != nil {
				h.failedReads.Add(1) // a failed read has no effect: drop it
				continue
			}
			h.okReads.Add(1)
			h.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Value: v}, Return: ret,
				Metadata: fmt.Sprintf("replica %d", id)})
			continue
		}
		var cmd []byte
		if in.Op == kvPut {
			cmd = rgtest.EncodePut(key, in.Value)
		} else {
			cmd = rgtest.EncodeAppend(key, in.Value)
		}
		v, meta, ok, unknown := linWrite(c, cmd, time.Now().Add(linOpDeadline))
		ret := h.now()
		switch {
		case ok:
			s, isStr := v.(string)
			if !isStr {
				errs <- fmt.Errorf("client %d: %s(%s) returned %T %v, want the previous value", client, in.Op, key, v, v)
				return
			}
			h.okWrites.Add(1)
			h.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Value: s}, Return: ret, Metadata: meta})
		case unknown:
			// It may take effect at any time from now on, even after the
			// test's last operation: its return is infinitely late.
			h.unknown.Add(1)
			h.add(porcupine.Operation{ClientId: client, Input: in, Call: call, Output: kvOutput{Unknown: true}, Return: math.MaxInt64,
				Metadata: meta})
		default:
			h.notExec.Add(1) // provably not executed: not part of the history
		}
	}
}

// linNemesis injects faults until the deadline, leaving the network healed
// and every replica running after each one, and counts the leader changes it
// observes.
type linNemesis struct {
	c       *rgtest.Cluster
	crashMu *sync.RWMutex
	h       *linHistory
	rng     *rand.Rand
	ids     []uint64

	lastLeader, lastTerm uint64
	leaderChanges        int
	log                  []string
}

func (n *linNemesis) observe() {
	id := n.c.Leader()
	if id == 0 {
		return
	}
	r := n.c.Replica(id)
	if r == nil {
		return
	}
	term := r.Term()
	if n.lastLeader != 0 && (id != n.lastLeader || term > n.lastTerm) {
		n.leaderChanges++
	}
	if id != n.lastLeader || term > n.lastTerm {
		n.lastLeader, n.lastTerm = id, term
	}
}

// sleep waits d while watching leadership.
func (n *linNemesis) sleep(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n.observe()
		time.Sleep(min(20*time.Millisecond, time.Until(end)))
	}
	n.observe()
}

func (n *linNemesis) leader() uint64 {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if id := n.c.Leader(); id != 0 {
			return id
		}
		n.sleep(20 * time.Millisecond)
	}
	return 0
}

func (n *linNemesis) hold() time.Duration {
	return 700*time.Millisecond + time.Duration(n.rng.Int64N(int64(600*time.Millisecond)))
}

// fault runs one fault: apply, hold, undo; it is annotated in the history.
func (n *linNemesis) fault(desc string, apply func() bool, undo func()) {
	start := n.h.now()
	n.log = append(n.log, desc)
	if !apply() {
		n.log = append(n.log, "  skipped (no leader)")
		return
	}
	n.sleep(n.hold())
	undo()
	n.h.note(start, n.h.now(), desc)
}

func (n *linNemesis) crash(id uint64) {
	n.crashMu.Lock()
	defer n.crashMu.Unlock()
	n.c.Crash(id)
}

func (n *linNemesis) others(id uint64) []uint64 {
	var out []uint64
	for _, o := range n.ids {
		if o != id {
			out = append(out, o)
		}
	}
	return out
}

func (n *linNemesis) faults() map[string]func() {
	c := n.c
	return map[string]func(){
		"partition": func() {
			perm := slices.Clone(n.ids)
			n.rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			minority, majority := perm[:len(perm)/2], perm[len(perm)/2:]
			n.fault(fmt.Sprintf("partition %v | %v", minority, majority),
				func() bool { c.Net.Partition(n.ids, minority, majority); return true }, c.Net.Heal)
		},
		"partition-leader-minority": func() {
			var l uint64
			n.fault("partition with the leader in the minority", func() bool {
				if l = n.leader(); l == 0 {
					return false
				}
				rest := n.others(l)
				n.rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
				k := len(n.ids)/2 - 1
				minority := append([]uint64{l}, rest[:k]...)
				c.Net.Partition(n.ids, minority, rest[k:])
				n.log = append(n.log, fmt.Sprintf("  minority %v majority %v", minority, rest[k:]))
				return true
			}, c.Net.Heal)
		},
		"isolate-leader": func() {
			var l uint64
			n.fault("isolate the leader", func() bool {
				if l = n.leader(); l == 0 {
					return false
				}
				c.Net.Isolate(n.ids, l)
				n.log = append(n.log, fmt.Sprintf("  isolated %d", l))
				return true
			}, c.Net.Heal)
		},
		"unreliable": func() {
			n.fault("unreliable network (drop 10%, dup 10%, delay <30ms)",
				func() bool { c.Net.SetUnreliable(0.1, 0.1, 30*time.Millisecond); return true },
				func() { c.Net.SetUnreliable(0, 0, 0) })
		},
		"crash-leader": func() {
			var l uint64
			n.fault("crash the leader", func() bool {
				if l = n.leader(); l == 0 {
					return false
				}
				n.crash(l)
				n.log = append(n.log, fmt.Sprintf("  crashed %d", l))
				return true
			}, func() { c.Start(l) })
		},
		"crash-followers": func() {
			var down []uint64
			n.fault("crash followers", func() bool {
				l := n.leader()
				rest := n.others(l)
				n.rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
				down = rest[:1+n.rng.IntN(len(n.ids)/2)] // a quorum stays up
				for _, id := range down {
					n.crash(id)
				}
				n.log = append(n.log, fmt.Sprintf("  crashed %v (leader %d)", down, l))
				return true
			}, func() {
				for _, id := range down {
					c.Start(id)
				}
			})
		},
		"crash-leader-lossy": func() {
			var l uint64
			n.fault("crash the leader on a lossy network", func() bool {
				if l = n.leader(); l == 0 {
					return false
				}
				c.Net.SetUnreliable(0.05, 0.05, 20*time.Millisecond)
				n.crash(l)
				n.log = append(n.log, fmt.Sprintf("  crashed %d", l))
				return true
			}, func() {
				c.Start(l)
				c.Net.SetUnreliable(0, 0, 0)
			})
		},
	}
}

// run injects every kind of fault once, in random order, then random ones
// until the deadline.
func (n *linNemesis) run(deadline time.Time) {
	fs := n.faults()
	var names []string
	for name := range fs {
		names = append(names, name)
	}
	slices.Sort(names)
	n.rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for i := 0; ; i++ {
		if i >= len(names) && time.Now().After(deadline) {
			return
		}
		name := names[i%len(names)]
		if i >= len(names) {
			name = names[n.rng.IntN(len(names))]
		}
		fs[name]()
		n.sleep(200*time.Millisecond + time.Duration(n.rng.Int64N(int64(300*time.Millisecond))))
	}
}

func TestLinearizability(t *testing.T) {
	c := rgtest.NewCluster(t, linReplicas, rgtest.Options{Config: func(cfg *raftgroup.Config) {
		// Compact often so restarted and lagging replicas catch up through
		// snapshots too, not only through the log.
		cfg.SnapshotEntries = 200
		cfg.TrailingEntries = 50
	}})
	c.WaitLeader(10 * time.Second)
	ids := c.IDs()
	h := &linHistory{start: time.Now()}
	var crashMu sync.RWMutex
	model := kvModel()

	stop := make(chan struct{})
	errs := make(chan error, linClients)
	var wg sync.WaitGroup
	for i := range linClients {
		wg.Go(func() { linClient(c, &crashMu, h, i, stop, errs) })
	}

	nem := &linNemesis{c: c, crashMu: &crashMu, h: h, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), ids: ids}
	nem.run(time.Now().Add(linRunFor))
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Heal everything. Every replica runs again (the nemesis restarts what it
	// crashes; this is a safety net).
	c.Net.Heal()
	c.Net.SetUnreliable(0, 0, 0)
	for _, id := range ids {
		c.Start(id)
	}
	nem.sleep(0)
	t.Logf("nemesis:\n%s", strings.Join(nem.log, "\n"))

	// A barrier write in the current term commits or discards for good every
	// earlier entry, so no write with an unknown outcome can still change
	// the state after it: all replicas must then agree.
	barrierDeadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		if _, _, ok, _ := linWrite(c, rgtest.EncodePut("_barrier", fmt.Sprint(i)), barrierDeadline); ok {
			break
		}
		if time.Now().After(barrierDeadline) {
			t.Fatalf("no write succeeded within 20s after healing the cluster")
		}
	}
	nem.observe()

	// Read every key on every replica; these reads join the history, so the
	// final state is checked too.
	final := map[uint64]map[string]string{}
	for idx, id := range ids {
		deadline := time.Now().Add(10 * time.Second)
		for {
			vals := map[string]string{}
			call := h.now()
			var err error
			for _, k := range linKeys {
				if vals[k], err = linRead(c, &crashMu, id, k); err != nil {
					break
				}
			}
			ret := h.now()
			if err == nil {
				final[id] = vals
				for _, k := range linKeys {
					h.add(porcupine.Operation{ClientId: linClients + idx, Input: kvInput{Op: kvGet, Key: k}, Call: call,
						Output: kvOutput{Value: vals[k]}, Return: ret, Metadata: fmt.Sprintf("final read on replica %d", id)})
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: no linearizable read within 10s after healing: %v", id, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	var snapsSent, snapsRecv uint64
	for _, id := range ids {
		m := c.Replica(id).Metrics()
		snapsSent += m.SnapshotsSent.Load()
		snapsRecv += m.SnapshotsReceived.Load()
	}
	t.Logf("snapshots since the last restarts: %d sent, %d received", snapsSent, snapsRecv)
	t.Logf("history: %d operations: %d reads ok, %d writes ok, %d writes with unknown outcome, %d writes not executed, %d reads failed; %d leader changes observed",
		len(h.ops), h.okReads.Load(), h.okWrites.Load(), h.unknown.Load(), h.notExec.Load(), h.failedReads.Load(), nem.leaderChanges)

	checkStart := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, linCheckLimit)
	t.Logf("porcupine: %s in %v", res, time.Since(checkStart).Round(time.Millisecond))
	info.AddAnnotations(h.notes)
	viz := ""
	if res != porcupine.Ok || os.Getenv(linVizEnv) != "" {
		viz = linVisualize(t, model, info)
	}
	switch res {
	case porcupine.Illegal:
		t.Fatalf("history is not linearizable; visualisation: %s", viz)
	case porcupine.Unknown:
		t.Fatalf("linearizability check timed out after %v (result unknown, treated as a failure); visualisation: %s", linCheckLimit, viz)
	}

	// The test must have done real work.
	if n := h.okReads.Load() + h.okWrites.Load(); n < linMinOK {
		t.Errorf("only %d operations succeeded, want at least %d", n, linMinOK)
	}
	if n := h.okWrites.Load(); n < linMinWrites {
		t.Errorf("only %d writes succeeded, want at least %d", n, linMinWrites)
	}
	if n := h.okReads.Load(); n < linMinReads {
		t.Errorf("only %d reads succeeded, want at least %d", n, linMinReads)
	}
	if nem.leaderChanges < 1 {
		t.Errorf("no leader change observed")
	}
	// All replicas converged.
	want := final[ids[0]]
	for _, id := range ids[1:] {
		for _, k := range linKeys {
			if final[id][k] != want[k] {
				t.Errorf("replicas diverged on key %q: replica %d has %q, replica %d has %q", k, ids[0], want[k], id, final[id][k])
			}
		}
	}
}

// linVisualize writes porcupine's HTML visualisation to a file that outlives
// the test and returns its path.
func linVisualize(t *testing.T, model porcupine.Model, info porcupine.LinearizationInfo) string {
	f, err := os.CreateTemp("", "linearizability-*.html")
	if err != nil {
		t.Logf("create visualisation file: %v", err)
		return "(none: " + err.Error() + ")"
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		t.Logf("write visualisation: %v", err)
		return f.Name() + " (incomplete: " + err.Error() + ")"
	}
	t.Logf("visualisation written to %s", f.Name())
	return f.Name()
}
