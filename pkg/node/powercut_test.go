//go:build !race

// Built only without the race detector, like pkg/raftgroup's power-cut
// test: many badger processes on FUSE mounts are minutes under it. `make
// test` runs these in its non-race step (-run PowerCut ./pkg/node/).

package node_test

// Power-cut tests of whole clusters (issue 15). Every replica is a `node
// serve` process whose data dir is on its own lazyfs mount, served by the
// test: a power cut of a replica forgets whatever it wrote and did not
// fsync, as a machine losing power does (killing a process cannot show it:
// the page cache survives). Under a workload of Go clients whose history
// is recorded, replicas are cut (one, a minority, or every replica of the
// cluster at once), at random instants and at dangerous ones (a memtable
// rotation with slow table flushes, right after a log compaction, during a
// snapshot install, while a moving shard's chunks are applied, while the
// old owner garbage-collects it), then restarted. At the end:
//   - the whole history, across every cut, is linearizable (porcupine, with
//     writes whose call failed as of unknown outcome) and ends with a read
//     of every key: no acknowledged write was lost;
//   - the replicas of each group, quiesced and stopped, hold the same
//     values (every value record, with the log index that wrote it).
//
// Runs are seeded: SHARDKV_POWERCUT_SEED=N replays run N's choices (the
// timing is the machine's), SHARDKV_POWERCUT_RUNS=N makes N runs (seeds
// N, N+1, ...; default 1, CI's sample). A campaign by hand:
//
//	SHARDKV_POWERCUT_RUNS=50 go test -failfast -count=1 -timeout 3h -run 'PowerCut' ./pkg/node/
//
// With writes not synced (SHARDKV_NODE_BUILD_TAGS=shardkv_nosync, the
// behaviour before badger's SyncWrites) they fail: acknowledged writes are
// lost.

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/internal/lazyfs"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/node"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

func init() {
	childModes["digest"] = digestChild
	childModes["identity"] = identityChild
}

// needFUSE fails (never skips) where lazyfs cannot run.
func needFUSE(t *testing.T) {
	t.Helper()
	needProcesses(t)
	if err := lazyfs.Check(); err != nil {
		t.Fatalf("power-cut tests need FUSE: %v (CI installs fuse3 and runs as root)", err)
	}
}

// powerCutSeeds returns the seeds to run: SHARDKV_POWERCUT_RUNS of them
// (default def) from SHARDKV_POWERCUT_SEED (default: from the clock).
func powerCutSeeds(t *testing.T, def int) []uint64 {
	t.Helper()
	runs := def
	if s := os.Getenv("SHARDKV_POWERCUT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SHARDKV_POWERCUT_RUNS=%q: want a number >= 1", s)
		}
		runs = n
	}
	first := uint64(time.Now().UnixNano()%1_000_000) + 1
	if s := os.Getenv("SHARDKV_POWERCUT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SHARDKV_POWERCUT_SEED=%q: %v", s, err)
		}
		first = n
	}
	var out []uint64
	for i := range runs {
		out = append(out, first+uint64(i))
	}
	return out
}

// --- child processes (they use the mounts the test serves) ---

