package shardkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Sorted sets: each member has two element records under the version:
// 'm'<member> holding its score, and the score index 's'<score:8><member>
// (scoreBytes: byte order is numeric order, ties by member), so a member's
// score is one read and ranges by score or rank walk the index in order.

// ZADD flags (WriteOp.delta).
const (
	ZAddNX   = 1 << iota // only add new members
	ZAddXX               // only update existing members
	ZAddGT               // update only to a greater score
	ZAddLT               // update only to a lower score
	ZAddCH               // Num counts changed members too
	ZAddIncr             // add the score to the member's (one member)
)

const (
	zMember = 'm'
	zScore  = 's'
)

// scoreBytes encodes a score so that byte order is numeric order (-0 as
// 0; NaN is never stored).
func scoreBytes(f float64) []byte {
	if f == 0 {
		f = 0
	}
	b := math.Float64bits(f)
	if b>>63 == 1 {
		b = ^b
	} else {
		b |= 1 << 63
	}
	return binary.BigEndian.AppendUint64(nil, b)
}

func scoreFrom(k []byte) float64 {
	b := binary.BigEndian.Uint64(k)
	if b>>63 == 1 {
		b &^= 1 << 63
	} else {
		b = ^b
	}
	return math.Float64frombits(b)
}

// ScoreValue and ValueScore convert a score to and from its wire form
// (8-byte big-endian IEEE 754 bits).
func ScoreValue(f float64) []byte { return binary.BigEndian.AppendUint64(nil, math.Float64bits(f)) }

func ValueScore(b []byte) (float64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	f := math.Float64frombits(binary.BigEndian.Uint64(b))
	return f, !math.IsNaN(f)
}

func zMemberField(member []byte) []byte { return append([]byte{zMember}, member...) }

func zScoreField(score float64, member []byte) []byte {
	return append(append([]byte{zScore}, scoreBytes(score)...), member...)
}

// zsetEdit is a sorted set being changed by one op.
type zsetEdit struct {
	a    *applyCtx
	s    int
	key  []byte
	old  *record
	m    collMeta
	orig collMeta // m as read: finish writes m if it changed
	live bool
	made bool
	exp  int64
}

func (a *applyCtx) zsetEdit(s int, key []byte) (*zsetEdit, string, error) {
	old, m, live, code, err := a.liveColl(s, key, TypeZSet)
	if err != nil || code != "" {
		return nil, code, err
	}
	z := &zsetEdit{a: a, s: s, key: key, old: old, m: m, orig: m, live: live}
	if live {
		z.exp = old.ExpireAtMs
	}
	return z, "", nil
}

func (z *zsetEdit) ensure() error {
	if z.live || z.made {
		return nil
	}
	v, err := z.a.newVersion(z.s, z.key, z.old)
	z.m, z.made = collMeta{Version: v}, true
	return err
}

// score is member's score (found false: not a member).
func (z *zsetEdit) score(member []byte) (float64, bool, error) {
	if !z.live && !z.made {
		return 0, false, nil
	}
	v, err := z.a.value(elemKey(z.s, z.key, z.m.Version, zMemberField(member)))
	if err != nil || v == nil {
		return 0, false, err
	}
	f, ok := ValueScore(elemPayload(v))
	if !ok {
		return 0, false, errBadRecord
	}
	return f, true, nil
}

func (z *zsetEdit) put(member []byte, score float64, cur float64, exists bool) error {
	if exists {
		if err := z.a.delShardRecord(z.s, elemKey(z.s, z.key, z.m.Version, zScoreField(cur, member))); err != nil {
			return err
		}
	} else {
		z.m.Size++
	}
	if err := z.a.setShardRecord(z.s, elemKey(z.s, z.key, z.m.Version, zMemberField(member)), elemValue(ScoreValue(score))); err != nil {
		return err
	}
	z.m.widenScores(binary.BigEndian.Uint64(scoreBytes(score)))
	return z.a.setShardRecord(z.s, elemKey(z.s, z.key, z.m.Version, zScoreField(score, member)), elemValue(nil))
}

func (z *zsetEdit) remove(member []byte, score float64) error {
	z.m.Size--
	if err := z.a.delShardRecord(z.s, elemKey(z.s, z.key, z.m.Version, zMemberField(member))); err != nil {
		return err
	}
	return z.a.delShardRecord(z.s, elemKey(z.s, z.key, z.m.Version, zScoreField(score, member)))
}

