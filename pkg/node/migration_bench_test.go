package node_test

// TestMigrationBench measures one shard move under load and prints a
// markdown table, one row per (key count, mode): stop-and-copy (the old
// hand-over: the shard is frozen on the source until the target has pulled
// all of it) and pre-copy (MoveRequest.stop_and_copy = false). It is a
// benchmark, not a regular test: skipped unless SHARDKV_MIGRATION_BENCH is
// set. docs/benchmarks.md ("Shard migration under load") says how to run
// it and defines every column; `make bench-migration` runs it.
//
// Each run gets a fresh `node local` (two data groups of three replicas and
// one controller replica, real processes, badger, gRPC over loopback):
//
//  1. one shard S of group A is filled with N keys of VALUE_BYTES (batched
//     MultiPuts); four other shards, two on A and two on B, carry the
//     unaffected load;
//  2. load: a Go-client writer (open loop, WRITE_RATE/s) and a Go-client
//     reader (closed loop) on S's keys, a go-redis ClusterClient writer
//     (open loop) on S's keys, and one closed-loop Go-client writer per
//     unaffected shard; every op's start, latency and outcome is kept;
//  3. BASELINE of load, then Move(S → B, stop_and_copy per mode) straight
//     through the Controller gRPC API, while both groups' leaders are polled
//     (GroupInfo) until B serves S (Serving or Acking) and A no longer holds
//     it; then AFTER more of load;
//  4. the row; then every acknowledged write of the moving-shard writers
//     must read back (its value, or that of a write not definitely before
//     it) and every fill key must hold its value, or the test fails.

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// benchParams are the benchmark's settings, from SHARDKV_MIGRATION_BENCH_*.
type benchParams struct {
	keys        []int
	modes       []string
	valueBytes  int
	baseline    time.Duration // load before the Move (its first warmup excluded from the baseline p99)
	warmup      time.Duration
	after       time.Duration // load after the target serves and the source dropped the shard
	writeRate   int           // ops/s of each open-loop moving-shard writer
	writerKeys  int           // keys each moving-shard writer cycles through
	unaffected  int           // unaffected shards (and writers), half on each group
	moveTimeout time.Duration
	opTimeout   time.Duration // per op of the load clients
	fillBatch   int           // keys per MultiPut of the fill
	fillWorkers int
	maxInFlight int           // per open-loop writer; ticks past it are skipped (and counted)
	poll        time.Duration // GroupInfo polling period during the move
	rate        int           // pre-copy-limited: the groups' copy rate limit, bytes/s
	out         string        // markdown file for the table ("" = log only)
	opsDir      string        // if set, every op of every run as CSV, one file per run
}

func benchEnv(t *testing.T, name, def string) string {
	t.Helper()
	if v := os.Getenv("SHARDKV_MIGRATION_BENCH_" + name); v != "" {
		return v
	}
	return def
}

func benchInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := benchEnv(t, name, strconv.Itoa(def))
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("SHARDKV_MIGRATION_BENCH_%s=%q: want a positive integer", name, s)
	}
	return n
}

func benchDur(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s := benchEnv(t, name, def.String())
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		t.Fatalf("SHARDKV_MIGRATION_BENCH_%s=%q: want a duration", name, s)
	}
	return d
}

func loadBenchParams(t *testing.T) benchParams {
	p := benchParams{
		valueBytes:  benchInt(t, "VALUE_BYTES", 100),
		baseline:    benchDur(t, "BASELINE", 5*time.Second),
		warmup:      benchDur(t, "WARMUP", time.Second),
		after:       benchDur(t, "AFTER", 3*time.Second),
		writeRate:   benchInt(t, "WRITE_RATE", 100),
		writerKeys:  benchInt(t, "WRITER_KEYS", 200),
		unaffected:  benchInt(t, "UNAFFECTED", 4),
		moveTimeout: benchDur(t, "MOVE_TIMEOUT", 20*time.Minute),
		opTimeout:   benchDur(t, "OP_TIMEOUT", 120*time.Second),
		fillBatch:   benchInt(t, "FILL_BATCH", 2000),
		fillWorkers: benchInt(t, "FILL_WORKERS", 4),
		maxInFlight: benchInt(t, "MAX_IN_FLIGHT", 1000),
		poll:        benchDur(t, "POLL", 10*time.Millisecond),
		rate:        benchInt(t, "RATE", 2_000_000),
		out:         benchEnv(t, "OUT", ""),
		opsDir:      benchEnv(t, "OPS_DIR", ""),
	}
	for _, s := range strings.Split(benchEnv(t, "KEYS", "100000,1000000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("SHARDKV_MIGRATION_BENCH_KEYS: bad count %q", s)
		}
		p.keys = append(p.keys, n)
	}
	for _, m := range strings.Split(benchEnv(t, "MODES", "stop-and-copy,pre-copy"), ",") {
		m = strings.TrimSpace(m)
		if m != "stop-and-copy" && m != "pre-copy" && m != "pre-copy-limited" {
			t.Fatalf("SHARDKV_MIGRATION_BENCH_MODES: unknown mode %q (stop-and-copy, pre-copy or pre-copy-limited)", m)
		}
		p.modes = append(p.modes, m)
	}
	if p.warmup >= p.baseline {
		p.warmup = p.baseline / 5
	}
	// A batch stays far below a write command's budget (docs/shardkv.md,
	// "Writes per command": 24,000 records or 2 MiB, about 8,000 keys of
	// MultiPut); keep it under 1 MiB of keys and values.
	if per := p.valueBytes + 32; p.fillBatch*per > 1<<20 {
		p.fillBatch = max(1, (1<<20)/per)
	}
	if p.fillBatch > 4000 {
		p.fillBatch = 4000
	}
	if p.unaffected < 2 {
		p.unaffected = 2
	}
	return p
}

