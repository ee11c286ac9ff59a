package shardkv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestLinearizabilityReconfig: 10 clients (one client.Client each) do
// random Get/Put/Append on a few keys through the Go client while client and
// group-to-group RPCs lose 10% of requests and 10% of replies and are delayed
// by up to 30 ms, and groups join and leave; porcupine then checks the
// history against a per-key register model (pkg/kvcheck).

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

// slinHashes are hashes in the shards of two of slinKeys (hash tags), so
// that they move with them; slinFields their fields.
var (
	slinHashes = []string{"{lin-a}h", "{lin-a}g", "{lin-c}h", "{lin-c}g"}
	slinSets   = []string{"{lin-a}s", "{lin-c}s"}
	slinLists  = []string{"{lin-a}l", "{lin-c}l"}
	slinFields = []string{"a", "b", "c"}
)

// slinClient does random get/put/append on slinKeys, and hset, hdel, hget
// and hgetall on slinHashes, until stop, recording each call in rec.
// Values are unique, so appends can be told apart.
func slinClient(c *client.Client, rec *kvcheck.Recorder, id int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), slinOpTimeout)
		switch rng.IntN(10) {
		case 0, 1:
			slinHashOp(ctx, c, rec, rng, id, seq)
			cancel()
			continue
		case 2:
			slinSetOp(ctx, c, rec, rng, id, seq)
			cancel()
			continue
		case 3:
			slinListOp(ctx, c, rec, rng, id, seq)
			cancel()
			continue
		}
		key := slinKeys[rng.IntN(len(slinKeys))]
		switch p := rng.IntN(10); {
		case p < 4:
			op := rec.Start(id, kvcheck.Get, key, "")
			v, _, err := c.Get(ctx, key)
			finish(op, v, err)
		case p < 6:
			v := fmt.Sprintf("%d.%d", id, seq)
			op := rec.Start(id, kvcheck.Put, key, v)
			finish(op, "", c.Put(ctx, key, v))
		default:
			v := fmt.Sprintf("%d.%d;", id, seq)
			op := rec.Start(id, kvcheck.Append, key, v)
			finish(op, "", c.Append(ctx, key, v))
		}
		cancel()
	}
}

// slinHashOp is one random operation on a field of one of slinHashes, or
// a read of a whole hash.
func slinHashOp(ctx context.Context, c *client.Client, rec *kvcheck.Recorder, rng *rand.Rand, id, seq int) {
	key, field := slinHashes[rng.IntN(len(slinHashes))], slinFields[rng.IntN(len(slinFields))]
	start := func(kind kvcheck.Kind, value string) kvcheck.Pending {
		return rec.StartField(id, kind, key, field, value)
	}
	switch p := rng.IntN(20); {
	case p < 8:
		v := fmt.Sprintf("%d.%d", id, seq)
		op := start(kvcheck.HSet, v)
		_, err := c.HSet(ctx, key, field, v)
		finish(op, "", err)
	case p < 11:
		op := start(kvcheck.HDel, "")
		_, err := c.HDel(ctx, key, field)
		finish(op, "", err)
	case p < 15:
		op := start(kvcheck.HGet, "")
		v, _, err := c.HGet(ctx, key, field)
		finish(op, v, err)
	default:
		op := rec.Start(id, kvcheck.HGetAll, key, "")
		h, err := c.HGetAll(ctx, key)
		finish(op, kvcheck.EncodeHash(h), err)
	}
}

// slinSetOp adds or removes a member of one of slinSets, or reads it
// whole. Members are few, so that adds and removes meet.
func slinSetOp(ctx context.Context, c *client.Client, rec *kvcheck.Recorder, rng *rand.Rand, id, seq int) {
	key, m := slinSets[rng.IntN(len(slinSets))], fmt.Sprint("m", rng.IntN(5))
	switch p := rng.IntN(10); {
	case p < 4:
		op := rec.StartField(id, kvcheck.SAdd, key, m, "")
		_, err := c.SAdd(ctx, key, m)
		finish(op, "", err)
	case p < 7:
		op := rec.StartField(id, kvcheck.SRem, key, m, "")
		_, err := c.SRem(ctx, key, m)
		finish(op, "", err)
	default:
		op := rec.Start(id, kvcheck.SMembers, key, "")
		ms, err := c.SMembers(ctx, key)
		finish(op, kvcheck.EncodeSet(ms), err)
	}
}