// finish writes the set's record: gone when empty.
func (z *zsetEdit) finish(changed bool) error {
	if z.m.Size <= 0 {
		if !z.live {
			return nil
		}
		return z.a.putRecord(z.s, z.key, z.old, &record{Tombstone: true, Index: z.a.index})
	}
	if !changed && z.m == z.orig {
		return nil
	}
	return z.a.putRecord(z.s, z.key, z.old, &record{Type: TypeZSet, Value: z.m.encode(), ExpireAtMs: z.exp, Index: z.a.index})
}

// mutateZSet runs a sorted-set op on the set at key in shard s.
func (a *applyCtx) mutateZSet(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	z, code, err := a.zsetEdit(s, op.Key)
	if err != nil || code != "" {
		if errors.Is(err, errBadRecord) {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrBadRecord}, nil
		}
		return &shardkvpb.WriteResult{Error: code}, err
	}
	for _, f := range op.Fields {
		if len(op.Key)+1+8+len(f) > MaxKeyBytesLimit-elemOverhead && op.Kind != shardkvpb.WriteOp_ZREMRANGE {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
		}
	}
	res := &shardkvpb.WriteResult{}
	size := z.m.Size
	changed := false
	switch op.Kind {
	case shardkvpb.WriteOp_ZADD:
		if e := zaddValid(op); e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
		flags := op.Delta
		if !z.live && flags&ZAddXX != 0 {
			return res, nil
		}
		if err := z.ensure(); err != nil {
			return nil, err
		}
		for i, member := range op.Fields {
			score, _ := ValueScore(op.FieldValues[i])
			cur, exists, err := z.score(member)
			if err != nil {
				return readFailed(err)
			}
			if (flags&ZAddNX != 0 && exists) || (flags&ZAddXX != 0 && !exists) {
				continue
			}
			if flags&ZAddIncr != 0 && exists {
				score += cur
				if math.IsNaN(score) {
					return &shardkvpb.WriteResult{Error: errNaN}, nil
				}
			}
			if exists && ((flags&ZAddGT != 0 && !(score > cur)) || (flags&ZAddLT != 0 && !(score < cur))) {
				continue
			}
			if flags&ZAddIncr != 0 {
				res.Ok, res.Value = true, ScoreValue(score)
			}
			switch {
			case !exists:
				res.Num++
			case score != cur:
				if flags&ZAddCH != 0 {
					res.Num++
				}
			default:
				continue
			}
			changed = true
			if err := z.put(member, score, cur, exists); err != nil {
				return nil, err
			}
		}
	case shardkvpb.WriteOp_ZREM:
		for _, member := range op.Fields {
			cur, exists, err := z.score(member)
			if err != nil {
				return readFailed(err)
			}
			if exists {
				res.Num++
				changed = true
				if err := z.remove(member, cur); err != nil {
					return nil, err
				}
			}
		}
	case shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX:
		if op.Delta < 1 || op.Delta > maxCopyElems {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil
		}
		if !z.live {
			return res, nil
		}
		prefix := elemKey(s, op.Key, z.m.Version, []byte{zScore})
		var idx []rawKV
		switch {
		case op.Kind == shardkvpb.WriteOp_ZPOPMIN:
			idx, err = a.scanElems(prefix, binary.BigEndian.AppendUint64(bytes.Clone(prefix), z.m.scoreLow()), int(op.Delta))
		case z.m.scoreHigh() == math.MaxUint64:
			idx, err = a.scanElemsRev(prefix, int(op.Delta))
		default:
			idx, err = a.scanElemsRevBelow(prefix, binary.BigEndian.AppendUint64(bytes.Clone(prefix), z.m.scoreHigh()+1), int(op.Delta))
		}
		if err != nil {
			return nil, err
		}
		n := 0
		for _, e := range idx {
			n += len(e.k) - len(prefix)
		}
		if !a.returns(n) {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrResultTooLarge}, nil
		}
		for _, e := range idx {
			score, member := scoreFrom(e.k[len(prefix):]), e.k[len(prefix)+8:]
			shown := score
			if score == 0 {
				// The index has one 0; the member's record keeps -0.
				if f, ok, err := z.score(member); err == nil && ok {
					shown = f
				}
			}
			res.Values = append(res.Values, bytes.Clone(member), ScoreValue(shown))
			if err := z.remove(member, score); err != nil {
				return nil, err
			}
			// Nothing live is left beyond the popped score: the next pop
			// starts there.
			if bits := binary.BigEndian.Uint64(e.k[len(prefix):]); op.Kind == shardkvpb.WriteOp_ZPOPMIN {
				z.m.Head = int64(bits)
			} else {
				z.m.Tail = ^bits
			}
			res.Num++
			changed = true
		}
	case shardkvpb.WriteOp_ZREMRANGE:
		if !z.live {
			return res, nil
		}
		r, e := zrangeOf(op)
		if e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
		picked, err := z.a.zselect(s, op.Key, z.m, r, maxCopyElems+1)
		if err != nil {
			return nil, err
		}
		if len(picked) > maxCopyElems {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
		}
		for _, p := range picked {
			if err := z.remove(p.member, p.score); err != nil {
				return nil, err
			}
		}
		res.Num = int64(len(picked))
		changed = len(picked) > 0
	}
	res.Ok = res.Ok || op.Kind != shardkvpb.WriteOp_ZADD || op.Delta&ZAddIncr == 0
	return res, z.finish(changed || z.m.Size != size)
}

