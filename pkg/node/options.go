// Package node assembles one shardkv replica process (`node serve`) and the
// one-machine cluster supervisor (`node local`).
package node

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
)

// Options are `node serve`'s flags: a stable contract for tests, the
// operator's pods and users' scripts.
type Options struct {
	Role string
	ID   uint64
	// IDAuto: --id=auto (see resolveAutoID).
	IDAuto        bool
	DataDir       string
	Listen        string
	Advertise     string
	Group         uint64
	Peers         []raftgroup.Peer
	Join          bool
	Ctrler        []string
	Shards        int
	Placement     string
	RESP          string
	RESPAdvertise string
	// RESPTLS: the Redis-over-TLS listener (needs TLS); RESPTLSAuthClients
	// is "no", "optional" or "yes" (Redis's tls-auth-clients).
	RESPTLS, RESPTLSAdvertise, RESPTLSAuthClients string
	RequirePass                                   string
	// Redis front-end limits (role=group).
	RESPMaxClients      int
	RESPMaxRequestBytes int
	RESPMaxBulkBytes    int
	RESPInputBudget     int64
	RESPOutputBudget    int64
	RESPTimeout         time.Duration
	RESPWriteTimeout    time.Duration
	MaxValueBytes       int
	MigrateBytesPerSec  int64
	// ReportEvery is how often the group's leader reports to the
	// controller (0: shardkv's default, 500ms).
	ReportEvery time.Duration
	// Raft log compaction (0: raftgroup's defaults).
	SnapshotEntries, TrailingEntries uint64
	HTTP                             string
	// PProf serves Go's profiler under /debug/pprof/ on --http. Off by
	// default: a profile shows internals and costs CPU while it runs.
	PProf    bool
	LogLevel string

	// TLS: mutual TLS on every gRPC connection, served and dialed, when
	// set (docs/security.md).
	TLS mtls.Files
	// HTTPTokenFile holds a bearer token that opens the HTTP endpoints.
	HTTPTokenFile string
	// HTTPOpen are the HTTP paths served without a token or an admin
	// certificate once either is configured.
	HTTPOpen []string
}

// EnvPrefix: every flag can also come from SHARDKV_<FLAG> (upper case, '-'
// as '_'). A flag on the command line wins.
const EnvPrefix = "SHARDKV_"

