// Package kvctl is shardkv's admin and data command-line tool. The binary
// (cmd/kvctl) is a thin wrapper around Run.
//
// kvctl talks to a cluster only through the wire API (pkg/shardkvpb) and the
// Go clients (pkg/client, pkg/ctrler/ctrlerclient); it never imports server
// packages. See docs/kvctl.md for every command, the JSON schemas and the
// exit codes.
package kvctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/localstate"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitNotFound = 3
)

// EnvCtrler names the environment variable holding the controller addresses.
const EnvCtrler = "SHARDKV_CTRLER"

// EnvTLSDir names the environment variable holding --tls-dir.
const EnvTLSDir = "SHARDKV_TLS_DIR"

// DefaultTimeout bounds one command (one operation, for bench).
const DefaultTimeout = 10 * time.Second

// probeTimeout bounds a call to one member made only to show its state.
const probeTimeout = 2 * time.Second

// LocalState is what `node local` records for kvctl.
type LocalState = localstate.State

// LocalStatePath is where it is recorded (~/.shardkv/local.json).
func LocalStatePath() string { return localstate.Path() }

// command is one kvctl command.
type command struct {
	name  string // "put", "member list"
	args  string // usage after the name
	about string
	run   func(k *kvctl, args []string) error
}

var commands []*command

func init() {
	commands = []*command{
		{"get", "<key>", "print the value of key (exit 3 if it does not exist)", cmdGet},
		{"put", "<key> <value>", "set key to value", cmdPut},
		{"append", "<key> <value>", "append value to key's value (creating it)", cmdAppend},
		{"del", "<key>", "delete key (exit 3 if it did not exist)", cmdDel},
		{"bench", "[--clients=8] [--duration=10s | --ops=N] [--value-size=64] [--keys=1000] [--read-ratio=0.5] [--key-prefix=kvctl-bench:]", "run a load and print a latency table", cmdBench},
		{"fill", "--keys=N [--value-size=1024] [--key-prefix=kvctl-fill:] [--passes=1] [--clients=16]", "write keys <prefix>0..N-1, each with a value made from its name (every key, --passes times); kvctl verify reads them back", cmdFill},
		{"verify", "--keys=N [--value-size=1024] [--key-prefix=kvctl-fill:] [--clients=16]", "read back what kvctl fill wrote; fails if any key is missing, wrong or unreadable", cmdVerify},
		{"workload", "[--redis=HOST:PORT[,...] [--redis-user=U] [--redis-password=PW]] [--clients=8] [--keys=16] [--prefix=P] [--rate=50] [--op-timeout=10s] [--listen=:8090] [--duration=0] [--check [--check-timeout=5m] [--viz=FILE]]", "record a history for a linearizability check; serves it over HTTP (GET /status, POST /stop, GET /history)", cmdWorkload},
		{"join", "<gid>=<addr>[,<addr>...] ... [--weight=N]", "add data groups (addresses are the members' gRPC addresses)", cmdJoin},
		{"leave", "<gid>...", "remove data groups; their shards move to the others (planned, then cut over)", cmdLeave},
		{"move", "<shard> <gid> [--stop-and-copy] [--wait] | --cancel <shard>", "pin shard to group gid (a planned move: pre-copy, then cut-over); --cancel a planned move; --wait prints its phases until the target serves it", cmdMove},
		{"unpin", "<shard>", "return a pinned shard to the balancer", cmdUnpin},
		{"query", "[num]", "show config num (default: the latest)", cmdQuery},
		{"status", "", "show the controller, the data groups and moving shards", cmdStatus},
		{"member list", "(--group <gid>|ctrler | --server <addr>)", "list a group's members", cmdMemberList},
		{"member add", "<id> <addr> (--group <gid>|ctrler | --server <addr>)", "add replica id (started with --join) as a learner", cmdMemberAdd},
		{"member promote", "<id> (--group <gid>|ctrler | --server <addr>) [--update-config=true]", "make learner id a voter", cmdMemberPromote},
		{"member remove", "<id> (--group <gid>|ctrler | --server <addr>) [--update-config=true]", "remove replica id from its group", cmdMemberRemove},
		{"cert ca", "--out=DIR [--name=shardkv] [--validity=87600h]", "make a cluster CA: DIR/ca.crt and DIR/ca.key (keep the key secret)", cmdCertCA},
		{"cert issue", "<identity> --ca=DIR --out=DIR [--hosts=NAME,IP,...] [--validity=8760h]", "issue a certificate from the CA in --ca: identity is ctrler, group/<gid>, admin[/name] or client[/name]; writes tls.crt, tls.key, ca.crt", cmdCertIssue},
		{"transfer-leader", "<id> (--group <gid>|ctrler | --server <addr>)", "make replica id the group's leader", cmdTransferLeader},
	}
}

