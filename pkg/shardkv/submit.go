package shardkv

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
)

// submit is the one write path of every API (Write, MultiWrite,
// WriteBatch): it checks the ops, refuses before proposing those whose shard
// this replica does not serve now, proposes the others as one log entry, and
// returns each op's outcome: OK with its result, or the Code that refused it
// (before proposing, or at apply, which decides). The error is about the
// request as a whole, in the vocabulary of pkg/shardkvpb: invalid input (a
// status), not executed (a *shardkvpb.Refusal), or outcome unknown
// (wrapping shardkvpb.ErrOutcomeUnknown).
func (g *Group) submit(ctx context.Context, ops []*shardkvpb.WriteOp) ([]OpResult, error) {
	if err := g.CheckBatch(ops); err != nil {
		return nil, err
	}
	out := make([]OpResult, len(ops))
	var send []*shardkvpb.WriteOp
	var idx []int
	for i, op := range ops {
		if code := g.writeRoute(ctx, op.Key); code != OK {
			out[i].Code = code // not executed, and not proposed
			continue
		}
		send = append(send, op)
		idx = append(idx, i)
	}
	if len(send) == 0 {
		return out, nil
	}
	v, err := g.propose(ctx, &shardkvpb.GroupCommand{Writes: send, MaxValueBytes: uint64(g.cfg.MaxValueBytes)})
	if err != nil {
		return nil, g.proposeError(err, send[0].Key)
	}
	res, ok := v.([]OpResult)
	if !ok || len(res) != len(send) {
		return nil, fmt.Errorf("%w: unexpected apply result %T", shardkvpb.ErrOutcomeUnknown, v)
	}
	for j, r := range res {
		out[idx[j]] = r
	}
	return out, nil
}

// proposeError translates the engine's error for a proposal of a write of
// key: not executed is a *shardkvpb.Refusal (NOT_LEADER names the leader as
// this replica knows it), too large stays invalid input (not executed, and
// resending it cannot help), and anything else may have run.
func (g *Group) proposeError(err error, key []byte) error {
	var nl *raftgroup.NotLeaderError
	switch {
	case raftgroup.IsTooLarge(err):
		return fmt.Errorf("the batch is too large for one log entry: %w", err)
	case errors.As(err, &nl):
		return g.refuse(key, OK, true)
	case raftgroup.IsNotExecuted(err):
		return &shardkvpb.Refusal{Reason: shardkvpb.ReasonNotExecuted, Msg: err.Error(), Shard: -1}
	case raftgroup.IsOutcomeUnknown(err):
		return err
	}
	// Anything else after proposing: we cannot say it did not run.
	return fmt.Errorf("%w: %v", shardkvpb.ErrOutcomeUnknown, err)
}

// opError is the error of one op (of key) that did not execute: a refusal,
// or RESULT_FORGOTTEN (outcome unknown: the session dropped its result).
// needLeader: the request can only run on the leader (see refuse).
func (g *Group) opError(key []byte, code Code, needLeader bool) error {
	if code == ResultForgotten {
		conf := g.sm.Config()
		s := routing.ShardOf(key, max(len(conf.Shards), 1))
		return shardkvpb.Error(codes.Aborted, shardkvpb.ReasonResultForgotten,
			fmt.Sprintf("shard %d: the session no longer remembers this write's result; it may or may not have been applied", s),
			map[string]string{"config_num": strconv.FormatUint(conf.Num, 10), "shard": strconv.Itoa(s)})
	}
	return g.refuse(key, code, needLeader)
}

// Reason is the shardkvpb reason of a Code that refused an op ("" for OK).
func (c Code) Reason() string {
	switch c {
	case WrongGroup:
		return shardkvpb.ReasonWrongGroup
	case NotReady:
		return shardkvpb.ReasonNotReady
	case ResultForgotten:
		return shardkvpb.ReasonResultForgotten
	}
	return ""
}

