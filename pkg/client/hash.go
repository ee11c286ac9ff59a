package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Hashes: a key holding fields and their values (docs/types.md). Every
// write is one op, exactly once like the others; reads are linearizable.
// A key of another type fails with ErrWrongType (an *OpError for writes).

// ErrWrongType: the key holds a value of another type than the operation
// is for.
var ErrWrongType = errors.New("WRONGTYPE: the key holds another type of value")

// typeHash is pkg/shardkv's TypeHash (the wire carries the number).
const typeHash = 1

// HSet sets fields of key's hash (field, value, field, value, ...),
// creating it, and returns how many fields it added.
func (c *Client) HSet(ctx context.Context, key string, fieldValues ...string) (int64, error) {
	return c.hset(ctx, key, shardkvpb.WriteOp_ALWAYS, fieldValues)
}

// HSetNX sets field only if key's hash does not have it; it reports
// whether it set it.
func (c *Client) HSetNX(ctx context.Context, key, field, value string) (bool, error) {
	n, err := c.hset(ctx, key, shardkvpb.WriteOp_IF_ABSENT, []string{field, value})
	return n == 1, err
}

func (c *Client) hset(ctx context.Context, key string, cond shardkvpb.WriteOp_Cond, fv []string) (int64, error) {
	if len(fv) == 0 || len(fv)%2 != 0 {
		return 0, fmt.Errorf("hset %q: want field, value pairs, got %d strings", key, len(fv))
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HSET, Key: []byte(key), Cond: cond}
	for i := 0; i < len(fv); i += 2 {
		op.Fields = append(op.Fields, []byte(fv[i]))
		op.FieldValues = append(op.FieldValues, []byte(fv[i+1]))
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// HDel removes fields of key's hash and returns how many it removed; the
// hash goes with its last field.
func (c *Client) HDel(ctx context.Context, key string, fields ...string) (int64, error) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HDEL, Key: []byte(key)}
	for _, f := range fields {
		op.Fields = append(op.Fields, []byte(f))
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// HIncrBy adds delta to the integer in field (absent: 0) and returns the
// new value.
func (c *Client) HIncrBy(ctx context.Context, key, field string, delta int64) (int64, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HINCR, Key: []byte(key), Fields: [][]byte{[]byte(field)}, Delta: delta})
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// HGet reads one field; found is false if the hash or the field does not
// exist.
func (c *Client) HGet(ctx context.Context, key, field string) (value string, found bool, err error) {
	vals, err := c.HMGet(ctx, key, field)
	if err != nil {
		return "", false, err
	}
	return vals[0].Value, vals[0].Found, nil
}

// Field is a field's value as read (Found false: no such field).
type Field struct {
	Value string
	Found bool
}

// HMGet reads fields of key's hash, in order, in one read.
func (c *Client) HMGet(ctx context.Context, key string, fields ...string) ([]Field, error) {
	req := &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeHash}
	for _, f := range fields {
		req.Fields = append(req.Fields, []byte(f))
	}
	rep, err := c.getElems(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make([]Field, len(fields))
	for i, e := range rep.Elems {
		if i < len(out) {
			out[i] = Field{Value: string(e.Value), Found: e.Found}
		}
	}
	return out, nil
}

// HGetAll reads key's whole hash in one read (empty: no hash). A hash
// whose reply would pass the group's bound (64 MiB) is refused: page it
// with HScan.
func (c *Client) HGetAll(ctx context.Context, key string) (map[string]string, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeHash, All: true})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(rep.Elems))
	for _, e := range rep.Elems {
		out[string(e.Field)] = string(e.Value)
	}
	return out, nil
}

// HScan reads up to count fields of key's hash in field order after
// `after` (from the first when after is nil) and returns where the next
// page starts (nil: done). Each page is a linearizable read of its own.
func (c *Client) HScan(ctx context.Context, key string, after *string, count int) (map[string]string, *string, error) {
	req := &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeHash, All: true, Count: uint32(max(count, 1))}
	if after != nil {
		req.After, req.HasAfter = []byte(*after), true
	}
	rep, err := c.getElems(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	out := make(map[string]string, len(rep.Elems))
	for _, e := range rep.Elems {
		out[string(e.Field)] = string(e.Value)
	}
	if !rep.More {
		return out, nil, nil
	}
	next := string(rep.Next)
	return out, &next, nil
}