// synopsis is the command's name and arguments.
func (c *command) synopsis() string { return strings.TrimSpace(c.name + " " + c.args) }

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const globalUsage = `Global flags (before or after the command):
  --ctrler=HOST:PORT[,...]  controller replicas (default: $SHARDKV_CTRLER, else ~/.shardkv/local.json)
  --json                    print JSON instead of tables (schemas: docs/kvctl.md)
  --timeout=10s             deadline of the command (of each operation, for bench)
  --tls-dir=DIR             mutual TLS: DIR holds tls.crt, tls.key (an admin or client
                            certificate) and ca.crt (default: $SHARDKV_TLS_DIR, else
                            what 'node local --tls' recorded; see 'kvctl cert')

Use -- to end flags, e.g. kvctl put k -- -v. Exit codes: 0 ok, 1 error, 2 usage, 3 key not found.
`

func writeUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvctl <command> [args] [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n        %s\n", c.synopsis(), c.about)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, globalUsage)
}

// --- errors and exit codes ---

// usageError: bad command line (exit 2).
type usageError struct {
	cmd *command // nil: the general usage
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd *command, format string, a ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
}

// notFoundError: the key does not exist (exit 3).
type notFoundError struct{ key, what string }

func (e *notFoundError) Error() string {
	if e.what == "" {
		e.what = "not found"
	}
	return fmt.Sprintf("key %q %s", e.key, e.what)
}

// silentExit ends with a code without printing anything more.
type silentExit struct{ code int }

func (e *silentExit) Error() string { return fmt.Sprintf("exit %d", e.code) }

// clean drops gRPC's wrappers from an error text and keeps it on one line.
func clean(s string) string { return client.CleanErrorText(s) }

// oneLine renders err as a single readable line: gRPC wrappers are dropped
// and the controller's refusals print its own message.
func oneLine(err error) string { return client.ErrorLine(err) }

// lastError is the innermost "last error" of a retry loop that ran out of
// time (the clients wrap it as "...: context deadline exceeded (last error:
// X)"), or the whole error.
func lastError(err error) string {
	s := err.Error()
	const marker = "(last error: "
	i := strings.LastIndex(s, marker)
	if i < 0 {
		return oneLine(err)
	}
	inner := s[i+len(marker):]
	for range strings.Count(s, marker) {
		inner = strings.TrimSuffix(inner, ")")
	}
	return clean(inner)
}

// --- the run ---

type kvctl struct {
	stdout, stderr io.Writer
	json           bool
	timeout        time.Duration
	ctrlerFlag     string
	tlsFlag        string

	ctrlerAddrs  []string
	ctrlerSource string // where the addresses came from, for error messages

	pool *grpcdial.Pool    // connections to single replicas
	dial []grpc.DialOption // plaintext, or mutual TLS (--tls-dir)
	// tlsSource is --tls-dir's certificates (nil: none).
	tlsSource *mtls.Source

	mu   sync.Mutex
	ctrl *ctrlerclient.Client
	data *client.Client
}