func invalid(format string, a ...any) error {
	return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonInvalid, fmt.Sprintf(format, a...), nil)
}

// internal is a local failure (reading badger); nothing was executed.
func internal(err error) error {
	return shardkvpb.Error(codes.Internal, shardkvpb.ReasonNotExecuted, err.Error(), nil)
}

// checkFields checks a collection op's fields and values: how many, and
// their sizes (a key and a field together are stored in one badger key).
func (g *Group) checkFields(op *shardkvpb.WriteOp) error {
	switch op.Kind {
	case shardkvpb.WriteOp_HSET:
		if len(op.Fields) == 0 || len(op.FieldValues) != len(op.Fields) {
			return invalid("%d fields but %d values", len(op.Fields), len(op.FieldValues))
		}
	case shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM:
		if len(op.Fields) == 0 || len(op.FieldValues) != 0 {
			return invalid("%d fields and %d values: want fields only", len(op.Fields), len(op.FieldValues))
		}
	case shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT, shardkvpb.WriteOp_SMOVE:
		if len(op.Fields) != 1 || len(op.FieldValues) != 0 {
			return invalid("%d fields: want 1", len(op.Fields))
		}
	case shardkvpb.WriteOp_SPOP:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return invalid("pop count %d: want 1 to %d", op.Delta, maxCopyElems)
		}
		return nil
	case shardkvpb.WriteOp_SSTORE:
		if op.Delta < 0 || op.Delta > 2 {
			return invalid("set operation %d: want 0 (inter), 1 (union) or 2 (diff)", op.Delta)
		}
		return nil
	case shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH:
		if len(op.Fields) == 0 || len(op.FieldValues) != 0 {
			return invalid("%d elements: want at least 1", len(op.Fields))
		}
		for _, f := range op.Fields {
			if len(f) > g.cfg.MaxValueBytes {
				return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("element of %d bytes exceeds the limit of %d", len(f), g.cfg.MaxValueBytes), nil)
			}
		}
		if len(op.Key)+8 > g.cfg.MaxKeyBytes-elemOverhead {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key of %d bytes: a list's key may have at most %d", len(op.Key), g.cfg.MaxKeyBytes-elemOverhead-8), nil)
		}
		return nil
	case shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return invalid("pop count %d: want 1 to %d", op.Delta, maxCopyElems)
		}
		return nil
	case shardkvpb.WriteOp_LMOVE:
		if op.Delta < 0 || op.Delta > 1 || op.Stop < 0 || op.Stop > 1 {
			return invalid("list ends %d and %d: want 0 (head) or 1 (tail)", op.Delta, op.Stop)
		}
		if len(op.Dest)+8 > g.cfg.MaxKeyBytes-elemOverhead {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key of %d bytes: a list's key may have at most %d", len(op.Dest), g.cfg.MaxKeyBytes-elemOverhead-8), nil)
		}
		return nil
	case shardkvpb.WriteOp_ZADD:
		if e := zaddValid(op); e != "" {
			return invalid("ZADD: bad flags %d, or %d members with %d scores (8 bytes each, not NaN)", op.Delta, len(op.Fields), len(op.FieldValues))
		}
		return g.checkMembers(op, 1+8)
	case shardkvpb.WriteOp_ZREM:
		if len(op.Fields) == 0 || len(op.FieldValues) != 0 {
			return invalid("%d members: want at least 1", len(op.Fields))
		}
		return g.checkMembers(op, 1+8)
	case shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return invalid("pop count %d: want 1 to %d", op.Delta, maxCopyElems)
		}
		return nil
	case shardkvpb.WriteOp_ZSTORE:
		if zstoreValid(op) != "" {
			return invalid("ZSTORE: set operation %d, aggregate %d, %d weights for %d sources (none, or one each, not NaN)", op.Delta, op.Aggregate, len(op.Weights), 1+len(op.MoreKeys))
		}
		return nil
	case shardkvpb.WriteOp_ZREMRANGE, shardkvpb.WriteOp_ZRANGESTORE:
		if _, e := zrangeOf(op); e != "" {
			return invalid("a range needs its kind (0 rank, 1 score, 2 lex) and two bounds")
		}
		return nil
	case shardkvpb.WriteOp_LINSERT:
		if op.Delta < 0 || op.Delta > 1 {
			return invalid("insert side %d: want 0 (before) or 1 (after)", op.Delta)
		}
		return nil
	case shardkvpb.WriteOp_LSET, shardkvpb.WriteOp_LTRIM, shardkvpb.WriteOp_LREM:
		return nil
	default:
		if len(op.Fields) > 0 || len(op.FieldValues) > 0 {
			return invalid("fields on a %v op", op.Kind)
		}
		return nil
	}
	for _, f := range op.Fields {
		if n := len(op.Key) + len(f); n > g.cfg.MaxKeyBytes-elemOverhead {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key and field of %d bytes together exceed the limit of %d", n, g.cfg.MaxKeyBytes-elemOverhead), nil)
		}
	}
	for _, v := range op.FieldValues {
		if len(v) > g.cfg.MaxValueBytes {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("value of %d bytes exceeds the limit of %d", len(v), g.cfg.MaxValueBytes), nil)
		}
	}
	return nil
}

