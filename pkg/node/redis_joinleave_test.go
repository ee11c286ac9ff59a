// Redis Cluster clients under load while groups join and leave: every
// acknowledged write is read back and no client runs out of redirects.

package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/kvctl"
)

type keyHist struct {
	acked   int          // seq of the last acknowledged SET (0: none)
	unknown map[int]bool // seqs of SETs whose outcome is unknown
}

// allowed reports whether a value read (seq, 0 for a missing key) is
// possible: the last acknowledged write, or a write whose outcome is
// unknown (it may take effect at any time after it was sent, as
// linearizability allows for an operation without a response). An older
// acknowledged value, or one never written, is a lost or phantom write.
func (h *keyHist) allowed(seq int) bool {
	return seq == h.acked || h.unknown[seq]
}

type loadClient struct {
	w       int
	keys    []string
	hist    []keyHist
	ctrKey  string
	ctrAck  int64 // acknowledged INCRs
	ctrUnk  int64 // INCRs with an unknown outcome
	logKey  string
	logAck  []int        // tokens of acknowledged APPENDs, in order
	logUnk  map[int]bool // tokens of APPENDs with an unknown outcome
	logLen  int64        // length of the acknowledged tokens
	logUnkN int64        // length of the unknown ones
	ops     int
	unknown []string     // outcome-unknown errors, with the command
	errs    []string     // any other final error, or a wrong reply
	nerrs   atomic.Int32 // len(errs), for the test's goroutine
}

func newLoadClient(w int) *loadClient {
	lc := &loadClient{w: w, ctrKey: fmt.Sprintf("c%02d:ctr", w), logKey: fmt.Sprintf("c%02d:log", w), logUnk: map[int]bool{}}
	for i := range 8 {
		lc.keys = append(lc.keys, fmt.Sprintf("c%02d:k%d", w, i))
		lc.hist = append(lc.hist, keyHist{unknown: map[int]bool{}})
	}
	return lc
}

func (lc *loadClient) value(seq int) string { return fmt.Sprintf("c%02d-%d", lc.w, seq) }