// Run runs kvctl with args (without the program name) and returns the exit
// code.
func Run(args []string, stdout, stderr io.Writer) int {
	k := &kvctl{stdout: stdout, stderr: stderr}
	defer k.close()

	gfs := flag.NewFlagSet("kvctl", flag.ContinueOnError)
	gfs.StringVar(&k.ctrlerFlag, "ctrler", "", "")
	gfs.BoolVar(&k.json, "json", false, "")
	gfs.DurationVar(&k.timeout, "timeout", DefaultTimeout, "")
	gfs.StringVar(&k.tlsFlag, "tls-dir", "", "")
	help := false
	gfs.BoolVar(&help, "h", false, "")
	gfs.BoolVar(&help, "help", false, "")
	rest, err := parseArgs(gfs, args, true)
	if err != nil {
		return k.fail(usagef(nil, "%v", err))
	}
	if k.timeout <= 0 {
		return k.fail(usagef(nil, "--timeout must be positive"))
	}
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		if help {
			writeUsage(stdout)
			return ExitOK
		}
		writeUsage(stderr)
		return ExitUsage
	}
	name := rest[0]
	rest = rest[1:]
	if isFlagArg(name) {
		return k.fail(usagef(nil, "unknown flag %s (a command's own flags go after the command)", name))
	}
	if name == "help" {
		if len(rest) > 0 {
			if c := lookupCommand(rest); c != nil {
				fmt.Fprintf(stdout, "usage: kvctl %s\n  %s\n\n%s", c.synopsis(), c.about, globalUsage)
				return ExitOK
			}
		}
		writeUsage(stdout)
		return ExitOK
	}
	if name == "member" || name == "cert" {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			subs := map[string]string{"member": "list, add, promote or remove", "cert": "ca or issue"}
			return k.fail(usagef(nil, "%s needs a subcommand: %s", name, subs[name]))
		}
		name += " " + rest[0]
		rest = rest[1:]
	}
	c := findCommand(name)
	if c == nil {
		return k.fail(usagef(nil, "unknown command %q", name))
	}
	if help {
		fmt.Fprintf(stdout, "usage: kvctl %s\n  %s\n\n%s", c.synopsis(), c.about, globalUsage)
		return ExitOK
	}
	if err := k.setupDial(); err != nil {
		return k.fail(err)
	}
	err = c.run(k, rest)
	var ue *usageError
	if errors.As(err, &ue) && ue.cmd == nil {
		ue.cmd = c
	}
	return k.fail(err)
}

func lookupCommand(words []string) *command {
	if c := findCommand(words[0]); c != nil {
		return c
	}
	if len(words) > 1 {
		return findCommand(words[0] + " " + words[1])
	}
	return nil
}

// fail prints err (if any) and returns its exit code.
func (k *kvctl) fail(err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *usageError
	var nf *notFoundError
	var se *silentExit
	switch {
	case errors.As(err, &se):
		return se.code
	case errors.As(err, &ue):
		fmt.Fprintf(k.stderr, "kvctl: %s\n", ue.msg)
		if ue.cmd != nil {
			fmt.Fprintf(k.stderr, "usage: kvctl %s\n", ue.cmd.synopsis())
		} else {
			fmt.Fprintln(k.stderr, "usage: kvctl <command> [args] [flags]; run 'kvctl help' for the commands")
		}
		return ExitUsage
	case errors.As(err, &nf):
		fmt.Fprintf(k.stderr, "kvctl: %s\n", nf.Error())
		return ExitNotFound
	}
	fmt.Fprintf(k.stderr, "kvctl: %s\n", oneLine(err))
	if k.tlsDir() == "" && strings.Contains(err.Error(), "error reading server preface") {
		// A TLS server closes a plaintext connection at once.
		fmt.Fprintf(k.stderr, "kvctl: the servers closed the connection: if the cluster serves mutual TLS, pass --tls-dir (or set %s)\n", EnvTLSDir)
	}
	return ExitError
}

func (k *kvctl) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pool != nil {
		k.pool.Close()
	}
	if k.ctrl != nil {
		k.ctrl.Close()
	}
	if k.data != nil {
		k.data.Close()
	}
}

// --- argument parsing ---

type boolFlag interface{ IsBoolFlag() bool }

// isFlagArg: "-x", "--x", "--x=v", but not "-", "--" or a negative number.
func isFlagArg(a string) bool {
	if len(a) < 2 || a[0] != '-' || a == "--" {
		return false
	}
	if _, err := strconv.ParseFloat(a, 64); err == nil {
		return false
	}
	return true
}

