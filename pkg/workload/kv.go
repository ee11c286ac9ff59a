package workload

import (
	"context"

	"github.com/shardkv/shardkv/pkg/client"
)

// kv is one workload client's connection to the cluster. An error from a
// write means its outcome is unknown; from a get, that it had no effect.
type kv interface {
	// Get returns key's value, "" if it does not exist.
	Get(ctx context.Context, key string) (string, error)
	Put(ctx context.Context, key, value string) error
	Append(ctx context.Context, key, value string) error
	Close()
}

// goKV is a kv over the Go client: its own exactly-once session.
type goKV struct{ c *client.Client }

func (g goKV) Get(ctx context.Context, key string) (string, error) {
	v, _, err := g.c.Get(ctx, key)
	return v, err
}

func (g goKV) Put(ctx context.Context, key, value string) error {
	return g.c.Put(ctx, key, value)
}

func (g goKV) Append(ctx context.Context, key, value string) error {
	return g.c.Append(ctx, key, value)
}

func (g goKV) Close() { g.c.Close() }
