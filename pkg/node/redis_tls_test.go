package node_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisTLS: `node local --tls` serves Redis only over TLS. go-redis's
// ClusterClient, redis-cli --tls and redis-py's RedisCluster (ssl=True)
// set and read keys of both groups through redirects; CLUSTER SLOTS and
// MOVED name the TLS endpoints; a plain-text client is refused, and the
// refusal logged once.
func TestRedisTLS(t *testing.T) {
	needProcesses(t)
	c := startTLSLocal(t, 3, "--groups=2", "--replicas=1", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	resp := c.respAddrs()
	r1, r2 := resp[1][0], resp[2][0]
	caFile := filepath.Join(c.dataDir, "tls", "ca", "ca.crt")
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}

	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r1}, TLSConfig: tlsCfg, MaxRedirects: 16})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 100 {
		if err := cl.Set(ctx, fmt.Sprint("tls-", i), i, 0).Err(); err != nil {
			t.Fatalf("go-redis SET over TLS: %v", err)
		}
	}
	for i := range 100 {
		if v, err := cl.Get(ctx, fmt.Sprint("tls-", i)).Int(); err != nil || v != i {
			t.Fatalf("go-redis GET tls-%d = %d, %v", i, v, err)
		}
	}
	slots, err := cl.ClusterSlots(ctx).Result() //lint:ignore SA1019 CLUSTER SLOTS is what most clients still read
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		for _, n := range s.Nodes {
			if n.Addr != r1 && n.Addr != r2 {
				t.Fatalf("CLUSTER SLOTS names %s, not a TLS endpoint (%s, %s)", n.Addr, r1, r2)
			}
		}
	}

	// A key of group 2 asked of group 1 without following: MOVED to group
	// 2's TLS endpoint.
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("moved-", i)
		if addr, err := cl.MasterForKey(ctx, k); err == nil && addr.Options().Addr == r2 {
			key = k
		}
	}
	conn, err := tls.Dial("tcp", r1, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "-MOVED ") || !strings.HasSuffix(strings.TrimSpace(line), " "+r2) {
		t.Fatalf("GET %s on group 1 over TLS: %q, %v; want MOVED to %s", key, line, err, r2)
	}

	// Plain text on the TLS port: no reply, the connection closed.
	for range 3 {
		pc, err := net.Dial("tcp", r1)
		if err != nil {
			t.Fatal(err)
		}
		pc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(pc, "*1\r\n$4\r\nPING\r\n")
		buf := make([]byte, 64)
		n, _ := pc.Read(buf)
		pc.Close()
		if n > 0 && strings.Contains(string(buf[:n]), "PONG") {
			t.Fatal("a plain-text client was served on the TLS port")
		}
	}
	// Logged after the server's handshake fails, perhaps after the client
	// read the alert.
	logs := waitForLog(t, filepath.Join(c.dataDir, "logs", "group-1-1.log"), "Redis TLS handshake refused")
	if n := strings.Count(logs, "Redis TLS handshake refused"); n != 1 {
		t.Errorf("plain-text clients on the TLS port logged %d times, want once", n)
	}

	// redis-cli --tls -c and redis-py, where installed (CI installs both).
	if _, err := os.Stat("/usr/bin/redis-cli"); err == nil || os.Getenv("CI") == "true" {
		cli := needTool(t, "/usr/bin/redis-cli", "redis-tools")
		host, port, _ := net.SplitHostPort(r1)
		out := redisCLI(t, cli, "", "--tls", "--cacert", caFile, "-c", "-h", host, "-p", port, "SET", key, "via-cli")
		if strings.TrimSpace(out) != "OK" {
			t.Fatalf("redis-cli --tls -c SET: %q", out)
		}
		if v, err := cl.Get(ctx, key).Result(); err != nil || v != "via-cli" {
			t.Fatalf("after redis-cli's SET: %q, %v", v, err)
		}
	}
	py := "/usr/bin/python3"
	if exec.Command(py, "-c", "import redis.cluster").Run() == nil {
		host, port, _ := net.SplitHostPort(r2)
		script := fmt.Sprintf(`
from redis.cluster import RedisCluster
rc = RedisCluster(host=%q, port=%s, ssl=True, ssl_ca_certs=%q)
for i in range(50):
    rc.set("py-%%d" %% i, str(i))
assert [rc.get("py-%%d" %% i) for i in range(50)] == [str(i).encode() for i in range(50)]
print(sorted(set(n.port for n in rc.get_nodes())))
`, host, port, caFile)
		out, err := exec.CommandContext(ctx, py, "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-py over TLS: %v\n%s", err, out)
		}
		_, p1, _ := net.SplitHostPort(r1)
		if got := strings.TrimSpace(string(out)); !slices.Contains([]string{"[" + p1 + ", " + port + "]", "[" + port + ", " + p1 + "]"}, got) {
			t.Fatalf("redis-py's nodes: %s; want the TLS ports %s and %s", got, p1, port)
		}
	} else if os.Getenv("CI") == "true" {
		t.Fatal("python3-redis is missing (.ci/run installs it)")
	}
}

// TestRedisTLSAndPlain: with --resp-plain, a replica serves Redis both in
// plain text and over TLS; each kind of client is shown, and redirected
// to, the endpoints it can reach the same way.
func TestRedisTLSAndPlain(t *testing.T) {
	needProcesses(t)
	c := startTLSLocal(t, 3, "--resp-plain", "--groups=2", "--replicas=1", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	plain := map[string]bool{}
	tlsAddrs := map[string]bool{}
	for _, addrs := range c.respAddrs() {
		for _, a := range addrs {
			host, port, _ := net.SplitHostPort(a)
			var p int
			fmt.Sscan(port, &p)
			plain[a], tlsAddrs[net.JoinHostPort(host, fmt.Sprint(p+1000))] = true, true
		}
	}
	pem, err := os.ReadFile(filepath.Join(c.dataDir, "tls", "ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		seeds map[string]bool
		tls   *tls.Config
	}{{"plain", plain, nil}, {"TLS", tlsAddrs, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}} {
		var seed string
		for a := range tc.seeds {
			seed = a
			break
		}
		cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{seed}, TLSConfig: tc.tls, MaxRedirects: 16})
		for i := range 40 {
			if err := cl.Set(ctx, fmt.Sprint(tc.name, i), i, 0).Err(); err != nil {
				t.Fatalf("%s client SET: %v", tc.name, err)
			}
		}
		slots, err := cl.ClusterSlots(ctx).Result() //lint:ignore SA1019 CLUSTER SLOTS is what most clients still read
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slots {
			for _, n := range s.Nodes {
				if !tc.seeds[n.Addr] {
					t.Fatalf("a %s client is shown %s, not one of %v", tc.name, n.Addr, tc.seeds)
				}
			}
		}
		cl.Close()
	}
}