// zaddValid checks a ZADD's flags and scores (the front end checks them
// first).
func zaddValid(op *shardkvpb.WriteOp) string {
	f := op.Delta
	switch {
	case len(op.Fields) == 0 || len(op.FieldValues) != len(op.Fields),
		f < 0 || f >= 1<<6,
		f&ZAddNX != 0 && f&(ZAddXX|ZAddGT|ZAddLT) != 0,
		f&ZAddGT != 0 && f&ZAddLT != 0,
		f&ZAddIncr != 0 && len(op.Fields) != 1:
		return shardkvpb.OpErrInvalidOp
	}
	for _, v := range op.FieldValues {
		if _, ok := ValueScore(v); !ok {
			return errNotFloat
		}
	}
	return ""
}

// Range kinds (ZRange.By, ZREMRANGE's delta).
const (
	ZByRank  = 0
	ZByScore = 1
	ZByLex   = 2
)

// Bound kinds.
const (
	BoundIncl   = 0
	BoundExcl   = 1
	BoundNegInf = 2
	BoundPosInf = 3
)

// Bound is one end of a range of a sorted set: a rank (negative: from the
// end), a score or a member (by lex), inclusive or not, or an infinity.
type Bound struct {
	Kind  int
	Rank  int64
	Score float64
	Lex   []byte
}

// Encode is the bound's wire form (ZREMRANGE's fields): its kind, then
// the rank or score (8 bytes) or the member.
func (b Bound) Encode(by int) []byte {
	out := []byte{byte(b.Kind)}
	switch by {
	case ZByRank:
		return binary.BigEndian.AppendUint64(out, uint64(b.Rank))
	case ZByScore:
		return append(out, ScoreValue(b.Score)...)
	}
	return append(out, b.Lex...)
}

// DecodeBound reads a bound's wire form.
func DecodeBound(by int, b []byte) (Bound, bool) {
	if len(b) < 1 || b[0] > BoundPosInf {
		return Bound{}, false
	}
	out := Bound{Kind: int(b[0])}
	switch by {
	case ZByRank:
		if len(b) != 9 {
			return Bound{}, false
		}
		out.Rank = int64(binary.BigEndian.Uint64(b[1:]))
	case ZByScore:
		f, ok := ValueScore(b[1:])
		if !ok {
			return Bound{}, false
		}
		out.Score = f
	case ZByLex:
		out.Lex = b[1:]
	default:
		return Bound{}, false
	}
	return out, true
}

// ZRange selects members of a sorted set: by rank (Min.Rank to Max.Rank,
// inclusive, Redis's index rules), by score or by member (lex), in
// ascending order or Rev, skipping Offset and taking Count (<0: all).
type ZRange struct {
	By       int
	Min, Max Bound
	Rev      bool
	Offset   int64
	Count    int64
}