func childExit(err error) int {
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

// identityChild runs node's identity check on NODE_TEST_DIR.
func identityChild() int {
	o := &node.Options{Role: "group", Group: 1, ID: 1, DataDir: os.Getenv("NODE_TEST_DIR")}
	fresh, err := node.CheckIdentity(o, slog.New(slog.DiscardHandler))
	if err == nil {
		fmt.Printf("fresh=%v\n", fresh)
	}
	return childExit(err)
}

// replicaDigest is what digestChild prints: a stopped data-group
// replica's value records (raw key -> hash and length of the record, which
// carries the value and the index of the entry that wrote it) and its
// applied index.
type replicaDigest struct {
	Applied uint64            `json:"applied"`
	Records map[string]string `json:"records"`
}

// digestChild opens the badger DB in NODE_TEST_DIR (a stopped replica's)
// and prints its replicaDigest as JSON.
func digestChild() int {
	db, err := badger.Open(raftgroup.StorageOptions(os.Getenv("NODE_TEST_DIR")))
	if err != nil {
		return childExit(err)
	}
	defer db.Close()
	d := replicaDigest{Records: map[string]string{}}
	err = db.View(func(txn *badger.Txn) error {
		var err error
		if d.Applied, err = raftgroup.LoadApplied(txn, []byte("m/applied")); err != nil {
			return err
		}
		// d<shard:2>k<user key>: a value record (pkg/shardkv's layout).
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte("d")
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().KeyCopy(nil)
			if len(k) < 4 || k[3] != 'k' {
				continue
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			h := fnv.New64a()
			h.Write(v)
			d.Records[fmt.Sprintf("%q", k)] = fmt.Sprintf("%016x/%d", h.Sum64(), len(v))
		}
		return nil
	})
	if err != nil {
		return childExit(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(d); err != nil {
		return childExit(err)
	}
	return 0
}

func runChild(mode, dir string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NODE_TEST_CHILD="+mode, "NODE_TEST_DIR="+dir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd.Output()
}

// TestPowerCutIdentity: the identity file a replica writes on its first
// start survives a power cut right after it (it was written without
// fsync: empty after the cut, and the replica refused to start).
func TestPowerCutIdentity(t *testing.T) {
	needFUSE(t)
	mnt, backing := t.TempDir(), t.TempDir()
	fs, err := lazyfs.Mount(mnt, backing)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Unmount()
	dir := filepath.Join(mnt, "data")
	out, err := runChild("identity", dir)
	if err != nil || string(out) != "fresh=true\n" {
		t.Fatalf("first start: %v: %s", err, out)
	}
	if _, err := fs.Cut(0, rand.New(rand.NewPCG(1, 1))); err != nil {
		t.Fatal(err)
	}
	if err := fs.Restart(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "node.json"))
	out, err = runChild("identity", dir)
	if err != nil || string(out) != "fresh=false\n" {
		t.Fatalf("start after a power cut (node.json holds %q): %v: %s", b, err, out)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("data dir after the start: %v, want only node.json", ents)
	}
}

// --- the cluster ---

// pcNode is one replica process on its own lazyfs mount.
type pcNode struct {
	name    string
	gid     uint64 // 0: the controller
	addr    string
	args    []string
	mnt     string // the mount; the data dir is mnt/data
	backing string // what the disk holds
	fs      *lazyfs.FS
	logPath string

	cmd    *exec.Cmd
	waited chan struct{}
	starts int
	conn   *grpc.ClientConn
}

func (n *pcNode) dbDir(under string) string { return filepath.Join(under, "data", "raft", "db") }

func (n *pcNode) alive() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.waited:
		return false
	default:
		return true
	}
}

func (n *pcNode) kill() {
	if n.alive() {
		n.cmd.Process.Kill()
	}
	if n.cmd != nil {
		<-n.waited
	}
}

func (n *pcNode) status(ctx context.Context) (*shardkvpb.MemberStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return shardkvpb.NewAdminClient(n.conn).Status(ctx, &shardkvpb.StatusRequest{})
}

func (n *pcNode) groupInfo(ctx context.Context) (*shardkvpb.GroupInfoReply, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return shardkvpb.NewKVClient(n.conn).GroupInfo(ctx, &shardkvpb.GroupInfoRequest{})
}

func (n *pcNode) logTail(max int) string {
	b, _ := os.ReadFile(n.logPath)
	return tail(string(b), max)
}

type pcCluster struct {
	t         *testing.T
	rng       *rand.Rand
	dir, home string
	ctrl      *pcNode
	groups    map[uint64][]*pcNode
	all       []*pcNode
	ctrlAddrs []string
	events    []string // what was done, for the log
}

// newPCCluster makes (does not start) a controller of one replica and
// groups data groups of replicas replicas each, every one on its own
// mount. Logs compact every 200 entries: snapshots and compactions are
// frequent.
func newPCCluster(t *testing.T, rng *rand.Rand, groups, replicas int) *pcCluster {
	t.Helper()
	dir := t.TempDir()
	c := &pcCluster{t: t, rng: rng, dir: dir, home: filepath.Join(dir, "home"), groups: map[uint64][]*pcNode{}}
	if err := os.MkdirAll(c.home, 0o755); err != nil {
		t.Fatal(err)
	}
	base := freeBase(t, 1+groups*replicas)
	i := 0
	mk := func(name string, gid uint64) *pcNode {
		n := &pcNode{name: name, gid: gid, addr: fmt.Sprintf("127.0.0.1:%d", base+i)}
		i++
		n.mnt, n.backing = filepath.Join(dir, name, "mnt"), filepath.Join(dir, name, "disk")
		n.logPath = filepath.Join(dir, name+".log")
		for _, d := range []string{n.mnt, n.backing} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fs, err := lazyfs.Mount(n.mnt, n.backing)
		if err != nil {
			t.Fatal(err)
		}
		n.fs = fs
		// Reconnects soon after a restart (gRPC's default backoff grows
		// to minutes while a node is down).
		conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: time.Second,
				Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 300 * time.Millisecond}}))
		if err != nil {
			t.Fatal(err)
		}
		n.conn = conn
		t.Cleanup(func() {
			n.kill()
			conn.Close()
			if err := fs.Unmount(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
		c.all = append(c.all, n)
		return n
	}
	c.ctrl = mk("ctrler-1", 0)
	c.ctrlAddrs = []string{c.ctrl.addr}
	c.ctrl.args = []string{"serve", "--role=ctrler", "--id=1", "--data-dir=" + filepath.Join(c.ctrl.mnt, "data"),
		"--listen=" + c.ctrl.addr, "--peers=1=" + c.ctrl.addr, "--shards=16", "--log-level=info"}
	for gid := uint64(1); gid <= uint64(groups); gid++ {
		var peers []string
		for id := 1; id <= replicas; id++ {
			n := mk(fmt.Sprintf("group-%d-%d", gid, id), gid)
			c.groups[gid] = append(c.groups[gid], n)
			peers = append(peers, fmt.Sprintf("%d=%s", id, n.addr))
		}
		for id, n := range c.groups[gid] {
			n.args = []string{"serve", "--role=group", fmt.Sprint("--group=", gid), fmt.Sprint("--id=", id+1),
				"--data-dir=" + filepath.Join(n.mnt, "data"), "--listen=" + n.addr, "--peers=" + strings.Join(peers, ","),
				"--ctrler=" + c.ctrl.addr, "--snapshot-entries=200", "--trailing-entries=50", "--log-level=info"}
		}
	}
	// Logs of every node on failure.
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.all {
				t.Logf("--- %s log (tail):\n%s", n.name, n.logTail(3000))
			}
			t.Logf("--- events:\n%s", strings.Join(c.events, "\n"))
		}
	})
	return c
}

