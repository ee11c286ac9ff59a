package node

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// errorCounter counts failed gRPC calls by error kind (the ErrorInfo reason,
// else the gRPC code), and times unary calls by method.
type errorCounter struct {
	mu     sync.Mutex
	counts map[string]uint64
	lat    map[string]*latency
}

// latencyBuckets are the upper bounds of shardkv_grpc_request_duration_seconds.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// latency is one method's histogram: counts[i] calls took at most
// latencyBuckets[i] (not cumulative), n calls in all, sum seconds.
type latency struct {
	counts []uint64
	n      uint64
	sum    float64
}

func newErrorCounter() *errorCounter {
	return &errorCounter{counts: map[string]uint64{}, lat: map[string]*latency{}}
}

func (e *errorCounter) observe(method string, d time.Duration) {
	s := d.Seconds()
	i, _ := slices.BinarySearch(latencyBuckets, s)
	e.mu.Lock()
	l := e.lat[method]
	if l == nil {
		l = &latency{counts: make([]uint64, len(latencyBuckets))}
		e.lat[method] = l
	}
	if i < len(l.counts) {
		l.counts[i]++
	}
	l.n++
	l.sum += s
	e.mu.Unlock()
}

// latencies are the histograms as Prometheus wants them: cumulative.
func (e *errorCounter) latencies() map[string]latency {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]latency, len(e.lat))
	for m, l := range e.lat {
		cum := make([]uint64, len(l.counts))
		var c uint64
		for i, v := range l.counts {
			c += v
			cum[i] = c
		}
		out[m] = latency{counts: cum, n: l.n, sum: l.sum}
	}
	return out
}

func (e *errorCounter) note(err error) {
	if err == nil {
		return
	}
	kind := shardkvpb.Reason(err)
	if kind == "" {
		kind = status.Code(err).String()
	}
	e.mu.Lock()
	e.counts[kind]++
	e.mu.Unlock()
}

func (e *errorCounter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	rep, err := h(ctx, req)
	e.observe(strings.TrimPrefix(info.FullMethod, "/"), time.Since(start))
	e.note(err)
	return rep, err
}

func (e *errorCounter) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	e.note(err)
	return err
}

func (e *errorCounter) snapshot() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]uint64, len(e.counts))
	for k, v := range e.counts {
		out[k] = v
	}
	return out
}

