package shardkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Collections (docs/types.md): a hash's record holds its metadata, a
// version and a size; each element is a record of its own under the
// version, so that DEL, overwrite and expiry of a collection of any size
// cost one record write, and a dead version's elements are deleted later,
// in bounded entries (collect.go).

// ValueType is the type of a key's value.
type ValueType uint8

const (
	TypeString ValueType = iota
	TypeHash
	TypeList
	TypeSet
	TypeZSet
)

// String is the type's name as Redis's TYPE gives it.
func (t ValueType) String() string {
	switch t {
	case TypeString:
		return "string"
	case TypeHash:
		return "hash"
	case TypeList:
		return "list"
	case TypeSet:
		return "set"
	case TypeZSet:
		return "zset"
	}
	return "unknown"
}

// collection reports whether values of the type have elements.
func (t ValueType) collection() bool { return t != TypeString }

// collMeta is a collection record's value: the version its elements carry,
// how many there are, and a list's head (the position of its first
// element; element i is at Head+i).
//
// For a sorted set, Head and Tail bound its score index instead: no entry
// sorts below Head's 8 bytes (scoreBytes), none above Tail's complement;
// 0 is no bound. For a set, Low bounds its members: each one's first
// maxSetLow bytes sort at or after it. Pops raise them, anything that adds
// an element beyond them widens them. They spare a pop the stepping over
// what earlier pops deleted: badger keeps a deleted key's tombstone until
// a compaction, and an iterator steps over each, so without them the n-th
// pop from one end cost O(n).
type collMeta struct {
	Version uint64
	Size    int64
	Head    int64
	Tail    uint64 // encoded, with Low, only when either is set
	Low     string
}

// maxSetLow is the most of a member a set's Low keeps.
const maxSetLow = 64

// collMetaLen is a record's largest encoding (budget estimates);
// collMetaMinLen its shortest (no Tail or Low).
const (
	collMetaLen    = 32 + maxSetLow
	collMetaMinLen = 24
)

func (m collMeta) encode() []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, collMetaMinLen+8+len(m.Low)), m.Version)
	b = binary.BigEndian.AppendUint64(b, uint64(m.Size))
	b = binary.BigEndian.AppendUint64(b, uint64(m.Head))
	if m.Tail != 0 || m.Low != "" {
		b = binary.BigEndian.AppendUint64(b, m.Tail)
		b = append(b, m.Low...)
	}
	return b
}

var errBadMeta = errors.New("bad collection metadata")

func decodeCollMeta(b []byte) (collMeta, error) {
	if len(b) != collMetaMinLen && (len(b) < collMetaMinLen+8 || len(b) > collMetaLen) {
		return collMeta{}, errBadMeta
	}
	m := collMeta{Version: binary.BigEndian.Uint64(b), Size: int64(binary.BigEndian.Uint64(b[8:])),
		Head: int64(binary.BigEndian.Uint64(b[16:]))}
	if len(b) > collMetaMinLen {
		m.Tail = binary.BigEndian.Uint64(b[24:])
		m.Low = string(b[32:])
	}
	return m, nil
}

// scoreLow and scoreHigh are a sorted set's bounds on its index entries'
// scores (scoreBytes as a number; see collMeta).
func (m collMeta) scoreLow() uint64  { return uint64(m.Head) }
func (m collMeta) scoreHigh() uint64 { return ^m.Tail }

// widenScores makes the bounds cover an index entry of score bits b.
func (m *collMeta) widenScores(b uint64) {
	if b < m.scoreLow() {
		m.Head = int64(b)
	}
	if b > m.scoreHigh() {
		m.Tail = ^b
	}
}

// versionOf is the version of a collection record (0: none, or not a live
// collection record).
func versionOf(r *record) uint64 {
	if r == nil || r.Tombstone || !r.Type.collection() {
		return 0
	}
	m, err := decodeCollMeta(r.Value)
	if err != nil {
		return 0
	}
	return m.Version
}

// elemOverhead is how much longer than a key and a field together the
// longest stored form of an element is: its change index entry, 'd'
// shard:2 'w' index:6 'e' keylen:2 and version:8, against a value record's
// longest form (longestKeyPrefix). A key and field fit when their sum is
// at most MaxKeyBytesLimit - elemOverhead.
const elemOverhead = 1 + 2 + 1 + 6 + 1 + 2 + 8 - longestKeyPrefix