// parseArgs sets the flags of fs found anywhere in args and returns the
// other arguments in order. With keepUnknown (the global pre-pass), flags
// fs does not define are kept in the result, and "--" and everything after
// it are returned untouched; otherwise an unknown flag is an error and
// everything after "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string, keepUnknown bool) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if keepUnknown {
				return append(rest, args[i:]...), nil
			}
			return append(rest, args[i+1:]...), nil
		}
		if !isFlagArg(a) {
			rest = append(rest, a)
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		value, hasValue := "", false
		if j := strings.IndexByte(name, '='); j >= 0 {
			name, value, hasValue = name[:j], name[j+1:], true
		}
		if name == "" || strings.HasPrefix(name, "-") {
			return nil, fmt.Errorf("bad flag syntax: %s", a)
		}
		f := fs.Lookup(name)
		if f == nil {
			if keepUnknown {
				rest = append(rest, a)
				continue
			}
			return nil, fmt.Errorf("unknown flag --%s", name)
		}
		if bf, ok := f.Value.(boolFlag); ok && bf.IsBoolFlag() {
			if !hasValue {
				value = "true"
			}
		} else if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if err := fs.Set(name, value); err != nil {
			return nil, fmt.Errorf("invalid value %q for --%s: %v", value, name, err)
		}
	}
	return rest, nil
}

// parse parses a command's own flags and checks its argument count
// (max < 0: no limit).
func (k *kvctl) parse(fs *flag.FlagSet, args []string, min, max int) ([]string, error) {
	pos, err := parseArgs(fs, args, false)
	if err != nil {
		return nil, usagef(nil, "%v", err)
	}
	if len(pos) < min || (max >= 0 && len(pos) > max) {
		return nil, usagef(nil, "wrong number of arguments (%d)", len(pos))
	}
	return pos, nil
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// --- context, controller and connections ---

func (k *kvctl) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), k.timeout)
}

// ctrlerCall opens the controller client and a context bounded by
// --timeout: the prologue of every command that makes one controller call.
func (k *kvctl) ctrlerCall() (*ctrlerclient.Client, context.Context, context.CancelFunc, error) {
	ctrl, err := k.ctrler()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := k.ctx()
	return ctrl, ctx, cancel, nil
}

// resolveCtrler finds the controller addresses: --ctrler, else
// $SHARDKV_CTRLER, else ~/.shardkv/local.json.
func (k *kvctl) resolveCtrler() ([]string, error) {
	if k.ctrlerAddrs != nil {
		return k.ctrlerAddrs, nil
	}
	split := func(s string) []string {
		var out []string
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
		return out
	}
	switch {
	case k.ctrlerFlag != "":
		k.ctrlerAddrs, k.ctrlerSource = split(k.ctrlerFlag), "--ctrler"
	case os.Getenv(EnvCtrler) != "":
		k.ctrlerAddrs, k.ctrlerSource = split(os.Getenv(EnvCtrler)), "$"+EnvCtrler
	default:
		path := LocalStatePath()
		b, err := os.ReadFile(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("no controller address: pass --ctrler=HOST:PORT[,HOST:PORT...], set %s, or start a local cluster with 'node local' (it records itself in %s)", EnvCtrler, path)
			}
			return nil, fmt.Errorf("no controller address given and %s is unreadable: %v", path, err)
		}
		var st LocalState
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("no controller address given and %s is not valid: %v", path, err)
		}
		k.ctrlerAddrs = st.Ctrler
		k.ctrlerSource = path

		if st.PID > 0 && !processAlive(st.PID) {
			k.ctrlerSource = fmt.Sprintf("%s, written by 'node local' pid %d, which is no longer running", path, st.PID)
		}
	}
	if len(k.ctrlerAddrs) == 0 {
		return nil, fmt.Errorf("no controller address in %s", k.ctrlerSource)
	}
	return k.ctrlerAddrs, nil
}

func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || errors.Is(err, syscall.EPERM)
}

// ctrlErr explains a controller call that ran out of time: which
// addresses were tried, where they came from, and the last error.
func (k *kvctl) ctrlErr(err error) error {
	if err == nil || ctrlerclient.IsRefused(err) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("no answer from the controller at %s (from %s) within %v; last error: %s",
			strings.Join(k.ctrlerAddrs, ","), k.ctrlerSource, k.timeout, lastError(err))
	}
	return err
}

