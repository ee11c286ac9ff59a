package shardkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// ChunkLimit bounds the encoded records of one FetchShard chunk, so that a
// chunk of small records is a modest log entry. A record larger than this
// goes alone in its chunk; it still fits one entry, because the entry limit
// exceeds the value limit (EntryBytesFor), and the puller splits whatever it
// receives into entries that fit (installPieces).
const ChunkLimit = 256 << 10

// kvBytes is the encoded size of kv as one element of a repeated field
// numbered below 16 (ShardChunk.kvs, InsertChunk.kvs): tag, length, body.
func kvBytes(kv *shardkvpb.KeyValue) int {
	n := proto.Size(kv)
	return 1 + protowire.SizeVarint(uint64(n)) + n
}

// installPieces splits the records of one received chunk into install
// entries of at most ChunkLimit encoded records each, whatever the source
// sent, and within maxCommand bytes with their framing (the resume key after
// which each applies: the previous piece's last key). Small pieces keep one
// entry's badger transaction far below its limit (values under badger's
// value threshold count in full). A record larger than a piece goes alone;
// one above maxCommand is then refused as too large (EntryBytesFor keeps
// that from happening for records within the value limit).
func installPieces(kvs []*shardkvpb.KeyValue, after []byte, maxCommand int) [][]*shardkvpb.KeyValue {
	if len(kvs) == 0 {
		return [][]*shardkvpb.KeyValue{nil}
	}
	var out [][]*shardkvpb.KeyValue
	start, size := 0, 0
	// Framing outside the records: shard, config, flags, total (at most
	// ~40 bytes), the resume key, and the two enclosing lengths.
	frame := func() int { return 64 + len(after) + 2*binary.MaxVarintLen64 }
	for i, kv := range kvs {
		n := kvBytes(kv)
		if i > start && (size+n > ChunkLimit || frame()+size+n > maxCommand) {
			out = append(out, kvs[start:i])
			after, start, size = kvs[i-1].Key, i, 0
		}
		size += n
	}
	return append(out, kvs[start:])
}

// DeleteChunkKeys bounds how many keys one GC entry deletes, so deleting a
// large shard never stalls the group's other writes.
const DeleteChunkKeys = 1000