func TestMigrationBench(t *testing.T) {
	if os.Getenv("SHARDKV_MIGRATION_BENCH") == "" {
		t.Skip("a benchmark: set SHARDKV_MIGRATION_BENCH=1 (see docs/benchmarks.md)")
	}
	needProcesses(t)
	p := loadBenchParams(t)
	var rows []string
	for _, n := range p.keys {
		for _, mode := range p.modes {
			name := fmt.Sprintf("keys=%d/%s", n, mode)
			t.Run(name, func(t *testing.T) {
				r := runMigrationBench(t, p, n, mode)
				if r != nil {
					rows = append(rows, r.row())
					t.Logf("%s\n%s", migrationTableHeader, r.row())
					t.Logf("details: %s", r.details)
				}
			})
		}
	}
	table := migrationTableHeader + "\n" + strings.Join(rows, "\n") + "\n"
	t.Logf("migration benchmark:\n%s", table)
	fmt.Fprintf(os.Stdout, "\n%s\n", table)
	if p.out != "" {
		hdr := fmt.Sprintf("<!-- TestMigrationBench %s: value %d B, baseline %v, after %v, writers %d/s open loop over %d keys each, %d unaffected shards -->\n\n",
			time.Now().UTC().Format(time.RFC3339), p.valueBytes, p.baseline, p.after, p.writeRate, p.writerKeys, p.unaffected)
		if err := os.WriteFile(p.out, []byte(hdr+table), 0o644); err != nil {
			t.Errorf("writing %s: %v", p.out, err)
		}
	}
}

const migrationTableHeader = "| keys | mode | move s | copy MB/s | snapshot MB/s | Go write gap ms | redis write gap ms | cut-over gap ms Go / redis | Go gap before move ms | barrier writes | barrier p50 ms | barrier p99 ms | freeze→serve ms | reported pause ms | unaffected p99 base ms | unaffected p99 move ms | ratio | client errors | lost writes |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// --- ops and their records ---

type opRec struct {
	start, end time.Time
	ok         bool
	errKind    string
	key        int // writers: key index
	seq        int // writers: the value's sequence number
}

func (o opRec) lat() time.Duration { return o.end.Sub(o.start) }

// opLog collects one load stream's ops.
type opLog struct {
	mu  sync.Mutex
	ops []opRec
}

func (l *opLog) add(o opRec) {
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
}

func (l *opLog) all() []opRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ops)
}

