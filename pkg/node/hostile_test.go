package node_test

// TestHostileInput: issue 14's hostile inputs, and a few more, sent to real
// `node` processes of one shared `node local` cluster. For each case the
// client gets a clear error (or the documented outcome), and afterwards no
// replica process has exited or been restarted, every replica still
// answers, the groups still serve writes, and no other key changed.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	// hostileMaxValue is the cluster's --max-value-bytes (through the
	// environment `node local` passes on): 2 MiB keeps case 3 quick while
	// still above the old 1 MiB command limit that froze the shard.
	hostileMaxValue = 2 << 20
	// hostileMaxClients is its --resp-max-clients.
	hostileMaxClients = 1000
	hostileShards     = 16
)

// hostile is the shared cluster and what every case checks afterwards.
type hostile struct {
	c        *localCluster
	resp     map[uint64][]string // RESP addresses by gid
	respAll  []string
	rc       *redis.ClusterClient
	cc       *ctrlerclient.Client
	kv       *client.Client
	pids     map[string]int // node serve pid by gRPC address, at the start
	canaries map[string]string
	conf     *shardkvpb.Config // config at the start
	probes   int
}

func TestHostileInput(t *testing.T) {
	needProcesses(t)
	start := time.Now()
	// The limits reach the replicas through the environment, which node
	// local passes on to its children.
	c := startLocalEnv(t, 7, []string{
		fmt.Sprint("SHARDKV_MAX_VALUE_BYTES=", hostileMaxValue),
		fmt.Sprint("SHARDKV_RESP_MAX_CLIENTS=", hostileMaxClients),
	}, "--resp", "--groups=2", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0",
		fmt.Sprint("--shards=", hostileShards))
	h := newHostile(t, c, c.respAddrs())
	t.Logf("cluster up in %v", time.Since(start).Round(time.Millisecond))

	run := func(name string, f func(t *testing.T)) {
		t0 := time.Now()
		ok := t.Run(name, func(t *testing.T) {
			f(t)
			h.check(t)
		})
		t.Logf("%s: %v (%v)", name, map[bool]string{true: "ok", false: "FAILED"}[ok], time.Since(t0).Round(time.Millisecond))
	}
	run("Case1_KeyAndBatchLimits", h.case1)
	run("Case2_RawFrames", h.case2)
	run("Case4_StockPipeline", h.case4)
	run("Case3and5_LargeValueMoveAndForgedHandoff", h.case3and5)
	run("OversizedRequests", h.oversized)
	run("MaxClients", h.maxClients)
	run("MGETLargeValueRepeated", h.mgetRepeated)
	// Last: before a fix it stops a replica, which the later checks see.
	run("MGETReplyPastMemory", h.mgetPastMemory)
	run("PipelinedReadsPastMemory", h.pipelinedReadsPastMemory)
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

func newHostile(t *testing.T, c *localCluster, resp map[uint64][]string) *hostile {
	h := &hostile{c: c, resp: resp, pids: map[string]int{}, canaries: map[string]string{}}
	for _, a := range resp {
		h.respAll = append(h.respAll, a...)
	}
	for _, ep := range c.eps {
		h.pids[ep.grpc] = pidListening(t, ep.grpc, 10*time.Second)
	}
	h.rc = newClusterClient(h.respAll)
	t.Cleanup(func() { h.rc.Close() })
	var err error
	if h.cc, err = ctrlerclient.New(c.ctrl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cc.Close() })
	if h.kv, err = client.New(c.ctrl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.kv.Close() })
	ctx := tctx(t, 30*time.Second)
	if h.conf, err = h.cc.Query(ctx, -1); err != nil {
		t.Fatal(err)
	}
	for g := uint64(1); g <= 2; g++ {
		if !slices.Contains(h.conf.Shards, g) {
			t.Fatalf("group %d owns no shard: %v", g, h.conf.Shards)
		}
	}
	// Canaries on every shard.
	for s := 0; s < hostileShards; s++ {
		k := keyOnShard(fmt.Sprintf("canary-%d-", s), s)
		v := fmt.Sprintf("value-%d-%d", s, time.Now().UnixNano())
		if err := h.rc.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatalf("canary %s: %v", k, err)
		}
		h.canaries[k] = v
	}
	return h
}

func tctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// keyOnShard returns prefix+n for the first n that lands on shard s.
func keyOnShard(prefix string, s int) string {
	for n := 0; ; n++ {
		k := prefix + strconv.Itoa(n)
		if routing.ShardOf([]byte(k), hostileShards) == s {
			return k
		}
	}
}