func (c *pcCluster) logf(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	c.events = append(c.events, time.Now().Format("15:04:05.000")+" "+s)
	c.t.Log(s)
}

func (c *pcCluster) start(n *pcNode) {
	c.t.Helper()
	lf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer lf.Close()
	n.starts++
	fmt.Fprintf(lf, "=== start %d at %s\n", n.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(nodeBin, n.args...)
	cmd.Env = childEnv(c.home)
	cmd.Dir = c.home
	cmd.Stdout, cmd.Stderr = lf, lf
	// Dies with the test, even one killed by go test's timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("%s: %v", n.name, err)
	}
	n.cmd, n.waited = cmd, make(chan struct{})
	w := n.waited
	go func() { cmd.Wait(); close(w) }()
}

// checkAlive fails the test if a node process has exited.
func (c *pcCluster) checkAlive(nodes []*pcNode) {
	c.t.Helper()
	for _, n := range nodes {
		if !n.alive() {
			c.t.Fatalf("%s exited (%v); its log:\n%s", n.name, n.cmd.ProcessState, n.logTail(6000))
		}
	}
}

// bringUp starts every node, joins the data groups and waits until every
// shard is served.
func (c *pcCluster) bringUp() {
	c.t.Helper()
	for _, n := range c.all {
		c.start(n)
	}
	cl, err := ctrlerclient.New(c.ctrlAddrs)
	if err != nil {
		c.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := cl.Query(ctx, -1); err != nil {
		c.checkAlive(c.all)
		c.t.Fatalf("the controller did not come up: %v", err)
	}
	var join []*shardkvpb.Group
	for gid := uint64(1); gid <= uint64(len(c.groups)); gid++ {
		g := &shardkvpb.Group{Gid: gid}
		for id, n := range c.groups[gid] {
			g.Servers = append(g.Servers, &shardkvpb.Server{Id: uint64(id + 1), Addr: n.addr})
		}
		join = append(join, g)
	}
	if _, err := cl.Join(ctx, join...); err != nil {
		c.t.Fatalf("join: %v", err)
	}
	c.waitServed(90 * time.Second)
}

// waitServed waits until every shard of the latest config is served.
func (c *pcCluster) waitServed(timeout time.Duration) *shardkvpb.Config {
	c.t.Helper()
	cl, err := ctrlerclient.New(c.ctrlAddrs)
	if err != nil {
		c.t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cl.Status(ctx)
		cancel()
		if err == nil && served(st) {
			return st.Latest
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	c.checkAlive(c.all)
	c.t.Fatalf("the cluster did not serve every shard within %v: %v", timeout, last)
	return nil
}

// waitGroup waits until every replica of gid answers, knows a leader and
// has applied what was committed when it answered (it has caught up).
func (c *pcCluster) waitGroup(gid uint64, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		c.checkAlive(c.groups[gid])
		ok := true
		for _, n := range c.groups[gid] {
			st, err := n.status(context.Background())
			if err != nil || st.Leader == 0 || (st.Role != "leader" && st.Role != "follower") {
				ok, last = false, fmt.Sprintf("%s: %v %v", n.name, st, err)
				break
			}
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("group %d did not recover within %v: %s", gid, timeout, last)
}

// powerCut cuts the power of nodes at once (keeping each unsynced page
// with probability keep), kills their processes, and mounts their disks
// again. It does not restart them.
func (c *pcCluster) powerCut(nodes []*pcNode, keep float64, what string) {
	c.t.Helper()
	var cs lazyfs.CutStats
	for _, n := range nodes {
		s, err := n.fs.Cut(keep, c.rng)
		if err != nil {
			c.t.Fatalf("cut %s: %v", n.name, err)
		}
		cs.Files += s.Files
		cs.DroppedPage += s.DroppedPage
		cs.KeptPages += s.KeptPages
	}
	for _, n := range nodes {
		n.kill()
	}
	var names []string
	for _, n := range nodes {
		if err := n.fs.DelaySync("", 0); err != nil {
			c.t.Fatal(err)
		}
		if err := n.fs.Restart(); err != nil {
			c.t.Fatalf("remount %s: %v", n.name, err)
		}
		names = append(names, n.name)
	}
	c.logf("power cut (%s) of %s, keep %.1f: %d files had unsynced data, %d pages dropped, %d kept",
		what, strings.Join(names, ","), keep, cs.Files, cs.DroppedPage, cs.KeptPages)
}

func (c *pcCluster) restart(nodes []*pcNode) {
	for _, n := range nodes {
		c.start(n)
	}
}

// slowDisks makes the syncs of badger's tables on gid's replicas slow, or
// normal again.
func (c *pcCluster) slowDisks(gid uint64, slow bool) {
	for _, n := range c.groups[gid] {
		if slow {
			n.fs.DelaySync("*.sst", 500*time.Millisecond)
		} else {
			n.fs.DelaySync("", 0)
		}
	}
}

// maxMemFid is the highest memtable log number in a badger dir.
func maxMemFid(dir string) int {
	ents, _ := os.ReadDir(dir)
	best := -1
	for _, e := range ents {
		if s, ok := strings.CutSuffix(e.Name(), ".mem"); ok {
			if n, err := strconv.Atoi(s); err == nil {
				best = max(best, n)
			}
		}
	}
	return best
}

// pause sleeps up to max, at random.
func (c *pcCluster) pause(max time.Duration) {
	if max > 0 {
		time.Sleep(time.Duration(c.rng.Int64N(int64(max))))
	}
}

// waitInstant waits for a dangerous instant on watch and returns its
// description, or "" if none came within timeout (the cut is then at a
// random instant). It may slow watch's disk to widen the window.
func (c *pcCluster) waitInstant(instant string, watch *pcNode, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	switch instant {
	case "rotation":
		// Tables are slow to sync: a rotated memtable waits for its flush
		// with its log the only copy of its writes.
		// (Until the caller's slowDisks(false).)
		c.slowDisks(watch.gid, true)
		dir := watch.dbDir(watch.backing)
		from := maxMemFid(dir)
		for time.Now().Before(deadline) {
			if m := maxMemFid(dir); m > from {
				c.pause(200 * time.Millisecond)
				return fmt.Sprintf("memtable rotation on %s (%05d.mem created)", watch.name, m)
			}
			time.Sleep(2 * time.Millisecond)
		}
	case "compaction":
		st, err := watch.status(context.Background())
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			st, err = watch.status(context.Background())
		}
		if err != nil {
			return ""
		}
		from := st.FirstIndex
		for time.Now().Before(deadline) {
			if st, err := watch.status(context.Background()); err == nil && st.FirstIndex != from {
				c.pause(20 * time.Millisecond)
				return fmt.Sprintf("log compaction on %s (first index %d -> %d)", watch.name, from, st.FirstIndex)
			}
			time.Sleep(2 * time.Millisecond)
		}
	default:
		c.pause(time.Second)
		return "random"
	}
	return ""
}

// --- the workload ---

type pcLoad struct {
	rec        *kvcheck.Recorder
	stop       atomic.Bool
	wg         sync.WaitGroup
	keys       []string
	onceMu     sync.Mutex
	once       []string // write-once keys (whatever the outcome)
	fills      atomic.Int64
	fillFailed atomic.Int64
}

// pcSetKey is the set the power-cut load adds to and removes from, in the
// shard of keys[0] (the moving one, in the migration test).
func pcSetKey(keys []string) string { return routingTag(keys[0]) + "set" }

// startLoad runs 6 recorded clients doing gets, puts and appends on keys,
// adds and removes of a set's members,
// and puts to write-once keys (a lost acknowledged write cannot hide
// behind a later one), and one unrecorded filler writing fillBytes-byte
// values over fillKeys (memtables fill, logs compact, shards grow).
func startLoad(t *testing.T, ctrl []string, seed uint64, keys, fillKeys []string, fillBytes int) *pcLoad {
	l := &pcLoad{rec: kvcheck.NewRecorder(), keys: keys}
	for id := range 6 {
		cl, err := client.New(ctrl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		r := rand.New(rand.NewPCG(seed, uint64(id)))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stop.Load(); i++ {
				k := keys[r.IntN(len(keys))]
				val := fmt.Sprintf("%d.%d;", id, i)
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				var err error
				switch x := r.IntN(12); {
				case x < 3:
					p := l.rec.Start(id, kvcheck.Get, k, "")
					var v string
					if v, _, err = cl.Get(ctx, k); err != nil {
						p.Fail(err)
					} else {
						p.Ok(v)
					}
				case x < 5:
					p := l.rec.Start(id, kvcheck.Put, k, val)
					if err = cl.Put(ctx, k, val); err != nil {
						p.Fail(err)
					} else {
						p.Ok("")
					}
				case x < 9:
					// The hash tag of keys[0] keeps it in the same shard
					// (the moving one, in the migration test).
					k = fmt.Sprintf("%sonce-%d-%d", routingTag(keys[r.IntN(len(keys))]), id, i)
					l.onceMu.Lock()
					l.once = append(l.once, k)
					l.onceMu.Unlock()
					p := l.rec.Start(id, kvcheck.Put, k, val)
					if err = cl.Put(ctx, k, val); err != nil {
						p.Fail(err)
					} else {
						p.Ok("")
					}
				case x < 10:
					p := l.rec.Start(id, kvcheck.Append, k, val)
					if err = cl.Append(ctx, k, val); err != nil {
						p.Fail(err)
					} else {
						p.Ok("")
					}
				default:
					// A set of a few members, across the cuts: collections
					// are as durable as strings.
					sk, m := pcSetKey(keys), fmt.Sprint("m", r.IntN(4))
					kind := kvcheck.SAdd
					if x == 11 {
						kind = kvcheck.SRem
					}
					p := l.rec.StartField(id, kind, sk, m, "")
					if kind == kvcheck.SAdd {
						_, err = cl.SAdd(ctx, sk, m)
					} else {
						_, err = cl.SRem(ctx, sk, m)
					}
					if err != nil {
						p.Fail(err)
					} else {
						p.Ok("")
					}
				}
				cancel()
				if err != nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	if len(fillKeys) > 0 {
		cl, err := client.New(ctrl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stop.Load(); i++ {
				v := strings.Repeat(fmt.Sprintf("%08d", i), fillBytes/8)
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				err := cl.Put(ctx, fillKeys[i%len(fillKeys)], v)
				cancel()
				if err != nil {
					l.fillFailed.Add(1)
					time.Sleep(100 * time.Millisecond)
				} else {
					l.fills.Add(1)
				}
			}
		}()
	}
	return l
}

// routingTag is key's hash tag in braces, or "".
func routingTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i : i+j+2]
		}
	}
	return ""
}

// finish stops the clients, reads every key once more (recorded: what an
// acknowledged write left must be there) and checks the whole history.
func (l *pcLoad) finish(t *testing.T, c *pcCluster) {
	t.Helper()
	l.stop.Store(true)
	l.wg.Wait()
	cl, err := client.New(c.ctrlAddrs)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// The write-once keys, by batches: each read is recorded with the
	// batch's call and return.
	for len(l.once) > 0 {
		batch := l.once[:min(len(l.once), 200)]
		l.once = l.once[len(batch):]
		for attempt := 1; ; attempt++ {
			var ps []kvcheck.Pending
			for _, k := range batch {
				ps = append(ps, l.rec.Start(100, kvcheck.Get, k, ""))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			vals, err := cl.MultiGet(ctx, batch)
			cancel()
			for i, p := range ps {
				if err != nil {
					p.Fail(err)
				} else {
					p.Ok(vals[batch[i]])
				}
			}
			if err == nil {
				break
			}
			if attempt == 3 {
				c.checkAlive(c.all)
				t.Fatalf("final read of %d write-once keys: %v", len(batch), err)
			}
		}
	}
	for attempt := 1; ; attempt++ {
		sk := pcSetKey(l.keys)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		p := l.rec.Start(100, kvcheck.SMembers, sk, "")
		ms, err := cl.SMembers(ctx, sk)
		cancel()
		if err == nil {
			p.Ok(kvcheck.EncodeSet(ms))
			break
		}
		p.Fail(err)
		if attempt == 3 {
			c.checkAlive(c.all)
			t.Fatalf("final read of %s: %v", sk, err)
		}
	}
	for _, k := range l.keys {
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			p := l.rec.Start(100, kvcheck.Get, k, "")
			v, _, err := cl.Get(ctx, k)
			cancel()
			if err == nil {
				p.Ok(v)
				break
			}
			p.Fail(err)
			if attempt == 3 {
				c.checkAlive(c.all)
				t.Fatalf("final read of %s: %v", k, err)
			}
		}
	}
	h := l.rec.History()
	res, err := kvcheck.Check(h.Ops, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c.logf("history: %s; filler: %d writes ok, %d failed", res, l.fills.Load(), l.fillFailed.Load())
	if !res.Linearizable {
		t.Errorf("the history across the power cuts is not linearizable: %s", res)
		for _, k := range res.IllegalKeys {
			t.Errorf("%s", lostWrites(h.Ops, k))
		}
		keepDir, _ := os.MkdirTemp("", "shardkv-powercut-")
		viz := filepath.Join(keepDir, "history.html")
		if err := res.VisualizePath(viz); err == nil {
			t.Logf("porcupine's visualization: %s", viz)
		}
		if b, err := json.Marshal(h); err == nil {
			os.WriteFile(filepath.Join(keepDir, "history.json"), b, 0o644)
			t.Logf("history: %s", filepath.Join(keepDir, "history.json"))
		}
	}
}

// lostWrites explains an illegal key: its last acknowledged write before
// the final read, and what the final read found.
func lostWrites(ops []kvcheck.Op, key string) string {
	var mine []kvcheck.Op
	for _, o := range ops {
		if o.Key == key {
			mine = append(mine, o)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].Call < mine[j].Call })
	var final *kvcheck.Op
	for i := len(mine) - 1; i >= 0; i-- {
		if o := mine[i]; o.Client == 100 && !o.Unknown {
			final = &mine[i]
			break
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "key %s: %d operations", key, len(mine))
	if final == nil {
		return sb.String()
	}
	fmt.Fprintf(&sb, "; the final read returned %q", final.Output)
	var lastPut *kvcheck.Op
	var acked []kvcheck.Op
	for i, o := range mine {
		if o.IsWrite() && !o.Unknown && o.Return < final.Call {
			acked = append(acked, o)
			if o.Kind == kvcheck.Put {
				lastPut = &mine[i]
			}
		}
	}
	// Acknowledged writes whose value the final read does not hold:
	// those after the last acknowledged put (whose value is at least a
	// prefix) must all be there.
	var missing []string
	for _, o := range acked {
		if lastPut != nil && o.Return < lastPut.Call {
			continue
		}
		if !strings.Contains(final.Output, o.Value) {
			missing = append(missing, fmt.Sprintf("%s(%q) acknowledged at +%v", o.Kind, o.Value, time.Duration(o.Return-mine[0].Call).Round(time.Millisecond)))
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(&sb, "; acknowledged writes missing from it (lost): %s", strings.Join(missing, ", "))
	}
	return sb.String()
}

// --- replicas agree ---

// quiesceAndCompare waits until each group's replicas have applied the
// same index, stops every node gracefully, and compares the value records
// of each group's replicas.
func (c *pcCluster) quiesceAndCompare() {
	c.t.Helper()
	for gid, nodes := range c.groups {
		deadline := time.Now().Add(60 * time.Second)
		steady := 0
		var last string
		for steady < 3 {
			if time.Now().After(deadline) {
				c.t.Fatalf("group %d did not quiesce: %s", gid, last)
			}
			c.checkAlive(nodes)
			var applied []uint64
			var commit uint64
			for _, n := range nodes {
				st, err := n.status(context.Background())
				if err != nil {
					applied = append(applied, 0)
					continue
				}
				applied = append(applied, st.Applied)
				commit = max(commit, st.Commit)
			}
			last = fmt.Sprintf("applied %v, commit %d", applied, commit)
			if slices.Min(applied) == commit && slices.Max(applied) == commit {
				steady++
			} else {
				steady = 0
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for _, n := range c.all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n.alive() {
				n.cmd.Process.Signal(syscall.SIGTERM)
			}
			select {
			case <-n.waited:
			case <-time.After(30 * time.Second):
				n.kill()
			}
		}()
	}
	wg.Wait()
	for gid, nodes := range c.groups {
		var ds []replicaDigest
		for _, n := range nodes {
			out, err := runChild("digest", n.dbDir(n.mnt))
			if err != nil {
				c.t.Fatalf("digest of %s: %v: %s", n.name, err, out)
			}
			var d replicaDigest
			if err := json.Unmarshal(out, &d); err != nil {
				c.t.Fatalf("digest of %s: %v: %s", n.name, err, out)
			}
			ds = append(ds, d)
		}
		var applied []uint64
		for _, d := range ds {
			applied = append(applied, d.Applied)
		}
		for i := 1; i < len(ds); i++ {
			var diff []string
			for k, v := range ds[0].Records {
				if ds[i].Records[k] != v {
					diff = append(diff, fmt.Sprintf("%s: %s has %s, %s has %q", k, nodes[0].name, v, nodes[i].name, ds[i].Records[k]))
				}
			}
			for k, v := range ds[i].Records {
				if _, ok := ds[0].Records[k]; !ok {
					diff = append(diff, fmt.Sprintf("%s: only %s has it (%s)", k, nodes[i].name, v))
				}
			}
			if len(diff) > 0 {
				sort.Strings(diff)
				c.t.Errorf("group %d: replicas %s and %s disagree (applied indexes %v) on %d records:\n%s",
					gid, nodes[0].name, nodes[i].name, applied, len(diff), strings.Join(diff, "\n"))
			}
		}
		c.logf("group %d: %d value records, the same on its %d replicas (applied %v)", gid, len(ds[0].Records), len(ds), applied)
	}
}

// --- the scenarios ---

// TestPowerCut: power cuts of one replica, of a minority (2 of 5) and
// twice of the whole cluster (the 5 replicas and the controller at once) under a
// recorded workload, each at a random or a dangerous instant (memtable
// rotation, log compaction, snapshot install for a single replica).
func TestPowerCut(t *testing.T) {
	needFUSE(t)
	for _, seed := range powerCutSeeds(t, 1) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("replay: SHARDKV_POWERCUT_SEED=%d SHARDKV_POWERCUT_RUNS=1", seed)
			start := time.Now()
			powerCutGroupRun(t, seed)
			t.Logf("run took %v", time.Since(start).Round(time.Second))
		})
	}
}

func powerCutGroupRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc0ffee))
	c := newPCCluster(t, rng, 1, 5)
	c.bringUp()
	var keys, fills []string
	for i := range 12 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	// Many filler keys, each rewritten every few seconds only: a lost
	// write of one stays visible (replicas then disagree).
	for i := range 48 {
		fills = append(fills, fmt.Sprintf("fill%02d", i))
	}
	load := startLoad(t, c.ctrlAddrs, seed, keys, fills, 128<<10)
	group := c.groups[1]
	// Each kind once, the whole cluster twice.
	kinds := []string{"one", "minority", "all", "all"}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	for _, kind := range kinds {
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		c.checkAlive(c.all)
		perm := rng.Perm(len(group))
		keep := []float64{0, 0.3, 0.9}[rng.IntN(3)]
		var victims []*pcNode
		switch kind {
		case "one":
			victims = []*pcNode{group[perm[0]]}
		case "minority":
			victims = []*pcNode{group[perm[0]], group[perm[1]]}
		case "all":
			victims = append(slices.Clone(group), c.ctrl)
		}
		// A rotation half the time: the instant the old sync behaviour
		// lost writes at (a rotated memtable's log was never synced).
		instants := []string{"random", "rotation", "compaction", "rotation", "rotation", "random"}
		switch kind {
		case "one":
			instants = append(instants, "snapshot", "snapshot")
		case "all":
			// Where a lost write is lost for good.
			instants = []string{"random", "rotation", "compaction", "rotation", "rotation", "rotation"}
		}
		instant := instants[rng.IntN(len(instants))]
		if instant == "snapshot" {
			c.snapshotInstall(victims[0], keep)
			continue
		}
		what := c.waitInstant(instant, group[perm[0]], 20*time.Second)
		if what == "" {
			what = instant + " (not seen in 20s: at a random instant)"
		}
		c.powerCut(victims, keep, what)
		c.slowDisks(1, false)
		c.restart(victims)
		c.waitGroup(1, 90*time.Second)
	}
	load.finish(t, c)
	c.quiesceAndCompare()
}

