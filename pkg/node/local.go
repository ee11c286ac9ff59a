package node

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/shardkv/shardkv/internal/durable"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/localstate"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// LocalOptions are `node local`'s flags.
type LocalOptions struct {
	Groups         int    `json:"groups"`
	Replicas       int    `json:"replicas"`
	CtrlerReplicas int    `json:"ctrler_replicas"`
	SpareGroups    int    `json:"spare_groups"`
	DataDir        string `json:"-"`
	BasePort       int    `json:"base_port"`
	Host           string `json:"host"`
	RESP           bool   `json:"resp"`
	Shards         int    `json:"shards"`
	Placement      string `json:"placement"`
	// TLS: mutual TLS everywhere, with a CA and certificates made under
	// DataDir/tls (localtls.go).
	TLS bool `json:"tls"`
	// RESPPlain: with TLS, Redis also in plain text on the RESP ports, and
	// over TLS 1000 above them.
	RESPPlain bool   `json:"resp_plain"`
	LogLevel  string `json:"-"`
	// MigrateBytesPerSec is passed to every data group (node serve).
	MigrateBytesPerSec int64 `json:"-"`
	// ReportEvery is passed to every data group (node serve).
	ReportEvery time.Duration `json:"-"`
	// PProf is passed to every process (node serve --pprof).
	PProf bool `json:"-"`
	given map[string]bool
}

// ParseLocal parses `node local` arguments.
func ParseLocal(args []string, stderr io.Writer) (*LocalOptions, error) {
	fs := flag.NewFlagSet("node local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &LocalOptions{}
	fs.IntVar(&o.Groups, "groups", 3, "data groups joined at start")
	fs.IntVar(&o.Replicas, "replicas", 3, "replicas per data group")
	fs.IntVar(&o.CtrlerReplicas, "ctrler-replicas", 3, "controller replicas")
	fs.IntVar(&o.SpareGroups, "spare-groups", 1, "extra data groups started but not joined (try `kvctl join`)")
	fs.StringVar(&o.DataDir, "data-dir", "./data", "where every replica keeps its state")
	fs.IntVar(&o.BasePort, "base-port", 7000, "first port: gRPC base+i, HTTP base+1000+i, RESP base+2000+i for process i")
	fs.StringVar(&o.Host, "host", "127.0.0.1", "address to listen on and advertise")
	fs.BoolVar(&o.RESP, "resp", true, "serve the Redis protocol on every data-group replica")
	fs.IntVar(&o.Shards, "shards", routing.DefaultShards, "shard count (fixed when the cluster is created)")
	fs.StringVar(&o.Placement, "placement", string(placement.Balanced), "balanced or consistent-hash (fixed when the cluster is created)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "children's log level")
	fs.Int64Var(&o.MigrateBytesPerSec, "migrate-bytes-per-sec", 0, "every data group's copy rate limit, bytes/s (0: none)")
	fs.DurationVar(&o.ReportEvery, "report-every", 0, "how often every data group's leader reports to the controller (0: 500ms)")
	fs.BoolVar(&o.PProf, "pprof", false, "every process serves Go's profiler under /debug/pprof/ on its HTTP port")
	fs.BoolVar(&o.RESPPlain, "resp-plain", false, "with --tls: serve Redis in plain text on the RESP ports too, and over TLS on RESP+1000 (base+3000+i); plain-text Redis clients are then not authenticated by TLS")
	fs.BoolVar(&o.TLS, "tls", false, "mutual TLS on every gRPC connection and HTTPS on the HTTP ports, with a CA and certificates made under --data-dir/tls (fixed when the cluster is created); kvctl finds the admin certificate")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	o.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.given[f.Name] = true })
	switch {
	case o.Groups < 1:
		return nil, errors.New("--groups must be >= 1")
	case o.Replicas < 1 || o.CtrlerReplicas < 1:
		return nil, errors.New("--replicas and --ctrler-replicas must be >= 1")
	case o.SpareGroups < 0:
		return nil, errors.New("--spare-groups must be >= 0")
	case o.RESPPlain && !o.TLS:
		return nil, errors.New("--resp-plain is for --tls clusters (without --tls, Redis is only plain text)")
	case o.BasePort < 1 || o.BasePort+3000+o.processes() > 65535:
		return nil, fmt.Errorf("--base-port=%d leaves no room for %d processes", o.BasePort, o.processes())
	}
	if err := routing.ValidateShards(o.Shards); err != nil {
		return nil, fmt.Errorf("--shards: %w", err)
	}
	if _, err := placement.Parse(o.Placement); err != nil {
		return nil, fmt.Errorf("--placement: %w", err)
	}
	if err := validReportEvery(o.ReportEvery); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *LocalOptions) processes() int { return o.CtrlerReplicas + (o.Groups+o.SpareGroups)*o.Replicas }