// tagOn returns a hash tag "{name-n}" whose shard group gid owns at the
// start, and that shard.
func (h *hostile) tagOn(gid uint64, name string) (string, int) {
	for n := 0; ; n++ {
		tag := fmt.Sprintf("{%s-%d}", name, n)
		s := routing.ShardOf([]byte(tag), hostileShards)
		if h.conf.Shards[s] == gid {
			return tag, s
		}
	}
}

// check: every replica process is the one of the start and answers, none
// exited (node local restarts a dead child and says so), every replica's
// log holds one start, the canaries are unchanged, and both groups take a
// write and read it back.
func (h *hostile) check(t *testing.T) {
	t.Helper()
	ctx := tctx(t, 60*time.Second)
	for addr, pid := range h.pids {
		if got := pidsListening(addr); len(got) != 1 || got[0] != pid {
			t.Errorf("%s (%s): node serve pids %v, want [%d] as at the start", h.c.nameOf(addr), addr, got, pid)
		}
		if _, err := adminStatus(ctx, addr); err != nil {
			t.Errorf("%s (%s) does not answer Admin.Status: %v", h.c.nameOf(addr), addr, err)
		}
	}
	if out := h.c.out.String(); strings.Contains(out, " exited: ") {
		t.Errorf("node local restarted a replica:\n%s", out)
	}
	ents, _ := os.ReadDir(filepath.Join(h.c.dataDir, "logs"))
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(h.c.dataDir, "logs", e.Name()))
		if n := bytes.Count(b, []byte("replica serving")); n != 1 {
			t.Errorf("%s: %d starts logged, want 1", e.Name(), n)
		}
		if bytes.Contains(b, []byte("panic")) {
			t.Errorf("%s logs a panic:\n%s", e.Name(), tail(string(b), 3000))
		}
	}
	for k, v := range h.canaries {
		got, err := h.rc.Get(ctx, k).Result()
		if err != nil || got != v {
			t.Errorf("canary %s = %q, %v; want %q", k, got, err, v)
		}
	}
	for g := uint64(1); g <= 2; g++ {
		h.probes++
		tag, _ := h.tagOn(g, "probe")
		k := fmt.Sprintf("%sprobe-%d", tag, h.probes)
		if err := h.rc.Set(ctx, k, "alive", 0).Err(); err != nil {
			t.Errorf("group %d: SET after the case: %v", g, err)
			continue
		}
		if got, err := h.rc.Get(ctx, k).Result(); err != nil || got != "alive" {
			t.Errorf("group %d: GET after the case: %q, %v", g, got, err)
		}
	}
}

func wantErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: got error %v, want one containing %q", what, err, want)
	}
}

// existing counts which of keys exist (EXISTS, in slices of 1000).
func (h *hostile) existing(t *testing.T, keys []string) int64 {
	t.Helper()
	ctx := tctx(t, 30*time.Second)
	var n int64
	for i := 0; i < len(keys); i += 1000 {
		m, err := h.rc.Exists(ctx, keys[i:min(i+1000, len(keys))]...).Result()
		if err != nil {
			t.Fatalf("EXISTS: %v", err)
		}
		n += m
	}
	return n
}

func manyKeys(tag, name string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%s-%d", tag, name, i)
	}
	return keys
}