func zrangeOf(op *shardkvpb.WriteOp) (ZRange, string) {
	by := int(op.Delta)
	if len(op.Fields) != 2 || by < ZByRank || by > ZByLex {
		return ZRange{}, shardkvpb.OpErrInvalidOp
	}
	lo, ok1 := DecodeBound(by, op.Fields[0])
	hi, ok2 := DecodeBound(by, op.Fields[1])
	if !ok1 || !ok2 {
		return ZRange{}, shardkvpb.OpErrInvalidOp
	}
	return ZRange{By: by, Min: lo, Max: hi, Count: -1}, ""
}

type zpick struct {
	member []byte
	score  float64
}

// zselect picks the members of r (at most limit) from the sorted set at
// key (metadata m), as the current entry sees it.
func (a *applyCtx) zselect(s int, key []byte, m collMeta, r ZRange, limit int) ([]zpick, error) {
	prefix := elemKey(s, key, m.Version, []byte{zScore})
	var out []zpick
	err := walkZRange(r, m.Size, func(from []byte, n int) ([][]byte, error) {
		var start []byte
		if from != nil {
			start = append(bytes.Clone(prefix), from...)
		}
		kvs, err := a.scanElems(prefix, start, n)
		fields := make([][]byte, len(kvs))
		for i, e := range kvs {
			fields[i] = e.k[len(prefix):]
		}
		return fields, err
	}, func(field []byte) bool {
		out = append(out, zpick{member: bytes.Clone(field[8:]), score: scoreFrom(field)})
		return len(out) < limit
	})
	for i := range out {
		if out[i].score == 0 { // -0 is kept in the member's record only
			if v, err := a.value(elemKey(s, key, m.Version, zMemberField(out[i].member))); err == nil {
				if f, ok := ValueScore(elemPayload(v)); ok {
					out[i].score = f
				}
			}
		}
	}
	return out, err
}

// rankRange applies Redis's index rules to ranks start..stop of size
// members: lo..hi, or ok false when none.
func rankRange(start, stop, size int64) (lo, hi int64, ok bool) {
	if start < 0 {
		start = max(start+size, 0)
	}
	if stop < 0 {
		stop += size
	}
	if start > stop || start >= size {
		return 0, 0, false
	}
	return start, min(stop, size-1), true
}

func (b Bound) belowScore(sc float64) bool { // sc is below a lower bound b
	switch b.Kind {
	case BoundNegInf:
		return false
	case BoundPosInf:
		return true
	case BoundExcl:
		return sc <= b.Score
	}
	return sc < b.Score
}

func (b Bound) aboveScore(sc float64) bool { // sc is above an upper bound b
	switch b.Kind {
	case BoundPosInf:
		return false
	case BoundNegInf:
		return true
	case BoundExcl:
		return sc >= b.Score
	}
	return sc > b.Score
}

func (b Bound) belowLex(m []byte) bool {
	switch b.Kind {
	case BoundNegInf:
		return false
	case BoundPosInf:
		return true
	case BoundExcl:
		return bytes.Compare(m, b.Lex) <= 0
	}
	return bytes.Compare(m, b.Lex) < 0
}

func (b Bound) aboveLex(m []byte) bool {
	switch b.Kind {
	case BoundPosInf:
		return false
	case BoundNegInf:
		return true
	case BoundExcl:
		return bytes.Compare(m, b.Lex) >= 0
	}
	return bytes.Compare(m, b.Lex) > 0
}

// walkZRange calls f with the score index fields (score:8 member) of the
// members in r, in ascending order (Rev, Offset and Count are the
// readers'), until f returns false. scan reads up to n index fields from
// one on (nil: the first). By lex assumes equal scores, as Redis does.
func walkZRange(r ZRange, size int64, scan func(from []byte, n int) ([][]byte, error), f func(field []byte) bool) error {
	var from []byte
	skip, left := int64(0), int64(-1)
	switch r.By {
	case ZByRank:
		lo, hi, ok := rankRange(r.Min.Rank, r.Max.Rank, size)
		if !ok {
			return nil
		}
		skip, left = lo, hi-lo+1
	case ZByScore:
		if r.Min.Kind == BoundPosInf || r.Max.Kind == BoundNegInf {
			return nil
		}
		if r.Min.Kind == BoundIncl || r.Min.Kind == BoundExcl {
			from = scoreBytes(r.Min.Score)
		}
	}
	const page = 256
	for {
		batch, err := scan(from, page)
		if err != nil {
			return err
		}
		for _, field := range batch {
			if len(field) < 8 {
				continue
			}
			if skip > 0 {
				skip--
				continue
			}
			switch r.By {
			case ZByScore:
				sc := scoreFrom(field)
				if r.Min.belowScore(sc) {
					continue
				}
				if r.Max.aboveScore(sc) {
					return nil
				}
			case ZByLex:
				m := field[8:]
				if r.Min.belowLex(m) {
					continue
				}
				if r.Max.aboveLex(m) {
					return nil
				}
			}
			if !f(field) {
				return nil
			}
			if left > 0 {
				if left--; left == 0 {
					return nil
				}
			}
		}
		if len(batch) < page {
			return nil
		}
		from = append(bytes.Clone(batch[len(batch)-1]), 0)
	}
}