// seqOf parses a value written by this client (-1 if it is not one).
func (lc *loadClient) seqOf(v string) int {
	s, ok := strings.CutPrefix(v, fmt.Sprintf("c%02d-", lc.w))
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func (lc *loadClient) fail(format string, args ...any) {
	lc.errs = append(lc.errs, fmt.Sprintf("client %d: ", lc.w)+fmt.Sprintf(format, args...))
	lc.nerrs.Add(1)
}

// step runs one round: SET, GET (checked), and every few rounds INCR and
// APPEND.
func (lc *loadClient) step(ctx context.Context, rc *redis.ClusterClient, seq int) {
	i := seq % len(lc.keys)
	k, h := lc.keys[i], &lc.hist[i]
	err := rc.Set(ctx, k, lc.value(seq), 0).Err()
	lc.ops++
	switch {
	case err == nil:
		h.acked = seq
	case isOutcomeUnknown(err):
		h.unknown[seq] = true
		lc.unknown = append(lc.unknown, fmt.Sprintf("SET %s %s: %v", k, lc.value(seq), err))
	default:
		lc.fail("SET %s %s: %v", k, lc.value(seq), err)
	}

	j := (seq * 7) % len(lc.keys)
	v, err := rc.Get(ctx, lc.keys[j]).Result()
	lc.ops++
	switch {
	case errors.Is(err, redis.Nil):
		if !lc.hist[j].allowed(0) {
			lc.fail("GET %s = nil; last acknowledged write %s", lc.keys[j], lc.value(lc.hist[j].acked))
		}
	case err != nil:
		lc.fail("GET %s: %v", lc.keys[j], err)
	default:
		if s := lc.seqOf(v); s <= 0 || !lc.hist[j].allowed(s) {
			lc.fail("GET %s = %q; last acknowledged write %s, unknown outcomes %v", lc.keys[j], v, lc.value(lc.hist[j].acked), lc.hist[j].unknown)
		}
	}

	if seq%3 == 0 {
		n, err := rc.Incr(ctx, lc.ctrKey).Result()
		lc.ops++
		switch {
		case err == nil:
			// Only this client increments: the counter is the INCRs
			// acknowledged before, plus this one, plus some of the
			// unknown ones.
			if n < lc.ctrAck+1 || n > lc.ctrAck+1+lc.ctrUnk {
				lc.fail("INCR %s = %d; want %d..%d (%d acknowledged before, %d unknown)", lc.ctrKey, n, lc.ctrAck+1, lc.ctrAck+1+lc.ctrUnk, lc.ctrAck, lc.ctrUnk)
			}
			lc.ctrAck++
		case isOutcomeUnknown(err):
			lc.ctrUnk++
			lc.unknown = append(lc.unknown, fmt.Sprintf("INCR %s: %v", lc.ctrKey, err))
		default:
			lc.fail("INCR %s: %v", lc.ctrKey, err)
		}
	}
	if seq%5 == 0 {
		tok := strconv.Itoa(seq) + ";"
		n, err := rc.Append(ctx, lc.logKey, tok).Result()
		lc.ops++
		switch {
		case err == nil:
			want := lc.logLen + int64(len(tok))
			if n < want || n > want+lc.logUnkN {
				lc.fail("APPEND %s %s = %d; want %d..%d", lc.logKey, tok, n, want, want+lc.logUnkN)
			}
			lc.logAck = append(lc.logAck, seq)
			lc.logLen = want
		case isOutcomeUnknown(err):
			lc.logUnk[seq] = true
			lc.logUnkN += int64(len(tok))
			lc.unknown = append(lc.unknown, fmt.Sprintf("APPEND %s %s: %v", lc.logKey, tok, err))
		default:
			lc.fail("APPEND %s %s: %v", lc.logKey, tok, err)
		}
	}
}

// verify reads every key of the client at the end.
func (lc *loadClient) verify(ctx context.Context, rc *redis.ClusterClient) {
	for i, k := range lc.keys {
		h := &lc.hist[i]
		v, err := rc.Get(ctx, k).Result()
		seq := 0
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			lc.fail("final GET %s: %v", k, err)
			continue
		default:
			if seq = lc.seqOf(v); seq <= 0 {
				lc.fail("final GET %s = %q: not a value this client wrote", k, v)
				continue
			}
		}
		if !h.allowed(seq) {
			lc.fail("final GET %s = %q; the last acknowledged write was %q (unknown outcomes: %v)", k, v, lc.value(h.acked), h.unknown)
		}
	}
	n, err := rc.Get(ctx, lc.ctrKey).Int64()
	if errors.Is(err, redis.Nil) {
		n, err = 0, nil
	}
	if err != nil {
		lc.fail("final GET %s: %v", lc.ctrKey, err)
	} else if n < lc.ctrAck || n > lc.ctrAck+lc.ctrUnk {
		lc.fail("counter %s = %d; %d INCRs acknowledged, %d with unknown outcome", lc.ctrKey, n, lc.ctrAck, lc.ctrUnk)
	}
	log, err := rc.Get(ctx, lc.logKey).Result()
	if errors.Is(err, redis.Nil) {
		log, err = "", nil
	}
	if err != nil {
		lc.fail("final GET %s: %v", lc.logKey, err)
		return
	}
	// The tokens in order: every acknowledged one, plus possibly some
	// unknown ones, each once, in the order sent.
	var got []int
	for _, f := range strings.Split(strings.TrimSuffix(log, ";"), ";") {
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			lc.fail("log %s = %q: bad token %q", lc.logKey, log, f)
			return
		}
		got = append(got, n)
	}
	var acked []int
	for i, n := range got {
		if i > 0 && n <= got[i-1] {
			lc.fail("log %s: token %d after %d (duplicated or reordered append): %q", lc.logKey, n, got[i-1], log)
			return
		}
		if !lc.logUnk[n] {
			acked = append(acked, n)
		}
	}
	if !slices.Equal(acked, lc.logAck) {
		lc.fail("log %s = %q; acknowledged appends %v (unknown outcomes %v)", lc.logKey, log, lc.logAck, lc.logUnk)
	}
}