// errKind names an error by kind for the error counts.
func errKind(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	switch {
	case errors.Is(err, client.ErrOutcomeUnknown), strings.HasPrefix(s, outcomeUnknownPrefix):
		return "outcome-unknown"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case strings.Contains(s, "i/o timeout"):
		return "io-timeout"
	case strings.Contains(s, "pool timeout"):
		return "pool-timeout"
	}
	s = client.CleanErrorText(s)
	if f := strings.Fields(s); len(f) > 0 && f[0] == strings.ToUpper(f[0]) && len(f[0]) > 2 {
		return f[0] // a Redis error code: TRYAGAIN, MOVED, CLUSTERDOWN, ...
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return strings.ReplaceAll(s, "|", "/")
}

// --- keys ---

// slotTags returns, for each slot of shard, a short hash tag that routes to
// it, so keys "{tag}..." spread over all of the shard's slots.
func slotTags(shard, nshards int) []string {
	first, last := routing.SlotRange(shard, nshards)
	tags := make([]string, last-first+1)
	missing := len(tags)
	for i := 0; missing > 0; i++ {
		tag := "t" + strconv.Itoa(i)
		s := routing.SlotOf(tag)
		if s >= first && s <= last && tags[s-first] == "" {
			tags[s-first] = tag
			missing--
		}
	}
	return tags
}

type shardKeys struct {
	tags []string
}

func (k shardKeys) key(kind string, i int) string {
	return "{" + k.tags[i%len(k.tags)] + "}" + kind + ":" + strconv.Itoa(i)
}

func fillValue(i, size int) string {
	s := "f" + strconv.Itoa(i) + "|"
	return s + strings.Repeat("v", max(0, size-len(s)))
}

func seqValue(seq, size int) string {
	s := strconv.Itoa(seq) + "|"
	return s + strings.Repeat("w", max(0, size-len(s)))
}

func parseSeq(v string) int {
	i := strings.IndexByte(v, '|')
	if i <= 0 {
		return -1
	}
	n, err := strconv.Atoi(v[:i])
	if err != nil {
		return -1
	}
	return n
}

// --- one run ---

type benchResult struct {
	keys       int
	mode       string
	moveTime   time.Duration
	mbps       float64
	snapMBps   float64 // the snapshot phase's copy rate, as B reported it; -1: not seen
	goGap      time.Duration
	goGapOpen  bool // no success after the gap before the load stopped
	redisGap   time.Duration
	redisOpen  bool
	goGapBase  time.Duration // the Go writer's longest gap before the Move (its warmup excluded)
	goCut      time.Duration // the longest gaps overlapping the cut-over (A frozen → B serving); -1: not seen
	redisCut   time.Duration
	barrier    time.Duration
	barrierN   int
	barrierP50 time.Duration
	barrierP99 time.Duration
	freezeServ time.Duration // -1: not observed
	pause      time.Duration // B's reported write_pause_us; -1: not reported
	baseP99    time.Duration
	moveP99    time.Duration
	errs       string
	lost       int
	details    string
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func (r *benchResult) row() string {
	opt := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return ms(d)
	}
	gap := func(d time.Duration, open bool) string {
		if open {
			return "≥" + ms(d)
		}
		return ms(d)
	}
	ratio := "-"
	if r.baseP99 > 0 {
		ratio = fmt.Sprintf("%.2f", float64(r.moveP99)/float64(r.baseP99))
	}
	snap := "-"
	if r.snapMBps >= 0 {
		snap = fmt.Sprintf("%.2f", r.snapMBps)
	}
	return fmt.Sprintf("| %d | %s | %.2f | %.2f | %s | %s | %s | %s / %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %d |",
		r.keys, r.mode, r.moveTime.Seconds(), r.mbps, snap, gap(r.goGap, r.goGapOpen), gap(r.redisGap, r.redisOpen),
		opt(r.goCut), opt(r.redisCut), ms(r.goGapBase), r.barrierN, ms(r.barrierP50), ms(r.barrierP99), opt(r.freezeServ), opt(r.pause),
		ms(r.baseP99), ms(r.moveP99), ratio, r.errs, r.lost)
}

// groupPoller reads a group's applied view from its leader (GroupInfo).
type groupPoller struct {
	addrs  []string
	leader int
	pool   *grpcdial.Pool
}

func (g *groupPoller) info(ctx context.Context) (*shardkvpb.GroupInfoReply, error) {
	var last error
	for i := range g.addrs {
		j := (g.leader + i) % len(g.addrs)
		cc, err := g.pool.Get(g.addrs[j])
		if err != nil {
			last = err
			continue
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		rep, err := shardkvpb.NewKVClient(cc).GroupInfo(actx, &shardkvpb.GroupInfoRequest{})
		cancel()
		if err != nil {
			last = err
			continue
		}
		if rep.GetMember().GetRole() == "leader" {
			g.leader = j
			return rep, nil
		}
		last = fmt.Errorf("%s is %s", g.addrs[j], rep.GetMember().GetRole())
	}
	return nil, last
}

func shardStateOf(rep *shardkvpb.GroupInfoReply, shard int) *shardkvpb.ShardState {
	for _, s := range rep.GetShards() {
		if int(s.Shard) == shard {
			return s
		}
	}
	return nil
}

// moveShard calls the controller's Move through the gRPC API itself (the
// Go client has no stop_and_copy), following leader hints.
func moveShard(ctx context.Context, ctrl []string, pool *grpcdial.Pool, shard int, gid uint64, stopAndCopy bool) (*shardkvpb.Config, error) {
	var b [8]byte
	crand.Read(b[:])
	req := &shardkvpb.MoveRequest{ClientId: binary.BigEndian.Uint64(b[:]) | 1, Seq: 1, Shard: uint32(shard), Gid: gid, StopAndCopy: stopAndCopy}
	var out *shardkvpb.Config
	opts := grpcdial.CallOptions{AttemptTimeout: 5 * time.Second, Final: ctrlerclient.IsRefused,
		Backoff: grpcdial.Backoff{Base: 20 * time.Millisecond, Max: time.Second}}
	err := grpcdial.NewCaller(pool).Call(ctx, 0, ctrl, opts, func(ctx context.Context, _ string, cc *grpc.ClientConn) error {
		r, err := shardkvpb.NewControllerClient(cc).Move(ctx, req)
		if err == nil {
			out = r.Config
		}
		return err
	})
	return out, err
}

func runMigrationBench(t *testing.T, p benchParams, nkeys int, mode string) *benchResult {
	args := []string{"--resp", "--groups=2", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0"}
	if mode == "pre-copy-limited" {
		args = append(args, fmt.Sprint("--migrate-bytes-per-sec=", p.rate))
	}
	c := startLocal(t, 7, args...)
	cc, err := ctrlerclient.New(c.ctrl)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st := waitSettled(t, cc, 1, 60*time.Second)
	conf := st.Latest
	nshards := len(conf.Shards)
	if len(conf.Groups) != 2 {
		t.Fatalf("want 2 groups in config %d, have %d", conf.Num, len(conf.Groups))
	}
	gidA, gidB := conf.Groups[0].Gid, conf.Groups[1].Gid
	var onA, onB []int
	for s, g := range conf.Shards {
		switch g {
		case gidA:
			onA = append(onA, s)
		case gidB:
			onB = append(onB, s)
		}
	}
	half := p.unaffected / 2
	if len(onA) < 1+half || len(onB) < p.unaffected-half {
		t.Fatalf("config %d: too few shards: %v on %d, %v on %d", conf.Num, onA, gidA, onB, gidB)
	}
	moving := onA[0]
	var unaffected []int
	for i := range half {
		unaffected = append(unaffected, onA[1+i*(len(onA)-1)/half])
	}
	for i := range p.unaffected - half {
		unaffected = append(unaffected, onB[i*len(onB)/(p.unaffected-half)])
	}
	mk := shardKeys{slotTags(moving, nshards)}
	t.Logf("config %d: moving shard %d (group %d → %d, slots %d tags); unaffected shards %v", conf.Num, moving, gidA, gidB, len(mk.tags), unaffected)

	newGo := func() *client.Client {
		cl, err := client.New(c.ctrl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}

	// 1. Fill.
	fillStart := time.Now()
	var fillBytes int64
	{
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, p.fillWorkers)
		for range p.fillWorkers {
			cl := newGo()
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					from := int(next.Add(int64(p.fillBatch))) - p.fillBatch
					if from >= nkeys || ctx.Err() != nil {
						return
					}
					kvs := map[string]string{}
					for i := from; i < min(nkeys, from+p.fillBatch); i++ {
						kvs[mk.key("f", i)] = fillValue(i, p.valueBytes)
					}
					if err := cl.MultiPut(ctx, kvs); err != nil {
						errs <- fmt.Errorf("fill MultiPut of keys %d..: %w", from, err)
						cancel()
						return
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		for i := range nkeys {
			fillBytes += int64(len(mk.key("f", i)) + p.valueBytes)
		}
	}
	t.Logf("filled shard %d with %d keys (%.1f MB of keys and values) in %v", moving, nkeys, float64(fillBytes)/1e6, time.Since(fillStart).Round(time.Millisecond))
	if cur, err := cc.Query(context.Background(), -1); err != nil || cur.Shards[moving] != gidA {
		t.Fatalf("shard %d not on group %d after the fill: %v %v", moving, gidA, cur.GetShards(), err)
	}

	// 2. Load.
	var (
		stop             atomic.Bool
		wg               sync.WaitGroup
		goW, redisW, goR opLog
		unaff            = make([]opLog, len(unaffected))
		wrongReads       atomic.Int64
		wrongMu          sync.Mutex
		wrongEx          []string
		capped           = map[*opLog]*atomic.Int64{&goW: {}, &redisW: {}}
		loadStart        = time.Now()
	)
	opCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), p.opTimeout)
	}
	openLoop := func(log *opLog, do func(ctx context.Context, key, seq int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inFlight atomic.Int64
			var opsWG sync.WaitGroup
			defer opsWG.Wait()
			tick := time.NewTicker(time.Second / time.Duration(p.writeRate))
			defer tick.Stop()
			for seq := 1; !stop.Load(); seq++ {
				<-tick.C
				if inFlight.Load() >= int64(p.maxInFlight) {
					capped[log].Add(1)
					continue
				}
				inFlight.Add(1)
				opsWG.Add(1)
				go func(seq int) {
					defer opsWG.Done()
					defer inFlight.Add(-1)
					key := seq % p.writerKeys
					ctx, cancel := opCtx()
					start := time.Now()
					err := do(ctx, key, seq)
					end := time.Now()
					cancel()
					log.add(opRec{start: start, end: end, ok: err == nil, errKind: errKind(err), key: key, seq: seq})
				}(seq)
			}
		}()
	}
	// Go-client writer on the moving shard.
	goWriter := newGo()
	openLoop(&goW, func(ctx context.Context, key, seq int) error {
		return goWriter.Put(ctx, mk.key("gw", key), seqValue(seq, p.valueBytes))
	})
	// go-redis writer on the moving shard.
	resp := c.respAddrs()
	rc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:           append(slices.Clone(resp[gidA]), resp[gidB]...),
		MaxRedirects:    16,
		MinRetryBackoff: 8 * time.Millisecond,
		MaxRetryBackoff: 512 * time.Millisecond,
		ReadTimeout:     6 * time.Second,
		WriteTimeout:    6 * time.Second,
		DialTimeout:     5 * time.Second,
		PoolSize:        512,
		PoolTimeout:     30 * time.Second,
	})
	defer rc.Close()
	openLoop(&redisW, func(ctx context.Context, key, seq int) error {
		return rc.Set(ctx, mk.key("rw", key), seqValue(seq, p.valueBytes), 0).Err()
	})
	// Go-client reader on the moving shard: fill keys (whose values are
	// known) and the Go writer's keys.
	reader := newGo()
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(uint64(nkeys), 7))
		for i := 0; !stop.Load(); i++ {
			ctx, cancel := opCtx()
			start := time.Now()
			var err error
			if i%2 == 0 {
				k := rng.IntN(nkeys)
				var v string
				var ok bool
				v, ok, err = reader.Get(ctx, mk.key("f", k))
				if err == nil && (!ok || v != fillValue(k, p.valueBytes)) {
					wrongReads.Add(1)
					wrongMu.Lock()
					if len(wrongEx) < 5 {
						wrongEx = append(wrongEx, fmt.Sprintf("GET %s = %.20q, found %v", mk.key("f", k), v, ok))
					}
					wrongMu.Unlock()
				}
			} else {
				_, _, err = reader.Get(ctx, mk.key("gw", rng.IntN(p.writerKeys)))
			}
			end := time.Now()
			cancel()
			goR.add(opRec{start: start, end: end, ok: err == nil, errKind: errKind(err)})
		}
	}()
	// Closed-loop Go-client writers on unaffected shards.
	for u, shard := range unaffected {
		uk := shardKeys{slotTags(shard, nshards)}
		cl := newGo()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 1; !stop.Load(); seq++ {
				ctx, cancel := opCtx()
				start := time.Now()
				err := cl.Put(ctx, uk.key("u", seq%p.writerKeys), seqValue(seq, p.valueBytes))
				end := time.Now()
				cancel()
				unaff[u].add(opRec{start: start, end: end, ok: err == nil, errKind: errKind(err)})
			}
		}()
	}
	stopLoad := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopLoad()

	// 3. Baseline, then the move.
	time.Sleep(p.baseline)
	pool := grpcdial.NewPool(grpcdial.Options()...)
	defer pool.Close()
	pa := &groupPoller{addrs: c.groupAddrs(int(gidA)), pool: pool}
	pb := &groupPoller{addrs: c.groupAddrs(int(gidB)), pool: pool}
	moveStart := time.Now()
	mctx, mcancel := context.WithTimeout(context.Background(), p.moveTimeout)
	defer mcancel()
	newConf, err := moveShard(mctx, c.ctrl, pool, moving, gidB, mode == "stop-and-copy")
	if err != nil {
		t.Fatalf("Move(shard %d → group %d, stop_and_copy=%v): %v", moving, gidB, mode == "stop-and-copy", err)
	}
	moveReturned := time.Now()
	var others []string
	for s, g := range newConf.Shards {
		if s != moving && g != conf.Shards[s] {
			others = append(others, fmt.Sprintf("%d: %d→%d", s, conf.Shards[s], g))
		}
	}
	if len(others) > 0 {
		t.Logf("warning: the Move's config %d also moves other shards: %v", newConf.Num, others)
	}
	var (
		frozenAt, servingAt, droppedAt time.Time
		lastB                          *shardkvpb.ShardState
		// The snapshot's copy rate: B's copied bytes at its first and
		// last observation in the snapshot phase.
		snapT0, snapT1   time.Time
		snapB0, snapB1   uint64
		statesA, statesB []string
	)
	note := func(list *[]string, s string) {
		if n := len(*list); n == 0 || (*list)[n-1] != s {
			*list = append(*list, s)
		}
	}
	for servingAt.IsZero() || droppedAt.IsZero() {
		if mctx.Err() != nil {
			t.Fatalf("shard %d not served by group %d and dropped by group %d within %v; states seen: A %v, B %v",
				moving, gidB, gidA, p.moveTimeout, statesA, statesB)
		}
		// Each state counts from when the reply arrived: B serving and A
		// frozen are never dated early.
		if ra, err := pa.info(mctx); err == nil {
			now := time.Now()
			sa := shardStateOf(ra, moving)
			name := "absent"
			if sa != nil {
				name = sa.State
			}
			note(&statesA, name)
			if frozenAt.IsZero() && name != "Serving" {
				frozenAt = now
			}
			if droppedAt.IsZero() && sa == nil && ownerIn(ra.Config, moving) != gidA {
				droppedAt = now
			}
		}
		if rb, err := pb.info(mctx); err == nil {
			now := time.Now()
			sb := shardStateOf(rb, moving)
			name := "absent"
			if sb != nil {
				name = sb.State
				if sb.Phase != "" {
					name += "/" + sb.Phase
				}
				lastB = sb
				if sb.Phase == "snapshot" && sb.Bytes > 0 {
					if snapT0.IsZero() {
						snapT0, snapB0 = now, sb.Bytes
					}
					snapT1, snapB1 = now, sb.Bytes
				}
			}
			note(&statesB, name)
			if servingAt.IsZero() && sb != nil && (sb.State == "Serving" || sb.State == "Acking") && ownerIn(rb.Config, moving) == gidB {
				servingAt = now
			}
		}
		time.Sleep(p.poll)
	}
	// Wait for the final report of B (write_pause_us) to settle a little.
	time.Sleep(p.after)
	stopLoad()
	loadEnd := time.Now()
	if rb, err := pb.info(context.Background()); err == nil {
		if sb := shardStateOf(rb, moving); sb != nil {
			lastB = sb
		}
	}

	// 4. The row.
	r := &benchResult{keys: nkeys, mode: mode, freezeServ: -1, pause: -1, snapMBps: -1}
	if d := snapT1.Sub(snapT0); d > 200*time.Millisecond {
		r.snapMBps = float64(snapB1-snapB0) / 1e6 / d.Seconds()
	}
	r.moveTime = servingAt.Sub(moveStart)
	r.mbps = float64(fillBytes) / 1e6 / r.moveTime.Seconds()
	if !frozenAt.IsZero() && frozenAt.Before(servingAt) {
		r.freezeServ = servingAt.Sub(frozenAt)
	} else if !frozenAt.IsZero() {
		r.freezeServ = 0
	}
	if lastB != nil && lastB.WritePauseUs > 0 {
		r.pause = time.Duration(lastB.WritePauseUs) * time.Microsecond
	}
	gw, rw := goW.all(), redisW.all()
	var gapStart, gapEnd time.Time
	r.goGap, gapStart, gapEnd, r.goGapOpen = longestGap(gw, moveStart, servingAt, loadEnd)
	r.redisGap, _, _, r.redisOpen = longestGap(rw, moveStart, servingAt, loadEnd)
	// The gaps at the cut-over itself (a longer one elsewhere in the move is
	// the copy competing with the writes).
	r.goCut, r.redisCut = -1, -1
	if !frozenAt.IsZero() && !frozenAt.After(servingAt) {
		r.goCut, _, _, _ = longestGap(gw, frozenAt, servingAt, loadEnd)
		r.redisCut, _, _, _ = longestGap(rw, frozenAt, servingAt, loadEnd)
	}
	// The same writer with nothing moving: the gap a move adds is above it.
	r.goGapBase, _, _, _ = longestGap(gw, loadStart.Add(p.warmup), moveStart, loadEnd)
	r.barrier = gapEnd.Sub(gapStart)
	var inBarrier []time.Duration
	for _, o := range gw {
		if o.start.Before(gapEnd) && o.end.After(gapStart) {
			inBarrier = append(inBarrier, o.lat())
		}
	}
	r.barrierN = len(inBarrier)
	r.barrierP50, r.barrierP99 = pct(inBarrier, 50), pct(inBarrier, 99)
	var base, during []time.Duration
	for u := range unaff {
		for _, o := range unaff[u].all() {
			if !o.ok {
				continue
			}
			switch {
			case !o.start.Before(loadStart.Add(p.warmup)) && o.start.Before(moveStart):
				base = append(base, o.lat())
			case !o.start.Before(moveStart) && o.start.Before(servingAt):
				during = append(during, o.lat())
			}
		}
	}
	r.baseP99, r.moveP99 = pct(base, 99), pct(during, 99)
	counts := map[string]int{}
	streams := []struct {
		name string
		ops  []opRec
	}{{"go-w", gw}, {"redis-w", rw}, {"go-r", goR.all()}}
	for u := range unaff {
		streams = append(streams, struct {
			name string
			ops  []opRec
		}{"unaff", unaff[u].all()})
	}
	total := map[string]int{}
	for _, s := range streams {
		for _, o := range s.ops {
			total[s.name]++
			if !o.ok {
				counts[s.name+":"+o.errKind]++
			}
		}
	}
	if n := capped[&goW].Load(); n > 0 {
		counts["go-w:skipped"] = int(n)
	}
	if n := capped[&redisW].Load(); n > 0 {
		counts["redis-w:skipped"] = int(n)
	}
	if p.opsDir != "" {
		if err := writeOpsCSV(p.opsDir, nkeys, mode, moveStart, streams); err != nil {
			t.Errorf("writing the ops CSV: %v", err)
		}
	}
	r.errs = formatCounts(counts)

	// Correctness: a fresh client reads everything back.
	vctx, vcancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer vcancel()
	vc := newGo()
	var lostEx []string
	check := func(name, kind string, ops []opRec) {
		keys := make([]string, p.writerKeys)
		for i := range keys {
			keys[i] = mk.key(kind, i)
		}
		got, err := vc.MultiGet(vctx, keys)
		if err != nil {
			t.Fatalf("reading back %s keys: %v", name, err)
		}
		lost, ex := checkWriter(ops, keys, got)
		r.lost += lost
		lostEx = append(lostEx, ex...)
	}
	check("Go writer", "gw", gw)
	check("redis writer", "rw", rw)
	badFill := 0
	for from := 0; from < nkeys; from += 5000 {
		var keys []string
		for i := from; i < min(nkeys, from+5000); i++ {
			keys = append(keys, mk.key("f", i))
		}
		got, err := vc.MultiGet(vctx, keys)
		if err != nil {
			t.Fatalf("reading back fill keys %d..: %v", from, err)
		}
		for j, k := range keys {
			if v, ok := got[k]; !ok || v != fillValue(from+j, p.valueBytes) {
				if badFill < 5 {
					lostEx = append(lostEx, fmt.Sprintf("fill key %s = %.20q (present %v)", k, v, ok))
				}
				badFill++
			}
		}
	}
	r.lost += badFill
	otherMoves := ""
	if final, err := cc.Query(context.Background(), -1); err != nil {
		t.Errorf("querying the latest config: %v", err)
	} else {
		if final.Shards[moving] != gidB {
			t.Errorf("after the move the latest config %d has shard %d on group %d; want %d", final.Num, moving, final.Shards[moving], gidB)
		}
		var moved []string
		for s, g := range final.Shards {
			if s != moving && g != conf.Shards[s] {
				moved = append(moved, fmt.Sprintf("%d: %d→%d", s, conf.Shards[s], g))
			}
		}
		if len(moved) > 0 {
			// Not what the benchmark measures: say so loudly in the row's details.
			t.Logf("warning: other shards moved too (config %d): %v", final.Num, moved)
			otherMoves = fmt.Sprintf("; WARNING: other shards moved too: %v", moved)
		}
	}

	r.details = fmt.Sprintf("keys=%d mode=%s: Move RPC %v (config %d); source A not Serving at +%v, target B serving at +%v, source dropped at +%v; states A %v, B %v; B's last shard state: %v; "+
		"ops: %v; unaffected base n=%d p50 %s ms, during n=%d p50 %s ms; Go barrier window [%s, %s] ms after the Move; fill start to end %v",
		nkeys, mode, moveReturned.Sub(moveStart).Round(time.Millisecond), newConf.Num, sinceOr(frozenAt, moveStart), servingAt.Sub(moveStart).Round(time.Millisecond),
		droppedAt.Sub(moveStart).Round(time.Millisecond), statesA, statesB, lastB, total, len(base), ms(pct(base, 50)), len(during), ms(pct(during, 50)),
		ms(gapStart.Sub(moveStart)), ms(gapEnd.Sub(moveStart)), time.Since(fillStart).Round(time.Millisecond))
	rgap, _, _, ropen := longestGap(streams[2].ops, moveStart, servingAt, loadEnd)
	r.details += fmt.Sprintf("; Go reader's longest gap between successes %s ms (open %v)", ms(rgap), ropen) + otherMoves
	if wrongReads.Load() > 0 {
		t.Errorf("%d reads of fill keys returned a wrong value during the load: %v", wrongReads.Load(), wrongEx)
	}
	if r.lost > 0 {
		t.Errorf("%d acknowledged writes lost or fill keys wrong after the move: %v", r.lost, lostEx)
	}
	return r
}

