package shardkv

import (
	"bytes"
	"slices"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
)

// ElemQuery says which elements of a collection ReadElems reads.
type ElemQuery struct {
	// Type is the type the command is for: a key of another type is
	// reported (ElemsReply.Entry.Type) with no element read.
	Type ValueType
	// Fields: these fields, in order (a missing one: Found false).
	Fields [][]byte
	// All: the elements in field order after After (from the first if
	// nil), at most Count of them (0: all); Next says where to go on.
	All   bool
	After []byte
	Count int
	// Range: a list's elements from index Start to Stop, inclusive, with
	// Redis's LRANGE rules (negative: from the tail; clipped).
	Range       bool
	Start, Stop int64
	// Z: a sorted set's members in a range (Elems: member, score as
	// ScoreValue); with CountOnly, only how many (ElemsReply.Count).
	Z         *ZRange
	CountOnly bool
	// RankOf: the rank of this member of a sorted set (ElemsReply.Rank,
	// -1 if none; its score in Elems[0]), counted from the end if Rev.
	RankOf []byte
	Rev    bool
}

// Elem is one element of a collection: a hash field and its value, a set
// member.
type Elem struct {
	Field, Value []byte
	Found        bool
}

// ElemsReply is what ReadElems read: the key's entry (Found, Type, its
// expiry), the collection's size, and the elements asked for.
type ElemsReply struct {
	Entry ValueEntry
	Len   int64
	Elems []Elem
	// Next: an All read stopped at Count; go on after this field.
	Next []byte
	// Count and Rank: see ElemQuery's CountOnly and RankOf.
	Count int64
	Rank  int64
}

// ReadElems reads key's collection from local state, judged at the log
// time of the state read (as GetEntry). reserve, if set, is asked for
// each element's size before it is kept (ErrReadLimit when it refuses).
func (sm *StateMachine) ReadElems(key []byte, q ElemQuery, reserve func(int) bool) (ElemsReply, Code, error) {
	rs, code, err := sm.ReadElemsOf([][]byte{key}, q, reserve)
	if len(rs) == 0 {
		return ElemsReply{}, code, err
	}
	return rs[0], code, err
}

// ReadElemsOf reads the collections at keys as ReadElems does, all from
// one view of the state (SINTER and the like see one point of the log).
// code refuses the first key not served here.
func (sm *StateMachine) ReadElemsOf(keys [][]byte, q ElemQuery, reserve func(int) bool) (rs []ElemsReply, code Code, err error) {
	err = sm.store.DB().View(func(txn *badger.Txn) error {
		ns, err := logTime(txn)
		if err != nil {
			return err
		}
		for _, key := range keys {
			var r ElemsReply
			r, code, err = sm.readElems(txn, key, q, ns/1e6, reserve)
			if err != nil || code != OK {
				return err
			}
			rs = append(rs, r)
		}
		return nil
	})
	return rs, code, err
}

