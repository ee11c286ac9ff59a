package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/shardkv/shardkv/pkg/shardkv"
)

// TestStateAges: a shard outside Serving gets an age that grows, starts
// again when its state or config changes, and is forgotten once it serves.
func TestStateAges(t *testing.T) {
	var a stateAges
	t0 := time.Unix(1000, 0)
	pulling := map[int]shardkv.ShardMeta{3: {State: shardkv.Pulling, Config: 5}, 4: {State: shardkv.Serving, Config: 5}}
	got := a.observe(pulling, t0)
	if len(got) != 1 || got[stateKey{3, shardkv.Pulling, 5}] != 0 {
		t.Fatalf("first sight: %v, want shard 3 Pulling at 0s only", got)
	}
	got = a.observe(pulling, t0.Add(90*time.Second))
	if got[stateKey{3, shardkv.Pulling, 5}] != 90*time.Second {
		t.Fatalf("90s later: %v", got)
	}
	acking := map[int]shardkv.ShardMeta{3: {State: shardkv.Acking, Config: 5}}
	got = a.observe(acking, t0.Add(100*time.Second))
	if len(got) != 1 || got[stateKey{3, shardkv.Acking, 5}] != 0 {
		t.Fatalf("new state: %v, want Acking at 0s only", got)
	}
	got = a.observe(map[int]shardkv.ShardMeta{3: {State: shardkv.Serving, Config: 5}}, t0.Add(110*time.Second))
	if len(got) != 0 || len(a.since) != 0 {
		t.Fatalf("serving: %v (remembered %v), want nothing", got, a.since)
	}
}

// startReplica starts an in-process replica with args (plus --data-dir).
func startReplica(t *testing.T, args ...string) *Node {
	t.Helper()
	o, err := ParseServe(append([]string{"--data-dir=" + t.TempDir(), "--log-level=warn"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(context.Background(), o, NewLogger("warn", os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func loopbackAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		defer l.Close()
	}
	return out
}

func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 0 && (m.Gauge != nil || m.Counter != nil) {
				out[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestQuorumAndDiskMetrics: a 3-replica controller group in this process.
// Every replica exports its voters and its data dir's filesystem; the
// leader alone exports the voters it hears from, 3, then 2 once a
// follower stops.
func TestQuorumAndDiskMetrics(t *testing.T) {
	addrs := loopbackAddrs(t, 6)
	peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[0], addrs[1], addrs[2])
	var nodes []*Node
	for i := range 3 {
		n := startReplica(t, "--role=ctrler", fmt.Sprint("--id=", i+1), "--listen="+addrs[i], "--peers="+peers, "--http="+addrs[3+i], "--shards=16")
		nodes = append(nodes, n)
	}
	stopped := make([]bool, 3)
	t.Cleanup(func() {
		for i, n := range nodes {
			if !stopped[i] {
				n.Shutdown()
			}
		}
	})
	leaderOf := func() int {
		for i, n := range nodes {
			if !stopped[i] && n.Replica().IsLeader() {
				return i
			}
		}
		return -1
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var m map[string]float64
	waitFor("a leader hearing 3 voters", func() bool {
		l := leaderOf()
		if l < 0 {
			return false
		}
		m = scrape(t, addrs[3+l])
		return m["shardkv_raft_voters_reachable"] == 3
	})
	l := leaderOf()
	for i := range 3 {
		m := scrape(t, addrs[3+i])
		if m["shardkv_raft_voters"] != 3 {
			t.Errorf("replica %d: shardkv_raft_voters %v, want 3", i+1, m["shardkv_raft_voters"])
		}
		if _, ok := m["shardkv_raft_voters_reachable"]; ok != (i == l) {
			t.Errorf("replica %d (leader %d): shardkv_raft_voters_reachable present %v", i+1, l+1, ok)
		}
		size, avail := m["shardkv_disk_capacity_bytes"], m["shardkv_disk_available_bytes"]
		if size <= 0 || avail <= 0 || avail > size {
			t.Errorf("replica %d: disk capacity %v, available %v", i+1, size, avail)
		}
		if _, ok := m["shardkv_raft_max_tick_gap_seconds"]; !ok {
			t.Errorf("replica %d: no shardkv_raft_max_tick_gap_seconds", i+1)
		}
	}

	// A follower stops: the leader hears 2 of 3 voters (still a quorum).
	f := (l + 1) % 3
	nodes[f].Shutdown()
	stopped[f] = true
	waitFor("the leader to hear 2 voters", func() bool {
		l := leaderOf()
		return l >= 0 && scrape(t, addrs[3+l])["shardkv_raft_voters_reachable"] == 2
	})
}

// TestMetricNames: every family a replica serves is in MetricNames.
func TestMetricNames(t *testing.T) {
	names := MetricNames()
	for _, want := range []string{"shardkv_raft_term", "shardkv_raft_voters_reachable", "shardkv_disk_available_bytes", "shardkv_shard_state_age_seconds", "shardkv_migration_write_pause_seconds"} {
		if !slices.Contains(names, want) {
			t.Errorf("MetricNames lacks %s", want)
		}
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "shardkv_") {
			t.Errorf("%s: not a shardkv_ name", n)
		}
	}
}

// TestRequestLatency: unary calls land in cumulative buckets by method,
// and the collector serves them as shardkv_grpc_request_duration_seconds.
func TestRequestLatency(t *testing.T) {
	e := newErrorCounter()
	e.observe("shardkv.KV/Write", 300*time.Microsecond)
	e.observe("shardkv.KV/Write", 3*time.Millisecond)
	e.observe("shardkv.KV/Write", time.Minute)
	l := e.latencies()["shardkv.KV/Write"]
	if l.n != 3 || l.counts[0] != 1 || l.counts[3] != 2 || l.counts[len(l.counts)-1] != 2 {
		t.Fatalf("histogram %+v: want 3 calls, 1 within 0.5ms, 2 within 5ms and 10s", l)
	}
	if l.sum < 60 || l.sum > 60.01 {
		t.Fatalf("sum %v, want about 60.0033", l.sum)
	}
}
