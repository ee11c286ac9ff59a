package shardkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// SessionTTL is how long a client session (its dedup entries in a shard)
// lives after its last write, in log time. A client must not retry a write
// for longer than this; the Go client's retries are bounded by its context.
const SessionTTL = time.Hour

// TombstoneTTL is how many log entries a tombstone outlives its delete
// before it is purged. Tombstones let a future pre-copy migration ship
// "changes since index i"; nothing reads them older than this.
const TombstoneTTL = 100_000

// moreWork is the result of an expiry entry that stopped at its bounds
// with work left: the leader proposes the next one at once instead of a
// period later.
type moreWork bool

// expire drops sessions idle past SessionTTL, found through their index,
// and purges tombstones older than TombstoneTTL entries (purgeTombstones).
func (a *applyCtx) expire() (any, error) {
	if err := a.room(budget{maintMaxRecords, maintMaxBytes}); err != nil {
		return nil, err
	}
	cutoff := a.nowNS - int64(SessionTTL)
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'e'}})
	var dead [][]byte
	for it.Rewind(); it.Valid() && len(dead) < DeleteChunkKeys; it.Next() {
		k := it.Item().KeyCopy(nil)
		if int64(binary.BigEndian.Uint64(k[1:9])) >= cutoff {
			break
		}
		dead = append(dead, k)
	}
	it.Close()
	for _, k := range dead {
		s := int(k[9])<<8 | int(k[10])
		client := binary.BigEndian.Uint64(k[11:19])
		if err := a.del(k); err != nil {
			return nil, err
		}
		if err := a.del(sessionKey(s, client)); err != nil {
			return nil, err
		}
	}
	more, err := a.purgeTombstones()
	if err != nil {
		return nil, err
	}
	return moreWork(more || len(dead) == DeleteChunkKeys), nil
}

// One expiry entry examines at most TombstoneScanKeys tombstone index
// entries (each costs a record read), or tombstoneScanBytes of their keys,
// and changes at most DeleteChunkKeys tombstones, or maintBytes of writes:
// user keys may be up to 64 KB, and 1,000 such purges would pass badger's
// transaction limit (2.4 MiB) and stop every replica.
const (
	TombstoneScanKeys  = 4 * DeleteChunkKeys
	tombstoneScanBytes = 4 << 20
)

// purgeTombstones deletes tombstones written more than TombstoneTTL entries
// ago. The tombstone index is in key order, not age order, so young
// tombstones may sort before old ones: each expiry entry goes on from where
// the last one stopped (keyTombCursor, replicated state like the rest) and
// wraps around at the end, so repeated entries sweep the whole index within
// the bounds above.
//
// A record's index is this group's: writes and imports stamp the entry
// applying them (insertChunk). A tombstone whose index is above the entry's
// own can only have been imported with its source's index (before imports
// were stamped): it is stamped now, and so purged TombstoneTTL entries
// later. more reports that it stopped at its bounds on changes.
func (a *applyCtx) purgeTombstones() (more bool, err error) {
	cursor, err := a.value(keyTombCursor)
	if err != nil {
		return false, fmt.Errorf("read tombstone cursor: %w", err)
	}
	keys, whole := a.tombstoneScan(cursor)
	var before uint64
	if a.index > TombstoneTTL {
		before = a.index - TombstoneTTL
	}
	changed, changedBytes := 0, 0
	var last []byte // the last entry examined: the next entry starts after it
	for _, tk := range keys {
		if changed >= DeleteChunkKeys {
			whole, more = false, true
			break
		}
		s := int(tk[1])<<8 | int(tk[2])
		dk := dataKey(s, tk[3:])
		v, err := a.value(dk)
		if err != nil {
			return false, fmt.Errorf("read tombstone %q: %w", dk, err)
		}
		// A stale index entry (no record, or not a tombstone: cannot
		// happen) is left alone and never deletes a value; a record that
		// does not decode is kept as it is, as every write to it
		// (BAD_RECORD).
		rec, err := decodeRecord(v)
		stamp := err == nil && rec.Tombstone && rec.Index > a.index
		purge := err == nil && rec.Tombstone && !stamp && rec.Index < before
		cost := 0
		switch {
		case stamp:
			cost = recordCost(len(dk), len(v))
		case purge:
			cost = recordCost(len(dk), 0) + recordCost(len(tk), 0)
		}
		if changed > 0 && changedBytes+cost > maintBytes {
			whole, more = false, true
			break // tk is examined again by the next entry
		}
		last = tk
		switch {
		case stamp:
			err = a.set(dk, stampIndex(v, a.index))
		case purge:
			if err = a.del(dk); err == nil {
				err = a.del(tk)
			}
		default:
			continue
		}
		if err != nil {
			return false, err
		}
		changed, changedBytes = changed+1, changedBytes+cost
	}
	switch {
	case !whole:
		return more, a.set(keyTombCursor, last)
	case cursor != nil:
		return more, a.del(keyTombCursor) // swept it all: start over next time
	}
	return more, nil
}