// HLen is the number of fields of key's hash (0: none).
func (c *Client) HLen(ctx context.Context, key string) (int64, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeHash})
	if err != nil {
		return 0, err
	}
	return rep.Len, nil
}

func (c *Client) getElems(ctx context.Context, req *shardkvpb.ReadElemsRequest) (*shardkvpb.ReadElemsReply, error) {
	var rep *shardkvpb.ReadElemsReply
	err := c.call(ctx, req.Key, func(ctx context.Context, cl shardkvpb.KVClient) error {
		var err error
		rep, err = cl.GetElems(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	if rep.Found && rep.Type != req.Type {
		return nil, fmt.Errorf("key %q: %w", req.Key, ErrWrongType)
	}
	return rep, nil
}

// Sets: a key holding distinct members (docs/types.md), written and read
// as hashes are.

// typeSet is pkg/shardkv's TypeSet.
const typeSet = 3

// SAdd adds members to key's set, creating it, and returns how many it
// added.
func (c *Client) SAdd(ctx context.Context, key string, members ...string) (int64, error) {
	return c.members(ctx, shardkvpb.WriteOp_SADD, key, members)
}

// SRem removes members of key's set and returns how many it removed; the
// set goes with its last member.
func (c *Client) SRem(ctx context.Context, key string, members ...string) (int64, error) {
	return c.members(ctx, shardkvpb.WriteOp_SREM, key, members)
}

func (c *Client) members(ctx context.Context, kind shardkvpb.WriteOp_Kind, key string, members []string) (int64, error) {
	op := &shardkvpb.WriteOp{Kind: kind, Key: []byte(key)}
	for _, m := range members {
		op.Fields = append(op.Fields, []byte(m))
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// SMembers reads key's whole set, in member order (empty: no set).
func (c *Client) SMembers(ctx context.Context, key string) ([]string, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeSet, All: true})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rep.Elems))
	for i, e := range rep.Elems {
		out[i] = string(e.Field)
	}
	return out, nil
}

// SIsMember reports whether member is in key's set.
func (c *Client) SIsMember(ctx context.Context, key, member string) (bool, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeSet, Fields: [][]byte{[]byte(member)}})
	if err != nil {
		return false, err
	}
	return len(rep.Elems) == 1 && rep.Elems[0].Found, nil
}

// Lists (docs/types.md).

// typeList is pkg/shardkv's TypeList.
const typeList = 2

// LPush pushes values at the head of key's list (the last one ends up
// first), creating it; RPush at its tail. Both return the new length.
func (c *Client) LPush(ctx context.Context, key string, values ...string) (int64, error) {
	return c.members(ctx, shardkvpb.WriteOp_LPUSH, key, values)
}

// RPush pushes values at the tail of key's list.
func (c *Client) RPush(ctx context.Context, key string, values ...string) (int64, error) {
	return c.members(ctx, shardkvpb.WriteOp_RPUSH, key, values)
}

// LPop removes and returns the first element of key's list (found false:
// no list); RPop the last.
func (c *Client) LPop(ctx context.Context, key string) (string, bool, error) {
	return c.pop(ctx, shardkvpb.WriteOp_LPOP, key)
}

// RPop removes and returns the last element of key's list.
func (c *Client) RPop(ctx context.Context, key string) (string, bool, error) {
	return c.pop(ctx, shardkvpb.WriteOp_RPOP, key)
}

func (c *Client) pop(ctx context.Context, kind shardkvpb.WriteOp_Kind, key string) (string, bool, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: kind, Key: []byte(key), Delta: 1})
	if err != nil || len(r.Values) == 0 {
		return "", false, err
	}
	return string(r.Values[0]), true, nil
}

// LRange reads the elements of key's list from index start to stop
// (negative: from the tail), as Redis's LRANGE.
func (c *Client) LRange(ctx context.Context, key string, start, stop int64) ([]string, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeList, Range: true, Start: start, Stop: stop})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rep.Elems))
	for i, e := range rep.Elems {
		out[i] = string(e.Value)
	}
	return out, nil
}

// LLen is the length of key's list (0: none).
func (c *Client) LLen(ctx context.Context, key string) (int64, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeList})
	if err != nil {
		return 0, err
	}
	return rep.Len, nil
}