func sinceOr(t, from time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(from).Round(time.Millisecond).String()
}

// longestGap finds the longest interval between consecutive successful
// completions of ops that overlaps [from, to]: it returns its length, its
// ends, and whether it was still open when the load stopped (no success
// after it; it then ends at loadEnd).
func longestGap(ops []opRec, from, to, loadEnd time.Time) (time.Duration, time.Time, time.Time, bool) {
	var ends []time.Time
	for _, o := range ops {
		if o.ok {
			ends = append(ends, o.end)
		}
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	ends = append(ends, loadEnd)
	var best time.Duration
	var bs, be time.Time
	open := false
	for i := 0; i+1 < len(ends); i++ {
		a, b := ends[i], ends[i+1]
		if b.Before(from) || a.After(to) {
			continue
		}
		if d := b.Sub(a); d > best {
			best, bs, be, open = d, a, b, i+1 == len(ends)-1
		}
	}
	if len(ends) == 1 { // no success at all
		return loadEnd.Sub(from), from, loadEnd, true
	}
	return best, bs, be, open
}

// pct is the nearest-rank percentile q of ds (0 for none).
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func formatCounts(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// checkWriter checks one moving-shard writer's keys after the move: for
// each key, the value read must come from a write of this writer to that
// key, and no acknowledged write to it may have started after that write
// was acknowledged (it would have been lost); a key with an acknowledged
// write must exist. A write that failed may or may not have taken effect,
// at any time after it started (its end counts as never).
func checkWriter(ops []opRec, keys []string, got map[string]string) (int, []string) {
	byKey := make([][]opRec, len(keys))
	for _, o := range ops {
		byKey[o.key] = append(byKey[o.key], o)
	}
	lost := 0
	var ex []string
	bad := func(format string, args ...any) {
		lost++
		if len(ex) < 5 {
			ex = append(ex, fmt.Sprintf(format, args...))
		}
	}
	for i, k := range keys {
		v, found := got[k]
		var lastAckStart time.Time // latest start of an acknowledged write
		for _, o := range byKey[i] {
			if o.ok && o.start.After(lastAckStart) {
				lastAckStart = o.start
			}
		}
		if !found {
			if !lastAckStart.IsZero() {
				bad("%s missing; acknowledged writes exist", k)
			}
			continue
		}
		seq := parseSeq(v)
		var w *opRec
		for j := range byKey[i] {
			if byKey[i][j].seq == seq {
				w = &byKey[i][j]
			}
		}
		switch {
		case w == nil:
			bad("%s = %.20q: not a value written to it", k, v)
		case w.ok && w.end.Before(lastAckStart):
			bad("%s = value of write %d (acknowledged at %v), but a later write acknowledged too started at %v", k, seq, w.end.Format(time.StampMicro), lastAckStart.Format(time.StampMicro))
		}
	}
	return lost, ex
}

func ownerIn(conf *shardkvpb.Config, shard int) uint64 {
	if conf == nil || shard >= len(conf.Shards) {
		return 0
	}
	return conf.Shards[shard]
}

// writeOpsCSV writes every op of a run: stream, start and end in ms from
// the Move RPC, ok, error kind, key and seq (writers).
func writeOpsCSV(dir string, nkeys int, mode string, moveStart time.Time, streams []struct {
	name string
	ops  []opRec
}) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var sb strings.Builder
	sb.WriteString("stream,start_ms,end_ms,latency_ms,ok,err,key,seq\n")
	for _, s := range streams {
		for _, o := range s.ops {
			fmt.Fprintf(&sb, "%s,%.3f,%.3f,%.3f,%v,%q,%d,%d\n", s.name,
				float64(o.start.Sub(moveStart))/1e6, float64(o.end.Sub(moveStart))/1e6, float64(o.lat())/1e6, o.ok, o.errKind, o.key, o.seq)
		}
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("ops-%d-%s.csv", nkeys, mode)), []byte(sb.String()), 0o644)
}

