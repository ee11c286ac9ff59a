package shardkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The change index and rounds of changes (live migration, docs/shardkv.md).
//
// While a move of shard s out is planned, every write to one of its keys
// also writes d<s>w<index:7><key> (putRecord): the change index, in log
// order. The target copies a snapshot read at the source's applied index I
// and then asks, in rounds, for the changes from a position in that index
// on; each round costs what changed, not the shard's size. A round sends
// each changed key's current record, or an empty record if the key is
// gone (a purged tombstone), so it is correct whatever happened to the key
// in between: after applying a round up to position p, every key is as at
// the source, or has a change index entry after p. Once the source froze
// the shard (BePulling, the write barrier), the last round also carries the
// dedup table and ends the copy.

// deltaChunkKeys bounds the records of one round's chunk, so that its
// install entry (each record with the delete of its old index entry and
// its new one) always fits one transaction.
const deltaChunkKeys = 4000

// StreamChanges sends shard s's changes from cursor on (a change index
// position), each key once per chunk with its current record, in chunks of
// at most ChunkLimit encoded bytes or deltaChunkKeys records, then the
// sessions written at or after sessionsSince (all if 0), and the view's log
// time as the last chunk's SessionsAt. frozen: the shard no longer changes
// here, so the last chunk says Last.
func (sm *StateMachine) StreamChanges(s int, cursor []byte, sessionsSince int64, frozen bool, frozeAt int64, send func(*shardkvpb.ShardChunk) error) error {
	changes := append(shardPrefix(s), tagChange)
	if !bytes.HasPrefix(cursor, changes) || len(cursor) < changePrefixLen {
		return invalid("cursor %x is not a position in shard %d's change index", cursor, s)
	}
	txn := sm.store.DB().NewTransaction(false)
	defer txn.Discard()
	view, err := chunkView(txn)
	if err != nil {
		return err
	}
	newChunk := func(from []byte) *shardkvpb.ShardChunk {
		return &shardkvpb.ShardChunk{LogTimeNs: view.LogTimeNs, SourceIndex: view.SourceIndex, NextCursor: from, FrozeAtNs: frozeAt}
	}
	chunk, size := newChunk(cursor), 0
	// add puts kv in the chunk, first sending the chunk if kv would take it
	// past its bounds; it reports whether it sent one.
	add := func(kv *shardkvpb.KeyValue) (bool, error) {
		n, sent := kvBytes(kv), false
		if len(chunk.Kvs) > 0 && (size+n > ChunkLimit || len(chunk.Kvs) >= deltaChunkKeys) {
			if err := send(chunk); err != nil {
				return false, err
			}
			next := newChunk(chunk.NextCursor)
			next.CaughtUp = chunk.CaughtUp
			chunk, size, sent = next, 0, true
		}
		chunk.Kvs = append(chunk.Kvs, kv)
		size += n
		return sent, nil
	}
	seen := map[string]bool{} // records in the chunk being filled
	live := liveVersions{txn: txn, s: s}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: changes})
	for it.Seek(cursor); it.Valid(); it.Next() {
		ck := it.Item().Key()
		if len(ck) <= changePrefixLen {
			continue
		}
		raw := changedRecord(s, ck)
		if !seen[string(raw)] {
			v, err := raftgroup.GetValue(txn, raw)
			if err == nil && v != nil {
				// An element of a dead version is no part of the shard:
				// the copy deletes it if it has it.
				var ok bool
				if ok, err = live.holds(raw); !ok {
					v = nil
				}
			}
			if err != nil {
				it.Close()
				return err
			}
			sent, err := add(&shardkvpb.KeyValue{Key: raw, Record: v})
			if err != nil {
				it.Close()
				return err
			}
			if sent {
				clear(seen)
			}
			seen[string(raw)] = true
		}
		chunk.NextCursor = append(bytes.Clone(ck), 0) // the next position
	}
	it.Close()
	chunk.CaughtUp = true
	// The sessions (the dedup table) go with every round, those written
	// since the puller's copy of them: the last round, frozen, carries only
	// what the clients changed since the round before, not the whole table.
	// These chunks keep the cursor: a repeated one rewrites the same
	// sessions.
	if err := sessionsWritten(txn, s, sessionsSince, func(k, v []byte) error {
		_, err := add(&shardkvpb.KeyValue{Key: k, Record: v})
		return err
	}); err != nil {
		return err
	}
	chunk.SessionsAt = view.LogTimeNs
	chunk.Last = frozen
	return send(chunk)
}

