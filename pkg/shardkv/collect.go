package shardkv

import (
	"bytes"
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
	}
	var marks []mark
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'c'}})
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
		marks = append(marks, mark{raw: k, s: s, version: v, key: key})
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
				done, n, c, err := a.deleteElems(m.s, elemPrefix(m.s, m.key, m.version), DeleteChunkKeys-deleted, maintBytes-cost)
				if err != nil {
					return nil, err
				}
				deleted, cost = deleted+n, cost+c
				if !done {
					return moreWork(true), nil
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

// deleteElems deletes the records under prefix, at most n of them and
// about maxCost bytes of deletes (at least one); done reports that none is
// left. The deletes are not tracked in the change index: a dead version's
// elements are no part of the shard a copy receives (changes.go).
func (a *applyCtx) deleteElems(s int, prefix []byte, n, maxCost int) (done bool, deleted, cost int, err error) {
	var dels [][]byte
	it := a.txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	for it.Rewind(); it.Valid(); it.Next() {
		c := recordCost(len(it.Item().Key()), 0)
		if len(dels) >= max(n, 1) || (len(dels) > 0 && cost+c > maxCost) {
			break
		}
		dels, cost = append(dels, it.Item().KeyCopy(nil)), cost+c
	}
	done = !it.Valid()
	it.Close()
	for _, k := range dels {
		if !bytes.HasPrefix(k, prefix) {
			continue
		}
		if err := a.del(k); err != nil {
			return false, 0, 0, err
		}
	}
	return done, len(dels), cost, nil
}
