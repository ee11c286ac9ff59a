package shardkv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Errors decided when an op is applied. They are Redis's texts, since the
// Redis front end passes them on verbatim; the op changes nothing.
const (
	errNotInteger = "ERR value is not an integer or out of range"
	errOverflow   = "ERR increment or decrement would overflow"
	errNotFloat   = "ERR value is not a valid float"
	errNaN        = "ERR increment would produce NaN or Infinity"
)

// applyOp computes the record op leaves behind (nil: no change) and fills
// res. It is pure: every replica computes the same from the same inputs, and
// the only clock it reads is nowMs, the entry's log time.
func applyOp(op *shardkvpb.WriteOp, old *record, oldLive bool, nowMs int64, res *shardkvpb.WriteResult) (*record, error) {
	var oldExpiry int64
	if oldLive {
		oldExpiry = old.ExpireAtMs
	}
	switch op.Kind {
	case shardkvpb.WriteOp_PUT:
		if (op.Cond == shardkvpb.WriteOp_IF_ABSENT && oldLive) || (op.Cond == shardkvpb.WriteOp_IF_PRESENT && !oldLive) {
			return nil, nil
		}
		exp := op.ExpireAtMs
		if op.KeepTtl {
			exp = oldExpiry
		}
		res.Ok = true
		return &record{Value: op.Value, ExpireAtMs: exp}, nil
	case shardkvpb.WriteOp_APPEND:
		v := op.Value
		if oldLive {
			v = append(append([]byte{}, old.Value...), op.Value...)
		}
		res.Ok, res.Num = true, int64(len(v))
		return &record{Value: v, ExpireAtMs: oldExpiry}, nil
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
			n, ok := parseRedisInt(old.Value)
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
		incr, ok := parseRedisFloat(op.Value)
		if !ok {
			res.Error = errNotFloat
			return nil, nil
		}
		var cur float64
		if oldLive {
			if cur, ok = parseRedisFloat(old.Value); !ok {
				res.Error = errNotFloat
				return nil, nil
			}
		}
		cur += incr
		if math.IsNaN(cur) || math.IsInf(cur, 0) {
			res.Error = errNaN
			return nil, nil
		}
		v := formatRedisFloat(cur)
		res.Ok, res.Value = true, v
		return &record{Value: v, ExpireAtMs: oldExpiry}, nil
	case shardkvpb.WriteOp_EXPIRE:
		if !oldLive {
			return nil, nil
		}
		// No expiry counts as an infinite one (Redis 7's GT/LT).
		cur, next := oldExpiry, op.ExpireAtMs
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
		return &record{Value: old.Value, ExpireAtMs: next}, nil
	case shardkvpb.WriteOp_PERSIST:
		if !oldLive || oldExpiry == 0 {
			return nil, nil
		}
		res.Ok = true
		return &record{Value: old.Value}, nil
	}
	return nil, fmt.Errorf("unknown write kind %v", op.Kind)
}

// parseRedisInt parses a value as Redis does for INCR: a canonical signed
// 64-bit decimal (no spaces, no '+', no leading zeros).
func parseRedisInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || string(strconv.AppendInt(nil, n, 10)) != string(b) {
		return 0, false
	}
	return n, true
}

// parseRedisFloat parses a value as Redis does for INCRBYFLOAT: no
// surrounding spaces, not NaN. "inf" parses (Redis then refuses the
// infinite result); a finite number beyond float64's range is refused
// (Redis computes in long double, which holds it: a documented difference).
func parseRedisFloat(b []byte) (float64, bool) {
	if len(b) == 0 || b[0] == ' ' || b[len(b)-1] == ' ' {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// formatRedisFloat formats an INCRBYFLOAT result as Redis shows it: plain
// decimal, no exponent, no trailing zeros. Redis computes in long double and
// prints 17 digits, so 0.1+0.2 shows as 0.3; in float64 the sum is
// 0.30000000000000004. When rounding to 15 significant digits moves the
// value by at most 2 ulps, the difference is float64 noise from the
// addition and the rounded value is shown (and stored); a value that really
// has 16-17 digits keeps them.
func formatRedisFloat(f float64) []byte {
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
// indexes in step.
func (a *applyCtx) putRecord(s int, key []byte, old, next *record) error {
	if err := a.set(dataKey(s, key), next.encode()); err != nil {
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

// expiresKey is the expiry index entry of a key that has an expiry.
func expiresKey(atMs int64, s int, key []byte) []byte {
	k := binary.BigEndian.AppendUint64([]byte{'x'}, uint64(atMs))
	return append(append(k, byte(s>>8), byte(s)), key...)
}

// ExpireKeysBatch bounds the keys one expiry entry deletes.
const ExpireKeysBatch = 1000

// expireKeys deletes keys whose expiry is at or before the entry's time, in
// expiry order, in shards the group serves: a frozen (BePulling) shard keeps
// its data unchanged for the new owner, which expires those keys itself. It
// returns how many it deleted.
func (a *applyCtx) expireKeys() (any, error) {
	nowMs := a.nowNS / 1e6
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'x'}})
	type due struct {
		xk    []byte
		shard int
		key   []byte
		at    int64
	}
	var dues []due
	scanned := 0
	for it.Rewind(); it.Valid() && len(dues) < ExpireKeysBatch && scanned < 4*ExpireKeysBatch; it.Next() {
		k := it.Item().KeyCopy(nil)
		at := int64(binary.BigEndian.Uint64(k[1:9]))
		if at > nowMs {
			break
		}
		scanned++
		s := int(k[9])<<8 | int(k[10])
		if !serves(a.meta(s)) {
			continue
		}
		dues = append(dues, due{xk: k, shard: s, key: k[11:], at: at})
	}
	it.Close()
	n := 0
	for _, d := range dues {
		rec, err := a.get(dataKey(d.shard, d.key))
		if err != nil {
			return nil, err
		}
		if rec == nil || rec.Tombstone || rec.ExpireAtMs != d.at {
			// A stale index entry (cannot happen if every write keeps the
			// index in step, but a stale entry must never delete a key).
			if err := a.del(d.xk); err != nil {
				return nil, err
			}
			continue
		}
		if err := a.putRecord(d.shard, d.key, rec, &record{Tombstone: true, Index: a.index}); err != nil {
			return nil, err
		}
		if err := a.del(d.xk); err != nil {
			return nil, err
		}
		n++
	}
	return n, nil
}

// expiryDue reports whether a key of a served shard is past its expiry at
// nowMs (the leader then proposes expireKeys).
func (sm *StateMachine) expiryDue(nowMs int64) bool {
	due := false
	_ = sm.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'x'}})
		defer it.Close()
		n := 0
		for it.Rewind(); it.Valid() && n < 4*ExpireKeysBatch; it.Next() {
			k := it.Item().Key()
			if int64(binary.BigEndian.Uint64(k[1:9])) > nowMs {
				return nil
			}
			n++
			if serves(sm.Shard(int(k[9])<<8 | int(k[10]))) {
				due = true
				return nil
			}
		}
		return nil
	})
	return due
}
