package node_test

// Integration tests of the Redis Cluster protocol front end (`node local
// --resp`) with real clients: go-redis's ClusterClient while groups join and
// leave, redis-cli -c and redis-cli --cluster, and redis-py's RedisCluster
// (testdata/redis/cluster_smoke.py). The differential test against
// redis-server is in redisdiff_test.go.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// outcomeUnknownPrefix starts the front end's reply to a write whose outcome
// is unknown (proposed, then a timeout or a leader change). Clients do not
// retry it.
const outcomeUnknownPrefix = "ERR outcome unknown"

func isOutcomeUnknown(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), outcomeUnknownPrefix)
}

// newClusterClient returns a go-redis ClusterClient with the settings that
// ride through shard migrations and leader elections (the client settings
// docs/redis.md documents under "Clients"):
//
//   - MaxRedirects 16: a command is retried up to 16 times on MOVED (a
//     shard moved, or a follower answered), TRYAGAIN (a shard is still
//     arriving, no leader known yet) and CLUSTERDOWN; go-redis's default
//     of 3 runs out during a migration;
//   - MinRetryBackoff 8ms, MaxRetryBackoff 512ms: the pause before a retry
//     that is not a redirect doubles from 8ms to 512ms, so the 16 attempts
//     span a few seconds, longer than an election or a shard pull;
//   - ReadTimeout 6s (WriteTimeout the same): longer than the front end's
//     own bound on a write (--resp-write-timeout, 2s by default; docs say
//     3s or more), with room for a loaded CI machine, so the server answers
//     first. go-redis resends a command whose reply timed out, which could
//     apply a write twice; a reply of "-ERR outcome unknown" is final and
//     never resent.
func newClusterClient(addrs []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		// A copy: go-redis appends the nodes it discovers to Addrs, which
		// races when clients share one slice.
		Addrs:           slices.Clone(addrs),
		MaxRedirects:    16,
		MinRetryBackoff: 8 * time.Millisecond,
		MaxRetryBackoff: 512 * time.Millisecond,
		ReadTimeout:     6 * time.Second,
		WriteTimeout:    6 * time.Second,
		DialTimeout:     5 * time.Second,
	})
}

// redirectCounter is a go-redis hook on a cluster's node clients that
// counts the redirect and retry replies (MOVED, ASK, TRYAGAIN,
// CLUSTERDOWN) they get; ClusterClient handles those itself.
type redirectCounter struct{ moved, tryAgain, other atomic.Int64 }

func (rc *redirectCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (rc *redirectCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			switch s := err.Error(); {
			case strings.HasPrefix(s, "MOVED "):
				rc.moved.Add(1)
			case strings.HasPrefix(s, "TRYAGAIN "):
				rc.tryAgain.Add(1)
			case strings.HasPrefix(s, "ASK "), strings.HasPrefix(s, "CLUSTERDOWN "):
				rc.other.Add(1)
			}
		}
		return err
	}
}

func (rc *redirectCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// startRESPLocal starts `node local --resp` with args and returns it and
// the RESP addresses by gid.
func startRESPLocal(t *testing.T, procs int, args ...string) (*localCluster, map[uint64][]string) {
	t.Helper()
	c := startLocal(t, procs, append([]string{"--resp"}, args...)...)
	resp := c.respAddrs()
	if len(resp) == 0 {
		t.Fatalf("no RESP addresses in the endpoint table:\n%s", c.out.String())
	}
	return c, resp
}

// grpcToRESP maps each data-group replica's gRPC address to its RESP
// address, from the endpoint table.
func (c *localCluster) grpcToRESP() map[string]string {
	out := map[string]string{}
	for gid, addrs := range c.respAddrs() {
		for i, a := range addrs {
			if ep, ok := c.eps[fmt.Sprintf("group-%d-%d", gid, i+1)]; ok {
				out[ep.grpc] = a
			}
		}
	}
	return out
}

// waitSettled waits until the controller's latest config has at least
// config num and every group of it serves all its shards.
func waitSettled(t *testing.T, cc *ctrlerclient.Client, num uint64, timeout time.Duration) *shardkvpb.ClusterStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		st, err := cc.Status(ctx)
		if err == nil && st.Latest.Num >= num && served(st) {
			return st
		}
		if ctx.Err() != nil {
			t.Fatalf("config %d not served within %v: %v %v", num, timeout, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// --- the load: 16 clients, each owning its keys ---

// keyHist is what one client knows about one of its string keys.
