package shardkv

import (
	"errors"

	"github.com/dgraph-io/badger/v4"
)

// collectDead is one collection entry: it deletes the elements of dead
// collection versions (deadKey marks), oldest version first, at most
// DeleteChunkKeys of them or maintBytes of deletes, and drops each mark
// once its version has no element left. A mark of the version a live
// record still holds (a copy received back from another group under the
// same version) is dropped without deleting anything. Marks of shards being
// garbage-collected wait: the GC deletes their elements.
//
// The result is moreWork: it stopped at its bounds with marks left.
func (a *applyCtx) collectDead() (any, error) {
	if err := a.room(budget{maintMaxRecords, maintMaxBytes}); err != nil {
		return nil, err
	}
	type mark struct {
		raw     []byte
		s       int
		version uint64
		key     []byte
		after   []byte // the last element deleted (resume after it)
	}
	var marks []mark
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'c'}, PrefetchValues: true})
	for it.Rewind(); it.Valid() && len(marks) < DeleteChunkKeys; it.Next() {
		k := it.Item().KeyCopy(nil)
		s, v, key, ok := deadOf(k)
		if !ok {
			marks = append(marks, mark{raw: k, s: -1})
			continue
		}
		if a.meta(s).State == GCing {
			continue
		}
		val, err := it.Item().ValueCopy(nil)
		if err != nil {
			it.Close()
			return nil, err
		}
		m := mark{raw: k, s: s, version: v, key: key}
		if len(val) > 1 {
			m.after = val[1:]
		}
		marks = append(marks, m)
	}
	it.Close()
	if len(marks) == 0 {
		a.sm.deadPending.Store(false)
		return moreWork(false), nil
	}
	deleted, cost := 0, 0
	for _, m := range marks {
		if m.s >= 0 {
			live, err := a.get(dataKey(m.s, m.key))
			if err != nil && !errors.Is(err, errBadRecord) {
				return nil, err
			}
			if versionOf(live) != m.version {
				done, last, n, c, err := a.deleteElems(elemPrefix(m.s, m.key, m.version), m.after, DeleteChunkKeys-deleted, maintBytes-cost)
				if err != nil {
					return nil, err
				}
				deleted, cost = deleted+n, cost+c
				if !done {
					// Next time from after the last one deleted: starting
					// over would step over every delete marker so far
					// (quadratic: 75 s for a 1,000,000-field hash).
					return moreWork(true), a.set(m.raw, append([]byte{1}, last...))
				}
			}
		}
		if err := a.del(m.raw); err != nil {
			return nil, err
		}
		deleted, cost = deleted+1, cost+recordCost(len(m.raw), 0)
		if deleted >= DeleteChunkKeys || cost >= maintBytes {
			return moreWork(true), nil
		}
	}
	return moreWork(len(marks) == DeleteChunkKeys), nil
}

// deleteElems deletes the records under prefix after key after (nil: from
// the first), at most n of them and about maxCost bytes of deletes (at
// least one); done reports that none is left, last is the last deleted.
// The deletes are not tracked in the change index: a dead version's
// elements are no part of the shard a copy receives (changes.go).
func (a *applyCtx) deleteElems(prefix, after []byte, n, maxCost int) (done bool, last []byte, deleted, cost int, err error) {
	var dels [][]byte
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	startAfter(it, after, after != nil)
	for ; it.Valid(); it.Next() {
		c := recordCost(len(it.Item().Key()), 0)
		if len(dels) >= max(n, 1) || (len(dels) > 0 && cost+c > maxCost) {
			break
		}
		dels, cost = append(dels, it.Item().KeyCopy(nil)), cost+c
	}
	done = !it.Valid()
	it.Close()
	for _, k := range dels {
		if err := a.del(k); err != nil {
			return false, nil, 0, 0, err
		}
		last = k
	}
	return done, last, len(dels), cost, nil
}
