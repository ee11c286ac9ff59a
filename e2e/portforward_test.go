//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardkv/shardkv/pkg/routing"
)

// redisGet asks pod's Redis port for key through `kubectl port-forward`
// (works on any cluster; the test's host needs no route to pod IPs), one
// connection, no redirects followed: what that replica itself answers.
func (e *env) redisGet(t *testing.T, pod string, port int, key string) (string, error) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(c, envOr("KUBECTL", "kubectl"), "-n", e.ns, "port-forward", "pod/"+pod, fmt.Sprintf(":%d", port))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	local := ""
	re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
	sc := bufio.NewScanner(out)
	for local == "" && sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			local = "127.0.0.1:" + m[1]
		}
	}
	if local == "" {
		return "", fmt.Errorf("kubectl port-forward pod/%s: no local port (%v)", pod, sc.Err())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	rc := redis.NewClient(&redis.Options{Addr: local, MaxRetries: -1, DialTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second, Protocol: 2})
	defer rc.Close()
	gc, gcancel := context.WithTimeout(c, 20*time.Second)
	defer gcancel()
	return rc.Get(gc, key).Result()
}

// keyOfGroup is a key whose shard group gid owns in ShardMap name.
func (e *env) keyOfGroup(t *testing.T, name string, gid int64, prefix string) string {
	t.Helper()
	m := e.shardMap(t, name)
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if tableOwner(m, routing.ShardOf([]byte(k), int(m.Spec.Shards))) == gid {
			return k
		}
	}
}
