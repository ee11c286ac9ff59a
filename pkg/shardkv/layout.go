package shardkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Storage layout (all keys outside the engine's 0x00 prefix):
//
//	m/applied, m/config, m/prev, m/logtime     group metadata
//	m/tombcursor                               tombstone sweep position (a t key)
//	s<shard:2>                                 per-shard state (ShardMeta)
//	d<shard:2>e<keylen:2><key><version:8><sub> a collection's element
//	d<shard:2>k<user key>                      a value record
//	d<shard:2>s<client:8>                      a client session (dedup)
//	d<shard:2>w<index:6><tag><rest>            change index: d<shard:2><tag><rest>
//	                                           written at index (only while a
//	                                           move out is planned)
//	c<shard:2><version:8><keylen:2><key>       a dead collection version whose
//	                                           elements are still to delete
//	e<lastNS:8><shard:2><client:8>             session expiry index
//	t<shard:2><user key>                       tombstone index
//	x<expireAtMs:8><shard:2><user key>         key expiry index
//
// Everything of one shard that moves with it (values, tombstones, sessions)
// is one contiguous key range, d<shard>: moving, counting and deleting a
// shard are range operations. The three indexes are rebuilt from it.
//
// m/tombcursor is new: a store without it sweeps from the start. Records
// imported before insertChunk stamped them keep their source's index; the
// sweep stamps a tombstone whose index is above the local one (expiry.go).
var (
	keyApplied    = []byte("m/applied")
	keyConfig     = []byte("m/config")
	keyPrev       = []byte("m/prev")
	keyLogTime    = []byte("m/logtime")
	keyTombCursor = []byte("m/tombcursor")
	metaPrefix    = []byte("m/")
)

const (
	tagElem    = 'e'
	tagData    = 'k'
	tagSession = 's'
	// tagChange sorts after the records and sessions, so a snapshot of a
	// shard's records and its sessions never meets it.
	tagChange = 'w'
)

func shardPrefix(s int) []byte { return []byte{'d', byte(s >> 8), byte(s)} }

func dataKey(s int, key []byte) []byte {
	return append(append(shardPrefix(s), tagData), key...)
}

func sessionKey(s int, client uint64) []byte {
	return binary.BigEndian.AppendUint64(append(shardPrefix(s), tagSession), client)
}

// changeKey is the change index entry of the shard record raw
// (d<s><tag><rest>: a value record or an element), written at index: a
// shard whose move out is planned records every write in it, so that each
// pre-copy round reads only what changed since the last (changes.go). The
// index takes 6 bytes (2^48 entries), so the entry of a value record is no
// longer than the key's expiry index entry, which MaxKeyBytesLimit is set
// by; an element's is elemOverhead longer than its key and field.
func changeKey(s int, index uint64, raw []byte) []byte {
	return append(changePos(s, index), raw[3:]...)
}

// changePos is where the change index entries written at index start.
func changePos(s int, index uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], index)
	return append(append(shardPrefix(s), tagChange), b[2:]...)
}

// changeIndex is the index of a change index entry (raw key).
func changeIndex(k []byte) uint64 {
	var b [8]byte
	copy(b[2:], k[4:changePrefixLen])
	return binary.BigEndian.Uint64(b[:])
}

// changedRecord is the shard record a change index entry names.
func changedRecord(s int, k []byte) []byte {
	return append(shardPrefix(s), k[changePrefixLen:]...)
}

const changePrefixLen = 10

func shardMetaKey(s int) []byte { return []byte{'s', byte(s >> 8), byte(s)} }

// expiryKeyLen is the length of every expiryKey.
const expiryKeyLen = 1 + 8 + 2 + 8

func expiryKey(lastNS int64, s int, client uint64) []byte {
	k := binary.BigEndian.AppendUint64([]byte{'e'}, uint64(lastNS))
	k = append(k, byte(s>>8), byte(s))
	return binary.BigEndian.AppendUint64(k, client)
}

func tombstoneKey(s int, key []byte) []byte {
	return append([]byte{'t', byte(s >> 8), byte(s)}, key...)
}

// record is a stored value: the index, in this group's log, of the entry
// that wrote it here (a write, or the insert of a pulled shard: never the
// source group's index), so that a later pre-copy migration can ask for
// "changes since index i" and tombstones age by this log; an optional
// absolute expiry, and a tombstone flag for deletes.
//
//	flags:1 index:8 expireAtMs:8 value
//
// flags: bit 0 tombstone, bits 1-3 the value's type. A collection's value
// is its metadata (collMeta); its elements are records of their own
// (elemKey).
type record struct {
	Tombstone  bool
	Type       ValueType
	Index      uint64
	ExpireAtMs int64
	Value      []byte
	// framed, when set, is a buffer this record owns: recordHeader bytes
	// and then Value, in place. encode fills the header and returns it
	// rather than copying Value: APPEND builds its result so, since a
	// value that grows by every APPEND was copied twice per APPEND.
	framed []byte
}

const recordHeader = 17