// elemPrefix is where the elements of key's version start.
func elemPrefix(s int, key []byte, version uint64) []byte {
	k := append(append(shardPrefix(s), tagElem), byte(len(key)>>8), byte(len(key)))
	k = append(k, key...)
	return binary.BigEndian.AppendUint64(k, version)
}

func elemKey(s int, key []byte, version uint64, field []byte) []byte {
	return append(elemPrefix(s, key, version), field...)
}

// elemOf splits an element's raw key into the collection's key, version
// and field; ok is false for a key that is not one.
func elemOf(raw []byte) (key []byte, version uint64, field []byte, ok bool) {
	if len(raw) < 6 || raw[3] != tagElem {
		return nil, 0, nil, false
	}
	n := int(binary.BigEndian.Uint16(raw[4:]))
	if len(raw) < 6+n+8 {
		return nil, 0, nil, false
	}
	return raw[6 : 6+n], binary.BigEndian.Uint64(raw[6+n:]), raw[6+n+8:], true
}

// An element's stored value is a zero byte and the element's value, never
// empty (an empty record means "absent" to the readers and the rounds of
// changes).
func elemValue(v []byte) []byte { return append([]byte{0}, v...) }

func elemPayload(stored []byte) []byte {
	if len(stored) == 0 {
		return nil
	}
	return stored[1:]
}

// deadKey marks a collection version as dead: its elements are deleted by
// later maintenance entries (collect.go), oldest version first.
func deadKey(s int, version uint64, key []byte) []byte {
	k := make([]byte, 0, 1+2+8+2+len(key))
	k = append(k, 'c', byte(s>>8), byte(s))
	k = binary.BigEndian.AppendUint64(k, version)
	k = append(k, byte(len(key)>>8), byte(len(key)))
	return append(k, key...)
}

// deadOf splits a dead-version mark into its shard, version and key.
func deadOf(k []byte) (s int, version uint64, key []byte, ok bool) {
	if len(k) < 13 || k[0] != 'c' {
		return 0, 0, nil, false
	}
	n := int(binary.BigEndian.Uint16(k[11:]))
	if len(k) != 13+n {
		return 0, 0, nil, false
	}
	return int(binary.BigEndian.Uint16(k[1:])), binary.BigEndian.Uint64(k[3:]), k[13:], true
}

// newVersion picks the version of a collection the current entry creates
// under key: in the entry's own space (its index times 2^16), so that no
// two entries of this log ever pick the same one, and one neither the
// record replaced (old) holds nor any dead version of key still being
// collected (a copy received from another group carries that group's
// versions).
func (a *applyCtx) newVersion(s int, key []byte, old *record) (uint64, error) {
	oldV := versionOf(old)
	for v := a.index << 16; ; v++ {
		if v == oldV {
			continue
		}
		d, err := a.value(deadKey(s, v, key))
		if err != nil {
			return 0, err
		}
		if d == nil {
			return v, nil
		}
	}
}

// retire marks the collection version old holds as dead when next (the
// record replacing it) does not carry it on: a DEL, an overwrite, an
// expiry, a received record. O(1) whatever the collection's size.
func (a *applyCtx) retire(s int, key []byte, old, next *record) error {
	v := versionOf(old)
	if v == 0 || versionOf(next) == v {
		return nil
	}
	a.sm.deadPending.Store(true)
	return a.set(deadKey(s, v, key), []byte{0})
}

// setShardRecord writes a record of shard s (raw key) and, while a move
// of the shard out is planned, its change index entry.
func (a *applyCtx) setShardRecord(s int, raw, v []byte) error {
	if err := a.set(raw, v); err != nil {
		return err
	}
	return a.track(s, raw)
}

// delShardRecord deletes a record of shard s (raw key), as setShardRecord.
func (a *applyCtx) delShardRecord(s int, raw []byte) error {
	if err := a.del(raw); err != nil {
		return err
	}
	return a.track(s, raw)
}

func (a *applyCtx) track(s int, raw []byte) error {
	if !a.meta(s).tracking() {
		return nil
	}
	return a.set(changeKey(s, a.index, raw), nil)
}

// maxCopyElems bounds the elements RENAME and COPY of a collection copy
// in one entry (elements are stored under their key's name): a larger
// collection is refused (COMMAND_TOO_LARGE), as the entry's write budget
// would refuse it anyway.
const maxCopyElems = EntryMaxRecords / 2

