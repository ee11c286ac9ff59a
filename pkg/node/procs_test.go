package node_test

// Helpers for the integration tests: they run the real node binary (built
// once in TestMain) as child processes on free ports.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// nodeBin is the node binary built by TestMain.
var nodeBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// childModes are other mains of this test binary, run as child processes
// by tests (NODE_TEST_CHILD=name): the power-cut tests' processes that use
// a lazyfs mount, which the test process serves and so must not use.
var childModes = map[string]func() int{}

func runMain(m *testing.M) int {
	if mode := os.Getenv("NODE_TEST_CHILD"); mode != "" {
		if f := childModes[mode]; f != nil {
			return f()
		}
		fmt.Fprintf(os.Stderr, "unknown NODE_TEST_CHILD=%q\n", mode)
		return 2
	}
	dir, err := os.MkdirTemp("", "shardkv-node-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	nodeBin = filepath.Join(dir, "node")
	goCmd := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goCmd); err != nil {
		goCmd = "go"
	}
	// SHARDKV_NODE_BUILD_TAGS=shardkv_nosync builds a node without
	// synced writes: the power-cut tests must then fail.
	build := exec.Command(goCmd, "build", "-tags", os.Getenv("SHARDKV_NODE_BUILD_TAGS"), "-o", nodeBin, "github.com/shardkv/shardkv/cmd/node")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building the node binary: %v\n", err)
		return 1
	}
	return m.Run()
}

func needProcesses(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("needs /proc (Linux)")
	}
}

// childEnv is the environment for child processes: ours without any
// SHARDKV_* variable, with HOME in a temp dir, plus extra.
func childEnv(home string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SHARDKV_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, "HOME="+home), extra...)
}

// freeBase picks a random base port such that base+off+i is free for every
// offset and i < n. Ports stay below the kernel's ephemeral range so that
// outgoing connections cannot take them while a replica restarts.
func freeBase(t *testing.T, n int, offsets ...int) int {
	t.Helper()
	if len(offsets) == 0 {
		offsets = []int{0}
	}
	hi := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 12000+offsets[len(offsets)-1]+n {
				hi = lo
			}
		}
	}
	span := offsets[len(offsets)-1] + n
	for attempt := 0; attempt < 100; attempt++ {
		base := 10000 + rand.IntN(hi-10000-span)
		if portsFree(base, n, offsets) {
			return base
		}
	}
	t.Fatal("no free port range found")
	return 0
}

func portsFree(base, n int, offsets []int) bool {
	for _, off := range offsets {
		for i := 0; i < n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off+i))
			if err != nil {
				return false
			}
			l.Close()
		}
	}
	return true
}

// lineBuf collects a process's output and lets tests wait for a line.
type lineBuf struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	tee  io.Writer
	done chan struct{}
}

func newLineBuf() *lineBuf { return &lineBuf{done: make(chan struct{})} }

func (b *lineBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee != nil {
		b.tee.Write(p)
	}
	return b.buf.Write(p)
}

func (b *lineBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a node process started by a test.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	out     *lineBuf // stdout
	errOut  *lineBuf // stderr
	waited  chan struct{}
	waitErr error
	exitAt  time.Time
}

