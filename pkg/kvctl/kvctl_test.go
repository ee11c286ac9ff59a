package kvctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/kvctl"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

const nshards = 16

type result struct {
	out, err string
	code     int
}

func run(args ...string) result {
	var out, errb bytes.Buffer
	code := kvctl.Run(args, &out, &errb)
	return result{out.String(), errb.String(), code}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err)
}

func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := run(args...)
	if r.code != 0 {
		t.Fatalf("kvctl %s: %s", strings.Join(args, " "), r)
	}
	return r
}

func expectCode(t *testing.T, code int, args ...string) result {
	t.Helper()
	r := run(args...)
	if r.code != code {
		t.Fatalf("kvctl %s: want exit %d, got %s", strings.Join(args, " "), code, r)
	}
	return r
}

func decode[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.out), &v); err != nil {
		t.Fatalf("bad JSON (%v): %s", err, r)
	}
	return v
}

// isolate makes kvctl find no controller unless a test gives one.
func isolate(t *testing.T) string {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(kvctl.EnvCtrler, "")
	return home
}

// The JSON shapes the tests check (documented in docs/kvctl.md).
type configOut struct {
	Num       uint64   `json:"num"`
	Placement string   `json:"placement"`
	NShards   int      `json:"nshards"`
	Shards    []uint64 `json:"shards"`
	Groups    []struct {
		GID         uint64 `json:"gid"`
		Weight      uint32 `json:"weight"`
		OwnedShards int    `json:"owned_shards"`
		Leaving     bool   `json:"leaving"`
		Servers     []struct {
			ID       uint64 `json:"id"`
			Addr     string `json:"addr"`
			RespAddr string `json:"resp_addr"`
		} `json:"servers"`
	} `json:"groups"`
	Pins []struct {
		Shard uint32 `json:"shard"`
		GID   uint64 `json:"gid"`
	} `json:"pins"`
	Moves []struct {
		Shard       uint32 `json:"shard"`
		FromGID     uint64 `json:"from_gid"`
		ToGID       uint64 `json:"to_gid"`
		SinceConfig uint64 `json:"since_config"`
	} `json:"moves"`
}

type memberOut struct {
	ID        uint64 `json:"id"`
	Addr      string `json:"addr"`
	Role      string `json:"role"`
	Learner   bool   `json:"learner"`
	Reachable bool   `json:"reachable"`
	Term      uint64 `json:"term"`
	Applied   uint64 `json:"applied"`
	Match     uint64 `json:"match"`
	Member    bool   `json:"member"`
	Error     string `json:"error"`
}

type statusOut struct {
	NShards    int    `json:"nshards"`
	ConfigNum  uint64 `json:"config_num"`
	Settled    bool   `json:"settled"`
	Controller struct {
		Leader     uint64      `json:"leader"`
		LeaderAddr string      `json:"leader_addr"`
		Term       uint64      `json:"term"`
		Members    []memberOut `json:"members"`
	} `json:"controller"`
	Groups []struct {
		GID         uint64         `json:"gid"`
		InConfig    bool           `json:"in_config"`
		OwnedShards int            `json:"owned_shards"`
		Leader      uint64         `json:"leader"`
		Term        uint64         `json:"term"`
		Applied     uint64         `json:"applied"`
		ConfigNum   uint64         `json:"config_num"`
		ShardStates map[string]int `json:"shard_states"`
		InfoFrom    string         `json:"info_from"`
		Members     []memberOut    `json:"members"`
	} `json:"groups"`
	Migrations []struct {
		Shard  uint32 `json:"shard"`
		GID    uint64 `json:"gid"`
		State  string `json:"state"`
		Source uint64 `json:"source"`
		Target uint64 `json:"target"`
	} `json:"migrations"`
	PlannedMoves []struct {
		Shard       uint32 `json:"shard"`
		FromGID     uint64 `json:"from_gid"`
		ToGID       uint64 `json:"to_gid"`
		SinceConfig uint64 `json:"since_config"`
		TargetState string `json:"target_state"`
		CaughtUp    bool   `json:"caught_up"`
	} `json:"planned_moves"`
	Config configOut `json:"config"`
}

