package shardkv

import (
	"bytes"
	"encoding/binary"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Lists: element i of a list is the element record at position Head+i
// (posKey), so pushes and pops at either end, LINDEX, LSET and LRANGE
// touch only the elements they name. LREM and LINSERT rewrite the list as
// a new version (the old one is collected), and LTRIM deletes the shorter
// of what it drops and what it keeps the same way: each is refused
// (COMMAND_TOO_LARGE) when that is more than maxCopyElems elements.

// minListPos: a head there can take no more pushes (never reached: 2^63
// pushes).
const minListPos = -1 << 63

// posKey is a list position as an element's field: big-endian with the
// sign bit flipped, so that byte order is numeric order.
func posKey(p int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(p)^(1<<63))
}

// PosOf is the position a list element's field (posKey) holds.
func PosOf(field []byte) int64 {
	if len(field) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(field) ^ (1 << 63))
}

// listIndex turns a Redis index (negative: from the tail) into 0..size-1;
// ok is false when it is out of range.
func listIndex(i, size int64) (int64, bool) {
	if i < 0 {
		i += size
	}
	return i, i >= 0 && i < size
}

// mutateList runs a list op on the list at key in shard s.
func (a *applyCtx) mutateList(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	old, m, live, code, err := a.liveColl(s, op.Key, TypeList)
	if err != nil || code != "" {
		return &shardkvpb.WriteResult{Error: code}, err
	}
	l := &listEdit{a: a, s: s, key: op.Key, old: old, m: m, live: live}
	if live {
		l.exp = old.ExpireAtMs
	}
	res := &shardkvpb.WriteResult{Ok: true}
	switch op.Kind {
	case shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH:
		if len(op.Fields) == 0 {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil
		}
		if !live && op.Cond == shardkvpb.WriteOp_IF_PRESENT {
			return res, nil
		}
		for _, v := range op.Fields {
			if len(v) > a.maxValue {
				return &shardkvpb.WriteResult{Error: errValueTooLarge}, nil
			}
			if err := l.push(op.Kind == shardkvpb.WriteOp_LPUSH, v); err != nil {
				return nil, err
			}
		}
		res.Num = l.m.Size
	case shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil
		}
		// What they return is held on every replica until the entry is
		// applied: bounded with the entry's other returned values.
		n, size := min(op.Delta, l.m.Size), 0
		for i := range n {
			pos := l.m.Head + i
			if op.Kind == shardkvpb.WriteOp_RPOP {
				pos = l.m.Head + l.m.Size - 1 - i
			}
			v, err := a.value(l.elem(pos))
			if err != nil {
				return nil, err
			}
			size += len(v)
		}
		if !a.returns(size) {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrResultTooLarge}, nil
		}
		for range n {
			v, err := l.pop(op.Kind == shardkvpb.WriteOp_LPOP)
			if err != nil {
				return nil, err
			}
			res.Values = append(res.Values, v)
		}
		res.Num = int64(len(res.Values))
	case shardkvpb.WriteOp_LSET:
		if !live {
			return &shardkvpb.WriteResult{Error: errNoSuchKey}, nil
		}
		i, ok := listIndex(op.Delta, l.m.Size)
		if !ok {
			return &shardkvpb.WriteResult{Error: errOffset}, nil
		}
		if len(op.Value) > a.maxValue {
			return &shardkvpb.WriteResult{Error: errValueTooLarge}, nil
		}
		return res, a.setShardRecord(s, l.elem(l.m.Head+i), elemValue(op.Value))
	case shardkvpb.WriteOp_LTRIM:
		if e, err := l.trim(op.Delta, op.Stop); err != nil || e != "" {
			return &shardkvpb.WriteResult{Error: e}, err
		}
	case shardkvpb.WriteOp_LREM, shardkvpb.WriteOp_LINSERT:
		if !live {
			return res, nil
		}
		if l.m.Size > maxCopyElems {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
		}
		elems, err := l.all()
		if err != nil {
			return nil, err
		}
		var next [][]byte
		if op.Kind == shardkvpb.WriteOp_LREM {
			next, res.Num = listRemove(elems, op.Value, op.Delta)
		} else {
			if len(op.Value) > a.maxValue {
				return &shardkvpb.WriteResult{Error: errValueTooLarge}, nil
			}
			next = listInsert(elems, op.Expect, op.Value, op.Delta == 1)
			res.Num = int64(len(next))
			if next == nil {
				res.Num = -1
			}
		}
		if next != nil && len(next) != len(elems) {
			if err := l.rewrite(next); err != nil {
				return nil, err
			}
		}
	case shardkvpb.WriteOp_LMOVE:
		return a.lmove(s, op, l)
	}
	return res, l.finish()
}