// readZSet reads a sorted set (prefix: its elements) for q.
func (sm *StateMachine) readZSet(txn *badger.Txn, prefix []byte, m collMeta, q ElemQuery, r *ElemsReply, reserve func(int) bool) error {
	keep := func(member, score []byte) bool {
		if reserve != nil && !reserve(len(member)+len(score)) {
			return false
		}
		r.Elems = append(r.Elems, Elem{Field: member, Value: score, Found: score != nil})
		return true
	}
	mprefix := append(bytes.Clone(prefix), zMember)
	sprefix := append(bytes.Clone(prefix), zScore)
	score := func(member []byte) ([]byte, error) {
		v, err := raftgroup.GetValue(txn, append(bytes.Clone(mprefix), member...))
		if v == nil || err != nil {
			return nil, err
		}
		return elemPayload(v), nil
	}
	for _, f := range q.Fields {
		sc, err := score(f)
		if err != nil {
			return err
		}
		if !keep(f, sc) {
			return ErrReadLimit
		}
	}
	scan := func(p []byte) func(from []byte, n int) ([][]byte, error) {
		return func(from []byte, n int) ([][]byte, error) {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: p})
			defer it.Close()
			if from == nil {
				it.Rewind()
			} else {
				it.Seek(append(bytes.Clone(p), from...))
			}
			var out [][]byte
			for ; it.Valid() && len(out) < n; it.Next() {
				out = append(out, it.Item().KeyCopy(nil)[len(p):])
			}
			return out, nil
		}
	}
	switch {
	case q.RankOf != nil:
		r.Rank = -1
		sc, err := score(q.RankOf)
		if err != nil || sc == nil {
			return err
		}
		f, _ := ValueScore(sc)
		target := zScoreField(f, q.RankOf)[1:]
		var rank int64
		err = walkZRange(ZRange{By: ZByRank, Min: Bound{Rank: 0}, Max: Bound{Rank: -1}}, m.Size, scan(sprefix), func(field []byte) bool {
			if bytes.Equal(field, target) {
				return false
			}
			rank++
			return true
		})
		r.Rank = rank
		if q.Rev {
			r.Rank = m.Size - 1 - rank
		}
		keep(q.RankOf, sc)
		return err
	case q.Z != nil:
		z := *q.Z
		if z.By == ZByRank && z.Rev {
			// Ranks from the end: the same members ascending, reversed.
			lo, hi, ok := rankRange(z.Min.Rank, z.Max.Rank, m.Size)
			if !ok {
				return nil
			}
			z.Min.Rank, z.Max.Rank = m.Size-1-hi, m.Size-1-lo
		}
		var fields [][]byte
		err := walkZRange(z, m.Size, scan(sprefix), func(field []byte) bool {
			if q.CountOnly {
				r.Count++
				return true
			}
			fields = append(fields, field)
			return z.Rev || z.Count < 0 || int64(len(fields)) < z.Offset+z.Count
		})
		if err != nil || q.CountOnly {
			return err
		}
		if z.Rev {
			slices.Reverse(fields)
		}
		fields = fields[min(int64(len(fields)), max(z.Offset, 0)):]
		if z.Count >= 0 && int64(len(fields)) > z.Count {
			fields = fields[:z.Count]
		}
		for _, field := range fields {
			sc := ScoreValue(scoreFrom(field))
			if scoreFrom(field) == 0 {
				// The index holds one 0: the member's record tells -0.
				exact, err := score(field[8:])
				if err != nil {
					return err
				}
				if exact != nil {
					sc = exact
				}
			}
			if !keep(field[8:], sc) {
				return ErrReadLimit
			}
		}
		return nil
	case q.All:
		it := txn.NewIterator(badger.IteratorOptions{Prefix: mprefix, PrefetchValues: true})
		defer it.Close()
		if q.After != nil {
			it.Seek(append(bytes.Clone(mprefix), q.After...))
			if it.Valid() && bytes.Equal(it.Item().Key()[len(mprefix):], q.After) {
				it.Next()
			}
		} else {
			it.Rewind()
		}
		for n := 0; it.Valid(); it.Next() {
			if q.Count > 0 && n >= q.Count {
				r.Next = bytes.Clone(r.Elems[len(r.Elems)-1].Field)
				return nil
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if !keep(it.Item().KeyCopy(nil)[len(mprefix):], elemPayload(v)) {
				return ErrReadLimit
			}
			n++
		}
	}
	return nil
}

func (sm *StateMachine) readElems(txn *badger.Txn, key []byte, q ElemQuery, nowMs int64, reserve func(int) bool) (r ElemsReply, code Code, err error) {
	err = func() error {
		var s int
		if s, code = sm.route(key); code != OK {
			return nil
		}
		r.Entry = ValueEntry{NowMs: nowMs}
		v, err := raftgroup.GetValue(txn, dataKey(s, key))
		if err != nil || v == nil {
			return err
		}
		rec, err := decodeRecord(v)
		if err != nil || !rec.live(nowMs) {
			return err
		}
		r.Entry = ValueEntry{Found: true, Type: rec.Type, ExpireAtMs: rec.ExpireAtMs, NowMs: nowMs}
		if rec.Type != q.Type || !rec.Type.collection() {
			return nil
		}
		m, err := decodeCollMeta(rec.Value)
		if err != nil {
			return err
		}
		r.Len = m.Size
		prefix := elemPrefix(s, key, m.Version)
		if rec.Type == TypeZSet {
			return sm.readZSet(txn, prefix, m, q, &r, reserve)
		}
		keep := func(e Elem) bool {
			if reserve != nil && !reserve(len(e.Field)+len(e.Value)) {
				return false
			}
			r.Elems = append(r.Elems, e)
			return true
		}
		for _, f := range q.Fields {
			ev, err := raftgroup.GetValue(txn, append(prefix[:len(prefix):len(prefix)], f...))
			if err != nil {
				return err
			}
			if !keep(Elem{Field: f, Value: elemPayload(ev), Found: ev != nil}) {
				return ErrReadLimit
			}
		}
		if q.Range {
			start, stop, n := q.Start, q.Stop, m.Size
			if start < 0 {
				start = max(start+n, 0)
			}
			if stop < 0 {
				stop += n
			}
			stop = min(stop, n-1)
			if start > stop {
				return nil
			}
			q.All, q.After, q.Count = true, posKey(m.Head+start-1), int(stop-start+1)
			if start == 0 && m.Head == minListPos {
				q.After = nil
			}
		}
		if !q.All {
			return nil
		}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true})
		defer it.Close()
		if q.After != nil {
			it.Seek(append(bytes.Clone(prefix), q.After...))
			if it.Valid() && bytes.Equal(it.Item().Key()[len(prefix):], q.After) {
				it.Next()
			}
		} else {
			it.Rewind()
		}
		n := 0
		for ; it.Valid(); it.Next() {
			if q.Count > 0 && n >= q.Count {
				r.Next = bytes.Clone(r.Elems[len(r.Elems)-1].Field)
				return nil
			}
			ev, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if !keep(Elem{Field: it.Item().KeyCopy(nil)[len(prefix):], Value: elemPayload(ev), Found: true}) {
				return ErrReadLimit
			}
			n++
		}
		return nil
	}()
	return r, code, err
}