func (r record) encode() []byte {
	b := r.framed
	if len(b) != recordHeader+len(r.Value) || len(r.Value) > 0 && &b[recordHeader] != &r.Value[0] {
		b = make([]byte, recordHeader, recordHeader+len(r.Value))
		b = append(b, r.Value...)
	}
	b[0] = byte(r.Type&7) << 1
	if r.Tombstone {
		b[0] |= 1
	}
	binary.BigEndian.PutUint64(b[1:], r.Index)
	binary.BigEndian.PutUint64(b[9:], uint64(r.ExpireAtMs))
	return b
}

func decodeRecord(b []byte) (record, error) {
	if len(b) < recordHeader {
		return record{}, errors.New("short value record")
	}
	return record{
		Tombstone:  b[0]&1 != 0,
		Type:       ValueType(b[0]>>1) & 7,
		Index:      binary.BigEndian.Uint64(b[1:]),
		ExpireAtMs: int64(binary.BigEndian.Uint64(b[9:])),
		Value:      b[recordHeader:],
	}, nil
}

// stampIndex returns a copy of an encoded record with its index replaced;
// everything else is kept byte for byte. b must be a decodable record.
func stampIndex(b []byte, index uint64) []byte {
	out := slices.Clone(b)
	binary.BigEndian.PutUint64(out[1:], index)
	return out
}

// live reports whether the record is a value visible at time nowMs.
func (r record) live(nowMs int64) bool {
	return !r.Tombstone && (r.ExpireAtMs == 0 || r.ExpireAtMs > nowMs)
}

// ShardState is the replicated state of one shard in this group.
type ShardState string

const (
	// NotOwned: the group neither serves nor holds the shard.
	NotOwned ShardState = ""
	// Serving: owned and served.
	Serving ShardState = "Serving"
	// Pulling: owned in the current config, data still arriving from the
	// previous owner; not served (clients get NOT_READY).
	Pulling ShardState = "Pulling"
	// Acking: installed and served; the old owner has not yet confirmed it
	// will drop its copy, so the group keeps telling it.
	Acking ShardState = "Acking"
	// BePulling: the previous config's owner keeps the frozen data for the
	// new owner; not served (WRONG_GROUP).
	BePulling ShardState = "BePulling"
	// GCing: the new owner has installed the shard; the old copy is being
	// deleted in bounded chunks through the log. Also a discarded pre-copy.
	GCing ShardState = "GCing"
	// PreCopying: a planned move brings the shard here; the source still
	// owns and serves it while this group copies it (never served here).
	PreCopying ShardState = "PreCopying"
)

// ShardMeta is the persisted state of one shard.
type ShardMeta struct {
	State  ShardState `json:"state,omitempty"`
	Config uint64     `json:"config,omitempty"` // the config that put it in this state
	Peer   uint64     `json:"peer,omitempty"`   // source while Pulling/Acking, target while BePulling/GCing
	// Progress: while Pulling, resume the pull after this raw key; while
	// GCing, the last raw key deleted.
	Resume  []byte `json:"resume,omitempty"`
	Resumed bool   `json:"resumed,omitempty"`
	Keys    uint64 `json:"keys,omitempty"`
	Bytes   uint64 `json:"bytes,omitempty"`
	Total   uint64 `json:"total,omitempty"` // keys the source reported, once known

	// A copy (PreCopying, Pulling): after its snapshot (Delta), it applies
	// the source's changes from Cursor on (a change index position); the
	// snapshot was read at the source's SourceIndex. CaughtUp: the last
	// round reached the source's end; Lag: log entries it was behind.
	Delta       bool   `json:"delta,omitempty"`
	Cursor      []byte `json:"cursor,omitempty"`
	SourceIndex uint64 `json:"sourceIndex,omitempty"`
	CaughtUp    bool   `json:"caughtUp,omitempty"`
	Lag         uint64 `json:"lag,omitempty"`
	TotalBytes  uint64 `json:"totalBytes,omitempty"`
	// SessionsAt: the copy holds the source's sessions as of this source
	// log time (a round's sessions_at), so later rounds send only those
	// written since.
	SessionsAt int64 `json:"sessionsAt,omitempty"`

	// The source of a planned move (Serving, Peer the target; BePulling
	// keeps it): writes are recorded in the change index since TrackFrom.
	TrackFrom uint64 `json:"trackFrom,omitempty"`
	// A cancelled move's change index entries below this index are being
	// deleted (Serving).
	TrimBelow uint64 `json:"trimBelow,omitempty"`
	// BePulling: the log time at which the shard froze (the write barrier).
	FrozeAtNs int64 `json:"frozeAtNs,omitempty"`
	// Serving, Acking: the write pause of the move that brought the shard
	// here, from the source's barrier to this group serving it.
	PauseUs uint64 `json:"pauseUs,omitempty"`
}

// copying reports whether the shard is being copied in (pre-copy or pull).
func (m ShardMeta) copying() bool { return m.State == PreCopying || m.State == Pulling }

// tracking reports whether writes to the shard go to the change index.
func (m ShardMeta) tracking() bool {
	return m.TrackFrom != 0 && (m.State == Serving || m.State == BePulling)
}

func (m ShardMeta) String() string {
	if m.State == NotOwned {
		return "NotOwned"
	}
	return fmt.Sprintf("%s(config %d, peer %d)", m.State, m.Config, m.Peer)
}