// listEdit is a list being changed by one op: its record, metadata and
// expiry as they were, and its metadata as the op leaves it.
type listEdit struct {
	a    *applyCtx
	s    int
	key  []byte
	old  *record
	m    collMeta
	live bool
	exp  int64
	made bool // the version was made by this op (no live list before)
}

func (l *listEdit) elem(pos int64) []byte { return elemKey(l.s, l.key, l.m.Version, posKey(pos)) }

func (l *listEdit) push(head bool, v []byte) error {
	if !l.live && !l.made {
		ver, err := l.a.newVersion(l.s, l.key, l.old)
		if err != nil {
			return err
		}
		l.m, l.made = collMeta{Version: ver}, true
	}
	pos := l.m.Head + l.m.Size
	if head {
		l.m.Head--
		pos = l.m.Head
	}
	l.m.Size++
	return l.a.setShardRecord(l.s, l.elem(pos), elemValue(v))
}

func (l *listEdit) pop(head bool) ([]byte, error) {
	pos := l.m.Head + l.m.Size - 1
	if head {
		pos = l.m.Head
		l.m.Head++
	}
	l.m.Size--
	ek := l.elem(pos)
	v, err := l.a.value(ek)
	if err != nil {
		return nil, err
	}
	return elemPayload(v), l.a.delShardRecord(l.s, ek)
}

// all is the list's elements in order, as the entry sees them.
func (l *listEdit) all() ([][]byte, error) {
	elems, err := l.a.scanElems(elemPrefix(l.s, l.key, l.m.Version), nil, int(l.m.Size))
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(elems))
	for i, e := range elems {
		out[i] = elemPayload(e.v)
	}
	return out, nil
}

// rewrite makes the list elems under a new version (the old one's
// elements are collected).
func (l *listEdit) rewrite(elems [][]byte) error {
	ver, err := l.a.newVersion(l.s, l.key, l.old)
	if err != nil {
		return err
	}
	l.m = collMeta{Version: ver}
	for _, v := range elems {
		if err := l.push(false, v); err != nil {
			return err
		}
	}
	return nil
}

// trim keeps the elements from index start to stop (Redis's LTRIM).
func (l *listEdit) trim(start, stop int64) (string, error) {
	if !l.live {
		return "", nil
	}
	n := l.m.Size
	if start < 0 {
		start = max(start+n, 0)
	}
	if stop < 0 {
		stop += n
	}
	if start > stop || start >= n {
		l.m.Size = 0
		return "", nil
	}
	stop = min(stop, n-1)
	kept, dropped := stop-start+1, n-(stop-start+1)
	switch {
	case dropped <= maxCopyElems:
		for p := l.m.Head; p < l.m.Head+start; p++ {
			if err := l.a.delShardRecord(l.s, l.elem(p)); err != nil {
				return "", err
			}
		}
		for p := l.m.Head + stop + 1; p < l.m.Head+n; p++ {
			if err := l.a.delShardRecord(l.s, l.elem(p)); err != nil {
				return "", err
			}
		}
		l.m.Head, l.m.Size = l.m.Head+start, kept
	case kept <= maxCopyElems:
		from := l.elem(l.m.Head + start)
		elems, err := l.a.scanElems(elemPrefix(l.s, l.key, l.m.Version), from, int(kept))
		if err != nil {
			return "", err
		}
		vals := make([][]byte, len(elems))
		for i, e := range elems {
			vals[i] = elemPayload(e.v)
		}
		return "", l.rewrite(vals)
	default:
		return shardkvpb.OpErrCommandTooLarge, nil
	}
	return "", nil
}