func TestUsageAndExitCodes(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"get"},
		{"get", "a", "b"},
		{"put", "a"},
		{"append", "a"},
		{"del"},
		{"get", "k", "--bogus"},
		{"--bogus", "get", "k"},
		{"get", "k", "--timeout=soon"},
		{"get", "k", "--timeout"},
		{"query", "x"},
		{"query", "1", "2"},
		{"move", "1"},
		{"move", "x", "1"},
		{"move", "--cancel"},
		{"move", "--cancel", "1", "2"},
		{"move", "--cancel", "--stop-and-copy", "1"},
		{"unpin"},
		{"leave"},
		{"join"},
		{"join", "3"},
		{"join", "0=127.0.0.1:1"},
		{"join", "x=127.0.0.1:1"},
		{"member"},
		{"member", "frob"},
		{"member", "list"},
		{"member", "list", "--group", "ctrler", "--server", "x:1"},
		{"member", "add", "4", "--server", "x:1"},
		{"member", "promote", "x", "--server", "x:1"},
		{"transfer-leader", "--server", "x:1"},
		{"bench", "--clients=0"},
		{"bench", "--read-ratio=2"},
		{"bench", "extra"},
		{"fill"},
		{"fill", "--keys=10", "--passes=0"},
		{"verify", "--keys=10", "--value-size=-1"},
		{"verify", "--keys=10", "--passes=2"},
	} {
		r := run(args...)
		if r.code != kvctl.ExitUsage {
			t.Errorf("kvctl %q: want exit 2, got %s", args, r)
			continue
		}
		if len(args) > 0 && (!strings.HasPrefix(r.err, "kvctl: ") || !strings.Contains(r.err, "usage: kvctl")) {
			t.Errorf("kvctl %q: want an error line and a usage hint, got %q", args, r.err)
		}
		if r.out != "" {
			t.Errorf("kvctl %q: wrote to stdout: %q", args, r.out)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"put", "-h"}, {"help", "member", "list"}} {
		r := run(args...)
		if r.code != 0 || !strings.Contains(r.out, "usage: kvctl") {
			t.Errorf("kvctl %q: %s", args, r)
		}
	}
	// The usage hint names the command.
	if r := run("put", "a"); !strings.Contains(r.err, "usage: kvctl put <key> <value>") {
		t.Errorf("put hint: %q", r.err)
	}
}

