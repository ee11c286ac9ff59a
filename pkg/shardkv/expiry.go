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

// expire drops sessions idle past SessionTTL, found through their index,
// and purges tombstones older than TombstoneTTL entries (purgeTombstones).
func (a *applyCtx) expire() error {
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
			return err
		}
		if err := a.del(sessionKey(s, client)); err != nil {
			return err
		}
	}
	return a.purgeTombstones()
}

// One expiry entry examines at most TombstoneScanKeys tombstone index
// entries (each costs a record read), or tombstoneScanBytes of their keys,
// and changes at most DeleteChunkKeys tombstones, or tombstonePurgeBytes of
// keys and values: user keys may be up to 64 KB, and 1,000 such purges
// would pass badger's transaction limit (2.4 MiB) and stop every replica.
const (
	TombstoneScanKeys   = 4 * DeleteChunkKeys
	tombstoneScanBytes  = 4 << 20
	tombstonePurgeBytes = 512 << 10
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
// later.
func (a *applyCtx) purgeTombstones() error {
	cursor, err := a.value(keyTombCursor)
	if err != nil {
		return fmt.Errorf("read tombstone cursor: %w", err)
	}
	keys, whole := a.tombstoneScan(cursor)
	var before uint64
	if a.index > TombstoneTTL {
		before = a.index - TombstoneTTL
	}
	changed, changedBytes := 0, 0
	var last []byte // the last entry examined: the next entry starts after it
	for _, tk := range keys {
		if changed >= DeleteChunkKeys || changedBytes >= tombstonePurgeBytes {
			whole = false
			break
		}
		last = tk
		s := int(tk[1])<<8 | int(tk[2])
		dk := dataKey(s, tk[3:])
		v, err := a.value(dk)
		if err != nil {
			return fmt.Errorf("read tombstone %q: %w", dk, err)
		}
		if v == nil {
			continue // a stale index entry (cannot happen): left alone
		}
		rec, err := decodeRecord(v)
		if err != nil {
			continue // kept as it is, as every write to it (BAD_RECORD)
		}
		switch {
		case !rec.Tombstone:
			// A stale index entry again; never deletes a value.
		case rec.Index > a.index:
			if err := a.set(dk, stampIndex(v, a.index)); err != nil {
				return err
			}
			changed, changedBytes = changed+1, changedBytes+len(dk)+len(v)
		case rec.Index < before:
			if err := a.del(dk); err != nil {
				return err
			}
			if err := a.del(tk); err != nil {
				return err
			}
			changed, changedBytes = changed+1, changedBytes+len(dk)+len(tk)
		}
	}
	switch {
	case !whole:
		return a.set(keyTombCursor, last)
	case cursor != nil:
		return a.del(keyTombCursor) // swept it all: start over next time
	}
	return nil
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
	it.Rewind()
	if cursor != nil {
		it.Seek(cursor)
		if it.Valid() && bytes.Equal(it.Item().Key(), cursor) {
			it.Next()
		}
	}
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

// ExpireKeysBatch bounds the keys one expiry entry deletes.
const ExpireKeysBatch = 1000

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

// expiryDue reports whether a key of a served shard is past its expiry at
// nowMs (the leader then proposes expireKeys).
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