// snapshotInstall cuts victim, keeps it down until the group's log is
// compacted past it, restarts it with a slow disk for the snapshot it is
// sent, and cuts it again while it receives or installs the snapshot.
func (c *pcCluster) snapshotInstall(victim *pcNode, keep float64) {
	c.t.Helper()
	st, err := victim.status(context.Background())
	var last uint64
	if err == nil {
		last = st.LastIndex
	}
	c.powerCut([]*pcNode{victim}, keep, "random, to make it lag")
	var others []*pcNode
	for _, n := range c.groups[victim.gid] {
		if n != victim {
			others = append(others, n)
		}
	}
	// Wait until every other replica's log starts past what victim had,
	// so that its leader can only send it a snapshot.
	deadline := time.Now().Add(60 * time.Second)
	for {
		lo := uint64(0)
		for i, n := range others {
			st, err := n.status(context.Background())
			if err != nil {
				lo = 0
				break
			}
			if i == 0 || st.FirstIndex < lo {
				lo = st.FirstIndex
			}
		}
		if lo > last+1 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the group's log was not compacted past %d within 60s", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	victim.fs.DelaySync("recv-*.tmp", 400*time.Millisecond)
	c.start(victim)
	snapDir := filepath.Join(victim.backing, "data", "raft", "snap")
	what := ""
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && what == "" {
		ents, _ := os.ReadDir(snapDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "recv-") || strings.HasSuffix(e.Name(), ".snap") {
				c.pause(700 * time.Millisecond)
				what = fmt.Sprintf("snapshot install on %s (%s seen)", victim.name, e.Name())
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if what == "" {
		what = "snapshot install (no snapshot seen in 30s: at a random instant)"
	}
	c.powerCut([]*pcNode{victim}, keep, what)
	c.start(victim)
	c.waitGroup(victim.gid, 90*time.Second)
}

// TestPowerCutMigration: power cuts while a shard moves between two
// groups: of one replica, of a whole group, or of the whole cluster,
// while the new owner applies the shard's chunks or while the old owner
// garbage-collects its copy.
func TestPowerCutMigration(t *testing.T) {
	needFUSE(t)
	for _, seed := range powerCutSeeds(t, 1) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("replay: SHARDKV_POWERCUT_SEED=%d SHARDKV_POWERCUT_RUNS=1", seed)
			start := time.Now()
			powerCutMigrationRun(t, seed)
			t.Logf("run took %v", time.Since(start).Round(time.Second))
		})
	}
}

func powerCutMigrationRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xfeed))
	c := newPCCluster(t, rng, 2, 3)
	c.bringUp()
	// The moving shard holds ~5 MiB (about 20 chunks): its filler keys
	// share a hash tag.
	const tag = "{mv}"
	shard := routing.ShardOf([]byte(tag), 16)
	var keys, fills []string
	for i := range 12 {
		keys = append(keys, fmt.Sprintf("k%02d", i))
	}
	keys = append(keys, tag+"k0", tag+"k1", tag+"k2")
	for i := range 20 {
		fills = append(fills, fmt.Sprintf("%sfill%02d", tag, i))
	}
	pre, err := client.New(c.ctrlAddrs)
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Close()
	for i, k := range fills {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := pre.Put(ctx, k, strings.Repeat(fmt.Sprintf("%08d", i), (256<<10)/8))
		cancel()
		if err != nil {
			t.Fatalf("preloading %s: %v", k, err)
		}
	}
	load := startLoad(t, c.ctrlAddrs, seed, keys, fills, 64<<10)
	ctl, err := ctrlerclient.New(c.ctrlAddrs)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	for phase := 0; phase < 3; phase++ {
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		c.checkAlive(c.all)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		conf, err := ctl.Query(ctx, -1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		src := conf.Shards[shard]
		dst := 3 - src
		stage, state, target := "chunk apply", "Pulling", dst
		if rng.IntN(2) == 1 {
			stage, state, target = "GC", "GCing", src
		}
		kind := []string{"one", "group", "all"}[rng.IntN(3)]
		keep := []float64{0, 0.3, 0.9}[rng.IntN(3)]
		var victims []*pcNode
		switch kind {
		case "one":
			victims = []*pcNode{c.groups[target][rng.IntN(3)]}
		case "group":
			victims = slices.Clone(c.groups[target])
		case "all":
			victims = slices.Clone(c.all)
		}
		c.logf("phase %d: moving shard %d from group %d to %d; cut %s at %s in group %d", phase, shard, src, dst, kind, stage, target)
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		_, err = ctl.Move(ctx, shard, dst)
		cancel()
		if err != nil {
			t.Fatalf("move shard %d to %d: %v", shard, dst, err)
		}
		// The cut comes once the state shows on a replica of the target
		// group and, for a pull, once some chunks are in (the apply of
		// the next ones is under way), or right after it if the pull
		// ended between two looks.
		what := ""
		seen := false
		deadline := time.Now().Add(30 * time.Second)
	watch:
		for time.Now().Before(deadline) {
			now := false
			for _, n := range c.groups[target] {
				gi, err := n.groupInfo(context.Background())
				if err != nil {
					continue
				}
				for _, s := range gi.Shards {
					if int(s.Shard) != shard || s.State != state {
						continue
					}
					now = true
					if state == "Pulling" && s.Keys == 0 && s.Bytes == 0 {
						continue // not a chunk in yet
					}
					c.pause(100 * time.Millisecond)
					what = fmt.Sprintf("%s of shard %d in group %d (%s seen on %s: %d keys, %d bytes in)", stage, shard, target, state, n.name, s.Keys, s.Bytes)
					break watch
				}
			}
			if seen && !now {
				what = fmt.Sprintf("%s of shard %d in group %d (just after %s ended)", stage, shard, target, state)
				break
			}
			seen = seen || now
			time.Sleep(2 * time.Millisecond)
		}
		if what == "" {
			what = stage + " (not seen: at a random instant)"
		}
		c.powerCut(victims, keep, what)
		c.restart(victims)
		conf = c.waitServed(120 * time.Second)
		if conf.Shards[shard] != dst {
			t.Fatalf("shard %d is with group %d after the move to %d", shard, conf.Shards[shard], dst)
		}
	}
	load.finish(t, c)
	c.quiesceAndCompare()
}