// finish writes the list's record: gone when empty.
func (l *listEdit) finish() error {
	if l.m.Size <= 0 {
		if !l.live {
			return nil
		}
		return l.a.putRecord(l.s, l.key, l.old, &record{Tombstone: true, Index: l.a.index})
	}
	if l.live && !l.made && versionOf(l.old) == l.m.Version && bytes.Equal(l.old.Value, l.m.encode()) {
		return nil // LSET: the elements changed, not the record
	}
	next := &record{Type: TypeList, Value: l.m.encode(), ExpireAtMs: l.exp, Index: l.a.index}
	if err := l.a.putRecord(l.s, l.key, l.old, next); err != nil {
		return err
	}
	// Later ops of the entry on this key build on this record.
	l.old, l.live, l.made = next, true, false
	return nil
}

// listRemove is LREM: elems without the first count elements equal to v
// (from the tail when count < 0; all when 0), and how many went.
func listRemove(elems [][]byte, v []byte, count int64) ([][]byte, int64) {
	drop := make([]bool, len(elems))
	var n int64
	for j := range elems {
		i := j
		if count < 0 {
			i = len(elems) - 1 - j
		}
		if bytes.Equal(elems[i], v) && (count == 0 || uint64(n) < absCount(count)) {
			drop[i] = true
			n++
		}
	}
	out := make([][]byte, 0, len(elems)-int(n))
	for i, e := range elems {
		if !drop[i] {
			out = append(out, e)
		}
	}
	return out, n
}

// absCount is |count| (MinInt64's too).
func absCount(count int64) uint64 {
	if count < 0 {
		return uint64(-(count + 1)) + 1
	}
	return uint64(count)
}

// listInsert is LINSERT: v before (or after) the first element equal to
// pivot; nil if there is none.
func listInsert(elems [][]byte, pivot, v []byte, after bool) [][]byte {
	for i, e := range elems {
		if !bytes.Equal(e, pivot) {
			continue
		}
		if after {
			i++
		}
		out := make([][]byte, 0, len(elems)+1)
		out = append(append(append(out, elems[:i]...), v), elems[i:]...)
		return out
	}
	return nil
}

// lmove pops from the list at key (l) and pushes onto the list at dest.
func (a *applyCtx) lmove(s int, op *shardkvpb.WriteOp, l *listEdit) (*shardkvpb.WriteResult, error) {
	if e := a.otherKeyError(s, op.Dest); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	if !l.live {
		return &shardkvpb.WriteResult{}, nil // before the destination's type, as Redis
	}
	dOld, dm, dLive, code, err := a.liveColl(s, op.Dest, TypeList)
	if err != nil || code != "" {
		return &shardkvpb.WriteResult{Error: code}, err
	}
	v, err := l.pop(op.Delta == 0)
	if err != nil {
		return nil, err
	}
	if err := l.finish(); err != nil {
		return nil, err
	}
	if bytes.Equal(op.Key, op.Dest) {
		dOld, dm, dLive = l.old, l.m, l.live && l.m.Size > 0
		if !dLive {
			dOld = nil
			if r, err := a.get(dataKey(s, op.Key)); err == nil {
				dOld = r
			}
		}
	}
	d := &listEdit{a: a, s: s, key: op.Dest, old: dOld, m: dm, live: dLive}
	if dLive {
		d.exp = dOld.ExpireAtMs
	}
	if err := d.push(op.Stop == 0, v); err != nil {
		return nil, err
	}
	return &shardkvpb.WriteResult{Ok: true, Values: [][]byte{v}}, d.finish()
}
