package workload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvRedisPassword is the environment variable read for the Redis
// password of kvctl workload --redis (--redis-password overrides it).
const EnvRedisPassword = "SHARDKV_REDIS_PASSWORD"

// RedisAuth is how the Redis clients authenticate: AUTH [user] password,
// and TLS (nil: plain text).
type RedisAuth struct {
	User, Password string
	TLS            *tls.Config
}

// redisKV is a kv over the Redis Cluster protocol of the data-group
// replicas: GET, SET and APPEND through a go-redis ClusterClient, which
// follows MOVED and ASK and retries TRYAGAIN and CLUSTERDOWN itself.
type redisKV struct{ c *redis.ClusterClient }

// newRedisKV returns a ClusterClient with its own small pool, with the
// settings of docs/redis.md ("Clients") that ride through migrations and
// elections: up to 16 redirects and retries, 8-512 ms apart; a read timeout
// (6 s) above the front ends' write timeout (2 s by default), so a slow
// write is answered "outcome unknown" rather than timed out. Calls end at
// their context's deadline (the op timeout).
func newRedisKV(seeds []string, auth RedisAuth, opTimeout time.Duration) redisKV {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		// A copy: go-redis appends the nodes it learns to Addrs in place,
		// which would race between clients sharing seeds' array.
		Addrs:                 slices.Clone(seeds),
		Username:              auth.User,
		Password:              auth.Password,
		TLSConfig:             auth.TLS,
		ClientName:            "kvctl-workload",
		MaxRedirects:          16,
		MinRetryBackoff:       8 * time.Millisecond,
		MaxRetryBackoff:       512 * time.Millisecond,
		DialTimeout:           min(5*time.Second, opTimeout),
		ReadTimeout:           6 * time.Second,
		WriteTimeout:          6 * time.Second,
		ContextTimeoutEnabled: true,
		PoolSize:              2,
	})
	c.OnNewNode(func(n *redis.Client) { n.AddHook(noResendHook{}) })
	return redisKV{c}
}

func (r redisKV) Get(ctx context.Context, key string) (string, error) {
	v, err := r.c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

func (r redisKV) Put(ctx context.Context, key, value string) error {
	return r.c.Set(ctx, key, value, 0).Err()
}

func (r redisKV) Append(ctx context.Context, key, value string) error {
	return r.c.Append(ctx, key, value).Err()
}

func (r redisKV) Close() { r.c.Close() }

// noResendHook keeps a ClusterClient from resending a write that may have
// been applied. ClusterClient resends a command whose connection failed
// (EOF, reset, read timeout) to the same or another node; Redis commands
// carry no request id, so a resent APPEND that had been applied is applied
// twice, and a resent SET can overwrite a later write: a history the
// checker rejects although the cluster did nothing wrong. On a node client,
// the hook turns such an error of a write into one ClusterClient does not
// retry, so the write is recorded with an unknown outcome. Replies from the
// server (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the command did not run; the
// outcome-unknown error) and dial errors (nothing was sent) pass through,
// as do all errors of a GET, which is safe to resend.
type noResendHook struct{}

func (noResendHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (noResendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (noResendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || cmd.Name() == "get" || !mayHaveRun(err) {
			return err
		}
		// Not wrapped: go-redis would still find the retryable error.
		err = fmt.Errorf("%s (may have been applied: not resent)", err.Error())
		cmd.SetErr(err)
		return err
	}
}

// mayHaveRun reports whether a command that failed with err may have
// reached the server.
func mayHaveRun(err error) bool {
	var rerr redis.Error
	var operr *net.OpError
	switch {
	case errors.As(err, &rerr): // the server's reply
		return false
	case errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout):
		return false
	case errors.As(err, &operr) && operr.Op == "dial":
		return false
	}
	return true
}

// isAuthError reports whether err is a Redis front end refusing the
// password (or asking for one), or the ACL user lacking the permission:
// retrying does not help.
func isAuthError(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	s := rerr.Error()
	return strings.HasPrefix(s, "WRONGPASS") || strings.HasPrefix(s, "NOAUTH") || strings.HasPrefix(s, "ERR AUTH") ||
		strings.HasPrefix(s, "NOPERM") // the ACL user may not run this or touch the key: waiting will not help
}
