package client

import (
	"context"
	"encoding/binary"
	"math"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Sorted sets (docs/types.md): members with scores, read by rank or by
// score. Every write is one op, exactly once; reads are linearizable.

// typeZSet is pkg/shardkv's TypeZSet; zByRank, zByScore and the bound
// kinds are its ZByRank, ZByScore and Bound kinds (the wire carries the
// numbers: the client does not import the server).
const (
	typeZSet     = 4
	zByRank      = 0
	zByScore     = 1
	boundIncl    = 0
	zaddIncrFlag = 32
)

// Z is a member and its score.
type Z struct {
	Member string
	Score  float64
}

func scoreBits(f float64) []byte { return binary.BigEndian.AppendUint64(nil, math.Float64bits(f)) }

func bitsScore(b []byte) float64 {
	if len(b) != 8 {
		return math.NaN()
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b))
}

// ZAdd sets the scores of members of key's sorted set, creating it, and
// returns how many members it added.
func (c *Client) ZAdd(ctx context.Context, key string, members ...Z) (int64, error) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZADD, Key: []byte(key)}
	for _, m := range members {
		op.Fields = append(op.Fields, []byte(m.Member))
		op.FieldValues = append(op.FieldValues, scoreBits(m.Score))
	}
	r, err := c.write(ctx, op)
	if err != nil {
		return 0, err
	}
	return r.Num, nil
}

// ZIncrBy adds incr to member's score (absent: 0) and returns the new one.
func (c *Client) ZIncrBy(ctx context.Context, key, member string, incr float64) (float64, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZADD, Key: []byte(key), Delta: zaddIncrFlag,
		Fields: [][]byte{[]byte(member)}, FieldValues: [][]byte{scoreBits(incr)}})
	if err != nil {
		return 0, err
	}
	return bitsScore(r.Value), nil
}

// ZRem removes members and returns how many it removed.
func (c *Client) ZRem(ctx context.Context, key string, members ...string) (int64, error) {
	return c.members(ctx, shardkvpb.WriteOp_ZREM, key, members)
}

// ZPopMin removes and returns up to count members with the lowest scores.
func (c *Client) ZPopMin(ctx context.Context, key string, count int64) ([]Z, error) {
	r, err := c.write(ctx, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZPOPMIN, Key: []byte(key), Delta: count})
	if err != nil {
		return nil, err
	}
	var out []Z
	for i := 0; i+1 < len(r.Values); i += 2 {
		out = append(out, Z{Member: string(r.Values[i]), Score: bitsScore(r.Values[i+1])})
	}
	return out, nil
}

// ZScore reads member's score (found false: no such member).
func (c *Client) ZScore(ctx context.Context, key, member string) (float64, bool, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeZSet, Fields: [][]byte{[]byte(member)}})
	if err != nil || len(rep.Elems) == 0 || !rep.Elems[0].Found {
		return 0, false, err
	}
	return bitsScore(rep.Elems[0].Value), true, nil
}

// ZCard is the number of members of key's sorted set (0: none).
func (c *Client) ZCard(ctx context.Context, key string) (int64, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeZSet})
	if err != nil {
		return 0, err
	}
	return rep.Len, nil
}

// ZRank is member's rank by ascending score (-1: not a member).
func (c *Client) ZRank(ctx context.Context, key, member string) (int64, error) {
	rep, err := c.getElems(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeZSet, RankOf: []byte(member), HasRankOf: true})
	if err != nil {
		return 0, err
	}
	if !rep.Found {
		return -1, nil
	}
	return rep.Rank, nil
}

// ZRange reads the members from rank start to stop (negative: from the
// end), as Redis's ZRANGE.
func (c *Client) ZRange(ctx context.Context, key string, start, stop int64) ([]Z, error) {
	rank := func(r int64) []byte { return binary.BigEndian.AppendUint64([]byte{boundIncl}, uint64(r)) }
	return c.zrange(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeZSet, Z: true, ZBy: zByRank, ZMin: rank(start), ZMax: rank(stop), ZCount: -1})
}

// ZRangeByScore reads the members with min <= score <= max in ascending
// order, skipping offset and taking count (count < 0: all).
func (c *Client) ZRangeByScore(ctx context.Context, key string, min, max float64, offset, count int64) ([]Z, error) {
	bound := func(f float64) []byte { return append([]byte{boundIncl}, scoreBits(f)...) }
	return c.zrange(ctx, &shardkvpb.ReadElemsRequest{Key: []byte(key), Type: typeZSet, Z: true, ZBy: zByScore, ZMin: bound(min), ZMax: bound(max),
		ZOffset: offset, ZCount: count})
}

func (c *Client) zrange(ctx context.Context, req *shardkvpb.ReadElemsRequest) ([]Z, error) {
	rep, err := c.getElems(ctx, req)
	if err != nil {
		return nil, err
	}
	out := make([]Z, len(rep.Elems))
	for i, e := range rep.Elems {
		out[i] = Z{Member: string(e.Field), Score: bitsScore(e.Value)}
	}
	return out, nil
}