// reconcileDisk loads the cluster's recorded shape from the data dir. Flags
// given that contradict it are refused; flags not given take the recorded
// values.
func (o *LocalOptions) reconcileDisk() (resumed bool, err error) {
	path := filepath.Join(o.DataDir, "local.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(o.DataDir, 0o750); err != nil {
			return false, err
		}
		b, _ := json.MarshalIndent(o, "", "  ")
		return false, durable.WriteFile(path, append(b, '\n'), 0o640)
	}
	if err != nil {
		return false, err
	}
	var disk LocalOptions
	if err := json.Unmarshal(b, &disk); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	var bad []string
	check := func(name string, flagV, diskV any, set func()) {
		if fmt.Sprint(flagV) == fmt.Sprint(diskV) {
			return
		}
		if o.given[name] {
			bad = append(bad, fmt.Sprintf("--%s=%v (the cluster has %v)", name, flagV, diskV))
			return
		}
		set()
	}
	check("groups", o.Groups, disk.Groups, func() { o.Groups = disk.Groups })
	check("replicas", o.Replicas, disk.Replicas, func() { o.Replicas = disk.Replicas })
	check("ctrler-replicas", o.CtrlerReplicas, disk.CtrlerReplicas, func() { o.CtrlerReplicas = disk.CtrlerReplicas })
	check("spare-groups", o.SpareGroups, disk.SpareGroups, func() { o.SpareGroups = disk.SpareGroups })
	check("base-port", o.BasePort, disk.BasePort, func() { o.BasePort = disk.BasePort })
	check("host", o.Host, disk.Host, func() { o.Host = disk.Host })
	check("resp", o.RESP, disk.RESP, func() { o.RESP = disk.RESP })
	check("shards", o.Shards, disk.Shards, func() { o.Shards = disk.Shards })
	check("placement", o.Placement, disk.Placement, func() { o.Placement = disk.Placement })
	check("tls", o.TLS, disk.TLS, func() { o.TLS = disk.TLS })
	check("resp-plain", o.RESPPlain, disk.RESPPlain, func() { o.RESPPlain = disk.RESPPlain })
	if len(bad) > 0 {
		return true, fmt.Errorf("%s holds a cluster created with other settings; these flags contradict it: %s. Drop them to resume it, or use another --data-dir",
			o.DataDir, strings.Join(bad, ", "))
	}
	return true, nil
}

// proc is one child replica process.
type proc struct {
	name     string
	role     string
	gid      uint64
	id       uint64
	grpc     string
	http     string
	resp     string
	respTLS  string // with --tls: the Redis TLS endpoint (resp itself unless --resp-plain)
	args     []string
	logPath  string
	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
}