// startProc runs the node binary with args. The process is killed (with
// every process whose command line mentions killUnder) when the test ends.
func startProc(t *testing.T, name, home, killUnder string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(nodeBin, args...)
	cmd.Env = childEnv(home, env...)
	cmd.Dir = home
	p := &proc{t: t, name: name, cmd: cmd, out: newLineBuf(), errOut: newLineBuf(), waited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.errOut
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		p.exitAt = time.Now()
		close(p.waited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.waited:
		default:
			cmd.Process.Kill()
			<-p.waited
		}
		if killUnder != "" {
			killAllUnder(killUnder)
		}
		if t.Failed() {
			t.Logf("--- %s stdout:\n%s", name, p.out.String())
			t.Logf("--- %s stderr:\n%s", name, tail(p.errOut.String(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.waited:
		return true
	default:
		return false
	}
}

// waitOutput waits until stdout (or stderr with fromErr) contains s.
func (p *proc) waitOutput(s string, timeout time.Duration, fromErr bool) bool {
	deadline := time.Now().Add(timeout)
	buf := p.out
	if fromErr {
		buf = p.errOut
	}
	for {
		if strings.Contains(buf.String(), s) {
			return true
		}
		if p.exited() {
			return strings.Contains(buf.String(), s)
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wait waits for the process to exit; it returns the exit code, or -1 on
// timeout.
func (p *proc) wait(timeout time.Duration) int {
	select {
	case <-p.waited:
	case <-time.After(timeout):
		return -1
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ExitCode()
	}
	if p.waitErr != nil {
		return -2
	}
	return 0
}

// stop signals the process and waits for it to exit within bound; it
// returns the exit code and how long the exit took.
func (p *proc) stop(sig syscall.Signal, bound time.Duration) (int, time.Duration) {
	p.t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil && !p.exited() {
		p.t.Fatalf("%s: signal: %v", p.name, err)
	}
	code := p.wait(bound)
	if code == -1 {
		p.t.Fatalf("%s did not exit within %v of %v", p.name, bound, sig)
	}
	return code, p.exitAt.Sub(start)
}

// runNode runs the node binary to completion (bounded) and returns its exit
// code and combined output.
func runNode(t *testing.T, home string, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, args...)
	cmd.Env = childEnv(home, env...)
	cmd.Dir = home
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), string(out)
	default:
		t.Fatalf("node %v: %v\n%s", args, err, out)
		return 0, ""
	}
}

// --- /proc ---

func procArgs(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

func allPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// pidsListening returns the live `node serve` processes whose arguments
// contain --listen=addr.
func pidsListening(addr string) []int {
	var out []int
	for _, pid := range allPids() {
		args := procArgs(pid)
		if len(args) < 2 || args[1] != "serve" || filepath.Base(args[0]) != filepath.Base(nodeBin) {
			continue
		}
		for _, a := range args {
			if a == "--listen="+addr && !processGone(pid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// pidListening waits for exactly one process listening on addr (a child
// may be restarting) and returns it.
func pidListening(t *testing.T, addr string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pids := pidsListening(addr)
		if len(pids) == 1 {
			return pids[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("want one node serve process with --listen=%s, found %v", addr, pids)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processGone reports whether pid has exited (gone, or a zombie not yet
// reaped by its parent).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// waitGone polls until pid has exited; it returns the time of exit as seen
// by polling (at most 10ms late), or false after timeout.
func waitGone(pid int, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for {
		if processGone(pid) {
			return time.Now(), true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killAllUnder SIGKILLs every process whose arguments mention dir (the
// test's own temp dir: only processes this test started).
func killAllUnder(dir string) {
	for _, pid := range allPids() {
		if pid == os.Getpid() {
			continue
		}
		for _, a := range procArgs(pid) {
			if strings.Contains(a, dir) {
				syscall.Kill(pid, syscall.SIGKILL)
				break
			}
		}
	}
}

// nodesUnder lists live processes whose arguments mention dir.
func nodesUnder(dir string) []int {
	var out []int
	for _, pid := range allPids() {
		if pid == os.Getpid() || processGone(pid) {
			continue
		}
		for _, a := range procArgs(pid) {
			if strings.Contains(a, dir) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// --- cluster queries ---

func adminStatus(ctx context.Context, addr string, dial ...grpc.DialOption) (*shardkvpb.MemberStatus, error) {
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return shardkvpb.NewAdminClient(cc).Status(actx, &shardkvpb.StatusRequest{})
}

// groupLeader finds data group gid's leader from the controller's status
// reports, confirmed by the replica's own Admin.Status; it returns the
// leader's address and term. dial: how to dial (default: plaintext).
func groupLeader(t *testing.T, ctrl []string, gid uint64, timeout time.Duration, dial ...grpc.DialOption) (string, uint64) {
	t.Helper()
	cl, err := ctrlerclient.New(ctrl, dial...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cl.Status(ctx)
		if err == nil {
			for _, g := range st.Groups {
				if g.Report.GetGid() != gid || g.Report.LeaderAddr == "" {
					continue
				}
				ms, err := adminStatus(ctx, g.Report.LeaderAddr, dial...)
				if err == nil && ms.Role == "leader" && ms.GroupId == gid {
					cancel()
					return g.Report.LeaderAddr, ms.Term
				}
				last = fmt.Sprintf("report names %s: %v %v", g.Report.LeaderAddr, ms.GetRole(), err)
			}
		} else {
			last = err.Error()
		}
		cancel()
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no leader of group %d found: %s", gid, last)
	return "", 0
}

// raftLeader finds the leader of the Raft group whose replicas are at addrs
// through Admin.Status.
func raftLeader(t *testing.T, addrs []string, timeout time.Duration) (string, uint64) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, a := range addrs {
			ms, err := adminStatus(context.Background(), a)
			if err != nil {
				last = err
				continue
			}
			if ms.LeaderAddr != "" {
				ls, err := adminStatus(context.Background(), ms.LeaderAddr)
				if err == nil && ls.Role == "leader" {
					return ms.LeaderAddr, ls.Term
				}
				last = err
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no leader among %v: %v", addrs, last)
	return "", 0
}

// served reports whether every group of the latest config reports that
// config with every shard Serving.
func served(st *shardkvpb.ClusterStatus) bool {
	reports := map[uint64]*shardkvpb.GroupReport{}
	for _, g := range st.Groups {
		reports[g.Report.Gid] = g.Report
	}
	for _, g := range st.Latest.Groups {
		r := reports[g.Gid]
		if r == nil || r.ConfigNum != st.Latest.Num {
			return false
		}
		for _, s := range r.Shards {
			if s.State != "Serving" {
				return false
			}
		}
	}
	return len(st.Latest.Groups) > 0
}

// --- `node local` ---

type endpoint struct{ name, grpc, http string }

// localCluster is a `node local` process tree.
type localCluster struct {
	*proc
	dir, home, dataDir string
	eps                map[string]endpoint // by replica name
	ctrl               []string            // controller gRPC addresses
}

// startLocal starts `node local` in a fresh data dir on free ports and waits
// until it is serving; it retries on other ports if one was taken.
func startLocal(t *testing.T, procs int, args ...string) *localCluster {
	t.Helper()
	return startLocalEnv(t, procs, nil, args...)
}

// startLocalEnv is startLocal with extra environment for `node local`,
// which its children inherit (SHARDKV_* sets their `node serve` flags).
func startLocalEnv(t *testing.T, procs int, env []string, args ...string) *localCluster {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		dataDir := filepath.Join(dir, fmt.Sprintf("data%d", attempt))
		base := freeBase(t, procs, 0, 1000, 2000)
		all := append([]string{"local", "--data-dir=" + dataDir, fmt.Sprint("--base-port=", base)}, args...)
		c := &localCluster{dir: dir, home: home, dataDir: dataDir}
		c.proc = startProc(t, "node local", home, dir, env, all...)
		if c.waitServing(t, 90*time.Second) {
			return c
		}
		busy := strings.Contains(logsText(dataDir), "address already in use")
		c.cmd.Process.Kill()
		<-c.waited
		killAllUnder(dir)
		if !busy || attempt == 3 {
			t.Fatalf("node local did not start serving:\n%s\n%s\nlogs:\n%s", c.out.String(), c.errOut.String(), tail(logsText(dataDir), 6000))
		}
		t.Logf("a port was taken; retrying on other ports")
	}
}

// waitServing waits for the "shardkv is serving" line and reads the
// endpoint table.
func (c *localCluster) waitServing(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	if !c.waitOutput("shardkv is serving", timeout, false) {
		return false
	}
	// The table follows the line; wait for its last line.
	if !c.waitOutput("Ctrl-C stops everything", 5*time.Second, false) {
		return false
	}
	c.eps = map[string]endpoint{}
	c.ctrl = nil
	sc := bufio.NewScanner(strings.NewReader(c.out.String()))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 5 && strings.HasPrefix(f[0], "ctrler-") && f[1] == "controller":
			c.eps[f[0]] = endpoint{f[0], f[2], f[4]}
			c.ctrl = append(c.ctrl, f[2])
		case len(f) >= 6 && strings.HasPrefix(f[0], "group-") && f[1] == "group":
			c.eps[f[0]] = endpoint{f[0], f[3], f[5]}
		}
	}
	return len(c.ctrl) > 0
}

func logsText(dataDir string) string {
	var sb strings.Builder
	ents, _ := os.ReadDir(filepath.Join(dataDir, "logs"))
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dataDir, "logs", e.Name()))
		fmt.Fprintf(&sb, "== %s\n%s", e.Name(), tail(string(b), 1500))
	}
	return sb.String()
}

// waitForLog reads the log at path until each of want is in it, or 15 s
// pass: for lines a replica writes after the client has its answer.
func waitForLog(t *testing.T, path string, want ...string) string {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		all := true
		for _, w := range want {
			all = all && strings.Contains(string(b), w)
		}
		if all || time.Now().After(deadline) {
			return string(b)
		}
	}
}

// groupAddrs returns the gRPC addresses of group gid's replicas.
func (c *localCluster) groupAddrs(gid int) []string {
	var out []string
	for i := 1; ; i++ {
		ep, ok := c.eps[fmt.Sprintf("group-%d-%d", gid, i)]
		if !ok {
			return out
		}
		out = append(out, ep.grpc)
	}
}

// nameOf returns the replica name serving gRPC at addr.
func (c *localCluster) nameOf(addr string) string {
	for _, ep := range c.eps {
		if ep.grpc == addr {
			return ep.name
		}
	}
	return ""
}

// --- HTTP ---

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metrics scrapes a Prometheus text page into series -> value, a series
// being the name with its labels as printed ("shardkv_shards{state=\"Serving\"}").
func metrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	code, body := httpGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}
