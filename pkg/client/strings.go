package client

import (
	"context"
	"slices"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// String operations beyond Put, Append and CompareAndSet: each is one
// write, exactly once like the others. A refusal decided by the group (a
// value that is not an integer, a result over the value limit, keys in two
// shards) is an *OpError and changed nothing.

// Incr adds delta to key's integer value (absent: 0) and returns the new
// value; the key keeps its expiry.
func (c *Client) Incr(ctx context.Context, key string, delta int64) (int64, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_INCR, Key: []byte(key), Delta: delta})
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// SetRange writes value over key's value from byte offset on, padding
// with zero bytes, and returns the new length.
func (c *Client) SetRange(ctx context.Context, key string, offset int64, value string) (int64, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SET_RANGE, Key: []byte(key), Delta: offset, Value: []byte(value)})
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// SetBit sets bit offset of key's value (0: the most significant bit of
// the first byte) and returns the bit's old value.
func (c *Client) SetBit(ctx context.Context, key string, offset int64, on bool) (bool, error) {
	b := byte(0)
	if on {
		b = 1
	}
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SET_BIT, Key: []byte(key), Delta: offset, Value: []byte{b}})
	if err != nil {
		return false, err
	}
	return r.Num == 1, nil
}

// Rename moves key's value and expiry to dst, which must be in the same
// shard (use a hash tag: "{user1}a", "{user1}b"). With onlyIfAbsent an
// existing dst is left alone; it reports whether it renamed. A missing key
// is an *OpError (NO_SUCH_KEY).
func (c *Client) Rename(ctx context.Context, key, dst string, onlyIfAbsent bool) (bool, error) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_RENAME, Key: []byte(key), Dest: []byte(dst)}
	if onlyIfAbsent {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// Copy copies key's value and expiry to dst (same shard), replacing an
// existing dst only with replace; it reports whether it copied.
func (c *Client) Copy(ctx context.Context, key, dst string, replace bool) (bool, error) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_COPY, Key: []byte(key), Dest: []byte(dst)}
	if !replace {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// PutIfNoneExist sets every key of kvs (all in one shard) if none of them
// exists, atomically (Redis's MSETNX); it reports whether it set them.
func (c *Client) PutIfNoneExist(ctx context.Context, kvs map[string]string) (bool, error) {
	keys := make([]string, 0, len(kvs))
	for k := range kvs {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return true, nil
	}
	slices.Sort(keys) // the op is routed by its first key
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_MSET_NX, Key: []byte(keys[0]), Value: []byte(kvs[keys[0]])}
	for _, k := range keys[1:] {
		op.MoreKeys = append(op.MoreKeys, []byte(k))
		op.MoreValues = append(op.MoreValues, []byte(kvs[k]))
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// Expire makes key expire ttl from the time the write is applied (by the
// group's log clock); ttl <= 0 deletes it. It reports whether key existed.
func (c *Client) Expire(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	ms := ttl.Milliseconds()
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Key: []byte(key), TtlMs: &ms})
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}

// Persist removes key's expiry; it reports whether there was one.
func (c *Client) Persist(ctx context.Context, key string) (bool, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PERSIST, Key: []byte(key)})
	if err != nil {
		return false, err
	}
	return r.Ok, nil
}