func TestNoController(t *testing.T) {
	home := isolate(t)
	r := expectCode(t, kvctl.ExitError, "get", "k")
	if !strings.HasPrefix(r.err, "kvctl: no controller address") || !strings.Contains(r.err, "--ctrler") ||
		!strings.Contains(r.err, kvctl.EnvCtrler) || strings.Count(r.err, "\n") != 1 {
		t.Fatalf("unclear error: %q", r.err)
	}
	// A local.json of a cluster that is gone: a timeout naming where the
	// address came from.
	if err := os.MkdirAll(filepath.Join(home, ".shardkv"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(kvctl.LocalState{Ctrler: []string{"127.0.0.1:1"}, DataDir: "/nowhere", PID: 1 << 30})
	if err := os.WriteFile(filepath.Join(home, ".shardkv", "local.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r = expectCode(t, kvctl.ExitError, "query", "--timeout=300ms")
	if !strings.Contains(r.err, "local.json") || !strings.Contains(r.err, "no longer running") || strings.Count(r.err, "\n") != 1 {
		t.Fatalf("unclear error: %q", r.err)
	}
}

// startWorld runs a controller and groups 1 and 2 (joined), and group 3
// (started, not joined).
func startWorld(t *testing.T) (*kvtest.World, string) {
	// No history compaction during the test: it reads config 0 (and, on a
	// slow machine, more than the default 10 s may pass before it does).
	w := kvtest.New(t, kvtest.Options{Shards: nshards, CompactEvery: time.Hour})
	for gid := uint64(1); gid <= 3; gid++ {
		w.StartGroup(gid)
	}
	w.Join(1, 2)
	w.WaitSettled(30 * time.Second)
	return w, strings.Join(w.CtrlerAddrs(), ",")
}

func TestCluster(t *testing.T) {
	home := isolate(t)
	w, ctrl := startWorld(t)
	c := "--ctrler=" + ctrl

	t.Run("data", func(t *testing.T) {
		if r := mustRun(t, c, "put", "greeting", "hello"); r.out != "OK\n" {
			t.Fatalf("put: %q", r.out)
		}
		if r := mustRun(t, c, "get", "greeting"); r.out != "hello\n" {
			t.Fatalf("get: %q", r.out)
		}
		// Global flags after the command, and "--" for a value with a dash.
		mustRun(t, "append", "greeting", "--ctrler", ctrl, "--timeout=5s", "--", "-world")
		if r := mustRun(t, "get", "greeting", c); r.out != "hello-world\n" {
			t.Fatalf("get after append: %q", r.out)
		}
		r := mustRun(t, "get", "greeting", "--json", c)
		if v := decode[map[string]any](t, r); v["key"] != "greeting" || v["value"] != "hello-world" || v["found"] != true {
			t.Fatalf("get --json: %s", r.out)
		}
		if r := mustRun(t, c, "del", "greeting"); r.out != "deleted\n" {
			t.Fatalf("del: %q", r.out)
		}
		r = expectCode(t, kvctl.ExitNotFound, c, "get", "greeting")
		if r.out != "" || r.err != "kvctl: key \"greeting\" not found\n" {
			t.Fatalf("get missing: %s", r)
		}
		r = expectCode(t, kvctl.ExitNotFound, c, "del", "greeting")
		if r.out != "" || !strings.HasPrefix(r.err, "kvctl: ") {
			t.Fatalf("del missing: %s", r)
		}
		r = expectCode(t, kvctl.ExitNotFound, "--json", c, "get", "greeting")
		if v := decode[map[string]any](t, r); v["found"] != false {
			t.Fatalf("get --json missing: %s", r.out)
		}
		mustRun(t, c, "put", "empty", "")
		if r := mustRun(t, c, "get", "empty"); r.out != "\n" {
			t.Fatalf("get empty: %q", r.out)
		}
		r = mustRun(t, c, "--json", "put", "k2", "v2")
		if v := decode[map[string]any](t, r); v["ok"] != true {
			t.Fatalf("put --json: %s", r.out)
		}
	})

	t.Run("ctrler from env and local.json", func(t *testing.T) {
		t.Setenv(kvctl.EnvCtrler, ctrl)
		if r := mustRun(t, "get", "k2"); r.out != "v2\n" {
			t.Fatalf("get via env: %q", r.out)
		}
		t.Setenv(kvctl.EnvCtrler, "")
		if err := os.MkdirAll(filepath.Join(home, ".shardkv"), 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(kvctl.LocalState{Ctrler: w.CtrlerAddrs(), DataDir: t.TempDir(), PID: os.Getpid()})
		if err := os.WriteFile(kvctl.LocalStatePath(), b, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(kvctl.LocalStatePath())
		if r := mustRun(t, "get", "k2"); r.out != "v2\n" {
			t.Fatalf("get via local.json: %q", r.out)
		}
	})

	t.Run("query", func(t *testing.T) {
		r := mustRun(t, c, "query")
		t.Logf("query:\n%s", r.out)
		for _, want := range []string{"config ", "GROUP", "WEIGHT", "SERVERS", "SHARDS", "16 shards"} {
			if !strings.Contains(r.out, want) {
				t.Fatalf("query table lacks %q:\n%s", want, r.out)
			}
		}
		q := decode[configOut](t, mustRun(t, "query", c, "--json"))
		if len(q.Shards) != nshards || q.NShards != nshards || len(q.Groups) != 2 || q.Num == 0 {
			t.Fatalf("query --json: %+v", q)
		}
		for _, g := range q.Groups {
			if g.OwnedShards != nshards/2 || len(g.Servers) != 3 || g.Weight != 1 {
				t.Fatalf("group in query --json: %+v", g)
			}
		}
		if !strings.Contains(r.out, fmt.Sprintf("config %d ", q.Num)) {
			t.Fatalf("query table: %s", r.out)
		}
		if ql := decode[configOut](t, mustRun(t, c, "--json", "query", "-1")); ql.Num != q.Num {
			t.Fatalf("query -1: config %d, want %d", ql.Num, q.Num)
		}
		q0 := decode[configOut](t, mustRun(t, c, "--json", "query", "0"))
		if q0.Num != 0 || len(q0.Shards) != nshards || len(q0.Groups) != 0 || slices.ContainsFunc(q0.Shards, func(g uint64) bool { return g != 0 }) {
			t.Fatalf("query 0: %+v", q0)
		}
	})

	t.Run("move and unpin", func(t *testing.T) {
		q := decode[configOut](t, mustRun(t, c, "--json", "query"))
		from, to := q.Shards[0], uint64(1)
		if from == 1 {
			to = 2
		}
		// A move is planned: the owner stays until the cut-over. The target
		// cannot copy until the plan is cancelled below: an empty shard is
		// otherwise copied and cut over within a second, before the cancel.
		w.Faults.Refuse(func(req any) bool { _, ok := req.(*shardkvpb.FetchShardRequest); return ok })
		defer w.Faults.Refuse(nil)
		r := mustRun(t, c, "move", "0", fmt.Sprint(to))
		if !strings.Contains(r.out, fmt.Sprintf("shard 0 pinned to group %d; move from group %d planned", to, from)) || !strings.Contains(r.out, "PLANNED MOVES") {
			t.Fatalf("move: %s", r.out)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if q.Shards[0] != from || len(q.Pins) != 1 || q.Pins[0].Shard != 0 || q.Pins[0].GID != to ||
			len(q.Moves) != 1 || q.Moves[0].Shard != 0 || q.Moves[0].FromGID != from || q.Moves[0].ToGID != to || q.Moves[0].SinceConfig != q.Num {
			t.Fatalf("after move: %+v", q)
		}
		r = mustRun(t, c, "query")
		if !strings.Contains(r.out, "PINNED") || !strings.Contains(r.out, "PLANNED MOVES") {
			t.Fatalf("query: %s", r.out)
		}
		s := decode[statusOut](t, mustRun(t, c, "--json", "status"))
		if s.Settled || len(s.PlannedMoves) != 1 || s.PlannedMoves[0].ToGID != to {
			t.Fatalf("status with a planned move: %+v", s)
		}
		if r := mustRun(t, c, "status"); !strings.Contains(r.out, "PLANNED MOVES") || !strings.Contains(r.out, "1 moves planned") {
			t.Fatalf("status with a planned move:\n%s", r.out)
		}
		// Cancel: the shard stays (pinned) where it is.
		r = mustRun(t, c, "move", "--cancel", "0")
		if !strings.Contains(r.out, fmt.Sprintf("planned move of shard 0 to group %d cancelled", to)) {
			t.Fatalf("move --cancel: %s", r.out)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if q.Shards[0] != from || len(q.Moves) != 0 || len(q.Pins) != 1 || q.Pins[0].GID != from {
			t.Fatalf("after move --cancel: %+v", q)
		}
		r = expectCode(t, kvctl.ExitError, c, "move", "--cancel", "0")
		if !strings.Contains(r.err, "no planned move") {
			t.Fatalf("move --cancel without a plan: %s", r)
		}
		w.Faults.Refuse(nil)
		// Stop-and-copy hands the shard over at once; --wait follows it
		// until the target serves it.
		r = mustRun(t, c, "move", "0", fmt.Sprint(to), "--stop-and-copy", "--wait", "--timeout=30s")
		t.Logf("move --stop-and-copy --wait:\n%s", r.out)
		if !strings.Contains(r.out, "handed over to group") || !strings.Contains(r.out, fmt.Sprintf("served by group %d", to)) {
			t.Fatalf("move --stop-and-copy --wait: %s", r.out)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if q.Shards[0] != to || len(q.Moves) != 0 || len(q.Pins) != 1 || q.Pins[0].GID != to {
			t.Fatalf("after move --stop-and-copy: %+v", q)
		}
		// A planned move followed with --wait; the targets here do not
		// pre-copy, so the test reports for them.
		done := make(chan result, 1)
		go func() { done <- run(c, "move", "0", fmt.Sprint(from), "--wait", "--timeout=30s") }()
		stop := reportCaughtUpUntilDone(t, ctrl)
		r = <-done
		stop()
		t.Logf("move --wait:\n%s", r)
		if r.code != 0 || !strings.Contains(r.out, "announced in config") || !strings.Contains(r.out, "cut over in config") || !strings.Contains(r.out, fmt.Sprintf("served by group %d", from)) {
			t.Fatalf("move --wait: %s", r)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "unpin", "0"))
		if len(q.Pins) != 0 || len(q.Moves) != 0 || q.Shards[0] != from {
			t.Fatalf("after unpin: %+v", q)
		}
		// Refusals print the controller's message.
		r = expectCode(t, kvctl.ExitError, c, "move", "0", "99")
		if !strings.HasPrefix(r.err, "kvctl: refused: ") || !strings.Contains(r.err, "99") || strings.Count(r.err, "\n") != 1 {
			t.Fatalf("move to unknown gid: %s", r)
		}
		r = expectCode(t, kvctl.ExitError, c, "unpin", "0")
		if !strings.HasPrefix(r.err, "kvctl: refused: ") {
			t.Fatalf("unpin of unpinned shard: %s", r)
		}
		w.WaitSettled(30 * time.Second)
	})

	t.Run("member list", func(t *testing.T) {
		r := mustRun(t, c, "member", "list", "--group", "1")
		t.Logf("member list:\n%s", r.out)
		if !strings.Contains(r.out, "leader") || !strings.Contains(r.out, "follower") || !strings.Contains(r.out, "APPLIED") {
			t.Fatalf("member list: %s", r.out)
		}
		type listOut struct {
			GroupID uint64      `json:"group_id"`
			Leader  uint64      `json:"leader"`
			Members []memberOut `json:"members"`
		}
		l := decode[listOut](t, mustRun(t, c, "member", "list", "--group=1", "--json"))
		if l.GroupID != 1 || l.Leader == 0 || len(l.Members) != 3 {
			t.Fatalf("member list --json: %+v", l)
		}
		leaders := 0
		for _, m := range l.Members {
			if !m.Reachable || !m.Member || m.Applied == 0 || m.Addr != w.Groups[1].Nodes[m.ID].Addr {
				t.Fatalf("member: %+v", m)
			}
			if m.Role == "leader" {
				leaders++
			}
		}
		if leaders != 1 {
			t.Fatalf("leaders: %+v", l)
		}
		// The controller group, and a group addressed by one server.
		l = decode[listOut](t, mustRun(t, c, "--json", "member", "list", "--group", "ctrler"))
		if len(l.Members) != 3 || l.Leader == 0 {
			t.Fatalf("member list ctrler: %+v", l)
		}
		l = decode[listOut](t, mustRun(t, "--json", "member", "list", "--server", w.Groups[3].Nodes[2].Addr))
		if l.GroupID != 3 || len(l.Members) != 3 {
			t.Fatalf("member list --server: %+v", l)
		}
		// An unjoined group is not in the config.
		r = expectCode(t, kvctl.ExitError, c, "member", "list", "--group", "42")
		if !strings.Contains(r.err, "--server") {
			t.Fatalf("member list of unknown group: %s", r)
		}
	})

	t.Run("status", func(t *testing.T) {
		r := mustRun(t, c, "status")
		t.Logf("status:\n%s", r.out)
		for _, want := range []string{"CONTROLLER", "DATA GROUPS", "DATA GROUP MEMBERS", "SHARD STATES", "Serving=8", "leader", "settled"} {
			if !strings.Contains(r.out, want) {
				t.Fatalf("status lacks %q:\n%s", want, r.out)
			}
		}
		s := decode[statusOut](t, mustRun(t, "status", c, "--json"))
		if s.NShards != nshards || s.ConfigNum == 0 || s.Controller.Leader == 0 || len(s.Controller.Members) != 3 ||
			len(s.Config.Shards) != nshards || !s.Settled || len(s.Migrations) != 0 {
			t.Fatalf("status --json: %s", r.out)
		}
		gids := map[uint64]bool{}
		for _, g := range s.Groups {
			gids[g.GID] = true
			if g.InConfig && (g.Leader == 0 || g.Term == 0 || g.Applied == 0 || g.ConfigNum != s.ConfigNum ||
				g.ShardStates["Serving"] != g.OwnedShards || len(g.Members) != 3 || g.InfoFrom == "none") {
				t.Fatalf("group %d in status --json: %+v", g.GID, g)
			}
		}
		if !gids[1] || !gids[2] {
			t.Fatalf("status --json groups: %+v", s.Groups)
		}
		// A member that is down is shown as such, quickly.
		g2 := w.Groups[2]
		down := uint64(1)
		if g2.Leader() == down {
			down = 2
		}
		g2.Crash(down)
		t0 := time.Now()
		r = mustRun(t, c, "status")
		if !strings.Contains(r.out, "unreachable") || time.Since(t0) > 5*time.Second {
			t.Fatalf("status with replica %d of group 2 down (%v):\n%s", down, time.Since(t0), r.out)
		}
		s = decode[statusOut](t, mustRun(t, c, "--json", "status"))
		for _, g := range s.Groups {
			for _, m := range g.Members {
				if m.Reachable != (g.GID != 2 || m.ID != down) || (!m.Reachable && (m.Role != "unreachable" || m.Error == "")) {
					t.Fatalf("group %d member in status --json: %+v", g.GID, m)
				}
			}
		}
		g2.Start(down)
	})

	t.Run("join and leave", func(t *testing.T) {
		g3 := w.Groups[3]
		var addrs []string
		for _, id := range g3.IDs() {
			addrs = append(addrs, g3.Nodes[id].Addr)
		}
		// A wrong gid for these addresses is caught before the join.
		r := expectCode(t, kvctl.ExitError, c, "join", "4="+strings.Join(addrs, ","))
		if !strings.Contains(r.err, "group 3, not of group 4") {
			t.Fatalf("join with wrong gid: %s", r)
		}
		r = mustRun(t, c, "join", "3="+strings.Join(addrs, ","), "--weight", "2")
		if !strings.Contains(r.out, "joined group 3") || !strings.Contains(r.out, "PLANNED MOVES") {
			t.Fatalf("join: %s", r.out)
		}
		// The join plans moves to group 3; it owns nothing until they are
		// cut over.
		q := decode[configOut](t, mustRun(t, c, "--json", "query"))
		var found bool
		for _, g := range q.Groups {
			if g.GID == 3 {
				found = true
				if g.Weight != 2 || len(g.Servers) != 3 || g.OwnedShards != 0 {
					t.Fatalf("joined group: %+v", g)
				}
				for i, s := range g.Servers {
					if s.ID != uint64(i+1) || s.Addr != g3.Nodes[s.ID].Addr {
						t.Fatalf("joined group servers: %+v", g.Servers)
					}
				}
			}
		}
		if !found || len(q.Moves) == 0 {
			t.Fatalf("group 3 not in config, or nothing planned: %+v", q)
		}
		for _, m := range q.Moves {
			if m.ToGID != 3 || m.SinceConfig != q.Num {
				t.Fatalf("planned move: %+v", m)
			}
		}
		// The new group's own reports may cut some moves over between the
		// query and the status (CI at c8a9159 saw config 9, moves of 4 of
		// the 8 shards cut over): the status is at the join's config or
		// later, not settled, and plans no move the join did not.
		s := decode[statusOut](t, mustRun(t, c, "--json", "status"))
		if s.ConfigNum < q.Num || s.Settled || len(s.PlannedMoves) > len(q.Moves) || len(s.PlannedMoves)+len(s.Migrations) == 0 {
			t.Fatalf("status after join (config %d, %d moves planned): %+v", q.Num, len(q.Moves), s)
		}
		cutOverAll(t, ctrl)
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if !slices.Contains(q.Shards, 3) || len(q.Moves) != 0 {
			t.Fatalf("after the cut-over: %+v", q)
		}
		// Right after the cut-over: moving, or already settled.
		s = decode[statusOut](t, mustRun(t, c, "--json", "status"))
		if s.ConfigNum != q.Num || (!s.Settled && len(s.Migrations) == 0 && allAt(s, q.Num)) {
			t.Fatalf("status after the cut-over: %+v", s)
		}
		for _, m := range s.Migrations {
			if m.Source == m.Target || (m.Source != 3 && m.Target != 3) {
				t.Fatalf("migration: %+v", m)
			}
		}
		r = mustRun(t, c, "status")
		t.Logf("status after join:\n%s", r.out)
		if !strings.Contains(r.out, "settled") {
			t.Fatalf("status: %s", r.out)
		}
		w.WaitSettled(30 * time.Second)
		s = decode[statusOut](t, mustRun(t, c, "--json", "status"))
		if !s.Settled || len(s.Migrations) != 0 {
			t.Fatalf("status after settling: %+v", s)
		}
		// Re-joining without --weight keeps the weight.
		q = decode[configOut](t, mustRun(t, c, "--json", "join", "3="+strings.Join(addrs, ",")))
		for _, g := range q.Groups {
			if g.GID == 3 && g.Weight != 2 {
				t.Fatalf("re-join reset the weight: %+v", g)
			}
		}
		// A leaving group stays, marked, until its shards are cut over. Its
		// shards cannot be copied away until the join below takes it back:
		// small shards are otherwise copied and cut over within a second,
		// and the group is gone before the join (a fresh-clone CI run).
		w.Faults.Refuse(func(req any) bool { _, ok := req.(*shardkvpb.FetchShardRequest); return ok })
		defer w.Faults.Refuse(nil)
		r = mustRun(t, c, "leave", "3")
		if !strings.Contains(r.out, "group 3 left") || !strings.Contains(r.out, "3 (leaving)") {
			t.Fatalf("leave: %s", r.out)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if len(q.Groups) != 3 || !q.Groups[2].Leaving || len(q.Moves) == 0 {
			t.Fatalf("after leave: %+v", q)
		}
		if r := mustRun(t, c, "leave", "3"); !strings.Contains(r.out, "group 3 left") {
			t.Fatalf("second leave: %s", r)
		}
		r = expectCode(t, kvctl.ExitError, c, "move", "0", "3")
		if !strings.Contains(r.err, "leaving") {
			t.Fatalf("move to a leaving group: %s", r)
		}
		// A join takes it back; leave again.
		r = mustRun(t, c, "join", "3="+strings.Join(addrs, ","))
		if !strings.Contains(r.out, "taken back") {
			t.Fatalf("rejoin: %s", r.out)
		}
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if len(q.Groups) != 3 || q.Groups[2].Leaving {
			t.Fatalf("after rejoin: %+v", q)
		}
		w.Faults.Refuse(nil)
		mustRun(t, c, "leave", "3")
		cutOverAll(t, ctrl)
		q = decode[configOut](t, mustRun(t, c, "--json", "query"))
		if slices.Contains(q.Shards, 3) || len(q.Groups) != 2 {
			t.Fatalf("after leave: %+v", q)
		}
		w.WaitSettled(30 * time.Second)
		if r := mustRun(t, c, "get", "k2"); r.out != "v2\n" {
			t.Fatalf("get after moves: %q", r.out)
		}
		r = expectCode(t, kvctl.ExitError, c, "leave", "3")
		if !strings.HasPrefix(r.err, "kvctl: refused: ") {
			t.Fatalf("leave of absent group: %s", r)
		}
	})

	t.Run("membership", func(t *testing.T) {
		mustRun(t, c, "put", "m", "1")
		g1 := w.Groups[1]
		nd := g1.AddNode(4)
		r := mustRun(t, c, "member", "add", "4", nd.Addr, "--group", "1")
		if !strings.Contains(r.out, "as a learner") {
			t.Fatalf("member add: %s", r.out)
		}
		type listOut struct {
			Leader  uint64      `json:"leader"`
			Members []memberOut `json:"members"`
		}
		waitFor(t, "replica 4 to report itself a caught-up learner", func() bool {
			l := decode[listOut](t, mustRun(t, c, "--json", "member", "list", "--group", "1"))
			for _, m := range l.Members {
				if m.ID == 4 && m.Learner && m.Role == "learner" && m.Match > 0 {
					return true
				}
			}
			return false
		})
		r = mustRun(t, c, "member", "promote", "4", "--group", "1")
		t.Logf("member promote:\n%s", r.out)
		if !strings.Contains(r.out, "promoted") || !strings.Contains(r.out, "now use") {
			t.Fatalf("member promote: %s", r.out)
		}
		q := decode[configOut](t, mustRun(t, c, "--json", "query"))
		if len(q.Groups[0].Servers) != 4 || q.Groups[0].Servers[3].Addr != nd.Addr {
			t.Fatalf("config after promote: %+v", q.Groups[0])
		}
		// Move leadership to replica 4, then away again, and remove it.
		r = mustRun(t, c, "transfer-leader", "4", "--group", "1")
		if !strings.Contains(r.out, "replica 4 now leads group 1") {
			t.Fatalf("transfer-leader: %s", r.out)
		}
		r = expectCode(t, kvctl.ExitError, c, "member", "remove", "4", "--group", "1")
		t.Logf("removing the leader: %s", r.err)
		if !strings.Contains(r.err, "leader") || strings.Count(r.err, "\n") != 1 {
			t.Fatalf("removing the leader: %s", r)
		}
		mustRun(t, c, "transfer-leader", "2", "--group", "1")
		m := decode[membershipOut](t, mustRun(t, c, "--json", "member", "remove", "4", "--group", "1"))
		if m.GroupID != 1 || len(m.Members) != 3 || m.Config == nil || len(m.Config.Groups[0].Servers) != 3 {
			t.Fatalf("member remove --json: %+v", m)
		}
		g1.Remove(4)
		l := decode[listOut](t, mustRun(t, c, "--json", "member", "list", "--group", "1"))
		if len(l.Members) != 3 || l.Leader != 2 {
			t.Fatalf("member list after remove: %+v", l)
		}
		w.WaitSettled(30 * time.Second)
		if s := decode[statusOut](t, mustRun(t, c, "--json", "status")); !s.Settled || len(s.Groups[0].Members) != 3 {
			t.Fatalf("status after membership changes: %+v", s)
		}
		if r := mustRun(t, c, "get", "m"); r.out != "1\n" {
			t.Fatalf("get after membership changes: %q", r.out)
		}
	})

	t.Run("bench", func(t *testing.T) {
		r := mustRun(t, c, "bench", "--duration=1200ms", "--clients=3", "--keys=20", "--value-size=16")
		t.Logf("bench:\n%s\nstderr:\n%s", r.out, r.err)
		for _, want := range []string{"OPS/S", "P50", "P90", "P99", "MAX", "ERRORS", "get", "put", "all"} {
			if !strings.Contains(r.out, want) {
				t.Fatalf("bench table lacks %q:\n%s", want, r.out)
			}
		}
		if !strings.Contains(r.err, "ops/s") {
			t.Fatalf("bench progress line missing on a non-TTY stderr: %q", r.err)
		}
		type benchOut struct {
			Ops    uint64 `json:"ops"`
			Errors uint64 `json:"errors"`
			ByOp   []struct {
				Op    string  `json:"op"`
				Ops   uint64  `json:"ops"`
				P50Ms float64 `json:"p50_ms"`
				P99Ms float64 `json:"p99_ms"`
				MaxMs float64 `json:"max_ms"`
			} `json:"by_op"`
		}
		b := decode[benchOut](t, mustRun(t, c, "--json", "bench", "--ops=40", "--clients=2", "--read-ratio=0.25"))
		if b.Ops != 40 || len(b.ByOp) != 3 || b.ByOp[2].Op != "all" || b.ByOp[2].Ops != 40 || b.ByOp[2].P50Ms <= 0 || b.ByOp[2].MaxMs < b.ByOp[2].P99Ms {
			t.Fatalf("bench --json: %+v", b)
		}
	})

	t.Run("fill and verify", func(t *testing.T) {
		r := mustRun(t, c, "fill", "--keys=50", "--value-size=40", "--key-prefix=fv:", "--passes=2", "--clients=3")
		if !strings.Contains(r.out, "50 keys of 40 bytes: 100 operations") {
			t.Fatalf("fill: %s", r)
		}
		type fillOut struct {
			Ops      uint64 `json:"ops"`
			Errors   uint64 `json:"errors"`
			Missing  uint64 `json:"missing"`
			Wrong    uint64 `json:"wrong"`
			FirstBad string `json:"first_bad"`
		}
		if v := decode[fillOut](t, mustRun(t, c, "--json", "verify", "--keys=50", "--value-size=40", "--key-prefix=fv:")); v.Ops != 50 || v.Missing+v.Wrong+v.Errors != 0 {
			t.Fatalf("verify after fill: %+v", v)
		}
		// One key lost and one overwritten: both are found, and it fails.
		mustRun(t, c, "del", "fv:7")
		mustRun(t, c, "put", "fv:9", "something else")
		r = run(c, "--json", "verify", "--keys=50", "--value-size=40", "--key-prefix=fv:")
		if v := decode[fillOut](t, r); r.code != 1 || v.Missing != 1 || v.Wrong != 1 || v.FirstBad == "" {
			t.Fatalf("verify after a loss: exit %d, %+v", r.code, v)
		}
		if r := run(c, "verify", "--keys=50", "--value-size=40", "--key-prefix=fv:"); r.code != 1 ||
			!strings.Contains(r.err, "of 50 keys, 1 missing, 1 with a wrong value, 0 unread") {
			t.Fatalf("verify after a loss: %s", r)
		}
	})

	// The command end to end (pkg/workload tests the workload itself):
	// the check's result on stdout, the progress on stderr, the exit code.
	t.Run("workload", func(t *testing.T) {
		r := mustRun(t, c, "--json", "workload", "--clients=3", "--keys=6", "--rate=0", "--duration=1500ms", "--check", "--listen=")
		type result struct {
			Linearizable bool   `json:"linearizable"`
			CheckResult  string `json:"checkResult"`
			Keys         int    `json:"keys"`
			OK           int    `json:"ok"`
		}
		if res := decode[result](t, r); !res.Linearizable || res.CheckResult != "ok" || res.Keys != 6 || res.OK == 0 {
			t.Fatalf("workload --check --json: %s", r.out)
		}
		if !strings.Contains(r.err, "protocol grpc, controller "+ctrl) || !strings.Contains(r.err, "stopped: ") {
			t.Fatalf("workload stderr:\n%s", r.err)
		}
		if r := mustRun(t, c, "workload", "--clients=2", "--keys=2", "--duration=500ms", "--check", "--listen="); !strings.HasPrefix(r.out, "ok: ") {
			t.Fatalf("workload --check: %s", r)
		}
		mustRun(t, c, "put", "wl-taken-0", "x")
		r = expectCode(t, kvctl.ExitError, c, "workload", "--prefix=taken", "--duration=2s", "--check", "--listen=")
		if !strings.Contains(r.err, "already has a value") {
			t.Fatalf("workload on a taken key: %s", r)
		}
	})
}

// reportCaughtUp reports, for every target of a planned move in the
// latest config, that its pre-copy has caught up (the data groups here do
// not pre-copy); the controller leader then cuts the moves over. It
// returns whether anything was planned.
func reportCaughtUp(t *testing.T, cl *ctrlerclient.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	latest, err := cl.Query(ctx, -1)
	if err != nil {
		t.Error(err)
		return false
	}
	reports := map[uint64]*shardkvpb.GroupReport{}
	for _, m := range latest.Moves {
		r := reports[m.ToGid]
		if r == nil {
			r = &shardkvpb.GroupReport{Gid: m.ToGid, LeaderId: 1}
			reports[m.ToGid] = r
		}
		r.Shards = append(r.Shards, &shardkvpb.ShardState{Shard: m.Shard, State: "PreCopying", ConfigNum: m.SinceConfig, PeerGid: m.FromGid,
			Phase: "delta", Keys: 3, TotalKeys: 3, Bytes: 100, TotalBytes: 100, CaughtUp: true})
	}
	for _, r := range reports {
		if _, err := cl.Report(ctx, r); err != nil {
			t.Error(err)
		}
	}
	return len(latest.Moves) > 0
}

func ctrlerClient(t *testing.T, ctrl string) *ctrlerclient.Client {
	cl, err := ctrlerclient.New(strings.Split(ctrl, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// cutOverAll reports for the targets until every planned move is cut over.
func cutOverAll(t *testing.T, ctrl string) {
	t.Helper()
	cl := ctrlerClient(t, ctrl)
	waitFor(t, "the planned moves to be cut over", func() bool { return !reportCaughtUp(t, cl) })
}

// reportCaughtUpUntilDone reports for the targets of whatever is planned,
// every 20 ms, until the returned stop is called.
func reportCaughtUpUntilDone(t *testing.T, ctrl string) (stop func()) {
	cl := ctrlerClient(t, ctrl)
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			reportCaughtUp(t, cl)
		}
	}()
	return func() { close(quit); <-finished }
}

type membershipOut struct {
	GroupID uint64 `json:"group_id"`
	Members []struct {
		ID      uint64 `json:"id"`
		Learner bool   `json:"learner"`
	} `json:"members"`
	Config *configOut `json:"config"`
}

func allAt(s statusOut, num uint64) bool {
	for _, g := range s.Groups {
		if g.InConfig && g.ConfigNum != num {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