// slinListOp pushes a unique value at either end of one of slinLists,
// pops from either end, or reads it whole.
func slinListOp(ctx context.Context, c *client.Client, rec *kvcheck.Recorder, rng *rand.Rand, id, seq int) {
	key := slinLists[rng.IntN(len(slinLists))]
	v := fmt.Sprintf("%d.%d", id, seq)
	switch p := rng.IntN(10); {
	case p < 2:
		op := rec.Start(id, kvcheck.LPush, key, v)
		_, err := c.LPush(ctx, key, v)
		finish(op, "", err)
	case p < 4:
		op := rec.Start(id, kvcheck.RPush, key, v)
		_, err := c.RPush(ctx, key, v)
		finish(op, "", err)
	case p < 6:
		op := rec.Start(id, kvcheck.LPop, key, "")
		got, _, err := c.LPop(ctx, key)
		finish(op, got, err)
	case p < 8:
		op := rec.Start(id, kvcheck.RPop, key, "")
		got, _, err := c.RPop(ctx, key)
		finish(op, got, err)
	default:
		op := rec.Start(id, kvcheck.LRange, key, "")
		l, err := c.LRange(ctx, key, 0, -1)
		finish(op, kvcheck.EncodeList(l), err)
	}
}

// finish records a call's outcome: a failed write may take effect at any
// time from its call on (kvcheck treats it so); a failed read is left out.
func finish(op kvcheck.Pending, out string, err error) {
	if err != nil {
		op.Fail(err)
		return
	}
	op.Ok(out)
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

	rec := kvcheck.NewRecorder()
	var notes []kvcheck.Note
	w.Faults.Set(0.1, 0.1, 30*time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range slinClients {
		c := w.Client()
		wg.Go(func() { slinClient(c, rec, i, stop) })
	}

	// Reconfigure in the test goroutine (World's Join and Leave may
	// t.Fatal): one group joins or leaves every ~1.5 s, at least one group
	// stays. Every round changes something (a group that may leave, or one
	// that is out), and the run goes on past slinRunFor until there were
	// slinMinConfigs changes: on a loaded machine rounds take longer, and
	// picking a group that could not change used to waste rounds (CI once
	// saw 3 changes in 15 s).
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	in := map[uint64]bool{100: true, 101: true}
	var changes []string
	runStart := time.Now()
	deadline := runStart.Add(slinRunFor)
	for time.Now().Before(deadline) || (len(changes) < slinMinConfigs && time.Since(runStart) < 4*slinRunFor) {
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(time.Second))))
		var can []uint64
		for _, g := range gids {
			if !in[g] || len(in) > 1 {
				can = append(can, g)
			}
		}
		gid := can[rng.IntN(len(can))]
		start, t0 := rec.Now(), time.Now()
		if in[gid] {
			conf := w.Leave(gid)
			delete(in, gid)
			changes = append(changes, fmt.Sprintf("leave %d -> config %d %v", gid, conf.Num, conf.Shards))
		} else {
			conf := w.Join(gid)
			in[gid] = true
			changes = append(changes, fmt.Sprintf("join %d -> config %d %v", gid, conf.Num, conf.Shards))
		}
		changes[len(changes)-1] += fmt.Sprintf(" (%v, at %v)", time.Since(t0).Round(time.Millisecond), t0.Sub(runStart).Round(100*time.Millisecond))
		notes = append(notes, kvcheck.Note{Tag: "config", Start: start, End: rec.Now(), Description: changes[len(changes)-1]})
	}
	close(stop)
	wg.Wait()
	t.Logf("reconfigurations:\n%s", strings.Join(changes, "\n"))

	// Heal, let every move finish, then read every key once more: the
	// final reads join the history.
	w.Faults.Set(0, 0, 0)
	last := w.WaitSettled(60 * time.Second)
	t.Logf("configs %d -> %d", first.Num, last.Num)
	st := slinFinalCheck(t, w.Client(), rec, notes)

	if n := st.OKGets + st.OKWrites; n < slinMinOK {
		t.Errorf("only %d operations succeeded, want at least %d", n, slinMinOK)
	}
	if n := st.OKGets; n < slinMinReads {
		t.Errorf("only %d reads succeeded, want at least %d", n, slinMinReads)
	}
	if n := st.OKWrites; n < slinMinWrites {
		t.Errorf("only %d writes succeeded, want at least %d", n, slinMinWrites)
	}
	if len(changes) < slinMinConfigs {
		t.Errorf("only %d reconfigurations during the run, want at least %d", len(changes), slinMinConfigs)
	}
}