// tombstoneScan returns tombstone index keys in sweep order, after cursor
// to the end, then from the start up to cursor, within the scan bounds.
// whole reports that they are the entire index.
func (a *applyCtx) tombstoneScan(cursor []byte) (keys [][]byte, whole bool) {
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'t'}})
	defer it.Close()
	size := 0
	full := func() bool { return len(keys) >= TombstoneScanKeys || size >= tombstoneScanBytes }
	take := func() {
		k := it.Item().KeyCopy(nil)
		keys, size = append(keys, k), size+len(k)
	}
	startAfter(it, cursor, cursor != nil)
	for ; it.Valid(); it.Next() {
		if full() {
			return keys, false
		}
		take()
	}
	if cursor == nil {
		return keys, true
	}
	for it.Rewind(); it.Valid() && bytes.Compare(it.Item().Key(), cursor) <= 0; it.Next() {
		if full() {
			return keys, false
		}
		take()
	}
	return keys, true
}

// ExpireKeysBatch bounds the keys one expiry entry deletes (and maintBytes
// what it writes).
const ExpireKeysBatch = 1000

// expireCost is the most expiring a key of keyLen bytes writes: its
// tombstone, its tombstone index entry, two deletes of its expiry index
// entry (putRecord's and expireKeys' own; badger counts both), and a change
// index entry (a planned move).
func expireCost(keyLen int) int {
	return recordCost(len(dataKey(0, nil))+keyLen, recordHeader) + recordCost(len(tombstoneKey(0, nil))+keyLen, 0) +
		3*recordCost(longestKeyPrefix+keyLen, 0)
}

// expiresKey is the expiry index entry of a key that has an expiry.
func expiresKey(atMs int64, s int, key []byte) []byte {
	k := binary.BigEndian.AppendUint64([]byte{'x'}, uint64(atMs))
	return append(append(k, byte(s>>8), byte(s)), key...)
}

// expireKeys deletes keys whose expiry is at or before the entry's time, in
// expiry order, in shards the group serves: a frozen (BePulling) shard keeps
// its data unchanged for the new owner, which expires those keys itself. It
// returns how many it deleted.
func (a *applyCtx) expireKeys() (any, error) {
	if err := a.room(budget{maintMaxRecords, maintMaxBytes}); err != nil {
		return nil, err
	}
	nowMs := a.nowNS / 1e6
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'x'}})
	type due struct {
		xk    []byte
		shard int
		key   []byte
		at    int64
	}
	var dues []due
	scanned, cost := 0, 0
	for it.Rewind(); it.Valid() && len(dues) < ExpireKeysBatch && scanned < 4*ExpireKeysBatch; it.Next() {
		k := it.Item().Key()
		at := int64(binary.BigEndian.Uint64(k[1:9]))
		if at > nowMs {
			break
		}
		scanned++
		s := int(k[9])<<8 | int(k[10])
		if !serves(a.meta(s)) {
			continue
		}
		c := expireCost(len(k) - longestKeyPrefix)
		if len(dues) > 0 && cost+c > maintBytes {
			break // the next entry goes on: the leader sees keys still due
		}
		cost += c
		k = it.Item().KeyCopy(nil)
		dues = append(dues, due{xk: k, shard: s, key: k[11:], at: at})
	}
	it.Close()
	n := 0
	for _, d := range dues {
		rec, err := a.get(dataKey(d.shard, d.key))
		if errors.Is(err, errBadRecord) {
			rec, err = nil, nil // an index entry of nothing readable: dropped below
		}
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

// expiryDue reports whether a key of a served shard is due by the time
// the next entry will carry: the group's time (not this replica's clock,
// which may have jumped), or the log clock if that is ahead (a shard
// imported from a group whose clock is ahead). The leader then proposes
// expireKeys.
func (g *Group) expiryDue() bool {
	now := g.sm.LogTime()
	if t, ok := g.r.GroupTime(); ok && t.After(now) {
		now = t
	}
	return g.sm.expiryDue(now.UnixMilli())
}

// expiryDue reports whether a key of a served shard is past its expiry at
// nowMs.
func (sm *StateMachine) expiryDue(nowMs int64) bool {
	due := false
	_ = sm.store.DB().View(func(txn *badger.Txn) error {
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
