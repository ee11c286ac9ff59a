package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/node"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// opTimeout is the per-operation context of client calls: generous, since
// an op may span an election and a restart; the tests assert outcomes, not
// latency.
const opTimeout = 30 * time.Second

// localStopBound bounds how long `node local` may take to stop: its own
// bound for the children (node.ShutdownTimeout + 4s) plus slack.
const localStopBound = node.ShutdownTimeout + 10*time.Second

func newClient(t *testing.T, ctrl []string) *client.Client {
	t.Helper()
	c, err := client.New(ctrl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func put(t *testing.T, c *client.Client, k, v string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.Put(ctx, k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func checkGet(t *testing.T, c *client.Client, k, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	v, ok, err := c.Get(ctx, k)
	if err != nil || !ok || v != want {
		t.Fatalf("get %s = %q, %v, %v; want %q", k, v, ok, err, want)
	}
}

// TestLocalClusterKillRestart runs `node local` as a real process tree:
// it serves; kill -9 of a data-group leader and of the controller leader
// loses nothing, writes continue after new elections and the supervisor
// restarts both; the tree stops cleanly on SIGINT; a contradicting flag on
// its data dir is refused; the restarted cluster has all the data.
func TestLocalClusterKillRestart(t *testing.T) {
	needProcesses(t)
	c := startLocal(t, 9, "--groups=2", "--replicas=3", "--ctrler-replicas=3", "--spare-groups=0", "--shards=16")

	// ~/.shardkv/local.json (HOME is the test's) names the same controllers
	// as the printed table, this data dir and the supervisor's pid.
	var st node.LocalState
	b, err := os.ReadFile(filepath.Join(c.home, ".shardkv", "local.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Ctrler, c.ctrl) || st.DataDir != c.dataDir || st.PID != c.pid() {
		t.Fatalf("local.json = %+v; want ctrler %v, data dir %s, pid %d", st, c.ctrl, c.dataDir, c.pid())
	}
	if len(c.ctrl) != 3 || len(c.groupAddrs(1)) != 3 || len(c.groupAddrs(2)) != 3 {
		t.Fatalf("endpoint table: %v", c.eps)
	}

	cl := newClient(t, st.Ctrler)
	const n = 40
	for i := 0; i < n; i++ {
		put(t, cl, fmt.Sprintf("key-%03d", i), fmt.Sprintf("v1-%d", i))
	}

	// kill -9 the leader of data group 1 and the controller leader.
	gAddr, gTerm := groupLeader(t, c.ctrl, 1, 20*time.Second)
	cAddr, cTerm := raftLeader(t, c.ctrl, 20*time.Second)
	gPid, cPid := pidListening(t, gAddr, 5*time.Second), pidListening(t, cAddr, 5*time.Second)
	t.Logf("kill -9 %s (pid %d, group 1 leader, term %d) and %s (pid %d, controller leader, term %d)",
		c.nameOf(gAddr), gPid, gTerm, c.nameOf(cAddr), cPid, cTerm)
	for _, pid := range []int{gPid, cPid} {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}

	// Writes and reads go on: the client finds the new leaders itself.
	for i := 0; i < n; i++ {
		put(t, cl, fmt.Sprintf("key-%03d", n+i), fmt.Sprintf("v1-%d", n+i))
		checkGet(t, cl, fmt.Sprintf("key-%03d", i), fmt.Sprintf("v1-%d", i))
	}
	// New elections happened (the old leaders may have been restarted by
	// now and even lead again, but in a later term).
	if _, term := groupLeader(t, c.ctrl, 1, 20*time.Second); term <= gTerm {
		t.Fatalf("group 1 term %d after killing its leader in term %d", term, gTerm)
	}
	if _, term := raftLeader(t, c.ctrl, 20*time.Second); term <= cTerm {
		t.Fatalf("controller term %d after killing its leader in term %d", term, cTerm)
	}
	// The supervisor noticed and restarted both.
	for _, p := range []struct {
		addr string
		pid  int
	}{{gAddr, gPid}, {cAddr, cPid}} {
		line := fmt.Sprintf("%s (pid %d) exited: signal: killed; restarting in", c.nameOf(p.addr), p.pid)
		if !c.waitOutput(line, 10*time.Second, false) {
			t.Fatalf("node local did not print %q:\n%s", line, c.out.String())
		}
		newPid := pidListening(t, p.addr, 15*time.Second)
		if newPid == p.pid {
			t.Fatalf("%s still has pid %d", p.addr, newPid)
		}
		// The restarted replica is back in its group.
		deadline := time.Now().Add(20 * time.Second)
		for {
			ms, err := adminStatus(context.Background(), p.addr)
			if err == nil && (ms.Role == "follower" || ms.Role == "leader") && ms.Leader != 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("restarted %s: %v %v", p.addr, ms, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	put(t, cl, "after-restart", "yes")

	// A replica whose disk was lost must not come back under its old id:
	// an empty data dir bootstrapping into group 1 (which has run) is
	// refused, and the data dir is left empty for a proper --join.
	g1 := c.groupAddrs(1)
	lost := filepath.Join(c.dir, "lost-disk")
	code, out := runNode(t, c.home, nil, "serve", "--role=group", "--group=1", "--id=1", "--data-dir="+lost,
		"--listen="+g1[0], fmt.Sprintf("--peers=1=%s,2=%s,3=%s", g1[0], g1[1], g1[2]), "--ctrler="+strings.Join(c.ctrl, ","))
	if code == 0 || !strings.Contains(out, "replica 1 has an empty data dir, but group 1 already exists") ||
		!strings.Contains(out, "start it with --join and a new id") {
		t.Fatalf("re-bootstrapping group 1 from an empty data dir: exit %d, output:\n%s", code, out)
	}
	if ents, _ := os.ReadDir(lost); len(ents) != 0 {
		t.Fatalf("a refused start left files in %s: %v", lost, ents)
	}

	// SIGINT stops the whole tree cleanly.
	code, took := c.stop(syscall.SIGINT, localStopBound)
	t.Logf("node local stopped in %v after SIGINT", took.Round(time.Millisecond))
	if out := c.out.String(); code != 0 || !strings.Contains(out, "stopping all replicas...\n") || !strings.HasSuffix(out, "stopped\n") {
		t.Fatalf("node local exit code %d after SIGINT; stdout:\n%s", code, c.out.String())
	}
	if left := nodesUnder(c.dataDir); len(left) > 0 {
		t.Fatalf("processes left after node local stopped: %v", left)
	}

	// A flag contradicting the cluster on disk is refused.
	code, out = runNode(t, c.home, nil, "local", "--data-dir="+c.dataDir, "--groups=3")
	if code == 0 || !strings.Contains(out, "--groups=3 (the cluster has 2)") || !strings.Contains(out, "Drop them to resume it") {
		t.Fatalf("node local --groups=3 on a 2-group data dir: exit %d, output:\n%s", code, out)
	}
	if left := nodesUnder(c.dataDir); len(left) > 0 {
		t.Fatalf("a refused node local left processes: %v", left)
	}

	// Resume with no shape flags: the same cluster, with all its data.
	r := &localCluster{dir: c.dir, home: c.home, dataDir: c.dataDir}
	r.proc = startProc(t, "node local (resumed)", c.home, c.dir, nil, "local", "--data-dir="+c.dataDir)
	if !r.waitServing(t, 90*time.Second) {
		t.Fatalf("resumed cluster did not serve:\n%s\n%s", r.out.String(), r.errOut.String())
	}
	if !strings.Contains(r.out.String(), "resuming the cluster in "+c.dataDir) || !slices.Equal(r.ctrl, c.ctrl) {
		t.Fatalf("resume output:\n%s", r.out.String())
	}
	cl2 := newClient(t, r.ctrl)
	for i := 0; i < 2*n; i++ {
		checkGet(t, cl2, fmt.Sprintf("key-%03d", i), fmt.Sprintf("v1-%d", i))
	}
	checkGet(t, cl2, "after-restart", "yes")
	code, took = r.stop(syscall.SIGTERM, localStopBound)
	t.Logf("resumed node local stopped in %v after SIGTERM", took.Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("resumed node local exit code %d", code)
	}
}

// TestSIGTERMLeaderUnderLoad: SIGTERM to a data-group leader while 16
// clients write. No client call fails (the client retries redirects
// itself), the leader hands over leadership, drains and exits 0 within
// 10s, and every acknowledged write is readable afterwards.
func TestSIGTERMLeaderUnderLoad(t *testing.T) {
	needProcesses(t)
	c := startLocal(t, 4, "--groups=1", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")

	const clients = 16
	var (
		stop    atomic.Bool
		ops     atomic.Int64
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
		lastVal = make([]map[string]string, clients)
	)
	for w := 0; w < clients; w++ {
		cl := newClient(t, c.ctrl)
		lastVal[w] = map[string]string{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k, v := fmt.Sprintf("w%02d-k%d", w, i%8), fmt.Sprintf("%d", i)
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				err := cl.Put(ctx, k, v)
				cancel()
				if err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("client %d put %s: %w", w, k, err))
					errMu.Unlock()
					return
				}
				lastVal[w][k] = v
				ops.Add(1)
			}
		}()
	}
	waitOps := func(n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for ops.Load() < n {
			errMu.Lock()
			failed := len(errs) > 0
			errMu.Unlock()
			if failed {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d writes done, want %d (%s)", ops.Load(), n, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitOps(200, "before SIGTERM")

	// Find the leader and its pid, and check it still leads right before
	// the signal.
	var (
		leader string
		term   uint64
		pid    int
	)
	for attempt := 1; ; attempt++ {
		leader, term = groupLeader(t, c.ctrl, 1, 20*time.Second)
		pid = pidListening(t, leader, 5*time.Second)
		if ms, err := adminStatus(context.Background(), leader); err == nil && ms.Role == "leader" {
			break
		} else if attempt == 5 {
			t.Fatalf("%s no longer leads: %v %v", leader, ms, err)
		}
	}
	name := c.nameOf(leader)
	before := ops.Load()
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exitAt, ok := waitGone(pid, 20*time.Second)
	if !ok {
		t.Fatalf("%s (pid %d) still running 20s after SIGTERM", name, pid)
	}
	took := exitAt.Sub(start)
	t.Logf("SIGTERM to %s (pid %d, leader in term %d): exited after %v, %d writes done meanwhile",
		name, pid, term, took.Round(time.Millisecond), ops.Load()-before)
	if took > 10*time.Second {
		t.Errorf("leader took %v to exit after SIGTERM; want < 10s", took)
	}
	// Writes keep going through the new leader.
	waitOps(ops.Load()+200, "after the leader exited")
	stop.Store(true)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	// It exited cleanly (status 0), after handing over leadership and
	// draining its in-flight requests.
	line := fmt.Sprintf("%s (pid %d) exited: <nil>; restarting", name, pid)
	if !c.waitOutput(line, 10*time.Second, false) {
		t.Fatalf("node local did not print %q:\n%s", line, c.out.String())
	}
	log, _ := os.ReadFile(filepath.Join(c.dataDir, "logs", name+".log"))
	if !strings.Contains(string(log), "transferred leadership before shutdown") {
		t.Errorf("%s did not transfer leadership before shutdown:\n%s", name, tail(string(log), 3000))
	}
	if strings.Contains(string(log), "in-flight requests did not finish in time") {
		t.Errorf("%s did not drain gracefully:\n%s", name, tail(string(log), 3000))
	}

	// Every acknowledged write is there.
	cl := newClient(t, c.ctrl)
	for w := range lastVal {
		for k, v := range lastVal[w] {
			checkGet(t, cl, k, v)
		}
	}
	t.Logf("%d writes by %d clients, none failed", ops.Load(), clients)
	if code, _ := c.stop(syscall.SIGTERM, localStopBound); code != 0 {
		t.Fatalf("node local exit code %d", code)
	}
}

// TestMetricsAndHealth: /metrics serves the documented series with live
// values (Raft term, commit and applied index, is-leader, proposals,
// ReadIndex rounds, shards by state, migration keys and bytes after a real
// migration, errors by kind after a provoked WRONG_GROUP); /healthz and
// /readyz answer on every replica; a replica that cannot reach its
// controller is live but not ready, with the reason, until it is stopped.
func TestMetricsAndHealth(t *testing.T) {
	needProcesses(t)
	c := startLocal(t, 3, "--groups=1", "--replicas=1", "--ctrler-replicas=1", "--spare-groups=1", "--shards=16")
	g1, g2 := c.eps["group-1-1"], c.eps["group-2-1"]

	cl := newClient(t, c.ctrl)
	const n = 64
	for i := 0; i < n; i++ {
		put(t, cl, fmt.Sprintf("m-%02d", i), strings.Repeat("x", 100))
	}
	for i := 0; i < n; i++ {
		checkGet(t, cl, fmt.Sprintf("m-%02d", i), strings.Repeat("x", 100))
	}

	// Client activity in the Admin status: none yet at the spare group.
	if ms, err := adminStatus(context.Background(), g2.grpc); err != nil || ms.ClientIdleMs != nil {
		t.Fatalf("spare group before any client request: client_idle_ms %v (%v), want absent", ms.GetClientIdleMs(), err)
	}

	// Join the spare group: half the shards migrate to it.
	cc, err := ctrlerclient.New(c.ctrl)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conf, err := cc.Join(ctx, &shardkvpb.Group{Gid: 2, Servers: []*shardkvpb.Server{{Id: 1, Addr: g2.grpc}}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		// Served, and every announced move cut over.
		st, err := cc.Status(ctx)
		if err == nil && st.Latest.Num >= conf.Num && len(st.Latest.Moves) == 0 && served(st) {
			conf = st.Latest
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("shards did not settle after join: %v %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		checkGet(t, cl, fmt.Sprintf("m-%02d", i), strings.Repeat("x", 100))
	}

	// A Get sent straight to the group that no longer owns the key.
	var wrongKey string
	for i := 0; i < n && wrongKey == ""; i++ {
		if k := fmt.Sprintf("m-%02d", i); routing.GroupOf([]byte(k), conf.Shards) == 2 {
			wrongKey = k
		}
	}
	if wrongKey == "" {
		t.Fatalf("no key moved to group 2: %v", conf.Shards)
	}
	conn, err := grpc.NewClient(g1.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = shardkvpb.NewKVClient(conn).Get(ctx, &shardkvpb.GetRequest{Key: []byte(wrongKey)})
	if shardkvpb.Reason(err) != shardkvpb.ReasonWrongGroup {
		t.Fatalf("Get %s at group 1: %v; want WRONG_GROUP", wrongKey, err)
	}
	// That refused Get counts as client activity: it came just now.
	if ms, err := adminStatus(ctx, g1.grpc); err != nil || ms.ClientIdleMs == nil || *ms.ClientIdleMs > 5000 {
		t.Fatalf("group 1 after a client request: client_idle_ms %v (%v), want under 5s", ms.GetClientIdleMs(), err)
	}

	m1 := metrics(t, "http://"+g1.http+"/metrics")
	m2 := metrics(t, "http://"+g2.http+"/metrics")
	mc := metrics(t, "http://"+c.eps["ctrler-1"].http+"/metrics")
	positive := func(name string, m map[string]float64, series ...string) {
		t.Helper()
		for _, s := range series {
			if v, ok := m[s]; !ok || v <= 0 {
				t.Errorf("%s: %s = %v (present %v); want > 0", name, s, v, ok)
			}
		}
	}
	raft := []string{"shardkv_raft_term", "shardkv_raft_commit_index", "shardkv_raft_applied_index",
		"shardkv_raft_is_leader", "shardkv_raft_proposals_total"}
	positive("group-1-1", m1, append(raft, "shardkv_raft_read_index_rounds_total",
		`shardkv_shards{state="Serving"}`, `shardkv_errors_total{kind="WRONG_GROUP"}`)...)
	positive("group-2-1", m2, append(raft, `shardkv_shards{state="Serving"}`,
		"shardkv_migration_keys_total", "shardkv_migration_bytes_total")...)
	positive("ctrler-1", mc, raft...)
	for _, m := range []map[string]float64{m1, m2} {
		if m["shardkv_raft_applied_index"] > m["shardkv_raft_commit_index"] {
			t.Errorf("applied %v > commit %v", m["shardkv_raft_applied_index"], m["shardkv_raft_commit_index"])
		}
		for _, s := range []string{"Pulling", "Acking", "BePulling", "GCing"} {
			if _, ok := m[fmt.Sprintf("shardkv_shards{state=%q}", s)]; !ok {
				t.Errorf("no shardkv_shards{state=%q} series", s)
			}
		}
	}
	if s1, s2 := m1[`shardkv_shards{state="Serving"}`], m2[`shardkv_shards{state="Serving"}`]; s1+s2 != 16 {
		t.Errorf("groups serve %v + %v shards; want 16", s1, s2)
	}
	if m2["shardkv_migration_bytes_total"] < 100*m2["shardkv_migration_keys_total"] {
		t.Errorf("migrated %v keys in %v bytes; each value is 100 bytes", m2["shardkv_migration_keys_total"], m2["shardkv_migration_bytes_total"])
	}

	for _, ep := range c.eps {
		if code, body := httpGet(t, "http://"+ep.http+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s /healthz: %d %q", ep.name, code, body)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body := httpGet(t, "http://"+ep.http+"/readyz")
			if code == http.StatusOK && body == "ready\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s /readyz: %d %q", ep.name, code, body)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// A replica whose controller is unreachable: live, not ready, and says
	// why.
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		base := freeBase(t, 3, 0)
		grpcAddr := fmt.Sprintf("127.0.0.1:%d", base)
		httpAddr := fmt.Sprintf("127.0.0.1:%d", base+1)
		nowhere := fmt.Sprintf("127.0.0.1:%d", base+2) // nothing listens there
		p := startProc(t, "orphan replica", dir, dir, nil, "serve", "--role=group", "--group=7", "--id=1",
			"--data-dir="+filepath.Join(dir, fmt.Sprint("g7-", attempt)), "--listen="+grpcAddr, "--peers=1="+grpcAddr,
			"--ctrler="+nowhere, "--http="+httpAddr)
		if !p.waitOutput("replica serving", 20*time.Second, true) {
			if strings.Contains(p.errOut.String(), "address already in use") && attempt < 3 {
				continue
			}
			t.Fatalf("orphan replica did not start: %s", p.errOut.String())
		}
		if code, body := httpGet(t, "http://"+httpAddr+"/healthz"); code != http.StatusOK {
			t.Errorf("orphan /healthz: %d %q", code, body)
		}
		// It elects itself (one replica); the controller stays unreachable.
		deadline := time.Now().Add(10 * time.Second)
		var code int
		var body string
		for time.Now().Before(deadline) {
			code, body = httpGet(t, "http://"+httpAddr+"/readyz")
			if !strings.Contains(body, "no leader known") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: ") ||
			!strings.Contains(body, "has not reached the controller to learn the latest config") {
			t.Errorf("orphan /readyz: %d %q; want 503 naming the controller", code, body)
		}
		ec, took := p.stop(syscall.SIGTERM, 15*time.Second)
		t.Logf("orphan replica exited %d %v after SIGTERM", ec, took.Round(time.Millisecond))
		if ec != 0 || took > 10*time.Second {
			t.Errorf("orphan replica: exit %d after %v; want 0 within 10s", ec, took)
		}
		break
	}
	if code, _ := c.stop(syscall.SIGTERM, localStopBound); code != 0 {
		t.Fatalf("node local exit code %d", code)
	}
}

// TestServeFlagContract: flags come from SHARDKV_<FLAG> when not on the
// command line (the command line wins); bad flags exit 2 with a message
// naming the problem; a data dir cannot be reused under another id.
func TestServeFlagContract(t *testing.T) {
	needProcesses(t)
	dir := t.TempDir()

	bad := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"serve"}, "--role is required"},
		{nil, []string{"serve", "--role=leader"}, `--role="leader": want ctrler or group`},
		{nil, []string{"serve", "--role=ctrler", "--bogus"}, "flag provided but not defined: -bogus"},
		{nil, []string{"serve", "--role=ctrler", "--id=0"}, "want a number >= 1 or auto"},
		{nil, []string{"serve", "--role=ctrler"}, "--id is required: a number >= 1, or auto"},
		{nil, []string{"serve", "--role=ctrler", "--id=auto", "--join", "--data-dir=x", "--listen=127.0.0.1:1"}, "--join with --id=auto"},
		{nil, []string{"serve", "--role=ctrler", "--id=1"}, "--data-dir is required"},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=nope"}, `--listen="nope"`},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=0.0.0.0:1"}, "wildcard address: give --advertise"},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--shards=15"}, "--shards"},
		{nil, []string{"serve", "--role=group", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1"}, "--group is required for role=group"},
		{nil, []string{"serve", "--role=group", "--group=1", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1"}, "--ctrler is required for role=group"},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--peers=2=127.0.0.1:2"}, "--peers must include this replica (id 1)"},
		{nil, []string{"serve", "--role=group", "--group=1", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--ctrler=127.0.0.1:2", "--report-every=3s"}, "--report-every=3s: want 0 (the default, 500ms) up to 1s"},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--report-every=1s"}, "--report-every is only for role=group"},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--peers=x"}, `--peers: "x": want id=host:port`},
		{nil, []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + dir, "--listen=127.0.0.1:1", "--log-level=loud"}, `--log-level="loud"`},
		{[]string{"SHARDKV_ID=abc"}, []string{"serve", "--role=ctrler"}, `SHARDKV_ID="abc"`},
		{[]string{"SHARDKV_ROLE=nope"}, []string{"serve", "--id=1"}, `--role="nope"`},
		{nil, []string{"local", "--groups=0"}, "--groups must be >= 1"},
		{nil, []string{"local", "--shards=3"}, "--shards"},
		{nil, []string{"local", "--report-every=-1s"}, "--report-every=-1s: want 0"},
		{[]string{"SHARDKV_REPLICAS=-1"}, []string{"local"}, "--replicas and --ctrler-replicas must be >= 1"},
		{nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{nil, nil, "usage:"},
	}
	for _, tc := range bad {
		code, out := runNode(t, dir, tc.env, tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v node %v: exit %d, output %q; want exit 2 and %q", tc.env, tc.args, code, out, tc.want)
		}
	}
	if code, out := runNode(t, dir, nil, "serve", "-h"); code != 0 || !strings.Contains(out, "-data-dir") {
		t.Errorf("node serve -h: exit %d, %q", code, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused starts wrote into %s: %v", dir, entries)
	}

	// A controller configured through the environment only (but for
	// --listen and --peers); the command line beats the environment.
	dataDir := filepath.Join(dir, "ctrler-data")
	var p *proc
	var httpAddr string
	for attempt := 1; ; attempt++ {
		base := freeBase(t, 2, 0)
		grpcAddr := fmt.Sprintf("127.0.0.1:%d", base)
		httpAddr = fmt.Sprintf("127.0.0.1:%d", base+1)
		os.RemoveAll(dataDir)
		p = startProc(t, "env ctrler", dir, dir, []string{
			"SHARDKV_ROLE=ctrler", "SHARDKV_ID=1", "SHARDKV_DATA_DIR=" + dataDir, "SHARDKV_SHARDS=32",
			"SHARDKV_PLACEMENT=consistent-hash", "SHARDKV_HTTP=" + httpAddr, "SHARDKV_LOG_LEVEL=bogus",
		}, "serve", "--listen="+grpcAddr, "--peers=1="+grpcAddr, "--log-level=debug")
		if p.waitOutput("replica serving", 20*time.Second, true) {
			break
		}
		if !strings.Contains(p.errOut.String(), "address already in use") || attempt == 3 {
			t.Fatalf("env-configured controller did not start: exit %d\n%s", p.wait(time.Second), p.errOut.String())
		}
	}
	var id struct {
		Role      string `json:"role"`
		ID        uint64 `json:"id"`
		Shards    int    `json:"shards"`
		Placement string `json:"placement"`
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "node.json"))
	if err != nil {
		t.Fatalf("SHARDKV_DATA_DIR was not used: %v", err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	if id.Role != "ctrler" || id.ID != 1 || id.Shards != 32 || id.Placement != "consistent-hash" {
		t.Fatalf("node.json from the environment: %s", b)
	}
	if !p.waitOutput("level=DEBUG", 10*time.Second, true) {
		t.Errorf("--log-level=debug on the command line did not beat SHARDKV_LOG_LEVEL")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := httpGet(t, "http://"+httpAddr+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("env ctrler /readyz: %d %q", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, took := p.stop(syscall.SIGTERM, 15*time.Second); code != 0 || took > 10*time.Second {
		t.Fatalf("env ctrler: exit %d after %v of SIGTERM", code, took)
	}

	// The same data dir under another id is refused, before binding.
	code, out := runNode(t, dir, nil, "serve", "--role=ctrler", "--id=2", "--data-dir="+dataDir, "--listen=127.0.0.1:1")
	want := fmt.Sprintf("data dir %s belongs to role=ctrler group=0 id=1, not role=ctrler group=0 id=2", dataDir)
	if code == 0 || !strings.Contains(out, want) {
		t.Errorf("reusing the data dir under id 2: exit %d, %q; want non-zero and %q", code, out, want)
	}
	// And as a data-group replica.
	code, out = runNode(t, dir, []string{"SHARDKV_DATA_DIR=" + dataDir}, "serve", "--role=group", "--group=1", "--id=1",
		"--listen=127.0.0.1:1", "--ctrler=127.0.0.1:2")
	if code == 0 || !strings.Contains(out, "belongs to role=ctrler group=0 id=1, not role=group group=1 id=1") {
		t.Errorf("reusing a controller's data dir for a group: exit %d, %q", code, out)
	}
}

// TestLocalInterruptedWhileStarting: Ctrl-C while `node local` is still
// bringing the cluster up stops every child and exits 0 (it is not a
// failure to start).
func TestLocalInterruptedWhileStarting(t *testing.T) {
	needProcesses(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	base := freeBase(t, 4, 0, 1000, 2000)
	p := startProc(t, "node local", dir, dir, nil, "local", "--data-dir="+dataDir, fmt.Sprint("--base-port=", base),
		"--groups=1", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	if !p.waitOutput("creating a cluster in", 20*time.Second, false) {
		t.Fatalf("no start line: %s %s", p.out.String(), p.errOut.String())
	}
	code, took := p.stop(syscall.SIGINT, localStopBound)
	t.Logf("stopped in %v; serving before the signal: %v", took.Round(time.Millisecond), strings.Contains(p.out.String(), "shardkv is serving"))
	if code != 0 || !strings.Contains(p.out.String(), "stopped\n") || strings.Contains(p.errOut.String(), "node:") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, p.out.String(), p.errOut.String())
	}
	if left := nodesUnder(dataDir); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}