var (
	descTerm       = prometheus.NewDesc("shardkv_raft_term", "Current Raft term.", nil, nil)
	descCommit     = prometheus.NewDesc("shardkv_raft_commit_index", "Raft commit index.", nil, nil)
	descApplied    = prometheus.NewDesc("shardkv_raft_applied_index", "Highest index applied to the state machine.", nil, nil)
	descLeader     = prometheus.NewDesc("shardkv_raft_is_leader", "1 if this replica is its group's leader.", nil, nil)
	descProposals  = prometheus.NewDesc("shardkv_raft_proposals_total", "Commands proposed on this replica.", nil, nil)
	descPropFailed = prometheus.NewDesc("shardkv_raft_proposals_failed_total", "Proposals that did not return a result.", nil, nil)
	descFsyncs     = prometheus.NewDesc("shardkv_raft_fsyncs_total", "fsyncs of the Raft log.", nil, nil)
	descRounds     = prometheus.NewDesc("shardkv_raft_read_index_rounds_total", "ReadIndex rounds (one serves many reads).", nil, nil)
	descReadIndex  = prometheus.NewDesc("shardkv_raft_read_index_seconds", "Time linearizable reads waited for ReadIndex.", nil, nil)
	descSnapSent   = prometheus.NewDesc("shardkv_raft_snapshots_sent_total", "Snapshots streamed to peers.", nil, nil)
	descSnapRecv   = prometheus.NewDesc("shardkv_raft_snapshots_received_total", "Snapshots received from the leader.", nil, nil)
	descDropped    = prometheus.NewDesc("shardkv_raft_messages_dropped_total", "Raft messages dropped (full queue, no route).", nil, nil)
	descShards     = prometheus.NewDesc("shardkv_shards", "Shards held by this group, by state.", []string{"state"}, nil)
	descMigKeys    = prometheus.NewDesc("shardkv_migration_keys_total", "Keys received through shard migration.", nil, nil)
	descMigBytes   = prometheus.NewDesc("shardkv_migration_bytes_total", "Bytes received through shard migration.", nil, nil)
	descGCKeys     = prometheus.NewDesc("shardkv_gc_keys_total", "Keys of handed-off shards deleted.", nil, nil)
	descMovePause  = prometheus.NewDesc("shardkv_migration_write_pause_seconds", "Write pause of each shard move into this group, from the source's barrier to this group serving the shard (log time).", nil, nil)
	descCopyKeys   = prometheus.NewDesc("shardkv_migration_shard_keys", "Keys copied so far of a shard being copied into this group.", []string{"shard", "source", "phase"}, nil)
	descCopyTotal  = prometheus.NewDesc("shardkv_migration_shard_total_keys", "Keys the source reported for a shard being copied into this group.", []string{"shard", "source"}, nil)
	descCopyBytes  = prometheus.NewDesc("shardkv_migration_shard_bytes", "Bytes copied so far of a shard being copied into this group.", []string{"shard", "source"}, nil)
	descCopyTotB   = prometheus.NewDesc("shardkv_migration_shard_total_bytes", "Bytes the source reported for a shard being copied into this group.", []string{"shard", "source"}, nil)
	descCopyLag    = prometheus.NewDesc("shardkv_migration_shard_lag_entries", "Log entries a shard's copy is behind its source (0 once caught up).", []string{"shard", "source"}, nil)
	descErrors     = prometheus.NewDesc("shardkv_errors_total", "Failed gRPC calls, by kind.", []string{"kind"}, nil)
	descConfig     = prometheus.NewDesc("shardkv_config_num", "Config number this replica has applied (data groups) or the latest (controller).", nil, nil)
	descRESPConns  = prometheus.NewDesc("shardkv_resp_connected_clients", "Open Redis protocol connections.", nil, nil)
	descRESPCmds   = prometheus.NewDesc("shardkv_resp_commands_total", "Redis commands processed.", nil, nil)
	descRESPRefuse = prometheus.NewDesc("shardkv_resp_refused_total", "Redis commands answered MOVED, TRYAGAIN or CLUSTERDOWN (not executed).", nil, nil)
	descRESPUnk    = prometheus.NewDesc("shardkv_resp_outcome_unknown_total", "Redis writes answered 'outcome unknown' (proposed, result not known).", nil, nil)
	descRESPReject = prometheus.NewDesc("shardkv_resp_rejected_connections_total", "Redis connections refused at the client limit.", nil, nil)
	descRESPAuth   = prometheus.NewDesc("shardkv_resp_auth_failures_total", "Failed Redis AUTHs (wrong user or password, or a user turned off).", nil, nil)
	descVoters     = prometheus.NewDesc("shardkv_raft_voters", "Voting members of the group, as this replica knows its configuration (quorum: voters/2+1).", nil, nil)
	descReachable  = prometheus.NewDesc("shardkv_raft_voters_reachable", "Leader only: voters, itself included, heard from within the last 3s (below quorum: writes stop).", nil, nil)
	descTickGap    = prometheus.NewDesc("shardkv_raft_max_tick_gap_seconds", "Longest time between two Raft ticks since start (near the election timeout: followers may start elections).", nil, nil)
	descStateAge   = prometheus.NewDesc("shardkv_shard_state_age_seconds", "For each shard in a state other than Serving: seconds since this replica's metrics first saw it in that state for that config (first seen at a scrape; a restart starts again from 0).", []string{"shard", "state"}, nil)
	descDiskSize   = prometheus.NewDesc("shardkv_disk_capacity_bytes", "Size of the filesystem that holds --data-dir.", nil, nil)
	descGRPCLat    = prometheus.NewDesc("shardkv_grpc_request_duration_seconds", "Time to serve unary gRPC calls (KV reads and writes of Go clients, admin, controller queries), by method, errors included.", []string{"method"}, nil)
	descDiskAvail  = prometheus.NewDesc("shardkv_disk_available_bytes", "Bytes of the --data-dir filesystem available to the replica (statfs f_bavail).", nil, nil)
)

// allDescs are every family the collector may export; some appear only in
// some states (a copy in progress, an error seen, a data-group replica).
var allDescs = []*prometheus.Desc{descTerm, descCommit, descApplied, descLeader, descProposals, descPropFailed, descFsyncs,
	descRounds, descReadIndex, descSnapSent, descSnapRecv, descDropped, descShards, descMigKeys, descMigBytes, descGCKeys, descErrors, descConfig,
	descMovePause, descCopyKeys, descCopyTotal, descCopyBytes, descCopyTotB, descCopyLag,
	descRESPConns, descRESPCmds, descRESPRefuse, descRESPUnk, descRESPReject, descRESPAuth,
	descVoters, descReachable, descTickGap, descStateAge, descDiskSize, descDiskAvail, descGRPCLat}

// reachableWithin is how recently a leader must have heard from a voter
// to count it reachable: maxLeaderSilence, the readiness bound of a
// follower, seen from the other side.
const reachableWithin = maxLeaderSilence

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// MetricNames are the names of every metric family /metrics may serve
// (histograms and summaries without their _bucket, _sum, _count series):
// for checks of dashboards and alert rules.
func MetricNames() []string {
	var out []string
	for _, d := range allDescs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// stateKey is one shard's stay in one state (a new config is a new stay).
type stateKey struct {
	shard  int
	state  shardkv.ShardState
	config uint64
}

// stateAges remembers when the metrics first saw each shard's current
// non-Serving state.
type stateAges struct {
	mu    sync.Mutex
	since map[stateKey]time.Time
}

// observe returns the age of every shard not Serving, forgetting stays
// that ended.
func (a *stateAges) observe(shards map[int]shardkv.ShardMeta, now time.Time) map[stateKey]time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.since == nil {
		a.since = map[stateKey]time.Time{}
	}
	out := map[stateKey]time.Duration{}
	for s, m := range shards {
		if m.State == shardkv.Serving || m.State == shardkv.NotOwned {
			continue
		}
		k := stateKey{s, m.State, m.Config}
		t, ok := a.since[k]
		if !ok {
			t = now
			a.since[k] = t
		}
		out[k] = now.Sub(t)
	}
	for k := range a.since {
		if _, ok := out[k]; !ok {
			delete(a.since, k)
		}
	}
	return out
}