// copyElems copies the elements of src's collection (key) to a new
// version under dst, which next will hold (its metadata is set here); old
// is dst's record before. A refusal is the error code.
func (a *applyCtx) copyElems(s int, key []byte, src *record, dst []byte, old, next *record) (string, error) {
	m, err := decodeCollMeta(src.Value)
	if err != nil {
		return shardkvpb.OpErrBadRecord, nil
	}
	elems, err := a.scanElems(elemPrefix(s, key, m.Version), nil, maxCopyElems+1)
	if err != nil {
		return "", err
	}
	if len(elems) > maxCopyElems {
		return shardkvpb.OpErrCommandTooLarge, nil
	}
	v, err := a.newVersion(s, dst, old)
	if err != nil {
		return "", err
	}
	n := len(elemPrefix(s, key, m.Version))
	for _, e := range elems {
		f := e.k[n:]
		if len(dst)+len(f) > MaxKeyBytesLimit-elemOverhead {
			return shardkvpb.OpErrKeyTooLarge, nil
		}
		if err := a.setShardRecord(s, elemKey(s, dst, v, f), e.v); err != nil {
			return "", err
		}
	}
	// Elements are copied as they are (a list's positions, a sorted set's
	// two records per member): the size and bounds stay the source's.
	next.Value = collMeta{Version: v, Size: m.Size, Head: m.Head, Tail: m.Tail, Low: m.Low}.encode()
	return "", nil
}

type rawKV struct{ k, v []byte }

// scanElems returns up to limit records under prefix in key order, from
// key from on (nil: the first), as the current entry sees them: storage
// overlaid with the entry's own buffered writes.
func (a *applyCtx) scanElems(prefix, from []byte, limit int) ([]rawKV, error) {
	return a.scanPrefix(prefix, from, limit, false)
}

// scanElemsRev returns the last (up to limit) records under prefix in
// descending key order, as the current entry sees them.
func (a *applyCtx) scanElemsRev(prefix []byte, limit int) ([]rawKV, error) {
	return a.scanPrefix(prefix, nil, limit, true)
}

// scanElemsRevBelow is scanElemsRev of the records before to.
func (a *applyCtx) scanElemsRevBelow(prefix, to []byte, limit int) ([]rawKV, error) {
	return a.scanPrefix(prefix, to, limit, true)
}

// scanPrefix is scanElems, or scanElemsRev when reverse (from, if set, is
// then an exclusive upper bound): storage read up to limit plus the entry's buffered writes (any
// of which may hide a stored record), then the buffer overlaid.
func (a *applyCtx) scanPrefix(prefix, from []byte, limit int, reverse bool) ([]rawKV, error) {
	var out []rawKV
	extra := 0
	if a.buf != nil {
		extra = len(a.buf.order)
	}
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, Reverse: reverse})
	switch {
	case reverse && from != nil:
		// Seek lands on the last key at or before from; from itself is
		// excluded below.
		it.Seek(from)
	case reverse:
		it.Seek(append(bytes.Clone(prefix), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	case from == nil:
		it.Rewind()
	default:
		it.Seek(from)
	}
	for ; it.ValidForPrefix(prefix) && len(out) < limit+extra; it.Next() {
		if reverse && from != nil && bytes.Equal(it.Item().Key(), from) {
			continue
		}
		v, err := it.Item().ValueCopy(nil)
		if err != nil {
			it.Close()
			return nil, err
		}
		out = append(out, rawKV{it.Item().KeyCopy(nil), v})
	}
	it.Close()
	if a.buf != nil {
		m := map[string]int{}
		for i, e := range out {
			m[string(e.k)] = i
		}
		for _, k := range a.buf.order {
			if !bytes.HasPrefix([]byte(k), prefix) || (from != nil && !reverse && k < string(from)) || (from != nil && reverse && k >= string(from)) {
				continue
			}
			w := a.buf.m[k]
			if i, ok := m[k]; ok {
				out[i].v = w.v
				if w.del {
					out[i].v = nil
				}
			} else if !w.del {
				out = append(out, rawKV{[]byte(k), w.v})
			}
		}
		out = slices.DeleteFunc(out, func(e rawKV) bool { return e.v == nil })
		slices.SortFunc(out, func(x, y rawKV) int {
			if reverse {
				return bytes.Compare(y.k, x.k)
			}
			return bytes.Compare(x.k, y.k)
		})
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
