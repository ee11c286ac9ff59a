package shardkv

import (
	"bytes"
	"fmt"
	"math"
	"strconv"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Errors decided when an op is applied (WriteResult.error); the op changes
// nothing.
const (
	errNotInteger = shardkvpb.OpErrNotInteger
	errOverflow   = shardkvpb.OpErrOverflow
	errNotFloat   = shardkvpb.OpErrNotFloat
	errNaN        = shardkvpb.OpErrNaN
	// errValueTooLarge: the value the op would leave (APPEND's result
	// included) is over the command's limit.
	errValueTooLarge = shardkvpb.OpErrValueTooLarge
	errNoSuchKey     = shardkvpb.OpErrNoSuchKey
	errOffset        = shardkvpb.OpErrOffset
)

// applyOp computes the record op leaves behind (nil: no change) and fills
// res. It is pure: every replica computes the same from the same inputs, and
// the only clock it reads is nowMs, the entry's log time. No value it
// leaves is longer than maxValue (VALUE_TOO_LARGE: nothing changes).
func applyOp(op *shardkvpb.WriteOp, old *record, oldLive bool, nowMs int64, maxValue int, res *shardkvpb.WriteResult) (*record, error) {
	var oldExpiry int64
	if oldLive {
		oldExpiry = old.ExpireAtMs
	}
	if len(op.Value) > maxValue && (op.Kind == shardkvpb.WriteOp_PUT || op.Kind == shardkvpb.WriteOp_CAS || op.Kind == shardkvpb.WriteOp_APPEND) {
		res.Error = errValueTooLarge
		return nil, nil
	}
	switch op.Kind {
	case shardkvpb.WriteOp_PUT:
		if (op.Cond == shardkvpb.WriteOp_IF_ABSENT && oldLive) || (op.Cond == shardkvpb.WriteOp_IF_PRESENT && !oldLive) {
			return nil, nil
		}
		exp := opExpiry(op, nowMs)
		if op.KeepTtl {
			exp = oldExpiry
		}
		res.Ok = true
		if exp != 0 && exp <= nowMs {
			// Expired as it is written (SET ... PXAT in the past, RESTORE
			// ... ABSTTL): the key is gone at once, as EXPIRE makes it,
			// rather than left for the expiry sweep, which DBSIZE counts
			// and FLUSHALL's scan of live keys misses meanwhile.
			if old != nil && !old.Tombstone {
				return &record{Tombstone: true}, nil
			}
			return nil, nil
		}
		return &record{Value: op.Value, ExpireAtMs: exp}, nil
	case shardkvpb.WriteOp_APPEND:
		var prev []byte
		if oldLive {
			if len(old.Value) > maxValue-len(op.Value) {
				res.Error = errValueTooLarge
				return nil, nil
			}
			prev = old.Value
		}
		// Built in the buffer it is encoded in (record.framed): one copy.
		framed := make([]byte, recordHeader, recordHeader+len(prev)+len(op.Value))
		framed = append(append(framed, prev...), op.Value...)
		res.Ok, res.Num = true, int64(len(framed)-recordHeader)
		return &record{Value: framed[recordHeader:], ExpireAtMs: oldExpiry, framed: framed}, nil
	case shardkvpb.WriteOp_DELETE:
		if oldLive {
			res.Ok = true
			return &record{Tombstone: true}, nil
		}
		return nil, nil
	case shardkvpb.WriteOp_CAS:
		if (op.ExpectAbsent && !oldLive) || (!op.ExpectAbsent && oldLive && bytes.Equal(old.Value, op.Expect)) {
			res.Ok = true
			return &record{Value: op.Value}, nil
		}
		return nil, nil
	case shardkvpb.WriteOp_INCR:
		var cur int64
		if oldLive {
			n, ok := parseIntValue(old.Value)
			if !ok {
				res.Error = errNotInteger
				return nil, nil
			}
			cur = n
		}
		if (op.Delta > 0 && cur > math.MaxInt64-op.Delta) || (op.Delta < 0 && cur < math.MinInt64-op.Delta) {
			res.Error = errOverflow
			return nil, nil
		}
		cur += op.Delta
		res.Ok, res.Num = true, cur
		return &record{Value: strconv.AppendInt(nil, cur, 10), ExpireAtMs: oldExpiry}, nil
	case shardkvpb.WriteOp_INCR_FLOAT:
		incr, ok := parseFloatValue(op.Value)
		if !ok {
			res.Error = errNotFloat
			return nil, nil
		}
		var cur float64
		if oldLive {
			if cur, ok = parseFloatValue(old.Value); !ok {
				res.Error = errNotFloat
				return nil, nil
			}
		}
		cur += incr
		if math.IsNaN(cur) || math.IsInf(cur, 0) {
			res.Error = errNaN
			return nil, nil
		}
		v := formatFloatValue(cur)
		res.Ok, res.Value = true, v
		return &record{Value: v, ExpireAtMs: oldExpiry}, nil
	case shardkvpb.WriteOp_EXPIRE:
		if !oldLive {
			return nil, nil
		}
		// No expiry counts as an infinite one (Redis 7's GT/LT).
		cur, next := oldExpiry, opExpiry(op, nowMs)
		switch op.Cond {
		case shardkvpb.WriteOp_IF_ABSENT:
			if cur != 0 {
				return nil, nil
			}
		case shardkvpb.WriteOp_IF_PRESENT:
			if cur == 0 {
				return nil, nil
			}
		case shardkvpb.WriteOp_IF_GREATER:
			if cur == 0 || next <= cur {
				return nil, nil
			}
		case shardkvpb.WriteOp_IF_LESS:
			if cur != 0 && next >= cur {
				return nil, nil
			}
		case shardkvpb.WriteOp_IF_PRESENT_LESS:
			if cur == 0 || next >= cur {
				return nil, nil
			}
		}
		res.Ok = true
		if next <= nowMs {
			return &record{Tombstone: true}, nil
		}
		return &record{Type: old.Type, Value: old.Value, ExpireAtMs: next}, nil
	case shardkvpb.WriteOp_PERSIST:
		if !oldLive || oldExpiry == 0 {
			return nil, nil
		}
		res.Ok = true
		return &record{Type: old.Type, Value: old.Value}, nil
	case shardkvpb.WriteOp_READ:
		return nil, nil
	case shardkvpb.WriteOp_SET_RANGE:
		return setRange(op, old, oldLive, maxValue, res), nil
	case shardkvpb.WriteOp_SET_BIT:
		return setBit(op, old, oldLive, maxValue, res), nil
	}
	return nil, fmt.Errorf("unknown write kind %v", op.Kind)
}

// setRange is SETRANGE: value written over the current one from byte
// offset delta on, zero bytes filling any gap. An empty value changes
// nothing and answers the current length, as Redis does; so does a refusal
// (a negative offset, or a result over maxValue).
func setRange(op *shardkvpb.WriteOp, old *record, oldLive bool, maxValue int, res *shardkvpb.WriteResult) *record {
	cur, exp := liveValue(old, oldLive)
	switch {
	case op.Delta < 0:
		res.Error = errOffset
		return nil
	case len(op.Value) == 0:
		res.Ok, res.Num = true, int64(len(cur))
		return nil
	case op.Delta > int64(maxValue-len(op.Value)):
		res.Error = errValueTooLarge
		return nil
	}
	next := grown(cur, int(op.Delta)+len(op.Value), exp)
	copy(next.Value[op.Delta:], op.Value)
	res.Ok, res.Num = true, int64(len(next.Value))
	return next
}

// liveValue is the value and expiry an op builds on: none if the key is
// not live.
func liveValue(old *record, oldLive bool) ([]byte, int64) {
	if !oldLive {
		return nil, 0
	}
	return old.Value, old.ExpireAtMs
}

// grown is a record holding cur zero-padded to at least n bytes, with
// expiry exp, built in the buffer it is encoded in (record.framed).
func grown(cur []byte, n int, exp int64) *record {
	framed := make([]byte, recordHeader+max(len(cur), n))
	copy(framed[recordHeader:], cur)
	return &record{Value: framed[recordHeader:], ExpireAtMs: exp, framed: framed}
}

// setBit is SETBIT: bit delta (most significant first) set to value[0],
// zero bytes filling any gap; refused for an offset that is negative or
// whose byte is past maxValue, or a value other than 0 or 1.
func setBit(op *shardkvpb.WriteOp, old *record, oldLive bool, maxValue int, res *shardkvpb.WriteResult) *record {
	cur, exp := liveValue(old, oldLive)
	switch {
	case op.Delta < 0 || len(op.Value) != 1 || op.Value[0] > 1:
		res.Error = errOffset
		return nil
	case op.Delta>>3 >= int64(maxValue):
		res.Error = errValueTooLarge
		return nil
	}
	i, mask := int(op.Delta>>3), byte(0x80)>>(op.Delta&7)
	next := grown(cur, i+1, exp)
	v := next.Value
	res.Ok = true
	if v[i]&mask != 0 {
		res.Num = 1
	}
	if op.Value[0] == 1 {
		v[i] |= mask
	} else {
		v[i] &^= mask
	}
	return next
}

// applyPair computes what RENAME and COPY leave behind: the records of the
// source (nil: unchanged) and of the destination (nil: unchanged). Pure, as
// applyOp.
func applyPair(op *shardkvpb.WriteOp, src *record, srcLive bool, dst *record, dstLive bool, res *shardkvpb.WriteResult) (nextSrc, nextDst *record) {
	same := bytes.Equal(op.Key, op.Dest)
	switch {
	case !srcLive && op.Kind == shardkvpb.WriteOp_RENAME:
		res.Error = errNoSuchKey
		return nil, nil
	case !srcLive:
		return nil, nil
	case same:
		// RENAME k k is OK and changes nothing (RENAMENX answers 0); the
		// front end refuses COPY k k before proposing.
		res.Ok = op.Kind == shardkvpb.WriteOp_RENAME && op.Cond != shardkvpb.WriteOp_IF_ABSENT
		return nil, nil
	case dstLive && op.Cond == shardkvpb.WriteOp_IF_ABSENT:
		return nil, nil
	}
	res.Ok = true
	nextDst = &record{Type: src.Type, Value: src.Value, ExpireAtMs: src.ExpireAtMs}
	if op.Kind == shardkvpb.WriteOp_RENAME {
		nextSrc = &record{Tombstone: true}
	}
	return nextSrc, nextDst
}

// opExpiry is the absolute expiry (Unix ms, 0: none) op asks for: its
// relative ttl_ms from the entry's log time, so that a relative TTL never
// depends on a proxy's or a leader's own clock, or else its expire_at_ms.
// A relative one saturates rather than overflow, and is at least 1 (0 is
// none; a negative time would sort last in the expiry index, never purged).
func opExpiry(op *shardkvpb.WriteOp, nowMs int64) int64 {
	if op.TtlMs == nil {
		return op.ExpireAtMs
	}
	switch ttl := *op.TtlMs; {
	case ttl > 0 && nowMs > math.MaxInt64-ttl:
		return math.MaxInt64
	case ttl < 0 && nowMs < math.MinInt64-ttl:
		return 1
	default:
		return max(nowMs+ttl, 1)
	}
}

// parseIntValue parses a value as Redis does for INCR: a canonical signed
// 64-bit decimal (no spaces, no '+', no leading zeros).
func parseIntValue(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || string(strconv.AppendInt(nil, n, 10)) != string(b) {
		return 0, false
	}
	return n, true
}

// parseFloatValue parses a value as Redis does for INCRBYFLOAT: no
// surrounding spaces, not NaN. "inf" parses (Redis then refuses the
// infinite result); a finite number beyond float64's range is refused
// (Redis computes in long double, which holds it: a documented difference).
func parseFloatValue(b []byte) (float64, bool) {
	if len(b) == 0 || b[0] == ' ' || b[len(b)-1] == ' ' {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// formatFloatValue formats an INCRBYFLOAT result as Redis shows it: plain
// decimal, no exponent, no trailing zeros. Redis computes in long double and
// prints 17 digits, so 0.1+0.2 shows as 0.3; in float64 the sum is
// 0.30000000000000004. When rounding to 15 significant digits moves the
// value by at most 2 ulps, the difference is float64 noise from the
// addition and the rounded value is shown (and stored); a value that really
// has 16-17 digits keeps them.
func formatFloatValue(f float64) []byte {
	if r, err := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 15, 64), 64); err == nil && ulps(f, r) <= 2 {
		f = r
	}
	return strconv.AppendFloat(nil, f, 'f', -1, 64)
}

// ulps is the distance between two finite float64s of the same sign in
// units in the last place (a large number if the signs differ).
func ulps(a, b float64) uint64 {
	if a == b {
		return 0
	}
	if (a < 0) != (b < 0) {
		return math.MaxUint64
	}
	x, y := math.Float64bits(math.Abs(a)), math.Float64bits(math.Abs(b))
	if x > y {
		return x - y
	}
	return y - x
}

// putRecord stores next in place of old and keeps the tombstone and expiry
// indexes in step, and the change index while a move of the shard out is
// planned.
func (a *applyCtx) putRecord(s int, key []byte, old, next *record) error {
	dk := dataKey(s, key)
	if err := a.setShardRecord(s, dk, next.encode()); err != nil {
		return err
	}
	if err := a.retire(s, key, old, next); err != nil {
		return err
	}
	var err error
	if next.Tombstone {
		err = a.set(tombstoneKey(s, key), nil)
	} else if old != nil && old.Tombstone {
		err = a.del(tombstoneKey(s, key))
	}
	if err != nil {
		return err
	}
	if old != nil && !old.Tombstone && old.ExpireAtMs != 0 && old.ExpireAtMs != next.ExpireAtMs {
		if err := a.del(expiresKey(old.ExpireAtMs, s, key)); err != nil {
			return err
		}
	}
	if !next.Tombstone && next.ExpireAtMs != 0 {
		return a.set(expiresKey(next.ExpireAtMs, s, key), nil)
	}
	return nil
}