// holdsSessions reports whether kvs are all sessions this replica holds
// with the same records. Sessions written at exactly a round's log time
// come again in the next round (it sends those written at or after that
// time: later entries may share it); a round that brings nothing else is
// idle, not worth an entry.
func (sm *StateMachine) holdsSessions(kvs []*shardkvpb.KeyValue) bool {
	txn := sm.store.DB().NewTransaction(false)
	defer txn.Discard()
	for _, kv := range kvs {
		if len(kv.Key) < 4 || kv.Key[3] != tagSession {
			return false
		}
		v, err := raftgroup.GetValue(txn, kv.Key)
		if err != nil || !bytes.Equal(v, kv.Record) {
			return false
		}
	}
	return true
}

// sessionsWritten calls f with the key and record of each of shard s's
// sessions written at or after log time since (all of them if 0). Log time
// never moves back, so these include every session changed after a view
// whose log time was since. A session's expiry index entry (expiryKey)
// orders it by the log time of its last write: only the recent part of the
// index is read.
func sessionsWritten(txn *badger.Txn, s int, since int64, f func(k, v []byte) error) error {
	if since <= 0 {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: append(shardPrefix(s), tagSession), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := f(it.Item().KeyCopy(nil), v); err != nil {
				return err
			}
		}
		return nil
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'e'}})
	defer it.Close()
	for it.Seek(expiryKey(since, 0, 0)); it.Valid(); it.Next() {
		ek := it.Item().Key()
		if len(ek) != expiryKeyLen || int(binary.BigEndian.Uint16(ek[9:11])) != s {
			continue
		}
		sk := sessionKey(s, binary.BigEndian.Uint64(ek[11:]))
		v, err := raftgroup.GetValue(txn, sk)
		if err != nil {
			return err
		}
		if v == nil {
			continue // an index entry is written with its session; never alone
		}
		if err := f(sk, v); err != nil {
			return err
		}
	}
	return nil
}

// chunkView is what every chunk of a stream says of the view it was read
// from: its applied index (where rounds of changes start) and its log clock,
// which travels with the shard (docs/time.md): the source judged the
// records at it.
func chunkView(txn *badger.Txn) (*shardkvpb.ShardChunk, error) {
	now, err := logTime(txn)
	if err != nil {
		return nil, err
	}
	index, err := raftgroup.LoadApplied(txn, keyApplied)
	if err != nil {
		return nil, err
	}
	return &shardkvpb.ShardChunk{LogTimeNs: now, SourceIndex: index}, nil
}

var errDeltaTooLarge = errors.New("a round's chunk does not fit one transaction")

// applyDelta applies one chunk of a round of changes at the copy's cursor:
// each record replaces the key's (with its index entries), an empty one
// removes it. The chunk applies whole or not at all. The last chunk from a
// frozen source ends the copy: the shard is served (Acking), and the write
// pause, from the source's barrier to this entry, is kept.
func (a *applyCtx) applyDelta(s int, m ShardMeta, c *shardkvpb.InsertChunk) (any, error) {
	if !m.Delta || !bytes.Equal(m.Cursor, c.Cursor) {
		return errStaleChunk, nil
	}
	size := budget{records: 1, bytes: recordCost(len(shardMetaKey(s)), metaMaxBytes)}
	for _, kv := range c.Kvs {
		if len(kv.Record) == 0 {
			if p := shardPrefix(s); !bytes.HasPrefix(kv.Key, p) || len(kv.Key) <= len(p) || len(kv.Key) > badgerMaxKey {
				return fmt.Errorf("chunk key outside shard %d", s), nil
			}
		} else if err := checkMoved(s, kv); err != nil {
			return err, nil
		}
		size.add(len(kv.Key), len(kv.Record))
		size.add(len(kv.Key)+indexKeyExtra, 0) // the old index entry's delete
		size.add(len(kv.Key)+indexKeyExtra, 0) // the new one
	}
	if !size.fits() {
		return errDeltaTooLarge, nil
	}
	if err := a.room(size); err != nil {
		return nil, err
	}
	pause := a.nowNS - c.FrozeAtNs // this entry's time against the source's barrier
	a.nowNS = max(a.nowNS, c.LogTimeNs)
	for _, kv := range c.Kvs {
		if err := a.replaceRecord(s, kv.Key, kv.Record); err != nil {
			return nil, err
		}
		if len(kv.Record) > 0 {
			a.countMoved(&m, kv)
		}
	}
	m.Cursor, m.CaughtUp, m.Lag = c.NextCursor, c.CaughtUp, 0
	if c.SessionsAt != 0 {
		m.SessionsAt = c.SessionsAt // the round's sessions are all in
	}
	if !c.CaughtUp && len(c.NextCursor) >= changePrefixLen {
		if at := changeIndex(c.NextCursor); c.SourceIndex > at {
			m.Lag = c.SourceIndex - at
		}
	}
	if c.Last {
		m = ShardMeta{State: Acking, Config: m.Config, Peer: m.Peer, Keys: m.Keys, Bytes: m.Bytes, Total: m.Total, TotalBytes: m.TotalBytes}
		if c.FrozeAtNs > 0 && pause > 0 {
			m.PauseUs = uint64(pause / 1000)
			a.sm.pauses.observe(time.Duration(pause))
		}
	}
	return nil, a.setMeta(s, m)
}