func (o *LocalOptions) layout() (ctrl []*proc, groups map[uint64][]*proc) {
	i := 0
	next := func() (string, string, string) {
		g := fmt.Sprintf("%s:%d", o.Host, o.BasePort+i)
		h := fmt.Sprintf("%s:%d", o.Host, o.BasePort+1000+i)
		r := fmt.Sprintf("%s:%d", o.Host, o.BasePort+2000+i)
		i++
		return g, h, r
	}
	// respTLSAt is the TLS Redis port beside a plain one (--resp-plain).
	respTLSAt := func(idx int) string { return fmt.Sprintf("%s:%d", o.Host, o.BasePort+3000+idx) }
	for id := 1; id <= o.CtrlerReplicas; id++ {
		g, h, _ := next()
		ctrl = append(ctrl, &proc{name: fmt.Sprintf("ctrler-%d", id), role: "ctrler", id: uint64(id), grpc: g, http: h})
	}
	groups = map[uint64][]*proc{}
	for gid := uint64(1); gid <= uint64(o.Groups+o.SpareGroups); gid++ {
		for id := 1; id <= o.Replicas; id++ {
			g, h, r := next()
			p := &proc{name: fmt.Sprintf("group-%d-%d", gid, id), role: "group", gid: gid, id: uint64(id), grpc: g, http: h}
			switch {
			case o.RESP && o.TLS && o.RESPPlain:
				p.resp, p.respTLS = r, respTLSAt(i-1)
			case o.RESP && o.TLS:
				p.respTLS = r
			case o.RESP:
				p.resp = r
			}
			groups[gid] = append(groups[gid], p)
		}
	}
	peers := func(ps []*proc) string {
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%d=%s", p.id, p.grpc))
		}
		return strings.Join(out, ",")
	}
	var ctrlAddrs []string
	for _, p := range ctrl {
		ctrlAddrs = append(ctrlAddrs, p.grpc)
	}
	for _, p := range ctrl {
		p.args = []string{"serve", "--role=ctrler", fmt.Sprint("--id=", p.id), "--data-dir=" + filepath.Join(o.DataDir, p.name),
			"--listen=" + p.grpc, "--http=" + p.http, "--peers=" + peers(ctrl), fmt.Sprint("--shards=", o.Shards),
			"--placement=" + o.Placement, "--log-level=" + o.LogLevel}
		if o.PProf {
			p.args = append(p.args, "--pprof")
		}
		p.args = append(p.args, o.tlsArgs(p)...)
	}
	for gid, ps := range groups {
		for _, p := range ps {
			p.args = []string{"serve", "--role=group", fmt.Sprint("--group=", gid), fmt.Sprint("--id=", p.id),
				"--data-dir=" + filepath.Join(o.DataDir, p.name), "--listen=" + p.grpc, "--http=" + p.http,
				"--peers=" + peers(ps), "--ctrler=" + strings.Join(ctrlAddrs, ","), "--log-level=" + o.LogLevel}
			if p.resp != "" {
				p.args = append(p.args, "--resp="+p.resp)
			}
			if p.respTLS != "" {
				p.args = append(p.args, "--resp-tls="+p.respTLS)
			}
			if o.MigrateBytesPerSec > 0 {
				p.args = append(p.args, fmt.Sprint("--migrate-bytes-per-sec=", o.MigrateBytesPerSec))
			}
			if o.ReportEvery > 0 {
				p.args = append(p.args, fmt.Sprint("--report-every=", o.ReportEvery))
			}
			if o.PProf {
				p.args = append(p.args, "--pprof")
			}
			p.args = append(p.args, o.tlsArgs(p)...)
		}
	}
	return ctrl, groups
}

// LocalState is what `node local` records for kvctl.
type LocalState = localstate.State

// LocalStatePath is where it is recorded (~/.shardkv/local.json).
func LocalStatePath() string { return localstate.Path() }