// zmembers reads every member of the sorted set or set at key (a set's
// members score 1), as the entry sees it; a missing key has none. Past
// maxCopyElems members it refuses (COMMAND_TOO_LARGE).
func (a *applyCtx) zmembers(s int, key []byte) ([]zpick, string, error) {
	rec, err := a.get(dataKey(s, key))
	if err != nil {
		r, err := readFailed(err)
		if r != nil {
			return nil, r.Error, nil
		}
		return nil, "", err
	}
	if rec == nil || !rec.live(a.nowNS/1e6) {
		return nil, "", nil
	}
	if rec.Type != TypeZSet && rec.Type != TypeSet {
		return nil, shardkvpb.OpErrWrongType, nil
	}
	m, err := decodeCollMeta(rec.Value)
	if err != nil {
		return nil, shardkvpb.OpErrBadRecord, nil
	}
	if m.Size > maxCopyElems {
		return nil, shardkvpb.OpErrCommandTooLarge, nil
	}
	prefix := elemPrefix(s, key, m.Version)
	if rec.Type == TypeZSet {
		prefix = append(prefix, zMember)
	}
	elems, err := a.scanElems(prefix, nil, maxCopyElems)
	if err != nil {
		return nil, "", err
	}
	out := make([]zpick, len(elems))
	for i, e := range elems {
		out[i] = zpick{member: e.k[len(prefix):], score: 1}
		if rec.Type == TypeZSet {
			f, ok := ValueScore(elemPayload(e.v))
			if !ok {
				return nil, shardkvpb.OpErrBadRecord, nil
			}
			out[i].score = f
		}
	}
	return out, "", nil
}

// storeZSet replaces dest with a sorted set of members (in member order),
// or deletes it when there are none.
func (a *applyCtx) storeZSet(s int, dest []byte, members []zpick) (*shardkvpb.WriteResult, error) {
	old, err := a.get(dataKey(s, dest))
	if err != nil {
		return readFailed(err)
	}
	res := &shardkvpb.WriteResult{Ok: true, Num: int64(len(members))}
	if len(members) > maxCopyElems {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
	}
	for _, p := range members {
		if len(dest)+1+8+len(p.member) > MaxKeyBytesLimit-elemOverhead {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
		}
	}
	if len(members) == 0 {
		if old != nil && old.live(a.nowNS/1e6) {
			return res, a.putRecord(s, dest, old, &record{Tombstone: true, Index: a.index})
		}
		return res, nil
	}
	v, err := a.newVersion(s, dest, old)
	if err != nil {
		return nil, err
	}
	z := &zsetEdit{a: a, s: s, key: dest, old: old, m: collMeta{Version: v}, made: true}
	for _, p := range members {
		if err := z.put(p.member, p.score, 0, false); err != nil {
			return nil, err
		}
	}
	return res, a.putRecord(s, dest, old, &record{Type: TypeZSet, Value: z.m.encode(), Index: a.index})
}

// Aggregates (ZSTORE's aggregate).
const (
	ZAggSum = 0
	ZAggMin = 1
	ZAggMax = 2
)

// zstore is ZUNIONSTORE, ZINTERSTORE and ZDIFFSTORE.
func (a *applyCtx) zstore(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	srcs := append([][]byte{op.Key}, op.MoreKeys...)
	if e := zstoreValid(op); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	for _, k := range append([][]byte{op.Dest}, op.MoreKeys...) {
		if e := a.otherKeyError(s, k); e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
	}
	sets := make([][]zpick, len(srcs))
	for i, k := range srcs {
		ms, code, err := a.zmembers(s, k)
		if err != nil || code != "" {
			return &shardkvpb.WriteResult{Error: code}, err
		}
		w := 1.0
		if len(op.Weights) > 0 {
			w = op.Weights[i]
		}
		for j := range ms {
			ms[j].score = weigh(ms[j].score, w)
		}
		sets[i] = ms
	}
	return a.storeZSet(s, op.Dest, zcombine(int(op.Delta), int(op.Aggregate), sets))
}