// TestMigrationBenchChecks tests the benchmark's own arithmetic and its
// lost-write check (always run; no cluster).
func TestMigrationBenchChecks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	op := func(key, seq, start, end int, ok bool) opRec {
		return opRec{start: at(start), end: at(end), ok: ok, key: key, seq: seq}
	}
	keys := []string{"k0", "k1"}
	ops := []opRec{
		op(0, 1, 0, 10, true),
		op(0, 2, 20, 30, true),     // acknowledged after 1: must not read 1
		op(1, 3, 0, 100, true),     // overlaps 4: either may win
		op(1, 4, 50, 60, true),     //
		op(0, 5, 40, 5000, false),  // failed: may or may not have applied
		op(1, 6, 200, 9000, false), //
	}
	for _, c := range []struct {
		got  map[string]string
		lost int
	}{
		{map[string]string{"k0": seqValue(2, 10), "k1": seqValue(4, 10)}, 0},
		{map[string]string{"k0": seqValue(5, 10), "k1": seqValue(3, 10)}, 0},
		{map[string]string{"k0": seqValue(2, 10), "k1": seqValue(6, 10)}, 0},
		{map[string]string{"k0": seqValue(1, 10), "k1": seqValue(4, 10)}, 1}, // 2 lost
		{map[string]string{"k1": seqValue(4, 10)}, 1},                        // k0 missing
		{map[string]string{"k0": seqValue(2, 10), "k1": seqValue(9, 10)}, 1}, // never written
	} {
		if lost, ex := checkWriter(ops, keys, c.got); lost != c.lost {
			t.Errorf("checkWriter(%v) = %d lost (%v), want %d", c.got, lost, ex, c.lost)
		}
	}

	// Successes end at 10, 20, 500, 510; the move is [15, 400].
	gops := []opRec{op(0, 1, 0, 10, true), op(0, 2, 5, 20, true), op(0, 3, 15, 450, false), op(0, 4, 30, 500, true), op(0, 5, 400, 510, true)}
	d, a, b, open := longestGap(gops, at(15), at(400), at(1000))
	if d != 480*time.Millisecond || !a.Equal(at(20)) || !b.Equal(at(500)) || open {
		t.Errorf("longestGap = %v [%v, %v] open %v; want 480ms [20, 500] closed", d, a.Sub(t0), b.Sub(t0), open)
	}
	// No success after the last one before the load ended: open.
	d, _, _, open = longestGap(gops[:2], at(15), at(400), at(1000))
	if d != 980*time.Millisecond || !open {
		t.Errorf("longestGap = %v open %v; want 980ms open", d, open)
	}

	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if pct(ds, 50) != 50*time.Millisecond || pct(ds, 99) != 99*time.Millisecond || pct(ds[:1], 99) != time.Millisecond || pct(nil, 50) != 0 {
		t.Errorf("pct: %v %v %v", pct(ds, 50), pct(ds, 99), pct(ds[:1], 99))
	}
	if tags := slotTags(3, 256); len(tags) != 64 {
		t.Errorf("slotTags: %d tags", len(tags))
	} else {
		for _, tag := range tags {
			k := shardKeys{tags}.key("f", 17)
			if routing.ShardOf([]byte(k), 256) != 3 || routing.ShardOf([]byte("{"+tag+"}x"), 256) != 3 {
				t.Errorf("key %s (tag %s) is not in shard 3", k, tag)
			}
		}
	}
}