// RunLocal runs a whole cluster as child processes until ctx ends.
func RunLocal(ctx context.Context, o *LocalOptions, out io.Writer, log *slog.Logger) error {
	resumed, err := o.reconcileDisk()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctrl, groups := o.layout()
	all := append([]*proc{}, ctrl...)
	for gid := uint64(1); gid <= uint64(o.Groups+o.SpareGroups); gid++ {
		all = append(all, groups[gid]...)
	}
	if err := os.MkdirAll(filepath.Join(o.DataDir, "logs"), 0o750); err != nil {
		return err
	}
	var ctrlAddrs []string
	for _, p := range ctrl {
		ctrlAddrs = append(ctrlAddrs, p.grpc)
	}
	absDir, _ := filepath.Abs(o.DataDir)
	state := LocalState{Ctrler: ctrlAddrs, DataDir: absDir, PID: os.Getpid()}
	if o.TLS {
		if err := o.makeCerts(all); err != nil {
			return fmt.Errorf("--tls: %w", err)
		}
		state.TLSDir, _ = filepath.Abs(o.adminTLSDir())
	}
	if b, err := json.MarshalIndent(state, "", "  "); err == nil {
		os.MkdirAll(filepath.Dir(LocalStatePath()), 0o750)
		os.WriteFile(LocalStatePath(), append(b, '\n'), 0o640)
	}
	if resumed {
		fmt.Fprintf(out, "resuming the cluster in %s (%d processes)\n", o.DataDir, len(all))
	} else {
		fmt.Fprintf(out, "creating a cluster in %s: %d controller replicas, %d groups x %d replicas (+%d spare), %d shards\n",
			o.DataDir, o.CtrlerReplicas, o.Groups, o.Replicas, o.SpareGroups, o.Shards)
	}
	var wg sync.WaitGroup
	stopping := make(chan struct{})
	for _, p := range all {
		p.logPath = filepath.Join(o.DataDir, "logs", p.name+".log")
		wg.Add(1)
		go func() {
			defer wg.Done()
			supervise(p, self, stopping, out, log)
		}()
	}
	shutdown := func() {
		close(stopping)
		fmt.Fprintln(out, "stopping all replicas...")
		for _, p := range all {
			p.signal(syscall.SIGTERM)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(ShutdownTimeout + 4*time.Second):
			for _, p := range all {
				p.signal(syscall.SIGKILL)
			}
			wg.Wait()
		}
		fmt.Fprintln(out, "stopped")
	}
	if err := bringUp(ctx, o, ctrlAddrs, groups, out); err != nil {
		shutdown()
		if ctx.Err() != nil {
			return nil // stopped (Ctrl-C) while starting: not a failure
		}
		return err
	}
	printEndpoints(out, o, ctrl, groups)
	<-ctx.Done()
	shutdown()
	return nil
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(sig)
	}
}

