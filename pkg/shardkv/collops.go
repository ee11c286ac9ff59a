package shardkv

import (
	"math"
	"strconv"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// collType is the type a collection op is for (TypeString: not one).
func collType(k shardkvpb.WriteOp_Kind) ValueType {
	switch k {
	case shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT:
		return TypeHash
	case shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM, shardkvpb.WriteOp_SPOP:
		return TypeSet
	case shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH, shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP, shardkvpb.WriteOp_LSET,
		shardkvpb.WriteOp_LTRIM, shardkvpb.WriteOp_LREM, shardkvpb.WriteOp_LINSERT, shardkvpb.WriteOp_LMOVE:
		return TypeList
	case shardkvpb.WriteOp_ZADD, shardkvpb.WriteOp_ZREM, shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX, shardkvpb.WriteOp_ZREMRANGE:
		return TypeZSet
	}
	return TypeString
}

// removes reports whether a collection op only removes elements: on a
// missing key it does nothing.
func removes(k shardkvpb.WriteOp_Kind) bool {
	return k == shardkvpb.WriteOp_HDEL || k == shardkvpb.WriteOp_SREM || k == shardkvpb.WriteOp_SPOP
}

// mutateColl runs a hash or set op on the collection at key in shard s:
// the elements, then the record (its size), all in the entry's buffer, so
// a refusal part way leaves nothing. Pure in the sense of applyOp: every
// replica computes the same.
func (a *applyCtx) mutateColl(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	typ := collType(op.Kind)
	old, err := a.get(dataKey(s, op.Key))
	if err != nil {
		return readFailed(err)
	}
	nowMs := a.nowNS / 1e6
	oldLive := old != nil && old.live(nowMs)
	if oldLive && old.Type != typ {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrWrongType}, nil
	}
	if e := a.checkFields(op); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	var meta collMeta
	var exp int64
	switch {
	case oldLive:
		if meta, err = decodeCollMeta(old.Value); err != nil {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrBadRecord}, nil
		}
		exp = old.ExpireAtMs
	case removes(op.Kind):
		return &shardkvpb.WriteResult{Ok: true}, nil // none: nothing to remove
	default:
		if meta.Version, err = a.newVersion(s, op.Key, old); err != nil {
			return nil, err
		}
	}
	before := meta
	res := &shardkvpb.WriteResult{Ok: true}
	switch op.Kind {
	case shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_SADD:
		for i, f := range op.Fields {
			ek := elemKey(s, op.Key, meta.Version, f)
			cur, err := a.value(ek)
			if err != nil {
				return nil, err
			}
			if cur != nil && op.Cond == shardkvpb.WriteOp_IF_ABSENT {
				continue
			}
			if cur == nil {
				meta.Size++
				res.Num++
				if typ == TypeSet {
					meta.widenMembers(f)
				}
			}
			var v []byte
			if op.Kind == shardkvpb.WriteOp_HSET {
				v = op.FieldValues[i]
			}
			if err := a.setShardRecord(s, ek, elemValue(v)); err != nil {
				return nil, err
			}
		}
	case shardkvpb.WriteOp_SPOP:
		picked, bound, err := a.pickElems(s, op.Key, meta, int(op.Delta))
		if err != nil {
			return nil, err
		}
		n := 0
		for _, ek := range picked {
			n += len(ek)
		}
		if !a.returns(n) {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrResultTooLarge}, nil
		}
		skip := len(elemPrefix(s, op.Key, meta.Version))
		for _, ek := range picked {
			if err := a.delShardRecord(s, ek); err != nil {
				return nil, err
			}
			res.Values = append(res.Values, ek[skip:])
		}
		meta.Size -= int64(len(picked))
		res.Num = int64(len(picked))
		if bound != nil {
			meta.Low = *bound
		}
	case shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_SREM:
		for _, f := range op.Fields {
			ek := elemKey(s, op.Key, meta.Version, f)
			cur, err := a.value(ek)
			if err != nil {
				return nil, err
			}
			if cur == nil {
				continue
			}
			meta.Size--
			res.Num++
			if err := a.delShardRecord(s, ek); err != nil {
				return nil, err
			}
		}
	case shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT:
		ek := elemKey(s, op.Key, meta.Version, op.Fields[0])
		cur, err := a.value(ek)
		if err != nil {
			return nil, err
		}
		v, e := incrField(op, cur, res)
		if e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
		if cur == nil {
			meta.Size++
		}
		if err := a.setShardRecord(s, ek, elemValue(v)); err != nil {
			return nil, err
		}
	}
	if meta == before && oldLive {
		return res, nil // the fields changed, not the record
	}
	next := &record{Type: typ, Value: meta.encode(), ExpireAtMs: exp, Index: a.index}
	if meta.Size <= 0 {
		if !oldLive {
			return res, nil
		}
		next = &record{Tombstone: true, Index: a.index}
	}
	if next.ExpireAtMs != 0 && len(expiresKey(0, s, op.Key)) > badgerMaxKey {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
	}
	return res, a.putRecord(s, op.Key, old, next)
}

// checkFields refuses a collection op whose fields and values the apply
// cannot take (the front end checks first: only an entry proposed
// without its checks gets here).
func (a *applyCtx) checkFields(op *shardkvpb.WriteOp) string {
	switch op.Kind {
	case shardkvpb.WriteOp_HSET:
		if len(op.Fields) == 0 || len(op.FieldValues) != len(op.Fields) {
			return shardkvpb.OpErrInvalidOp
		}
	case shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM, shardkvpb.WriteOp_HDEL:
		if len(op.Fields) == 0 || len(op.FieldValues) != 0 {
			return shardkvpb.OpErrInvalidOp
		}
	case shardkvpb.WriteOp_SPOP:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return shardkvpb.OpErrInvalidOp
		}
	case shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT:
		if len(op.Fields) != 1 {
			return shardkvpb.OpErrInvalidOp
		}
	}
	for _, f := range op.Fields {
		if len(op.Key)+len(f) > MaxKeyBytesLimit-elemOverhead {
			return shardkvpb.OpErrKeyTooLarge
		}
	}
	for _, v := range op.FieldValues {
		if len(v) > a.maxValue {
			return errValueTooLarge
		}
	}
	return ""
}

// incrField is HINCRBY's and HINCRBYFLOAT's new field value from the
// current one (stored, nil if absent), or the error that refuses it.
func incrField(op *shardkvpb.WriteOp, stored []byte, res *shardkvpb.WriteResult) ([]byte, string) {
	cur := elemPayload(stored)
	if op.Kind == shardkvpb.WriteOp_HINCR {
		var n int64
		if stored != nil {
			var ok bool
			if n, ok = parseIntValue(cur); !ok {
				return nil, errNotInteger
			}
		}
		if (op.Delta > 0 && n > math.MaxInt64-op.Delta) || (op.Delta < 0 && n < math.MinInt64-op.Delta) {
			return nil, errOverflow
		}
		n += op.Delta
		res.Num = n
		return strconv.AppendInt(nil, n, 10), ""
	}
	incr, ok := parseFloatValue(op.Value)
	if !ok {
		return nil, errNotFloat
	}
	var f float64
	if stored != nil {
		if f, ok = parseFloatValue(cur); !ok {
			return nil, errNotFloat
		}
	}
	f += incr
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, errNaN
	}
	v := formatFloatValue(f)
	res.Value = v
	return v, ""
}