// EnvName is the environment variable for a flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag of fs not given on the command line from its
// environment variable, if present.
func ApplyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// ParseServe parses `node serve` arguments (and environment).
func ParseServe(args []string, stderr io.Writer) (*Options, error) {
	fs := flag.NewFlagSet("node serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &Options{}
	var peers, ctrler string
	fs.StringVar(&o.Role, "role", "", "ctrler or group")
	fs.Var(idFlag{o}, "id", "replica id within its group, >= 1, never reused; or auto: the id on disk, else the --peers entry whose address is --advertise (bootstrap), else a fresh id, joining (for StatefulSets)")
	fs.StringVar(&o.DataDir, "data-dir", "", "directory for all of this replica's state")
	fs.StringVar(&o.Listen, "listen", "", "host:port for Raft and the gRPC API")
	fs.StringVar(&o.Advertise, "advertise", "", "address others use to reach --listen (default: --listen unless it is a wildcard)")
	fs.Uint64Var(&o.Group, "group", 0, "data group id (role=group)")
	fs.StringVar(&peers, "peers", "", "initial members when bootstrapping: id=host:port,... (including this one)")
	fs.BoolVar(&o.Join, "join", false, "start empty as a new member of an existing group")
	fs.StringVar(&ctrler, "ctrler", "", "controller addresses host:port,... (role=group)")
	fs.IntVar(&o.Shards, "shards", routing.DefaultShards, "shard count, a power of two (role=ctrler; fixed at cluster creation)")
	fs.StringVar(&o.Placement, "placement", string(placement.Balanced), "balanced or consistent-hash (role=ctrler; fixed at cluster creation)")
	fs.StringVar(&o.RESP, "resp", "", "Redis protocol listener host:port (role=group)")
	fs.StringVar(&o.RESPAdvertise, "resp-advertise", "", "address clients use to reach --resp")
	fs.StringVar(&o.RESPTLS, "resp-tls", "", "Redis protocol over TLS listener host:port, with --tls-cert (role=group); leave --resp unset to refuse plain-text clients")
	fs.StringVar(&o.RESPTLSAdvertise, "resp-tls-advertise", "", "address clients use to reach --resp-tls")
	fs.StringVar(&o.RESPTLSAuthClients, "resp-tls-auth-clients", "optional", "no, optional or yes: whether --resp-tls clients must present a certificate from --tls-ca (a given one is always checked)")
	fs.StringVar(&o.RequirePass, "requirepass", "", "Redis AUTH password (prefer "+EnvName("requirepass")+")")
	fs.IntVar(&o.RESPMaxClients, "resp-max-clients", 10000, "Redis connections served at once; more are refused with an error")
	fs.IntVar(&o.RESPMaxRequestBytes, "resp-max-request-bytes", 0, "largest Redis request (one command with its arguments), and so what one connection buffers (0: 16 MiB, or one --resp-max-bulk-bytes bulk if larger); a larger one gets a protocol error at its header and the connection is closed")
	fs.IntVar(&o.RESPMaxBulkBytes, "resp-max-bulk-bytes", 0, "largest Redis argument, Redis's proto-max-bulk-len (0: twice --max-value-bytes, at least 1 MiB); a longer one gets 'invalid bulk length' at its header and the connection is closed")
	fs.Int64Var(&o.RESPInputBudget, "resp-input-budget-bytes", 0, "input all Redis connections may hold at once (0: 256 MiB, at least 4 requests); a connection needing more gets an error and is closed")
	fs.Int64Var(&o.RESPOutputBudget, "resp-output-budget-bytes", 0, "output all Redis connections may hold at once: values read for replies and replies not yet written (0: 1 GiB); a read needing more gets an error, nothing else changes")
	fs.DurationVar(&o.RESPTimeout, "resp-timeout", 0, "close a Redis client idle this long, Redis's timeout (0: never)")
	fs.DurationVar(&o.RESPWriteTimeout, "resp-write-timeout", 2*time.Second, "how long a Redis write waits for its Raft entry to apply before answering 'outcome unknown' (keep it below clients' read timeouts: go-redis's default is 3s)")
	fs.Int64Var(&o.MigrateBytesPerSec, "migrate-bytes-per-sec", 0, "copy rate limit of the shards this group pulls, bytes per second over all of them (0: none); a move's last round, which writes wait for, is not limited")
	fs.DurationVar(&o.ReportEvery, "report-every", 0, fmt.Sprintf("how often the group's leader reports its state to the controller (0: 500ms; at most %v: the controller cuts a shard move over only on a report younger than 2s)", MaxReportEvery))
	fs.IntVar(&o.MaxValueBytes, "max-value-bytes", shardkv.DefaultMaxValueBytes, fmt.Sprintf("largest value a write may carry (one value travels in one Raft entry, whose limit follows from it; at most %d)", shardkv.MaxValueBytesLimit))
	fs.Uint64Var(&o.SnapshotEntries, "snapshot-entries", 0, "compact the Raft log every so many applied entries (0: 10000); small values make snapshots and compactions frequent, for tests")
	fs.Uint64Var(&o.TrailingEntries, "trailing-entries", 0, "entries kept in the Raft log after a compaction, for followers slightly behind (0: 5000)")
	fs.StringVar(&o.HTTP, "http", "", "host:port for /healthz, /readyz and /metrics")
	fs.BoolVar(&o.PProf, "pprof", false, "also serve Go's profiler under /debug/pprof/ on --http (unauthenticated: only where --http is private)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.TLS.Cert, "tls-cert", "", "PEM certificate from the cluster CA naming this replica (urn:shardkv:ctrler or urn:shardkv:group:<gid>); with --tls-key and --tls-ca turns on mutual TLS for all gRPC; re-read when it changes")
	fs.StringVar(&o.TLS.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&o.TLS.CA, "tls-ca", "", "PEM bundle of the CAs every peer's certificate must chain to")
	fs.StringVar(&o.HTTPTokenFile, "http-token-file", "", "file holding a bearer token that opens --http's endpoints (an admin client certificate does too, with TLS on); re-read when it changes")
	var open string
	fs.StringVar(&open, "http-open", "/healthz", "with TLS or --http-token-file on: comma-separated --http paths served to anyone (for example /healthz,/readyz for the kubelet's probes)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	var err error
	if o.Peers, err = ParsePeers(peers); err != nil {
		return nil, fmt.Errorf("--peers: %w", err)
	}
	o.Ctrler = splitList(ctrler)
	o.HTTPOpen = splitList(open)
	return o, o.validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// idFlag is --id: a number, or "auto".
type idFlag struct{ o *Options }

func (f idFlag) String() string {
	if f.o == nil {
		return ""
	}
	if f.o.IDAuto {
		return "auto"
	}
	return strconv.FormatUint(f.o.ID, 10)
}

func (f idFlag) Set(v string) error {
	if v == "auto" {
		f.o.ID, f.o.IDAuto = 0, true
		return nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return fmt.Errorf("want a number >= 1 or auto")
	}
	f.o.ID, f.o.IDAuto = n, false
	return nil
}

// ParsePeers parses "id=host:port,...".
func ParsePeers(s string) ([]raftgroup.Peer, error) {
	var out []raftgroup.Peer
	seen := map[uint64]bool{}
	for _, item := range splitList(s) {
		id, addr, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want id=host:port", item)
		}
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: id must be a number >= 1", item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%q: %v", item, err)
		}
		if seen[n] {
			return nil, fmt.Errorf("id %d given twice", n)
		}
		seen[n] = true
		out = append(out, raftgroup.Peer{ID: n, Addr: addr})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (o *Options) validate() error {
	switch o.Role {
	case "ctrler", "group":
	case "":
		return errors.New("--role is required (ctrler or group)")
	default:
		return fmt.Errorf("--role=%q: want ctrler or group", o.Role)
	}
	if o.ID == 0 && !o.IDAuto {
		return errors.New("--id is required: a number >= 1, or auto")
	}
	if o.DataDir == "" {
		return errors.New("--data-dir is required")
	}
	if err := o.TLS.Validate(); err != nil {
		return fmt.Errorf("--tls-cert, --tls-key, --tls-ca: %w", err)
	}
	for _, p := range o.HTTPOpen {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("--http-open: %q is not a path (want /healthz,/readyz,...)", p)
		}
	}
	if o.Listen == "" {
		return errors.New("--listen is required")
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		return fmt.Errorf("--listen=%q: %v", o.Listen, err)
	}
	if o.Advertise == "" {
		host, _, _ := net.SplitHostPort(o.Listen)
		if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			return fmt.Errorf("--listen=%q is a wildcard address: give --advertise with an address others can reach", o.Listen)
		}
		o.Advertise = o.Listen
	}
	if o.Role == "group" {
		if o.Group == 0 {
			return errors.New("--group is required for role=group (a gid >= 1)")
		}
		if len(o.Ctrler) == 0 {
			return errors.New("--ctrler is required for role=group")
		}
		if err := validReportEvery(o.ReportEvery); err != nil {
			return err
		}
	} else {
		if o.ReportEvery != 0 {
			return errors.New("--report-every is only for role=group")
		}
		if o.Group != 0 {
			return errors.New("--group is only for role=group")
		}
		if o.RESP != "" || o.RESPTLS != "" {
			return errors.New("--resp and --resp-tls are only for role=group")
		}
		if err := routing.ValidateShards(o.Shards); err != nil {
			return fmt.Errorf("--shards: %w", err)
		}
		if _, err := placement.Parse(o.Placement); err != nil {
			return fmt.Errorf("--placement: %w", err)
		}
	}
	if o.IDAuto {
		if o.Join {
			return errors.New("--join with --id=auto: auto decides whether to join")
		}
	} else if o.Join && len(o.Peers) > 0 {
		found := false
		for _, p := range o.Peers {
			found = found || p.ID == o.ID
		}
		if found {
			return fmt.Errorf("--join with --peers listing id %d: a joining replica needs a new id, not one of the existing members", o.ID)
		}
	}
	if !o.Join && !o.IDAuto && len(o.Peers) > 0 {
		found := false
		for _, p := range o.Peers {
			found = found || p.ID == o.ID
		}
		if !found {
			return fmt.Errorf("--peers must include this replica (id %d)", o.ID)
		}
	}
	for _, l := range []struct {
		flag        string
		listen, adv string
		advertise   *string
	}{{"resp", o.RESP, o.RESPAdvertise, &o.RESPAdvertise}, {"resp-tls", o.RESPTLS, o.RESPTLSAdvertise, &o.RESPTLSAdvertise}} {
		if l.listen == "" {
			continue
		}
		host, _, err := net.SplitHostPort(l.listen)
		if err != nil {
			return fmt.Errorf("--%s=%q: %v", l.flag, l.listen, err)
		}
		if l.adv == "" {
			if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
				return fmt.Errorf("--%s=%q is a wildcard address: give --%s-advertise with an address clients can reach", l.flag, l.listen, l.flag)
			}
			*l.advertise = l.listen
		}
	}
	if o.RESPTLS != "" && !o.TLS.Enabled() {
		return errors.New("--resp-tls needs --tls-cert, --tls-key and --tls-ca (its certificate)")
	}
	switch o.RESPTLSAuthClients {
	case "no", "optional", "yes":
	default:
		return fmt.Errorf("--resp-tls-auth-clients=%q: want no, optional or yes", o.RESPTLSAuthClients)
	}
	switch {
	case o.RESPMaxClients < 1:
		return fmt.Errorf("--resp-max-clients=%d: want >= 1", o.RESPMaxClients)
	case o.RESPMaxRequestBytes != 0 && o.RESPMaxRequestBytes < 1024:
		return fmt.Errorf("--resp-max-request-bytes=%d: want 0 or >= 1024", o.RESPMaxRequestBytes)
	case o.RESPMaxBulkBytes != 0 && o.RESPMaxBulkBytes < 1024:
		return fmt.Errorf("--resp-max-bulk-bytes=%d: want 0 or >= 1024", o.RESPMaxBulkBytes)
	case o.RESPInputBudget != 0 && o.RESPInputBudget < 1<<20:
		return fmt.Errorf("--resp-input-budget-bytes=%d: want 0 or >= 1 MiB", o.RESPInputBudget)
	case o.RESPOutputBudget != 0 && o.RESPOutputBudget < 16<<20:
		return fmt.Errorf("--resp-output-budget-bytes=%d: want 0 or >= 16 MiB", o.RESPOutputBudget)
	case o.RESPTimeout < 0:
		return fmt.Errorf("--resp-timeout=%v: want >= 0", o.RESPTimeout)
	case o.RESPWriteTimeout < 100*time.Millisecond:
		return fmt.Errorf("--resp-write-timeout=%v: want >= 100ms", o.RESPWriteTimeout)
	case o.MigrateBytesPerSec < 0:
		return fmt.Errorf("--migrate-bytes-per-sec=%d: want 0 (no limit) or more", o.MigrateBytesPerSec)
	case o.MaxValueBytes < 1 || o.MaxValueBytes > shardkv.MaxValueBytesLimit:
		return fmt.Errorf("--max-value-bytes=%d: want 1 to %d", o.MaxValueBytes, shardkv.MaxValueBytesLimit)
	}
	switch o.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("--log-level=%q: want debug, info, warn or error", o.LogLevel)
	}
	return nil
}

// parseFlags parses a subcommand's flags, refuses positional arguments, and
// then applies the SHARDKV_* environment to flags not given.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return ApplyEnv(fs)
}

// MaxReportEvery bounds --report-every: the controller cuts a planned move
// over only on a report younger than 2s, so slower reports would stall
// every move.
const MaxReportEvery = time.Second

func validReportEvery(d time.Duration) error {
	if d < 0 || d > MaxReportEvery {
		return fmt.Errorf("--report-every=%v: want 0 (the default, 500ms) up to %v (the controller cuts a shard move over only on a report younger than 2s)", d, MaxReportEvery)
	}
	return nil
}