// staleLocal is a note for errors when the controller addresses came from
// a local.json whose `node local` is gone.
func (k *kvctl) staleLocal() string {
	if strings.Contains(k.ctrlerSource, "no longer running") {
		return " (controller addresses from " + k.ctrlerSource + ")"
	}
	return ""
}

func (k *kvctl) ctrler() (*ctrlerclient.Client, error) {
	addrs, err := k.resolveCtrler()
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ctrl == nil {
		if k.ctrl, err = ctrlerclient.New(addrs, k.dial...); err != nil {
			return nil, err
		}
	}
	return k.ctrl, nil
}

func (k *kvctl) dataClient() (*client.Client, error) {
	addrs, err := k.resolveCtrler()
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.data == nil {
		if k.data, err = client.New(addrs, k.dial...); err != nil {
			return nil, err
		}
		k.data.AttemptTimeout = min(k.data.AttemptTimeout, k.timeout)
	}
	return k.data, nil
}

func (k *kvctl) admin(addr string) (shardkvpb.AdminClient, error) {
	cc, err := k.pool.Get(addr)
	if err != nil {
		return nil, err
	}
	return shardkvpb.NewAdminClient(cc), nil
}

func (k *kvctl) kv(addr string) (shardkvpb.KVClient, error) {
	cc, err := k.pool.Get(addr)
	if err != nil {
		return nil, err
	}
	return shardkvpb.NewKVClient(cc), nil
}

// memberStatus asks one replica for its status, with a short timeout.
func (k *kvctl) memberStatus(ctx context.Context, addr string) (*shardkvpb.MemberStatus, error) {
	cl, err := k.admin(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, min(probeTimeout, k.timeout))
	defer cancel()
	return cl.Status(ctx, &shardkvpb.StatusRequest{})
}

// memberStatuses asks every address concurrently; failures are in errs.
func (k *kvctl) memberStatuses(ctx context.Context, addrs []string) (map[string]*shardkvpb.MemberStatus, map[string]error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sts := map[string]*shardkvpb.MemberStatus{}
	errs := map[string]error{}
	for _, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := k.memberStatus(ctx, a)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[a] = err
			} else {
				sts[a] = st
			}
		}()
	}
	wg.Wait()
	return sts, errs
}

// --- output ---

func (k *kvctl) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = k.stdout.Write(append(b, '\n'))
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for s := range m {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func parseUint(what, s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, usagef(nil, "%s must be a non-negative integer, not %q", what, s)
	}
	return v, nil
}

// tlsDir is --tls-dir, else $SHARDKV_TLS_DIR, else the local cluster's
// (only when its controller addresses are used, so that a --ctrler of
// another cluster never picks up the local certificates).
func (k *kvctl) tlsDir() string {
	switch {
	case k.tlsFlag != "":
		return k.tlsFlag
	case os.Getenv(EnvTLSDir) != "":
		return os.Getenv(EnvTLSDir)
	case k.ctrlerFlag != "" || os.Getenv(EnvCtrler) != "":
		return ""
	}
	b, err := os.ReadFile(LocalStatePath())
	if err != nil {
		return ""
	}
	var st LocalState
	if json.Unmarshal(b, &st) != nil {
		return ""
	}
	return st.TLSDir
}

// setupDial loads the TLS files, if any, and opens the connection pool.
// The replicas kvctl dials must name themselves as replicas; what kvctl
// may do is up to its certificate (admin or client).
func (k *kvctl) setupDial() error {
	k.dial = grpcdial.Options()
	if dir := k.tlsDir(); dir != "" {
		src, err := mtls.Load(mtls.FilesIn(dir), nil)
		if err != nil {
			return fmt.Errorf("--tls-dir=%s: %w", dir, err)
		}
		k.dial = grpcdial.OptionsWith(src.ClientCredentials(mtls.AnyNode))
		k.tlsSource = src
	}
	k.pool = grpcdial.NewPool(k.dial...)
	return nil
}