// supervise runs a child and restarts it with backoff when it dies.
func supervise(p *proc, self string, stopping <-chan struct{}, out io.Writer, log *slog.Logger) {
	delay := time.Second
	for {
		f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
		if err != nil {
			fmt.Fprintf(out, "%s: cannot open log: %v\n", p.name, err)
			return
		}
		cmd := exec.Command(self, p.args...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C goes to us, not straight to children
		started := time.Now()
		p.mu.Lock()
		select {
		case <-stopping: // shutdown has signalled the children: start no new one
			p.mu.Unlock()
			f.Close()
			return
		default:
		}
		err = cmd.Start()
		p.cmd = cmd
		p.mu.Unlock()
		if err == nil {
			err = cmd.Wait()
		}
		f.Close()
		select {
		case <-stopping:
			return
		default:
		}
		if time.Since(started) > time.Minute {
			delay = time.Second
		}
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
		fmt.Fprintf(out, "%s (pid %d) exited: %v; restarting in %v (log: %s)\n", p.name, pid(cmd), err, delay, p.logPath)
		select {
		case <-stopping:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

func pid(c *exec.Cmd) int {
	if c.Process == nil {
		return 0
	}
	return c.Process.Pid
}

// bringUp waits for the controller, joins the groups that are not joined
// yet (first run), and waits until every shard is served.
func bringUp(ctx context.Context, o *LocalOptions, ctrlAddrs []string, groups map[uint64][]*proc, out io.Writer) error {
	dial, err := o.adminDialOptions()
	if err != nil {
		return err
	}
	cl, err := ctrlerclient.New(ctrlAddrs, dial...)
	if err != nil {
		return err
	}
	defer cl.Close()
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	conf, err := cl.Query(wctx, -1)
	if err != nil {
		return fmt.Errorf("the controller group did not come up: %w (see %s/logs)", err, o.DataDir)
	}
	var toJoin []*shardkvpb.Group
	for gid := uint64(1); gid <= uint64(o.Groups); gid++ {
		if !hasGroup(conf, gid) {
			g := &shardkvpb.Group{Gid: gid}
			for _, p := range groups[gid] {
				g.Servers = append(g.Servers, &shardkvpb.Server{Id: p.id, Addr: p.grpc, RespAddr: p.resp, RespTlsAddr: p.respTLS})
			}
			toJoin = append(toJoin, g)
		}
	}
	if len(toJoin) > 0 {
		fmt.Fprintf(out, "joining %d groups...\n", len(toJoin))
		if conf, err = cl.Join(wctx, toJoin...); err != nil {
			return fmt.Errorf("join: %w", err)
		}
	}
	fmt.Fprintf(out, "waiting for config %d to be served...\n", conf.Num)
	for {
		st, err := cl.Status(wctx)
		if err == nil && served(st) {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the cluster did not start serving in time (see %s/logs): %v", o.DataDir, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func hasGroup(c *shardkvpb.Config, gid uint64) bool {
	for _, g := range c.Groups {
		if g.Gid == gid {
			return true
		}
	}
	return false
}

// served: every group in the latest config reports it and no moving shard.
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

func printEndpoints(out io.Writer, o *LocalOptions, ctrl []*proc, groups map[uint64][]*proc) {
	fmt.Fprintln(out, "\nshardkv is serving. Endpoints:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tROLE\tGRPC\tRESP\tHTTP (/readyz /metrics)\tJOINED")
	for _, p := range ctrl {
		fmt.Fprintf(tw, "%s\tcontroller\t%s\t-\t%s\t-\n", p.name, p.grpc, p.http)
	}
	for gid := uint64(1); gid <= uint64(o.Groups+o.SpareGroups); gid++ {
		joined := "yes"
		if gid > uint64(o.Groups) {
			joined = "no (spare)"
		}
		for _, p := range groups[gid] {
			resp := p.resp
			if resp == "" {
				resp = p.respTLS
			}
			if resp == "" {
				resp = "-"
			}
			fmt.Fprintf(tw, "%s\tgroup %d\t%s\t%s\t%s\t%s\n", p.name, gid, p.grpc, resp, p.http, joined)
		}
	}
	tw.Flush()
	fmt.Fprintf(out, "\nkvctl finds this cluster through %s; or pass --ctrler=%s\n", LocalStatePath(), ctrl[0].grpc)
	fmt.Fprintln(out, "  kvctl put greeting hello && kvctl get greeting")
	fmt.Fprintln(out, "  kvctl status")
	if o.SpareGroups > 0 {
		sp := groups[uint64(o.Groups+1)]
		var addrs []string
		for _, p := range sp {
			addrs = append(addrs, p.grpc)
		}
		fmt.Fprintf(out, "  kvctl join %d=%s    # add a spare group and watch shards move\n", o.Groups+1, strings.Join(addrs, ","))
	}
	switch {
	case o.RESP && o.TLS:
		if o.RESPPlain {
			fmt.Fprintf(out, "  redis-cli -c -p %s set k v    (plain text; over TLS 1000 above)\n", strings.TrimPrefix(groups[1][0].resp, o.Host+":"))
		}
		fmt.Fprintf(out, "  redis-cli --tls --cacert %s -c -p %s set k v\n", filepath.Join(o.tlsDir(), "ca", "ca.crt"), strings.TrimPrefix(groups[1][0].respTLS, o.Host+":"))
	case o.RESP:
		fmt.Fprintf(out, "  redis-cli -c -p %s set k v\n", strings.TrimPrefix(groups[1][0].resp, o.Host+":"))
	}
	fmt.Fprintf(out, "Logs are in %s/logs. Kill a replica with kill -9 <pid>: it is restarted. Ctrl-C stops everything.\n", o.DataDir)
}
