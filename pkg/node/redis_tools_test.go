// redis-cli and redis-py against a local cluster.

package node_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/routing"
)

var ansiEscape = regexp.MustCompile("\x1b\\[[0-9;]*m")

// redisCLI runs redis-cli with args and stdin; it returns the output with
// colour codes removed.
func redisCLI(t *testing.T, bin, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return ansiEscape.ReplaceAllString(string(out), "")
}

// TestRedisCLISmoke: redis-cli -c sets and gets keys across slots,
// following redirects; without -c the same node answers MOVED for a key of
// another group; CLUSTER NODES parses; redis-cli --cluster check and
// --cluster info accept the cluster and count the keys.
func TestRedisCLISmoke(t *testing.T) {
	needProcesses(t)
	cli := needTool(t, "/usr/bin/redis-cli", "redis-tools")
	c, resp := startRESPLocal(t, 7, "--groups=2", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	cc, err := ctrlerclient.New(c.ctrl)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	conf, err := cc.Query(context.Background(), -1)
	if err != nil {
		t.Fatal(err)
	}
	leader := respLeader(t, resp[1], 20*time.Second)
	host, port, _ := net.SplitHostPort(leader)

	// SET and GET through one node, with -c; commands come on stdin, one
	// reply line each (plus "-> Redirected" lines).
	const n = 40
	var in strings.Builder
	moved := ""
	for i := range n {
		k := fmt.Sprintf("cli:key:%d", i)
		fmt.Fprintf(&in, "SET %s v%d\n", k, i)
		if routing.GroupOf([]byte(k), conf.Shards) != 1 && moved == "" {
			moved = k
		}
	}
	for i := range n {
		fmt.Fprintf(&in, "GET cli:key:%d\n", i)
	}
	in.WriteString("INCR cli:ctr\nINCRBY cli:ctr 41\nEXPIRE cli:ctr 100\nTTL cli:ctr\nMSET {cli}a 1 {cli}b 2\nMGET {cli}a {cli}b\nDEL {cli}a {cli}b\n")
	out := redisCLI(t, cli, in.String(), "-c", "-h", host, "-p", port)
	var replies []string
	redirects := 0
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.HasPrefix(l, "-> Redirected to slot") {
			redirects++
			continue
		}
		replies = append(replies, l)
	}
	want := slices.Repeat([]string{"OK"}, n)
	for i := range n {
		want = append(want, fmt.Sprintf("v%d", i))
	}
	want = append(want, "1", "42", "1", "100", "OK", "1", "2", "2")
	if len(replies) == len(want) && replies[2*n+3] == "99" {
		replies[2*n+3] = "100" // TTL rounds to the nearest second; a slow run may see 99
	}
	if !slices.Equal(replies, want) {
		t.Fatalf("redis-cli -c replies:\n%s\nwant (without redirect lines):\n%s", out, strings.Join(want, "\n"))
	}
	if redirects == 0 || moved == "" {
		t.Fatalf("no redirects among %d keys on two groups:\n%s", n, out)
	}
	t.Logf("redis-cli -c: %d commands, %d redirects", len(want), redirects)

	// Without -c, the leader of group 1 answers MOVED for a key of group 2.
	out = redisCLI(t, cli, "", "-h", host, "-p", port, "GET", moved)
	slot := routing.SlotOf(moved)
	if !strings.HasPrefix(out, fmt.Sprintf("MOVED %d ", slot)) {
		t.Fatalf("redis-cli GET %s at group 1 (no -c): %q; want MOVED %d <group 2's leader>", moved, out, slot)
	}
	if addr := strings.Fields(out)[2]; !slices.Contains(resp[2], addr) {
		t.Fatalf("MOVED to %s, not a group 2 node %v", addr, resp[2])
	}

	// CLUSTER NODES parses and matches the config.
	out = redisCLI(t, cli, "", "-c", "-h", host, "-p", port, "cluster", "nodes")
	lines, err := parseClusterNodes(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 6 {
		t.Fatalf("CLUSTER NODES has %d nodes, want 6:\n%s", len(lines), out)
	}
	checkClusterViews(t, c, conf, resp)

	// redis-cli --cluster check and info.
	out = redisCLI(t, cli, "", "--cluster", "check", leader)
	for _, s := range []string{"[OK] All nodes agree about slots configuration.", "[OK] All 16384 slots covered."} {
		if !strings.Contains(out, s) {
			t.Errorf("redis-cli --cluster check %s: no %q:\n%s", leader, s, out)
		}
	}
	if strings.Contains(out, "[ERR]") || strings.Contains(out, "[WARNING]") {
		t.Errorf("redis-cli --cluster check %s:\n%s", leader, out)
	}
	out = redisCLI(t, cli, "", "--cluster", "info", leader)
	// n keys plus the counter; the {cli} keys were deleted.
	if wantLine := fmt.Sprintf("[OK] %d keys in 2 masters.", n+1); !strings.Contains(out, wantLine) {
		t.Errorf("redis-cli --cluster info %s: no %q:\n%s", leader, wantLine, out)
	}
	t.Logf("redis-cli --cluster info:\n%s", out)
}

// --- redis-py ---

// TestRedisPySmoke runs testdata/redis/cluster_smoke.py (redis-py's
// RedisCluster, Debian's python3-redis for the system python) against node
// local --resp with three groups.
func TestRedisPySmoke(t *testing.T) {
	needProcesses(t)
	py := needTool(t, "/usr/bin/python3", "python3")
	if err := exec.Command(py, "-c", "import redis.cluster").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s cannot import redis.cluster (Debian package python3-redis; .ci/run installs it): %v", py, err)
		}
		t.Skipf("%s cannot import redis.cluster (apt-get install python3-redis): %v", py, err)
	}
	_, resp := startRESPLocal(t, 7, "--groups=3", "--replicas=2", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	host, port, _ := net.SplitHostPort(resp[2][1])
	script, err := filepath.Abs(filepath.Join("testdata", "redis", "cluster_smoke.py"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, script, host, port, "3")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s %s %s: %v\n%s", py, script, host, port, err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}
