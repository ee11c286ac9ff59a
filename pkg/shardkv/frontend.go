package shardkv

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The API of protocol front ends (pkg/resp) whose clients carry no request
// ids and resend a command the server refused. So a refusal is given only
// when the command provably did not execute: an error that is a
// *shardkvpb.Refusal did not execute and never will; an error wrapping
// shardkvpb.ErrOutcomeUnknown was proposed and may or may not take effect,
// which a front end must not turn into a "resend". Any other error is
// invalid input or a local failure (nothing executed, resending cannot
// help).

// ErrReadLimit: ReadKeys stopped because its reserve refused a value; the
// values it returned with it are those of the first keys.
var ErrReadLimit = errors.New("read stopped at the caller's memory limit")

// ReadKeys reads keys (of one shard) linearizably: a ReadIndex round, then
// local state with the log clock of that state deciding expiry (never the
// local clock: see GetEntry). A follower serves it
// only if followerReads; otherwise it refuses with NOT_LEADER. If reserve
// is set, it is asked for each value's size before the value is kept; when
// it refuses, ReadKeys returns the values of the keys before it and
// ErrReadLimit, so a caller bounds what one read holds.
func (g *Group) ReadKeys(ctx context.Context, keys [][]byte, followerReads bool, reserve func(bytes int) bool) ([]ValueEntry, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := g.readBarrier(ctx, keys, followerReads); err != nil {
		return nil, err
	}
	out := make([]ValueEntry, 0, len(keys))
	var refused error
	limited := false
	err := g.sm.GetEntries(keys, func(i int, e ValueEntry, code Code) bool {
		switch {
		case code != OK:
			// The config moved on while we waited for the barrier.
			refused = g.refuse(keys[i], code, !followerReads)
		case reserve != nil && !reserve(len(e.Value)):
			limited = true
		default:
			out = append(out, e)
			return true
		}
		return false
	})
	switch {
	case err != nil:
		return nil, err
	case refused != nil:
		return nil, refused
	case limited:
		return out, ErrReadLimit
	}
	return out, nil
}

// readBarrier makes a read of keys (of one shard) linearizable: it waits
// for their shard to be served here, then for a ReadIndex round, or
// refuses as ReadKeys does.
func (g *Group) readBarrier(ctx context.Context, keys [][]byte, followerReads bool) error {
	for _, k := range keys {
		if code := g.routeWait(ctx, k, !followerReads); code != OK {
			return g.refuse(k, code, !followerReads)
		}
	}
	if !followerReads && !g.r.IsLeader() {
		return g.refuse(keys[0], OK, true)
	}
	if err := g.r.ReadIndex(ctx); err != nil {
		if raftgroup.IsNotExecuted(err) {
			// A read has no effect: a refusal is always safe. Without
			// followerReads the client belongs at the leader; with them, on
			// any replica once a leader is known again.
			if !followerReads {
				return g.refuse(keys[0], OK, true)
			}
			return &shardkvpb.Refusal{Reason: shardkvpb.ReasonNotExecuted, Msg: "no leader is known for this group right now", Shard: -1}
		}
		return fmt.Errorf("read barrier: %w", err)
	}
	return nil
}

// ReadElems reads elements of the collection at key linearizably, as
// ReadKeys reads values (reserve: each element's size, ErrReadLimit when
// it refuses).
func (g *Group) ReadElems(ctx context.Context, key []byte, q ElemQuery, followerReads bool, reserve func(bytes int) bool) (ElemsReply, error) {
	rs, err := g.ReadElemsOf(ctx, [][]byte{key}, q, followerReads, reserve)
	if len(rs) == 0 {
		return ElemsReply{}, err
	}
	return rs[0], err
}

// ReadElemsOf reads the collections at keys (of one shard) as ReadElems
// does, all at one point of the log (SINTER, SUNION, SDIFF).
func (g *Group) ReadElemsOf(ctx context.Context, keys [][]byte, q ElemQuery, followerReads bool, reserve func(bytes int) bool) ([]ElemsReply, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := g.readBarrier(ctx, keys, followerReads); err != nil {
		return nil, err
	}
	rs, code, err := g.sm.ReadElemsOf(keys, q, reserve)
	switch {
	case err != nil:
		return rs, err
	case code != OK:
		return nil, g.refuse(keys[len(rs)], code, !followerReads)
	}
	return rs, nil
}

// WriteOutcome is one op's outcome: a result, or a *shardkvpb.Refusal.
type WriteOutcome struct {
	Result *shardkvpb.WriteResult
	Err    error
}

// WriteBatch proposes ops (without client sessions) as one log entry, in
// order. It returns one outcome per op, or, for the batch as a whole, a
// *shardkvpb.Refusal (nothing executed: not the leader, or the engine
// refused the entry), an error wrapping shardkvpb.ErrOutcomeUnknown, or
// another error for invalid input (nothing executed).
func (g *Group) WriteBatch(ctx context.Context, ops []*shardkvpb.WriteOp) ([]WriteOutcome, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	for _, op := range ops {
		if op.GetSession() != nil {
			return nil, errors.New("a batch write carries no client session")
		}
	}
	res, err := g.submit(ctx, ops)
	if err != nil {
		return nil, err
	}
	out := make([]WriteOutcome, len(ops))
	for i, r := range res {
		if r.Code == OK {
			out[i].Result = r.Result
		} else {
			out[i].Err = g.opError(ops[i].Key, r.Code, true)
		}
	}
	return out, nil
}
