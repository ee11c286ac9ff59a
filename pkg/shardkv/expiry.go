package shardkv

import (
	"encoding/binary"
	"errors"
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

// expire drops sessions idle past SessionTTL and tombstones older than
// TombstoneTTL entries, both found through their indexes.
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
	if a.index <= TombstoneTTL {
		return nil
	}
	before := a.index - TombstoneTTL
	it = a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'t'}})
	var tomb [][]byte
	for it.Rewind(); it.Valid() && len(tomb) < DeleteChunkKeys; it.Next() {
		tomb = append(tomb, it.Item().KeyCopy(nil))
	}
	it.Close()
	for _, tk := range tomb {
		s := int(tk[1])<<8 | int(tk[2])
		dk := dataKey(s, tk[3:])
		rec, err := a.get(dk)
		if errors.Is(err, errBadRecord) {
			continue // kept as it is, as every write to it (BAD_RECORD)
		}
		if err != nil {
			return err
		}
		if rec != nil && rec.Tombstone && rec.Index < before {
			if err := a.del(dk); err != nil {
				return err
			}
			if err := a.del(tk); err != nil {
				return err
			}
		}
	}
	return nil
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