func zstoreValid(op *shardkvpb.WriteOp) string {
	switch {
	case op.Delta < 0 || op.Delta > 2, op.Aggregate < 0 || op.Aggregate > 2,
		len(op.Weights) != 0 && len(op.Weights) != 1+len(op.MoreKeys):
		return shardkvpb.OpErrInvalidOp
	}
	for _, w := range op.Weights {
		if math.IsNaN(w) {
			return shardkvpb.OpErrInvalidOp
		}
	}
	return ""
}

// weigh is a score times its source's weight (NaN for an infinite score
// times 0: zcombine resolves it as Redis does).
func weigh(score, w float64) float64 { return score * w }

// zcombine combines scored member lists (each in member order, distinct):
// the union, intersection or difference (SetUnion, SetInter, SetDiff: the
// first less the others, its scores kept), scores aggregated by sum, min
// or max (a sum of opposite infinities is 0, as Redis). The result is in
// member order.
func zcombine(op, agg int, sets [][]zpick) []zpick {
	if len(sets) == 0 {
		return nil
	}
	type acc struct {
		score float64
		n     int
	}
	m := map[string]*acc{}
	var order []string
	for i, set := range sets {
		for _, p := range set {
			k := string(p.member)
			x, ok := m[k]
			switch {
			case op == SetDiff && i > 0:
				if ok {
					x.n = -1 << 30
				}
				continue
			case !ok:
				// A member's first score: NaN (inf times 0) counts as 0.
				sc := p.score
				if math.IsNaN(sc) {
					sc = 0
				}
				m[k] = &acc{score: sc, n: 1}
				order = append(order, k)
				continue
			}
			x.n++
			// As Redis's zunionInterAggregate: a NaN never wins min or max,
			// and a sum that is NaN (opposite infinities) is 0.
			switch agg {
			case ZAggMin:
				if p.score < x.score {
					x.score = p.score
				}
			case ZAggMax:
				if p.score > x.score {
					x.score = p.score
				}
			default:
				x.score += p.score
				if math.IsNaN(x.score) {
					x.score = 0
				}
			}
		}
	}
	var out []zpick
	for _, k := range order {
		x := m[k]
		if (op == SetInter && x.n == len(sets)) || op == SetUnion || (op == SetDiff && x.n > 0) {
			out = append(out, zpick{member: []byte(k), score: x.score})
		}
	}
	slices.SortFunc(out, func(x, y zpick) int { return bytes.Compare(x.member, y.member) })
	return out
}

// zrangeStore is ZRANGESTORE.
func (a *applyCtx) zrangeStore(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	if e := a.otherKeyError(s, op.Dest); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	r, e := zrangeOf(op)
	if e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	z, code, err := a.zsetEdit(s, op.Key)
	if err != nil || code != "" {
		return &shardkvpb.WriteResult{Error: code}, err
	}
	var picked []zpick
	if z.live {
		if r.By == ZByRank && op.Rev {
			lo, hi, ok := rankRange(r.Min.Rank, r.Max.Rank, z.m.Size)
			if !ok {
				return a.storeZSet(s, op.Dest, nil)
			}
			r.Min.Rank, r.Max.Rank = z.m.Size-1-hi, z.m.Size-1-lo
		}
		if picked, err = a.zselect(s, op.Key, z.m, r, maxCopyElems+1); err != nil {
			return nil, err
		}
		if len(picked) > maxCopyElems {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}, nil
		}
		if op.Rev {
			slices.Reverse(picked)
		}
		picked = picked[min(int64(len(picked)), max(op.Offset, 0)):]
		if op.Count >= 0 && int64(len(picked)) > op.Count {
			picked = picked[:op.Count]
		}
		slices.SortFunc(picked, func(x, y zpick) int { return bytes.Compare(x.member, y.member) })
	}
	return a.storeZSet(s, op.Dest, picked)
}