// Case 1: writes over storage's key and transaction limits are refused
// before they are proposed; before the fix each was committed and then
// stopped every replica at apply, on every restart.
func (h *hostile) case1(t *testing.T) {
	ctx := tctx(t, 60*time.Second)
	tag, _ := h.tagOn(1, "c1")

	long := tag + strings.Repeat("k", 65000-len(tag))
	wantErr(t, "SET 65,000-byte key", h.rc.Set(ctx, long, "v", 0).Err(), "ERR key of 65000 bytes exceeds the limit of 64989 bytes")
	longEx := tag + strings.Repeat("x", 64990-len(tag))
	wantErr(t, "SET 64,990-byte key EX 100", h.rc.Set(ctx, longEx, "v", 100*time.Second).Err(), "ERR key of 64990 bytes exceeds the limit of 64989 bytes")
	// The longest key allowed, with an expiry (its index entry the longest
	// stored key), is stored and read back.
	maxEx := tag + strings.Repeat("m", 64989-len(tag))
	if err := h.rc.Set(ctx, maxEx, "v", 100*time.Second).Err(); err != nil {
		t.Errorf("SET 64,989-byte key EX 100: %v", err)
	} else if ttl, err := h.rc.TTL(ctx, maxEx).Result(); err != nil || ttl <= 0 || ttl > 100*time.Second {
		t.Errorf("TTL of the 64,989-byte key: %v, %v", ttl, err)
	}
	if n := h.existing(t, []string{long, longEx}); n != 0 {
		t.Errorf("%d of the refused long keys exist", n)
	}
	if err := h.rc.Del(ctx, maxEx).Err(); err != nil {
		t.Errorf("DEL of the 64,989-byte key: %v", err)
	}

	const tooMany = "send fewer keys per command"
	mset := manyKeys(tag, "mset", 27000)
	var pairs []any
	for _, k := range mset {
		pairs = append(pairs, k, "v")
	}
	wantErr(t, "MSET of 27,000 keys", h.rc.MSet(ctx, pairs...).Err(), tooMany)
	if n := h.existing(t, mset); n != 0 {
		t.Errorf("%d keys of the refused MSET exist", n)
	}

	del := manyKeys(tag, "del", 13000)
	for i := 0; i < len(del); i += 1000 {
		var kv []any
		for _, k := range del[i:min(i+1000, len(del))] {
			kv = append(kv, k, "d")
		}
		if err := h.rc.MSet(ctx, kv...).Err(); err != nil {
			t.Fatalf("MSET of 1,000 keys: %v", err)
		}
	}
	wantErr(t, "DEL of 13,000 keys", h.rc.Del(ctx, del...).Err(), tooMany)
	if n := h.existing(t, del); n != int64(len(del)) {
		t.Errorf("after the refused DEL %d of %d keys exist", n, len(del))
	}

	mp := manyKeys(tag, "multiput", 9000)
	kvs := map[string]string{}
	for _, k := range mp {
		kvs[k] = "m"
	}
	t0 := time.Now()
	err := h.kv.MultiPut(ctx, kvs)
	t.Logf("MultiPut of %d keys: %v after %v", len(kvs), err, time.Since(t0).Round(time.Millisecond))
	wantErr(t, "Go client MultiPut of 9,000 keys of one group", err, tooMany)
	if shardkvpb.Reason(err) != shardkvpb.ReasonTooLarge {
		t.Errorf("MultiPut: reason %q, want %s", shardkvpb.Reason(err), shardkvpb.ReasonTooLarge)
	}
	if n := h.existing(t, mp); n != 0 {
		t.Errorf("%d keys of the refused MultiPut exist", n)
	}
}

// Case 2: frames with absurd lengths get Redis's protocol error at once and
// the connection is closed; before the fix the first crashed the process.
func (h *hostile) case2(t *testing.T) {
	frames := []struct{ name, frame, want string }{
		{"BulkOverflow", "*1\r\n$9223372036854775807\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"CountOverflow", "*9223372036854775807\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"CountHuge", "*3000000000\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"BulkHuge", "*1\r\n$2000000000\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"BulkNegative", "*1\r\n$-2\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
	}
	for _, addr := range h.respAll {
		for _, f := range frames {
			for range 2 { // twice: a repeat finds the same process
				got, closed, took := rawExchange(t, addr, f.frame, true)
				if got != f.want || !closed || took > time.Second {
					t.Errorf("%s %s: got %q (closed %v) after %v; want %q at once, then close", addr, f.name, got, closed, took, f.want)
				}
			}
		}
		// A bare "$2000000000" line is an inline command, as in Redis: an
		// unknown command, and the connection goes on.
		got, _, _ := rawExchange(t, addr, "$2000000000\r\nPING\r\n", false)
		if want := "-ERR unknown command '$2000000000', with args beginning with: \r\n+PONG\r\n"; got != want {
			t.Errorf("%s inline $2000000000: got %q, want %q", addr, got, want)
		}
	}
}

// rawExchange sends frame on a new connection and reads what comes back
// within 3s. With untilClose it reads until the server closes; otherwise
// it reads two reply lines.
func rawExchange(t *testing.T, addr, frame string, untilClose bool) (string, bool, time.Duration) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer nc.Close()
	start := time.Now()
	nc.SetDeadline(start.Add(3 * time.Second))
	// Written while reading: the server may answer and close before a long
	// frame is all sent (the write then fails; the reply is what counts).
	go io.WriteString(nc, frame)
	if !untilClose {
		br := bufio.NewReader(nc)
		var sb strings.Builder
		for range 2 {
			line, err := br.ReadString('\n')
			sb.WriteString(line)
			if err != nil {
				break
			}
		}
		return sb.String(), false, time.Since(start)
	}
	b, err := io.ReadAll(nc)
	took := time.Since(start)
	return string(b), err == nil || errors.Is(err, syscall.ECONNRESET), took
}

