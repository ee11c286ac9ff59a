package shardkv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/routing"
)

// KeyCounts counts the keys a replica holds, tombstones excluded and
// keys past their expiry but not yet deleted included (as Redis's DBSIZE).
type KeyCounts struct {
	Total   int
	Expires int                // keys with an expiry
	ByState map[ShardState]int // keys by their shard's state
	Shards  map[ShardState]int // shards by state
}

// KeyCounts counts every key this replica holds, from local state.
func (g *Group) KeyCounts() (KeyCounts, error) {
	shards := g.sm.Shards()
	kc := KeyCounts{ByState: map[ShardState]int{}, Shards: map[ShardState]int{}}
	for _, m := range shards {
		kc.Shards[m.State]++
	}
	err := g.sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'d'}, PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) < 4 || k[3] != tagData {
				continue
			}
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.Tombstone {
				continue
			}
			kc.Total++
			if rec.ExpireAtMs != 0 {
				kc.Expires++
			}
			st := shards[int(k[1])<<8|int(k[2])].State
			if st == NotOwned {
				st = "NotOwned"
			}
			kc.ByState[st]++
		}
		return nil
	})
	return kc, err
}

// itemHeader decodes a value record's header (tombstone, index, expiry)
// from a data item; the value itself is not kept.
func itemHeader(item *badger.Item) (record, error) {
	var rec record
	err := item.Value(func(v []byte) error {
		var err error
		rec, err = decodeRecord(v)
		rec.Value = nil // only valid inside Value
		return err
	})
	return rec, err
}

// slotKeys calls f for the live keys of slot held here, until f says stop.
func (g *Group) slotKeys(slot int, f func(key []byte) bool) error {
	if slot < 0 || slot >= routing.Slots {
		return fmt.Errorf("slot %d out of range", slot)
	}
	n := len(g.sm.Config().Shards)
	if n == 0 {
		return nil
	}
	prefix := append(shardPrefix(routing.Shard(slot, n)), tagData)
	return g.sm.store.DB().View(func(txn *badger.Txn) error {
		ns, err := logTime(txn) // expiry as of the state read (GetEntry)
		if err != nil {
			return err
		}
		now := ns / 1e6
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key := it.Item().Key()[len(prefix):]
			if routing.Slot(key) != slot {
				continue
			}
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.live(now) && !f(bytes.Clone(key)) {
				return nil
			}
		}
		return nil
	})
}

// CountKeysInSlot counts the live keys of slot held here (local state).
func (g *Group) CountKeysInSlot(slot int) (int, error) {
	n := 0
	err := g.slotKeys(slot, func([]byte) bool { n++; return true })
	return n, err
}

// KeysInSlot returns up to count live keys of slot held here (local state).
func (g *Group) KeysInSlot(slot, count int) ([][]byte, error) {
	var out [][]byte
	if count <= 0 {
		return nil, nil
	}
	err := g.slotKeys(slot, func(k []byte) bool { out = append(out, k); return len(out) < count })
	return out, err
}

// Scan examines up to count keys of the shards this replica serves, in
// order, after position `after` (nil: from the start), and returns the live
// ones match accepts (match nil: all) and the position to continue from;
// next is nil when the scan is complete. Local state: any replica.
func (g *Group) Scan(after []byte, count int, match func(key []byte) bool) (keys [][]byte, next []byte, err error) {
	if count <= 0 {
		count = 10
	}
	shards := g.sm.Shards()
	if g.sm.stranded() {
		shards = nil // serves nothing (route)
	}
	err = g.sm.store.DB().View(func(txn *badger.Txn) error {
		ns, err := logTime(txn) // expiry as of the state read (GetEntry)
		if err != nil {
			return err
		}
		now := ns / 1e6
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'d'}})
		defer it.Close()
		startAfter(it, after, after != nil)
		examined := 0
		for it.Valid() {
			k := it.Item().Key()
			s := int(k[1])<<8 | int(k[2])
			switch {
			case !serves(shards[s]) || k[3] > tagData:
				// The rest of a shard we do not serve, or past its value
				// records (sessions, change index): the next shard. (A seek
				// to tagData+1 landed on the sessions again: a scan of a
				// shard with a session never ended.)
				it.Seek(shardPrefix(s + 1))
				continue
			case k[3] < tagData:
				// Collection elements sort first: on to the records.
				it.Seek(append(shardPrefix(s), tagData))
				continue
			}
			if examined == count {
				next = bytes.Clone(after)
				return nil
			}
			examined++
			after = it.Item().KeyCopy(nil)
			key := after[4:]
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.live(now) && (match == nil || match(key)) {
				keys = append(keys, bytes.Clone(key))
			}
			it.Next()
		}
		return nil
	})
	return keys, next, err
}

// randomKeyExamined bounds the records RandomKey reads in one shard (dead
// ones are skipped), so that a shard of tombstones costs no more than that.
const randomKeyExamined = 1000

// RandomKey returns a live key of a shard this replica serves, picked at
// random, or nil if it finds none: the first live key at or after a random
// position of a random shard (wrapping around), trying each served shard
// in random order. Like Redis's, the pick is not uniform over keys. Local
// state: any replica.
func (g *Group) RandomKey() ([]byte, error) {
	shards := g.sm.Shards()
	if g.sm.stranded() {
		shards = nil // serves nothing (route)
	}
	var served []int
	for s := range shards {
		if serves(shards[s]) {
			served = append(served, s)
		}
	}
	rand.Shuffle(len(served), func(i, j int) { served[i], served[j] = served[j], served[i] })
	var out []byte
	err := g.sm.store.DB().View(func(txn *badger.Txn) error {
		ns, err := logTime(txn)
		if err != nil {
			return err
		}
		now := ns / 1e6
		for _, s := range served {
			prefix := append(shardPrefix(s), tagData)
			it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
			from := binary.BigEndian.AppendUint64(bytes.Clone(prefix), rand.Uint64())
			examined := 0
			for pass := 0; pass < 2 && out == nil && examined < randomKeyExamined; pass++ {
				if pass == 0 {
					it.Seek(from)
				} else {
					it.Rewind()
				}
				for ; it.Valid() && examined < randomKeyExamined; it.Next() {
					if pass == 1 && bytes.Compare(it.Item().Key(), from) >= 0 {
						break
					}
					examined++
					rec, err := itemHeader(it.Item())
					if err != nil {
						it.Close()
						return err
					}
					if rec.live(now) {
						out = it.Item().KeyCopy(nil)[len(prefix):]
						break
					}
				}
			}
			it.Close()
			if out != nil {
				return nil
			}
		}
		return nil
	})
	return out, err
}