// slinFinalCheck reads every key once more (the reads join the history),
// then checks the history with porcupine; a history that is not
// linearizable, or whose check timed out, fails the test.
func slinFinalCheck(t *testing.T, fc *client.Client, rec *kvcheck.Recorder, notes []kvcheck.Note) kvcheck.Stats {
	t.Helper()
	for _, k := range slinKeys {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		op := rec.Start(slinClients, kvcheck.Get, k, "")
		v, _, err := fc.Get(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("final read of %s after healing: %v", k, err)
		}
		op.Ok(v)
	}
	for _, k := range slinHashes {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		op := rec.Start(slinClients, kvcheck.HGetAll, k, "")
		h, err := fc.HGetAll(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("final read of %s after healing: %v", k, err)
		}
		op.Ok(kvcheck.EncodeHash(h))
	}
	for _, k := range slinSets {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		op := rec.Start(slinClients, kvcheck.SMembers, k, "")
		ms, err := fc.SMembers(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("final read of %s after healing: %v", k, err)
		}
		op.Ok(kvcheck.EncodeSet(ms))
	}
	for _, k := range slinLists {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		op := rec.Start(slinClients, kvcheck.LRange, k, "")
		l, err := fc.LRange(ctx, k, 0, -1)
		cancel()
		if err != nil {
			t.Fatalf("final read of %s after healing: %v", k, err)
		}
		op.Ok(kvcheck.EncodeList(l))
	}
	hist := rec.History()
	st := hist.Stats
	t.Logf("history: %d operations: %d reads ok, %d writes ok, %d writes with unknown outcome, %d reads failed",
		len(hist.Ops), st.OKGets, st.OKWrites, st.Unknown, st.FailedGets)
	if path := os.Getenv("LINEARIZABILITY_HISTORY"); path != "" {
		if b, err := json.Marshal(hist); err == nil {
			_ = os.WriteFile(path, b, 0o644)
		}
	}
	res, err := kvcheck.Check(hist.Ops, slinCheckLimit)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	t.Logf("porcupine: %s", res)
	if !res.Linearizable || os.Getenv("LINEARIZABILITY_VIZ") != "" {
		viz := slinVisualize(t, res, notes)
		switch res.CheckResult {
		case kvcheck.ResultIllegal:
			t.Fatalf("history is not linearizable; visualisation: %s", viz)
		case kvcheck.ResultUnknown:
			t.Fatalf("linearizability check timed out after %v (result unknown, treated as a failure); visualisation: %s", slinCheckLimit, viz)
		}
	}
	return st
}

func slinVisualize(t *testing.T, res kvcheck.Result, notes []kvcheck.Note) string {
	f, err := os.CreateTemp("", "shardkv-linearizability-*.html")
	if err != nil {
		return "(none: " + err.Error() + ")"
	}
	f.Close()
	if err := res.VisualizePath(f.Name(), notes...); err != nil {
		return f.Name() + " (incomplete: " + err.Error() + ")"
	}
	t.Logf("visualisation written to %s", f.Name())
	return f.Name()
}
