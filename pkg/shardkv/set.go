package shardkv

import (
	"bytes"
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"slices"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// smallSet: SPOP picks uniformly among the members of a set this small;
// from a larger one it takes consecutive members from a random position
// in member order (O(count), not uniform: documented in docs/types.md).
const smallSet = 1024

// rng is the entry's deterministic random source for key: every replica
// draws the same.
func (a *applyCtx) rng(key []byte) *rand.Rand {
	h := fnv.New64a()
	h.Write(key)
	return rand.New(rand.NewPCG(a.index, h.Sum64()))
}

// A set's Low (collMeta) is a lower bound on its members' first
// maxSetLow bytes. SPOP starts its scans there, so it does not step over
// the tombstones of earlier pops (which take members from the low end
// whenever the random start falls past the last member, as it mostly does
// for members that share a prefix).

// memberBound is member's first maxSetLow bytes.
func memberBound(member []byte) string { return string(member[:min(len(member), maxSetLow)]) }

// widenMembers lowers the bound to cover member.
func (m *collMeta) widenMembers(member []byte) {
	if b := memberBound(member); b < m.Low {
		m.Low = b
	}
}

// lowSeek is where a scan of the set's elements (under prefix) starts: no
// live member sorts before it (a member sorts at or after its own first
// bytes).
func (m collMeta) lowSeek(prefix []byte) []byte { return append(bytes.Clone(prefix), m.Low...) }

// pickElems picks up to n elements (raw keys) of the set at key
// (metadata m) at random, as the entry sees it, and the set's new lower
// bound once they are gone (nil: unchanged).
func (a *applyCtx) pickElems(s int, key []byte, m collMeta, n int) ([][]byte, *string, error) {
	prefix := elemPrefix(s, key, m.Version)
	low := m.lowSeek(prefix)
	r := a.rng(key)
	if m.Size <= smallSet || int64(n) >= m.Size {
		all, err := a.scanElems(prefix, low, int(min(m.Size, int64(max(smallSet, maxCopyElems)))))
		if err != nil || len(all) == 0 {
			return nil, nil, err
		}
		// Nothing before the first member found is live.
		bound := memberBound(all[0].k[len(prefix):])
		boundp := &bound
		if n < len(all) {
			// A partial Fisher-Yates shuffle.
			for i := range n {
				j := i + r.IntN(len(all)-i)
				all[i], all[j] = all[j], all[i]
			}
			all = all[:n]
		}
		out := make([][]byte, len(all))
		for i, e := range all {
			out[i] = e.k
		}
		return out, boundp, nil
	}
	start := binary.BigEndian.AppendUint64(bytes.Clone(prefix), r.Uint64())
	fromLow := bytes.Compare(start, low) <= 0
	if fromLow {
		start = low
	}
	elems, err := a.scanElems(prefix, start, n)
	if err != nil {
		return nil, nil, err
	}
	var bound *string
	if fromLow && len(elems) > 0 {
		b := memberBound(elems[len(elems)-1].k[len(prefix):])
		bound = &b
	}
	if len(elems) < n {
		// Past the last member: on from the bound. All it finds go, so
		// nothing up to the last of them is left.
		more, err := a.scanElems(prefix, low, n-len(elems))
		if err != nil {
			return nil, nil, err
		}
		if len(more) > 0 {
			b := memberBound(more[len(more)-1].k[len(prefix):])
			bound = &b
		}
		elems = append(elems, more...)
	}
	// The second scan can meet the first's members again; drop them,
	// keeping scan order (a set, not a quadratic search: a pop takes up
	// to maxCopyElems members).
	out := make([][]byte, 0, len(elems))
	seen := make(map[string]struct{}, len(elems))
	for _, e := range elems {
		if _, dup := seen[string(e.k)]; !dup {
			seen[string(e.k)] = struct{}{}
			out = append(out, e.k)
		}
	}
	return out, bound, nil
}

// liveColl reads the record at key of shard s for an op on a collection
// of type typ: its record (nil if none), its metadata if live, and an
// error code (WRONGTYPE, BAD_RECORD) or a storage fault.
func (a *applyCtx) liveColl(s int, key []byte, typ ValueType) (old *record, m collMeta, live bool, code string, err error) {
	old, err = a.get(dataKey(s, key))
	if err != nil {
		r, err := readFailed(err)
		if r != nil {
			return nil, m, false, r.Error, nil
		}
		return nil, m, false, "", err
	}
	if old == nil || !old.live(a.nowNS/1e6) {
		return old, m, false, "", nil
	}
	if old.Type != typ {
		return old, m, true, shardkvpb.OpErrWrongType, nil
	}
	if m, err = decodeCollMeta(old.Value); err != nil {
		return old, m, true, shardkvpb.OpErrBadRecord, nil
	}
	return old, m, true, "", nil
}

// smove moves member fields[0] from the set at key to the set at dest.
func (a *applyCtx) smove(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	if len(op.Fields) != 1 {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil
	}
	if e := a.otherKeyError(s, op.Dest); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	member := op.Fields[0]
	if len(op.Key)+len(member) > MaxKeyBytesLimit-elemOverhead || len(op.Dest)+len(member) > MaxKeyBytesLimit-elemOverhead {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
	}
	srcRec, sm, srcLive, code, err := a.liveColl(s, op.Key, TypeSet)
	if err != nil || code != "" {
		return &shardkvpb.WriteResult{Error: code}, err
	}
	if !srcLive {
		return &shardkvpb.WriteResult{}, nil // before the destination's type, as Redis
	}
	dstRec, dm, dstLive, code, err := a.liveColl(s, op.Dest, TypeSet)
	if err != nil || code != "" {
		return &shardkvpb.WriteResult{Error: code}, err
	}
	sk := elemKey(s, op.Key, sm.Version, member)
	cur, err := a.value(sk)
	if err != nil || cur == nil {
		return &shardkvpb.WriteResult{}, err
	}
	if bytes.Equal(op.Key, op.Dest) {
		return &shardkvpb.WriteResult{Ok: true}, nil
	}
	// Out of the source, which goes with its last member.
	if err := a.delShardRecord(s, sk); err != nil {
		return nil, err
	}
	sm.Size--
	next := &record{Type: TypeSet, Value: sm.encode(), ExpireAtMs: srcRec.ExpireAtMs, Index: a.index}
	if sm.Size <= 0 {
		next = &record{Tombstone: true, Index: a.index}
	}
	if err := a.putRecord(s, op.Key, srcRec, next); err != nil {
		return nil, err
	}
	// Into the destination, made if need be.
	var exp int64
	if dstLive {
		exp = dstRec.ExpireAtMs
	} else if dm.Version, err = a.newVersion(s, op.Dest, dstRec); err != nil {
		return nil, err
	}
	dk := elemKey(s, op.Dest, dm.Version, member)
	had, err := a.value(dk)
	if err != nil {
		return nil, err
	}
	if had == nil {
		dm.Size++
		dm.widenMembers(member)
		if err := a.setShardRecord(s, dk, elemValue(nil)); err != nil {
			return nil, err
		}
		if err := a.putRecord(s, op.Dest, dstRec, &record{Type: TypeSet, Value: dm.encode(), ExpireAtMs: exp, Index: a.index}); err != nil {
			return nil, err
		}
	}
	return &shardkvpb.WriteResult{Ok: true}, nil
}

// sstore stores the intersection, union or difference of sets at dest.
func (a *applyCtx) sstore(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	if op.Delta < 0 || op.Delta > 2 {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil
	}
	for _, k := range append([][]byte{op.Dest}, op.MoreKeys...) {
		if e := a.otherKeyError(s, k); e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
	}
	var sets [][][]byte // each source's members, sorted
	for _, k := range append([][]byte{op.Key}, op.MoreKeys...) {
		_, m, live, code, err := a.liveColl(s, k, TypeSet)
		if err != nil || code != "" {
			return &shardkvpb.WriteResult{Error: code}, err
		}
		var members [][]byte
		if live {
			if m.Size > maxCopyElems {
				return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
			}
			prefix := elemPrefix(s, k, m.Version)
			elems, err := a.scanElems(prefix, nil, maxCopyElems)
			if err != nil {
				return nil, err
			}
			for _, e := range elems {
				members = append(members, e.k[len(prefix):])
			}
		}
		sets = append(sets, members)
	}
	result := SetAlgebra(int(op.Delta), sets)
	dstRec, err := a.get(dataKey(s, op.Dest))
	if err != nil {
		return readFailed(err)
	}
	if len(result) > maxCopyElems {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
	}
	for _, f := range result {
		if len(op.Dest)+len(f) > MaxKeyBytesLimit-elemOverhead {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
		}
	}
	res := &shardkvpb.WriteResult{Ok: true, Num: int64(len(result))}
	if len(result) == 0 {
		if dstRec != nil && dstRec.live(a.nowNS/1e6) {
			return res, a.putRecord(s, op.Dest, dstRec, &record{Tombstone: true, Index: a.index})
		}
		return res, nil
	}
	v, err := a.newVersion(s, op.Dest, dstRec)
	if err != nil {
		return nil, err
	}
	for _, f := range result {
		if err := a.setShardRecord(s, elemKey(s, op.Dest, v, f), elemValue(nil)); err != nil {
			return nil, err
		}
	}
	next := &record{Type: TypeSet, Value: collMeta{Version: v, Size: int64(len(result))}.encode(), Index: a.index}
	return res, a.putRecord(s, op.Dest, dstRec, next)
}

// Set algebra ops (SSTORE's delta, and the front ends' SINTER, SUNION,
// SDIFF).
const (
	SetInter = 0
	SetUnion = 1
	SetDiff  = 2
)

// SetAlgebra combines sorted member lists: the intersection, union or
// difference (the first less the others), sorted.
func SetAlgebra(op int, sets [][][]byte) [][]byte {
	if len(sets) == 0 {
		return nil
	}
	count := map[string]int{}
	for i, set := range sets {
		for _, m := range set {
			switch {
			case op == SetDiff && i > 0:
				count[string(m)] = -1 << 30
			case op == SetDiff:
				count[string(m)]++
			default:
				count[string(m)]++
			}
		}
	}
	var out [][]byte
	for m, c := range count {
		switch {
		case op == SetInter && c == len(sets), op == SetUnion, op == SetDiff && c > 0:
			out = append(out, []byte(m))
		}
	}
	slices.SortFunc(out, bytes.Compare)
	return out
}