// Case 4: a stock go-redis ClusterClient (default options: 3s read
// timeout, retries on) sends one pipeline of 3,000 (GET, INCR, APPEND)
// triples to one slot. Replies stream, so nothing times out and nothing is
// resent: every append is applied exactly once. Before the fix the
// pipeline timed out and was resent, applying appends twice.
func (h *hostile) case4(t *testing.T) {
	ctx := tctx(t, 60*time.Second)
	stock := redis.NewClusterClient(&redis.ClusterOptions{Addrs: slices.Clone(h.respAll)})
	defer stock.Close()
	tag, _ := h.tagOn(1, "c4")
	ctr, logKey := tag+"ctr", tag+"log"
	const n = 3000
	pipe := stock.Pipeline()
	var incrs []*redis.IntCmd
	var appends []*redis.IntCmd
	for i := range n {
		pipe.Get(ctx, ctr)
		incrs = append(incrs, pipe.Incr(ctx, ctr))
		appends = append(appends, pipe.Append(ctx, logKey, fmt.Sprintf("t%d,", i)))
	}
	start := time.Now()
	cmds, _ := pipe.Exec(ctx)
	took := time.Since(start)
	failed := 0
	for _, c := range cmds {
		if err := c.Err(); err != nil && err != redis.Nil {
			if failed++; failed <= 5 {
				t.Errorf("%v: %v", c.Args(), err)
			}
		}
	}
	t.Logf("pipeline of %d commands: %v, %d failed", len(cmds), took.Round(time.Millisecond), failed)
	if failed > 0 {
		t.Errorf("%d of %d commands failed", failed, len(cmds))
	}
	logVal, err := h.rc.Get(ctx, logKey).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", logKey, err)
	}
	seen := map[string]int{}
	for _, tok := range strings.Split(strings.TrimSuffix(logVal, ","), ",") {
		seen[tok]++
	}
	for i := range n {
		tok := fmt.Sprintf("t%d", i)
		applied := seen[tok]
		if appends[i].Err() == nil && applied != 1 {
			t.Errorf("append %s answered OK, applied %d times", tok, applied)
		}
		if applied > 1 {
			t.Errorf("append %s applied %d times", tok, applied)
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct tokens in the log, want %d", len(seen), n)
	}
	okIncr := 0
	for _, c := range incrs {
		if c.Err() == nil {
			okIncr++
		}
	}
	if v, err := h.rc.Get(ctx, ctr).Int(); err != nil || v != okIncr {
		t.Errorf("counter %d (%v), want the %d INCRs answered", v, err, okIncr)
	}
}