// checkMembers checks that each of op's fields, stored with extra bytes
// of its own beside the key, fits a badger key.
func (g *Group) checkMembers(op *shardkvpb.WriteOp, extra int) error {
	for _, f := range op.Fields {
		if n := len(op.Key) + len(f) + extra; n > g.cfg.MaxKeyBytes-elemOverhead {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key and member of %d bytes together exceed the limit of %d", len(op.Key)+len(f), g.cfg.MaxKeyBytes-elemOverhead-extra), nil)
		}
	}
	return nil
}

func (g *Group) checkOp(op *shardkvpb.WriteOp) error {
	if op == nil {
		return invalid("missing write op")
	}
	// MaxKeyBytes is at most MaxKeyBytesLimit, so every stored form of an
	// accepted key (value, tombstone and expiry index) fits badger.
	if len(op.Key) > g.cfg.MaxKeyBytes {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key of %d bytes exceeds the limit of %d", len(op.Key), g.cfg.MaxKeyBytes), nil)
	}
	if len(op.Value) > g.cfg.MaxValueBytes || len(op.Expect) > g.cfg.MaxValueBytes {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("value of %d bytes exceeds the limit of %d", max(len(op.Value), len(op.Expect)), g.cfg.MaxValueBytes), nil)
	}
	if len(op.Dest) > g.cfg.MaxKeyBytes {
		return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("destination key of %d bytes exceeds the limit of %d", len(op.Dest), g.cfg.MaxKeyBytes), nil)
	}
	if op.Kind > shardkvpb.WriteOp_ZRANGESTORE {
		return invalid("unknown write kind %d", op.Kind)
	}
	if err := g.checkFields(op); err != nil {
		return err
	}
	if (op.Kind == shardkvpb.WriteOp_MSET_NX && len(op.MoreKeys) != len(op.MoreValues)) || (op.Kind != shardkvpb.WriteOp_MSET_NX && len(op.MoreValues) != 0) {
		return invalid("%d more keys but %d more values", len(op.MoreKeys), len(op.MoreValues))
	}
	for i, k := range op.MoreKeys {
		if len(k) > g.cfg.MaxKeyBytes {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("key of %d bytes exceeds the limit of %d", len(k), g.cfg.MaxKeyBytes), nil)
		}
		if i < len(op.MoreValues) && len(op.MoreValues[i]) > g.cfg.MaxValueBytes {
			return shardkvpb.Error(codes.InvalidArgument, shardkvpb.ReasonTooLarge, fmt.Sprintf("value of %d bytes exceeds the limit of %d", len(op.MoreValues[i]), g.cfg.MaxValueBytes), nil)
		}
	}
	return nil
}