// collector reads the replica's counters at scrape time.
type collector struct {
	n    *Node
	ages stateAges
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	r := c.n.replica
	st := r.Status()
	m := r.Metrics()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descTerm, float64(st.Term))
	gauge(descCommit, float64(st.Commit))
	gauge(descApplied, float64(st.Applied))
	leader := 0.0
	if r.IsLeader() {
		leader = 1
	}
	gauge(descLeader, leader)
	counter(descProposals, m.Proposals.Load())
	counter(descPropFailed, m.ProposalsFailed.Load())
	counter(descFsyncs, m.Fsyncs.Load())
	counter(descRounds, m.ReadIndexRounds.Load())
	ch <- prometheus.MustNewConstSummary(descReadIndex, m.ReadIndexReads.Load(), float64(m.ReadIndexNanos.Load())/1e9, nil)
	counter(descSnapSent, m.SnapshotsSent.Load())
	counter(descSnapRecv, m.SnapshotsReceived.Load())
	counter(descDropped, m.MessagesDropped.Load())
	gauge(descTickGap, float64(m.MaxTickGapNanos.Load())/1e9)
	voters, reachable := 0, 0
	for _, mb := range st.Members {
		if mb.Learner {
			continue
		}
		voters++
		if mb.HeardAgo >= 0 && mb.HeardAgo < reachableWithin {
			reachable++
		}
	}
	gauge(descVoters, float64(voters))
	if leader == 1 {
		gauge(descReachable, float64(reachable))
	}
	if size, avail, err := diskUsage(c.n.opts.DataDir); err == nil {
		gauge(descDiskSize, float64(size))
		gauge(descDiskAvail, float64(avail))
	}
	if sm := c.n.groupSM; sm != nil {
		states := []shardkv.ShardState{shardkv.Serving, shardkv.PreCopying, shardkv.Pulling, shardkv.Acking, shardkv.BePulling, shardkv.GCing}
		counts := map[shardkv.ShardState]int{}
		shards := sm.Shards()
		for k, age := range c.ages.observe(shards, time.Now()) {
			gauge(descStateAge, age.Seconds(), strconv.Itoa(k.shard), string(k.state))
		}
		for s, meta := range shards {
			counts[meta.State]++
			if meta.State != shardkv.PreCopying && meta.State != shardkv.Pulling {
				continue
			}
			shard, src := strconv.Itoa(s), strconv.FormatUint(meta.Peer, 10)
			phase := "snapshot"
			if meta.Delta {
				phase = "delta"
			}
			gauge(descCopyKeys, float64(meta.Keys), shard, src, phase)
			gauge(descCopyTotal, float64(meta.Total), shard, src)
			gauge(descCopyBytes, float64(meta.Bytes), shard, src)
			gauge(descCopyTotB, float64(meta.TotalBytes), shard, src)
			gauge(descCopyLag, float64(meta.Lag), shard, src)
		}
		for _, s := range states {
			gauge(descShards, float64(counts[s]), string(s))
		}
		cum, sum, n := sm.WritePauses()
		buckets := map[float64]uint64{}
		for i, b := range shardkv.PauseBuckets {
			buckets[b.Seconds()] = cum[i]
		}
		ch <- prometheus.MustNewConstHistogram(descMovePause, n, sum.Seconds(), buckets)
		counter(descMigKeys, sm.MigratedKeys.Load())
		counter(descMigBytes, sm.MigratedBytes.Load())
		counter(descGCKeys, sm.GCKeys.Load())
		gauge(descConfig, float64(sm.Config().Num))
	}
	if sm := c.n.ctrlSM; sm != nil {
		_, latest := sm.Bounds()
		gauge(descConfig, float64(latest))
	}
	if rs := c.n.resp; rs != nil {
		st := rs.Stats()
		gauge(descRESPConns, float64(st.ConnectedClients))
		counter(descRESPCmds, uint64(st.TotalCommands))
		counter(descRESPRefuse, uint64(st.Refused))
		counter(descRESPUnk, uint64(st.OutcomeUnknown))
		counter(descRESPReject, uint64(st.RejectedConnections))
		counter(descRESPAuth, uint64(st.AuthFailures))
	}
	for kind, v := range c.n.errs.snapshot() {
		counter(descErrors, v, kind)
	}
	for method, l := range c.n.errs.latencies() {
		buckets := make(map[float64]uint64, len(latencyBuckets))
		for i, b := range latencyBuckets {
			buckets[b] = l.counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(descGRPCLat, l.n, l.sum, buckets, method)
	}
}