// TestRedisClusterClientDuringJoinLeave: 16 go-redis ClusterClients read
// and write their own keys (SET, GET checked against the last write, INCR,
// APPEND) through `node local --resp` while a spare group joins (kvctl
// join) and then an original group leaves (kvctl leave). Every command
// ends in success or a final error; any final error fails the test except
// "outcome unknown", which is counted and reported, and is tolerated only
// where the data then shows a possible outcome. At the end every key holds
// its last written value, each counter equals its acknowledged INCRs (plus
// at most the unknown ones), each APPEND log has exactly the acknowledged
// tokens in order, and every node's CLUSTER SLOTS and CLUSTER NODES match
// the controller's latest config.
func TestRedisClusterClientDuringJoinLeave(t *testing.T) {
	needProcesses(t)
	c, resp := startRESPLocal(t, 10, "--groups=2", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=1", "--shards=16")
	if len(resp[1]) != 3 || len(resp[2]) != 3 || len(resp[3]) != 3 {
		t.Fatalf("RESP addresses: %v", resp)
	}
	cc, err := ctrlerclient.New(c.ctrl)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	// Filler keys (2 MB in all), so that each migration has data to move.
	const fillers = 4000
	filler := func(i int) (string, string) {
		return fmt.Sprintf("fill:%d", i), fmt.Sprintf("%04d:%s", i, strings.Repeat("x", 508))
	}
	fc := newClusterClient(resp[1])
	defer fc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < fillers; i += 200 {
		cmds, err := fc.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := i; j < i+200; j++ {
				k, v := filler(j)
				p.Set(ctx, k, v, 0)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("filler SETs: %v (%v)", err, cmds[0])
		}
	}

	const clients = 16
	var (
		stop  atomic.Bool
		ops   atomic.Int64
		wg    sync.WaitGroup
		load  = make([]*loadClient, clients)
		seeds = append(append([]string{}, resp[1]...), resp[2]...)
		redir redirectCounter
	)
	for w := range clients {
		lc := newLoadClient(w)
		load[w] = lc
		rc := newClusterClient(seeds)
		rc.OnNewNode(func(nc *redis.Client) { nc.AddHook(&redir) })
		t.Cleanup(func() { rc.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 1; !stop.Load() && lc.nerrs.Load() < 5; seq++ {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				before := lc.ops
				lc.step(ctx, rc, seq)
				cancel()
				ops.Add(int64(lc.ops - before))
			}
		}()
	}
	failedEarly := func() bool {
		for _, lc := range load {
			if lc.nerrs.Load() >= 5 {
				return true
			}
		}
		return false
	}
	waitOps := func(n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for ops.Load() < n && !failedEarly() {
			if time.Now().After(deadline) {
				t.Fatalf("only %d commands done, want %d (%s)", ops.Load(), n, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	start := time.Now()
	waitOps(500, "before the join")

	// The spare group 3 joins, the way an operator does it.
	var out, errOut bytes.Buffer
	joinArg := fmt.Sprintf("3=%s", strings.Join(c.groupAddrs(3), ","))
	if code := kvctl.Run([]string{"--ctrler=" + strings.Join(c.ctrl, ","), "--timeout=30s", "--json", "join", joinArg}, &out, &errOut); code != 0 {
		t.Fatalf("kvctl join %s: exit %d: %s%s", joinArg, code, out.String(), errOut.String())
	}
	conf, err := cc.Query(context.Background(), -1)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range conf.Groups {
		for _, s := range g.Servers {
			if s.RespAddr == "" {
				t.Errorf("config %d: group %d server %d has no RESP address (kvctl join should learn it from Admin.Status)", conf.Num, g.Gid, s.Id)
			}
		}
	}
	t.Logf("%v: group 3 joined: config %d; %d commands so far", time.Since(start).Round(time.Millisecond), conf.Num, ops.Load())
	waitSettled(t, cc, conf.Num, 60*time.Second)
	t.Logf("%v: config %d served", time.Since(start).Round(time.Millisecond), conf.Num)
	waitOps(ops.Load()+300, "after the join")

	// Group 1 leaves: its shards move to groups 2 and 3.
	out.Reset()
	errOut.Reset()
	if code := kvctl.Run([]string{"--ctrler=" + strings.Join(c.ctrl, ","), "--timeout=30s", "leave", "1"}, &out, &errOut); code != 0 {
		t.Fatalf("kvctl leave 1: exit %d: %s%s", code, out.String(), errOut.String())
	}
	if conf, err = cc.Query(context.Background(), -1); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: group 1 left: config %d; %d commands so far", time.Since(start).Round(time.Millisecond), conf.Num, ops.Load())
	st := waitSettled(t, cc, conf.Num, 60*time.Second)
	t.Logf("%v: config %d served", time.Since(start).Round(time.Millisecond), conf.Num)
	waitOps(ops.Load()+300, "after the leave")
	stop.Store(true)
	wg.Wait()

	// Final errors and outcome-unknown replies.
	var unknown int
	for _, lc := range load {
		unknown += len(lc.unknown)
		for _, u := range lc.unknown {
			t.Logf("client %d: outcome unknown: %s", lc.w, u)
		}
		for _, e := range lc.errs {
			t.Error(e)
		}
	}
	t.Logf("%d commands by %d clients in %v; %d outcome-unknown replies; retried by the clients: %d MOVED, %d TRYAGAIN, %d ASK or CLUSTERDOWN",
		ops.Load(), clients, time.Since(start).Round(time.Millisecond), unknown, redir.moved.Load(), redir.tryAgain.Load(), redir.other.Load())
	if t.Failed() {
		return
	}
	// The clients' slot maps went stale twice: they must have been
	// redirected (else the test did not exercise what it is for).
	if redir.moved.Load() == 0 {
		t.Errorf("no client saw a MOVED reply across a join and a leave")
	}

	// Every key holds its last written value (through a fresh client
	// seeded with group 1 only: it must learn the new layout).
	rc := newClusterClient(resp[1])
	defer rc.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, lc := range load {
		lc.errs = nil
		lc.verify(ctx, rc)
		for _, e := range lc.errs {
			t.Error(e)
		}
	}

	cmds, _ := rc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range fillers {
			k, _ := filler(i)
			p.Get(ctx, k)
		}
		return nil
	})
	for i, cmd := range cmds {
		k, v := filler(i)
		if got, err := cmd.(*redis.StringCmd).Result(); err != nil || got != v {
			t.Errorf("filler GET %s = %.20q..., %v; want %.20q...", k, got, err, v)
		}
	}

	// CLUSTER SLOTS and CLUSTER NODES agree with the controller's config on
	// every node.
	checkClusterViews(t, c, st.Latest, resp)
}

// slotOwners expands a config's shard table to slots: owner[slot] = gid.