// StreamShard sends shard s's value records (values and tombstones) and
// the elements of its live collections (not the sessions, which come with
// the last round of changes), after the given
// raw key if resume is set, in chunks of at most ChunkLimit encoded bytes
// (or one larger record), all read from one view of the state: every chunk
// names that view's applied index (source_index), from which the copy's
// rounds of changes start (StreamChanges).
func (sm *StateMachine) StreamShard(s int, after []byte, resume bool, send func(*shardkvpb.ShardChunk) error) error {
	prefix := shardPrefix(s)
	txn := sm.store.DB().NewTransaction(false)
	defer txn.Discard()
	live := liveVersions{txn: txn, s: s}
	// Count first (keys and sizes only) so the receiver can show progress;
	// only for a stream from the start: a resumed one (the copy keeps the
	// first count) does not scan the whole shard again.
	var total, totalBytes uint64
	if !resume {
		kit := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		for kit.Rewind(); kit.Valid() && snapshotted(kit.Item().Key()); kit.Next() {
			if kit.Item().Key()[3] == tagData {
				total++
			}
			totalBytes += uint64(len(kit.Item().Key())) + uint64(kit.Item().ValueSize())
		}
		kit.Close()
	}
	view, err := chunkView(txn)
	if err != nil {
		return err
	}
	newChunk := func() *shardkvpb.ShardChunk {
		return &shardkvpb.ShardChunk{TotalKeys: total, TotalBytes: totalBytes, LogTimeNs: view.LogTimeNs, SourceIndex: view.SourceIndex}
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	chunk := newChunk()
	size := 0
	startAfter(it, after, resume)
	for ; it.ValidForPrefix(prefix) && snapshotted(it.Item().Key()); it.Next() {
		k := it.Item().KeyCopy(nil)
		if ok, err := live.holds(k); err != nil {
			return err
		} else if !ok {
			continue // a dead version's element: collected here
		}
		v, err := it.Item().ValueCopy(nil)
		if err != nil {
			return err
		}
		kv := &shardkvpb.KeyValue{Key: k, Record: v}
		n := kvBytes(kv)
		if size > 0 && size+n > ChunkLimit {
			if err := send(chunk); err != nil {
				return err
			}
			chunk, size = newChunk(), 0
		}
		chunk.Kvs = append(chunk.Kvs, kv)
		size += n
	}
	chunk.Last = true
	return send(chunk)
}

// snapshotted reports whether a shard's record (raw key) is part of its
// snapshot: elements and value records, which sort before the sessions
// (they come with the last round of changes) and the change index.
func snapshotted(raw []byte) bool { return len(raw) > 3 && raw[3] < tagSession }

// insertChunk installs one chunk of a shard being pulled. Duplicates, stale
// chunks and chunks for another config are ignored, so the puller may retry
// freely.
//
// One install entry writes at most what one write command may (EntryMaxBytes,
// EntryMaxRecords), its records with their index entries: the puller's
// pieces (installPieces: ChunkLimit of records, or one larger record) always
// fit, but a larger entry would pass badger's transaction limit and stop
// every replica. Apply installs the records that fit (at least one), moves
// the resume point after them and returns errChunkCut: the puller pulls
// again from there, since its next piece would follow the records cut off,
// and is refused (errStaleChunk).
func (a *applyCtx) insertChunk(c *shardkvpb.InsertChunk) (any, error) {
	s := int(c.Shard)
	m := a.meta(s)
	want := Pulling
	if c.Precopy {
		want = PreCopying
	}
	if m.State != want || m.Config != c.ConfigNum {
		return errStaleChunk, nil
	}
	if c.Delta {
		return a.applyDelta(s, m, c)
	}
	if m.Delta || m.Resumed != c.Resume || !bytes.Equal(m.Resume, c.AfterKey) {
		return errStaleChunk, nil
	}
	// Checked before anything is written: a refused chunk leaves nothing.
	for _, kv := range c.Kvs {
		if err := checkMoved(s, kv); err != nil {
			return err, nil
		}
	}
	n, size := 0, budget{records: 1, bytes: recordCost(len(shardMetaKey(s)), metaMaxBytes)}
	for _, kv := range c.Kvs {
		next := size
		next.add(len(kv.Key), len(kv.Record))
		next.add(len(kv.Key)+indexKeyExtra, 0) // its index entry, at most
		if n > 0 && !next.fits() {
			break
		}
		n, size = n+1, next
	}
	if err := a.room(size); err != nil {
		return nil, err
	}
	// Time travels with the shard: the source judged these records at its
	// log clock, so ours moves up to it, never back. A key the source saw
	// expired stays expired here, and a TTL never ends earlier than there.
	a.nowNS = max(a.nowNS, c.LogTimeNs)
	for _, kv := range c.Kvs[:n] {
		if err := a.putReceived(s, kv.Key, kv.Record); err != nil {
			return nil, err
		}
		a.countMoved(&m, kv)
	}
	// The rounds of changes start after the oldest view a piece was read
	// from: a resumed snapshot may come from another replica of the source,
	// behind the first.
	if c.SourceIndex != 0 && (m.SourceIndex == 0 || c.SourceIndex < m.SourceIndex) {
		m.SourceIndex = c.SourceIndex
	}
	if n > 0 {
		m.Resume, m.Resumed = c.Kvs[n-1].Key, true
	}
	if c.TotalKeys > 0 {
		m.Total, m.TotalBytes = c.TotalKeys, c.TotalBytes
	}
	if n < len(c.Kvs) {
		return errChunkCut, a.setMeta(s, m)
	}
	if c.Last {
		// The snapshot is in: from now on, rounds of changes since it.
		m.Delta, m.Cursor, m.Resume, m.Resumed = true, changePos(s, m.SourceIndex+1), nil, false
	}
	return nil, a.setMeta(s, m)
}

// putReceived stores a received record (raw key, encoded value) and its
// index entry. The source's index means nothing in this log: a value
// record is stamped with this entry's, from which the tombstone purge ages
// it.
func (a *applyCtx) putReceived(s int, raw, val []byte) error {
	if raw[3] == tagData {
		if _, err := decodeRecord(val); err == nil {
			val = stampIndex(val, a.index)
		}
	}
	if err := a.set(raw, val); err != nil {
		return fmt.Errorf("install %d-byte key: %w", len(raw), err)
	}
	if ik := indexKey(s, raw, val); ik != nil {
		if err := a.set(ik, nil); err != nil {
			return fmt.Errorf("index %d-byte key: %w", len(raw), err)
		}
	}
	return nil
}

// countMoved adds a received record to the shard's progress and the
// process's counters.
func (a *applyCtx) countMoved(m *ShardMeta, kv *shardkvpb.KeyValue) {
	if kv.Key[3] == tagData {
		m.Keys++
		a.sm.MigratedKeys.Add(1)
	}
	m.Bytes += uint64(len(kv.Key) + len(kv.Record))
	a.sm.MigratedBytes.Add(uint64(len(kv.Key) + len(kv.Record)))
}

var (
	errStaleChunk = errors.New("stale or duplicate chunk")
	errChunkCut   = errors.New("install entry cut at the write budget: pull again from the shard's resume point")
)

// checkMoved refuses a received record this group could not store with its
// index entry: outside shard s, or past badger's key or value limits. A
// source stores none of these (its badger has the same limits).
func checkMoved(s int, kv *shardkvpb.KeyValue) error {
	prefix := shardPrefix(s)
	switch {
	case !bytes.HasPrefix(kv.Key, prefix) || len(kv.Key) <= len(prefix):
		return fmt.Errorf("chunk key outside shard %d", s)
	case len(kv.Key) > badgerMaxKey:
		return fmt.Errorf("chunk key of %d bytes in shard %d exceeds the limit of %d", len(kv.Key), s, badgerMaxKey)
	case len(kv.Record) > MaxValueBytesLimit+2*recordHeader:
		return fmt.Errorf("chunk record of %d bytes in shard %d exceeds the limit of %d", len(kv.Record), s, MaxValueBytesLimit+2*recordHeader)
	}
	if ik := indexKey(s, kv.Key, kv.Record); len(ik) > badgerMaxKey {
		return fmt.Errorf("chunk key of %d bytes in shard %d: its index entry exceeds the key limit of %d", len(kv.Key), s, badgerMaxKey)
	}
	return nil
}

// indexKeyExtra is how much longer an index entry's key may be than its
// record's: 'x' expireAt:8 shard:2 key against 'd' shard:2 'k' key, and
// 'e' lastNS:8 shard:2 client:8 against 'd' shard:2 's' client:8.
const indexKeyExtra = longestKeyPrefix - 4

// indexKey is the index entry of a shard record (raw key and value): the
// session expiry entry, the tombstone entry or the key expiry entry; nil if
// it has none, or does not decode (kept as it is, without one, as at the
// source: every write to it gets BAD_RECORD).
func indexKey(s int, raw, val []byte) []byte {
	tag, rest := raw[3], raw[4:]
	switch tag {
	case tagSession:
		sess, err := decodeSession(val)
		if err != nil || len(rest) != 8 {
			return nil
		}
		return expiryKey(sess.LastNS, s, binary.BigEndian.Uint64(rest))
	case tagData:
		r, err := decodeRecord(val)
		switch {
		case err != nil:
		case r.Tombstone:
			return tombstoneKey(s, rest)
		case r.ExpireAtMs != 0:
			return expiresKey(r.ExpireAtMs, s, rest)
		}
	}
	return nil
}

func (a *applyCtx) acked(r *shardkvpb.ShardRef) (any, error) {
	s := int(r.Shard)
	m := a.meta(s)
	if m.State != Acking || m.Config != r.ConfigNum {
		return nil, nil
	}
	return nil, a.setMeta(s, ShardMeta{State: Serving, Config: m.Config, PauseUs: m.PauseUs})
}

// startGC: the new owner has the shard; delete the old copy.
func (a *applyCtx) startGC(r *shardkvpb.ShardRef) (any, error) {
	s := int(r.Shard)
	m := a.meta(s)
	if m.State != BePulling || m.Config != r.ConfigNum {
		return nil, nil
	}
	return nil, a.setMeta(s, ShardMeta{State: GCing, Config: m.Config, Peer: m.Peer})
}

// deleteChunk deletes up to DeleteChunkKeys keys of a GCing shard, or
// maintBytes of deletes with their index entries (long keys), in key order
// (the same keys on every replica); the last chunk ends the GC.
func (a *applyCtx) deleteChunk(r *shardkvpb.ShardRef) (any, error) {
	s := int(r.Shard)
	m := a.meta(s)
	if m.State != GCing || m.Config != r.ConfigNum {
		return nil, nil
	}
	if err := a.room(budget{maintMaxRecords, maintMaxBytes}); err != nil {
		return nil, err
	}
	prefix := shardPrefix(s)
	type doomed struct{ key, index []byte }
	var dels []doomed
	cost := 0
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
	// Start after the previous chunk (its last key is deleted, so not seen
	// again), never from the shard's start.
	startAfter(it, m.Resume, m.Resumed)
	for ; it.Valid() && len(dels) < DeleteChunkKeys; it.Next() {
		item := it.Item()
		// The key's delete and its index entry's, at most this long.
		c := recordCost(len(item.Key()), 0) + recordCost(len(item.Key())+indexKeyExtra, 0)
		if len(dels) > 0 && cost+c > maintBytes {
			break
		}
		cost += c
		d := doomed{key: item.KeyCopy(nil)}
		if t := d.key[3]; t == tagSession || t == tagData {
			// Only the index entry is kept, not the value (up to 32 MiB).
			if err := item.Value(func(v []byte) error {
				d.index = indexKey(s, d.key, v)
				return nil
			}); err != nil {
				it.Close()
				return nil, fmt.Errorf("read %d-byte key of shard %d: %w", len(d.key), s, err)
			}
		}
		dels = append(dels, d)
	}
	more := it.Valid()
	it.Close()
	for _, d := range dels {
		if err := a.del(d.key); err != nil {
			return nil, err
		}
		if d.key[3] == tagData {
			a.sm.GCKeys.Add(1)
		}
		if d.index != nil {
			if err := a.del(d.index); err != nil {
				return nil, err
			}
		}
	}
	if !more {
		return nil, a.setMeta(s, ShardMeta{})
	}
	if len(dels) > 0 {
		m.Resume, m.Resumed = dels[len(dels)-1].key, true
		return nil, a.setMeta(s, m)
	}
	return nil, nil
}