// replaceRecord puts a received record (raw key, encoded value) in place
// of the one here, keeping its index entry in step; an empty value removes
// the key. A value record is stamped with this entry's index.
func (a *applyCtx) replaceRecord(s int, raw, val []byte) error {
	old, err := a.value(raw)
	if err != nil {
		return err
	}
	if old != nil {
		if ik := indexKey(s, raw, old); ik != nil {
			if err := a.del(ik); err != nil {
				return err
			}
		}
	}
	if raw[3] == tagData {
		// A collection replaced or deleted: its version's elements here
		// are dead (the source's collection of them is not copied).
		oldRec, _ := decodeRecord(old)
		newRec, _ := decodeRecord(val)
		if err := a.retire(s, raw[4:], &oldRec, &newRec); err != nil {
			return err
		}
	}
	if len(val) == 0 {
		if old == nil {
			return nil
		}
		return a.del(raw)
	}
	return a.putReceived(s, raw, val)
}

// liveVersions tells, in one view, whether an element of shard s belongs
// to the version its collection's record holds (a dead version's does
// not), remembering the last record read: elements of one key are
// read together.
type liveVersions struct {
	txn     *badger.Txn
	s       int
	key     []byte
	version uint64
	known   bool
}

// holds reports whether raw, a record of the shard, is part of it: any
// record but an element of a dead version.
func (l *liveVersions) holds(raw []byte) (bool, error) {
	key, v, _, ok := elemOf(raw)
	if !ok {
		return true, nil
	}
	if !l.known || !bytes.Equal(key, l.key) {
		b, err := raftgroup.GetValue(l.txn, dataKey(l.s, key))
		if err != nil {
			return false, err
		}
		l.key, l.version, l.known = bytes.Clone(key), 0, true
		if r, err := decodeRecord(b); err == nil {
			l.version = versionOf(&r)
		}
	}
	return v != 0 && v == l.version, nil
}

// trimChanges deletes up to DeleteChunkKeys change index entries of shard s
// below its TrimBelow (a cancelled move's), or maintBytes of deletes; the
// last batch clears TrimBelow. Entries written since (a new plan) stay.
func (a *applyCtx) trimChanges(r *shardkvpb.ShardRef) (any, error) {
	s := int(r.Shard)
	m := a.meta(s)
	if m.TrimBelow == 0 || m.Config != r.ConfigNum {
		return nil, nil
	}
	if err := a.room(budget{maintMaxRecords, maintMaxBytes}); err != nil {
		return nil, err
	}
	end := changePos(s, m.TrimBelow)
	var dels [][]byte
	cost := 0
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: append(shardPrefix(s), tagChange)})
	it.Rewind()
	for ; it.Valid() && len(dels) < DeleteChunkKeys && bytes.Compare(it.Item().Key(), end) < 0; it.Next() {
		c := recordCost(len(it.Item().Key()), 0)
		if len(dels) > 0 && cost+c > maintBytes {
			break
		}
		cost += c
		dels = append(dels, it.Item().KeyCopy(nil))
	}
	more := it.Valid() && bytes.Compare(it.Item().Key(), end) < 0
	it.Close()
	for _, k := range dels {
		if err := a.del(k); err != nil {
			return nil, err
		}
	}
	if !more {
		m.TrimBelow = 0
		return nil, a.setMeta(s, m)
	}
	return nil, nil
}