// Cases 3 and 5: a value grown by 512 KiB APPENDs to the value limit (the
// final size is checked: one more APPEND is refused) moves with its shard.
// While the move waits (the new owner's replicas paused, so it cannot pull),
// forged ShardInstalled calls to the old owner are refused and its copy is
// kept; once the new owner runs again the move completes and the value is
// intact there.
func (h *hostile) case3and5(t *testing.T) {
	ctx := tctx(t, 120*time.Second)
	tag, shard := h.tagOn(1, "big")
	key := tag + "value"
	piece := bytes.Repeat([]byte("0123456789abcdef"), (512<<10)/16)
	var want []byte
	for i := 0; len(want)+len(piece) <= hostileMaxValue; i++ {
		piece[0] = byte('A' + i) // each piece distinct
		n, err := h.rc.Append(ctx, key, string(piece)).Result()
		want = append(want, piece...)
		if err != nil || n != int64(len(want)) {
			t.Fatalf("APPEND %d: %d, %v; want length %d", i+1, n, err, len(want))
		}
	}
	wantErr(t, "APPEND past the value limit", h.rc.Append(ctx, key, "x").Err(), "ERR string exceeds maximum allowed size")
	if got, err := h.rc.Get(ctx, key).Result(); err != nil || got != string(want) {
		t.Fatalf("value after the refused APPEND: %d bytes, %v; want %d bytes unchanged", len(got), err, len(want))
	}

	g1 := h.c.groupAddrs(1)
	g2 := h.c.groupAddrs(2)
	leader, _ := groupLeader(t, h.c.ctrl, 1, 30*time.Second)
	// Case 5 at rest: the shard is group 1's in the current config.
	for _, a := range g1 {
		err := shardInstalled(ctx, a, shard, h.conf.Num, 2)
		wantCode(t, a+": ShardInstalled naming group 2 for a shard group 1 owns", err, codes.PermissionDenied, shardkvpb.ReasonNotShardOwner)
	}

	// Pause the new owner, then move the shard to it.
	var paused []int
	for _, a := range g2 {
		pid := h.pids[a]
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		paused = append(paused, pid)
	}
	resume := func() {
		for _, pid := range paused {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		paused = nil
	}
	defer resume()
	moveStart := time.Now()
	// Stop-and-copy: the shard is frozen at once, while the target is
	// paused (a pre-copy move would wait, announced, for the copy).
	conf, err := h.cc.MoveStopAndCopy(ctx, shard, 2)
	if err != nil {
		t.Fatalf("Move(%d, 2): %v", shard, err)
	}
	if conf.Shards[shard] != 2 {
		t.Fatalf("config %d gives shard %d to group %d", conf.Num, shard, conf.Shards[shard])
	}
	if st := waitShardState(t, leader, shard, "BePulling", conf.Num, 30*time.Second); st == nil {
		return
	}
	// Case 5: forged calls while the shard waits to be pulled.
	before := map[string]uint64{}
	for _, a := range g1 {
		waitShardState(t, a, shard, "BePulling", conf.Num, 10*time.Second)
		before[a] = groupKeys(t, a)
		if before[a] == 0 {
			t.Fatalf("%s reports no keys in the frozen shard: the comparison below would prove nothing", a)
		}
	}
	err = shardInstalled(ctx, leader, shard, conf.Num, 1)
	wantCode(t, "ShardInstalled naming group 1, not the new owner", err, codes.PermissionDenied, shardkvpb.ReasonNotShardOwner)
	err = shardInstalled(ctx, leader, shard, conf.Num, 3)
	wantCode(t, "ShardInstalled naming group 3, not in the config", err, codes.PermissionDenied, shardkvpb.ReasonNotShardOwner)
	t0 := time.Now()
	err = shardInstalled(ctx, leader, shard, conf.Num, 2)
	wantCode(t, "ShardInstalled naming the new owner before it installed the shard", err, codes.FailedPrecondition, shardkvpb.ReasonNotInstalled)
	t.Logf("the refusal naming the new owner took %v (its replicas are paused)", time.Since(t0).Round(time.Millisecond))
	// The old owner keeps its frozen copy: still BePulling, as many keys.
	for _, a := range g1 {
		waitShardState(t, a, shard, "BePulling", conf.Num, time.Second)
		if n := groupKeys(t, a); n != before[a] {
			t.Errorf("%s holds %d keys after the forged calls, %d before", a, n, before[a])
		}
	}

	resume()
	ctx2, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		st, err := h.cc.Status(ctx2)
		if err == nil && st.Latest.Num >= conf.Num && served(st) {
			break
		}
		if ctx2.Err() != nil {
			t.Fatalf("the move of shard %d did not complete within 60s of the new owner resuming: %v", shard, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("shard %d moved %v after the Move (%v after the new owner resumed)", shard,
		time.Since(moveStart).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	got, err := h.rc.Get(ctx, key).Result()
	if err != nil || got != string(want) {
		t.Errorf("value on the new owner: %d bytes (sha %x), %v; want %d bytes (sha %x)",
			len(got), sha256.Sum256([]byte(got)), err, len(want), sha256.Sum256(want))
	}
	// The value is read on group 2's own replicas.
	l2, _ := groupLeader(t, h.c.ctrl, 2, 30*time.Second)
	direct := redis.NewClient(&redis.Options{Addr: h.c.grpcToRESP()[l2]})
	defer direct.Close()
	if n, err := direct.StrLen(ctx, key).Result(); err != nil || n != int64(len(want)) {
		t.Errorf("STRLEN on group 2's leader: %d, %v; want %d", n, err, len(want))
	}
	h.conf = conf
}

// groupKeys is the number of keys the replica at addr holds.
func groupKeys(t *testing.T, addr string) uint64 {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := shardkvpb.NewKVClient(cc).GroupInfo(ctx, &shardkvpb.GroupInfoRequest{CountKeys: true})
	if err != nil {
		t.Fatalf("GroupInfo of %s: %v", addr, err)
	}
	return info.Keys
}

func shardInstalled(ctx context.Context, addr string, shard int, num, gid uint64) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = shardkvpb.NewKVClient(cc).ShardInstalled(actx, &shardkvpb.ShardInstalledRequest{Shard: uint32(shard), ConfigNum: num, Gid: gid})
	return err
}

func wantCode(t *testing.T, what string, err error, code codes.Code, reason string) {
	t.Helper()
	if status.Code(err) != code || shardkvpb.Reason(err) != reason {
		t.Errorf("%s: got %v; want %v with reason %s", what, err, code, reason)
	}
}

// waitShardState waits until the replica at addr reports shard in state
// for config num, and returns its report.
func waitShardState(t *testing.T, addr string, shard int, state string, num uint64, timeout time.Duration) *shardkvpb.ShardState {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	deadline := time.Now().Add(timeout)
	var last any
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := shardkvpb.NewKVClient(cc).GroupInfo(ctx, &shardkvpb.GroupInfoRequest{})
		cancel()
		last = err
		if err == nil {
			last = info.Shards
			for _, s := range info.Shards {
				if int(s.Shard) == shard && s.State == state && s.ConfigNum == num {
					return s
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("%s: shard %d not %s for config %d within %v: %v", addr, shard, state, num, timeout, last)
	return nil
}

// OversizedRequests: a request over --resp-max-request-bytes (16 MiB),
// an argument over the bulk limit (twice the value limit), and a value
// over the value limit: each a clear error, nothing stored.
func (h *hostile) oversized(t *testing.T) {
	ctx := tctx(t, 30*time.Second)
	tag, _ := h.tagOn(1, "big-req")
	addr := h.resp[1][0]
	// MSET of five 3.5 MiB values: each argument fits, the request does not.
	v := strings.Repeat("v", 3584<<10)
	var frame strings.Builder
	fmt.Fprintf(&frame, "*11\r\n$4\r\nMSET\r\n")
	var keys []string
	for i := range 5 {
		k := fmt.Sprintf("%sk%d", tag, i)
		keys = append(keys, k)
		fmt.Fprintf(&frame, "$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(v), v)
	}
	got, closed, took := rawExchange(t, addr, frame.String(), true)
	if !strings.HasPrefix(got, "-ERR Protocol error: request too large (limit ") || !closed {
		t.Errorf("MSET of 17.5 MiB: got %q (closed %v, after %v); want a request-too-large protocol error, then close", got, closed, took)
	}
	// One 5 MiB argument: past the bulk limit (4 MiB).
	big := fmt.Sprintf("*3\r\n$3\r\nSET\r\n$%d\r\n%sk\r\n$%d\r\n", len(tag)+1, tag, 5<<20)
	got, closed, _ = rawExchange(t, addr, big, true)
	if got != "-ERR Protocol error: invalid bulk length\r\n" || !closed {
		t.Errorf("SET of a 5 MiB value: got %q (closed %v); want invalid bulk length, then close", got, closed)
	}
	// A 3 MiB value: within the bulk limit, past the value limit.
	err := h.rc.Set(ctx, tag+"v3", strings.Repeat("w", 3<<20), 0).Err()
	wantErr(t, "SET of a 3 MiB value", err, fmt.Sprintf("ERR value of %d bytes exceeds the limit of %d bytes", 3<<20, hostileMaxValue))
	if n := h.existing(t, append(keys, tag+"k", tag+"v3")); n != 0 {
		t.Errorf("%d keys of the refused requests exist", n)
	}
}

// MaxClients: twice --resp-max-clients connections to one replica, left
// idle, then each sends PING: those over the limit were answered "max
// number of clients reached" and closed, the others are served.
func (h *hostile) maxClients(t *testing.T) {
	addr := h.resp[1][0]
	const n = 2 * hostileMaxClients
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond) // all idle for a moment
	pong, full, other := 0, 0, 0
	for _, c := range conns {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "PING\r\n") // may fail on a closed one: its reply was sent
		line, _ := bufio.NewReader(c).ReadString('\n')
		switch line {
		case "+PONG\r\n":
			pong++
		case "-ERR max number of clients reached\r\n":
			full++
		default:
			if other++; other <= 3 {
				t.Errorf("a connection got %q", line)
			}
		}
	}
	t.Logf("%d connections: %d served, %d refused, %d other", n, pong, full, other)
	// A few of the limit's slots are the cluster clients' connections.
	if pong > hostileMaxClients || pong < hostileMaxClients-50 || full < n-hostileMaxClients || other != 0 {
		t.Errorf("%d served, %d refused, %d other; want about %d each", pong, full, other, hostileMaxClients)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	// Once they are closed the replica takes clients again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _, _ := rawExchange(t, addr, "PING\r\nPING\r\n", false)
		if got == "+PONG\r\n+PONG\r\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing the connections: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MGETLargeValueRepeated: MGET naming one 2 MiB key 64 times asks for a
// 128 MiB reply, far more than the front end's 16 MiB output limit per
// connection. The replica must survive and answer, or refuse clearly. (It
// answers; its peak RSS, logged, grows by several times the reply: see
// MGETReplyPastMemory.)
func (h *hostile) mgetRepeated(t *testing.T) {
	ctx := tctx(t, 60*time.Second)
	tag, _ := h.tagOn(1, "mget")
	key := tag + "v"
	val := strings.Repeat("m", hostileMaxValue)
	if err := h.rc.Set(ctx, key, val, 0).Err(); err != nil {
		t.Fatalf("SET of the 2 MiB value: %v", err)
	}
	const reps = 64 // a 128 MiB reply
	keys := make([]string, reps)
	for i := range keys {
		keys[i] = key
	}
	leader, _ := groupLeader(t, h.c.ctrl, 1, 30*time.Second)
	direct := redis.NewClient(&redis.Options{Addr: h.c.grpcToRESP()[leader], ReadTimeout: 30 * time.Second, MaxRetries: -1})
	defer direct.Close()
	pid := h.pids[leader]
	hwm0 := procStatusKB(pid, "VmHWM")
	t0 := time.Now()
	vals, err := direct.MGet(ctx, keys...).Result()
	t.Logf("the replica's peak RSS: %d MiB before, %d MiB after", hwm0>>10, procStatusKB(pid, "VmHWM")>>10)
	t.Logf("MGET of %d copies of a %d-byte value: %d values, %v, in %v", reps, len(val), len(vals), err, time.Since(t0).Round(time.Millisecond))
	if err != nil {
		// A refusal of a memory budget would be a plain ERR.
		if !strings.HasPrefix(err.Error(), "ERR ") {
			t.Errorf("MGET of %d copies of a 2 MiB key: %v; want the reply or a clear error", reps, err)
		}
	} else {
		for i, v := range vals {
			if s, _ := v.(string); len(s) != len(val) {
				t.Errorf("MGET reply %d: %d bytes", i, len(s))
				break
			}
		}
	}
	if err := h.rc.Del(ctx, key).Err(); err != nil {
		t.Errorf("DEL: %v", err)
	}
}

// procStatusKB reads a "kB" field of /proc/pid/status (0 if absent).
func procStatusKB(pid int, field string) uint64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// MGETReplyPastMemory: MGET naming one 2 MiB key 2,048 times (a 40 KiB
// request) asks for a 4 GiB reply; the request limit allows about a
// million names, 2 TiB. The replica must refuse it clearly, or answer it,
// within its memory: here a follower (READONLY) given 2 GiB of address
// space beyond what it uses, so that running out stops that process only,
// as a container's memory limit would, not the machine.
//
// Before a repeated key was read once and a read's reply bounded
// (pkg/resp MaxReplyBytes), the replica ran out of memory and died here
// (node local restarted it).
func (h *hostile) mgetPastMemory(t *testing.T) {
	ctx := tctx(t, 60*time.Second)
	tag, _ := h.tagOn(1, "mget-mem")
	key := tag + "v"
	if err := h.rc.Set(ctx, key, strings.Repeat("M", hostileMaxValue), 0).Err(); err != nil {
		t.Fatalf("SET of the 2 MiB value: %v", err)
	}
	leader, _ := groupLeader(t, h.c.ctrl, 1, 30*time.Second)
	var follower string
	for _, a := range h.c.groupAddrs(1) {
		if a != leader {
			follower = a
			break
		}
	}
	pid := h.pids[follower]
	vm := procStatusKB(pid, "VmSize") << 10
	if err := limitAddressSpace(pid, vm+2<<30); err != nil {
		t.Fatalf("prlimit of %s: %v", h.c.nameOf(follower), err)
	}
	t.Logf("%s (pid %d): address space limited to %d MiB (%d MiB in use)", h.c.nameOf(follower), pid, (vm+2<<30)>>20, vm>>20)
	const reps = 2048
	keys := make([]string, reps)
	for i := range keys {
		keys[i] = key
	}
	rc := redis.NewClient(&redis.Options{Addr: h.c.grpcToRESP()[follower], ReadTimeout: 20 * time.Second, MaxRetries: -1,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	defer rc.Close()
	// The key is written on the leader; wait until the follower has it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := rc.StrLen(ctx, key).Result()
		if err == nil && n == hostileMaxValue {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("STRLEN on the follower: %d, %v", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t0 := time.Now()
	vals, err := rc.MGet(ctx, keys...).Result()
	t.Logf("MGET of %d copies: %d values, %v, after %v", reps, len(vals), err, time.Since(t0).Round(time.Millisecond))
	if err != nil && (strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "i/o timeout")) {
		t.Errorf("MGET of %d copies of a 2 MiB key: %v; want the reply or a clear error", reps, err)
	}
	if err != nil {
		waitGone(pid, 20*time.Second) // a replica out of memory may take a while to go
	}
	if processGone(pid) {
		t.Errorf("%s (pid %d) died serving the MGET; its log ends:\n%s",
			h.c.nameOf(follower), pid, crashHead(logOf(h.c, follower)))
	}
}

// PipelinedReadsPastMemory: one pipeline of (SET, GET of one 2 MiB key)
// pairs, 1,000 of them, to the group's leader, given 2 GiB of address
// space beyond what it uses. Each GET after a SET is made in the write
// batch; before the batch's returned values were bounded, the whole
// pipeline was a few batches returning 2 GB of values on every replica,
// and the leader built replies of as much again. It must stay within its
// memory and answer each command correctly or, once the pipeline's
// deadline is near, with the not-executed TRYAGAIN (2 GB of replies do
// not fit in its 2 s): the SETs that ran are exactly those answered OK.
func (h *hostile) pipelinedReadsPastMemory(t *testing.T) {
	ctx := tctx(t, 120*time.Second)
	tag, _ := h.tagOn(1, "pipe-mem")
	key, ctr := tag+"v", tag+"n"
	val := strings.Repeat("P", hostileMaxValue)
	// Written with the Go client, whose sessions make its retries safe: a
	// 2 MiB SET on a loaded machine can outlast the RESP front end's 2 s
	// write timeout ("outcome unknown"), which is not what this case is
	// about.
	if err := h.kv.Put(ctx, key, val); err != nil {
		t.Fatalf("put of the 2 MiB value: %v", err)
	}
	leader, _ := groupLeader(t, h.c.ctrl, 1, 30*time.Second)
	pid := h.pids[leader]
	vm := procStatusKB(pid, "VmSize") << 10
	if err := limitAddressSpace(pid, vm+2<<30); err != nil {
		t.Fatalf("prlimit of %s: %v", h.c.nameOf(leader), err)
	}
	hwm0 := procStatusKB(pid, "VmHWM")
	rc := redis.NewClient(&redis.Options{Addr: h.c.grpcToRESP()[leader], ReadTimeout: 60 * time.Second, MaxRetries: -1})
	defer rc.Close()
	const pairs = 1000
	pipe := rc.Pipeline()
	for i := range pairs {
		pipe.Set(ctx, ctr, i, 0)
		pipe.Get(ctx, key)
	}
	// The group's term before and after tells a leader change from a
	// timeout when a batch's outcome is unknown (CI saw one at command 65).
	term := func() uint64 {
		st, err := adminStatus(ctx, leader)
		if err != nil {
			return 0
		}
		return st.Term
	}
	term0 := term()
	t0 := time.Now()
	cmds, err := pipe.Exec(ctx)
	t.Logf("%d (SET, GET of %d bytes) pairs: %v in %v; the leader's peak RSS %d MiB before, %d MiB after; its term %d before, %d after",
		pairs, len(val), err, time.Since(t0).Round(time.Millisecond), hwm0>>10, procStatusKB(pid, "VmHWM")>>10, term0, term())
	bad, late, lastSet := 0, 0, -1
	for i, c := range cmds {
		var got string
		var cerr error
		switch c := c.(type) {
		case *redis.StatusCmd:
			got, cerr = c.Result()
			if cerr == nil && got != "OK" {
				cerr = fmt.Errorf("reply %q", got)
			}
			if cerr == nil {
				lastSet = i / 2
			}
		case *redis.StringCmd:
			got, cerr = c.Result()
			if cerr == nil && got != val {
				cerr = fmt.Errorf("a %d-byte value", len(got))
			}
		}
		switch {
		case cerr == nil:
		case strings.HasPrefix(cerr.Error(), "TRYAGAIN not executed"):
			late++
		default:
			if bad++; bad <= 3 {
				t.Errorf("command %d (%s): %v", i, c.Name(), cerr)
			}
		}
	}
	t.Logf("%d commands answered, %d refused as not executed (pipeline deadline), %d failed", len(cmds)-late-bad, late, bad)
	if bad > 0 || late == len(cmds) {
		t.Errorf("%d of %d commands failed, %d not executed", bad, len(cmds), late)
	}
	// Exactly the SETs answered OK ran: the last of them left its value.
	if got, err := h.rc.Get(ctx, ctr).Result(); lastSet >= 0 && (err != nil || got != fmt.Sprint(lastSet)) {
		t.Errorf("the counter holds %q (%v) after the pipeline; the last SET answered OK set %d", got, err, lastSet)
	}
	if err != nil {
		waitGone(pid, 20*time.Second)
	}
	if processGone(pid) {
		t.Errorf("%s (pid %d) died serving the pipeline; its log ends:\n%s",
			h.c.nameOf(leader), pid, crashHead(logOf(h.c, leader)))
	}
	if err := h.rc.Del(ctx, key, ctr).Err(); err != nil {
		t.Errorf("DEL: %v", err)
	}
}

// crashHead is the start of a Go crash report in a log, or its tail.
func crashHead(log string) string {
	if i := strings.Index(log, "fatal error"); i >= 0 {
		return log[i:min(len(log), i+600)]
	}
	return tail(log, 1500)
}

func logOf(c *localCluster, addr string) string {
	b, _ := os.ReadFile(filepath.Join(c.dataDir, "logs", c.nameOf(addr)+".log"))
	return string(b)
}
