package raftgroup

import (
	"encoding/binary"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// checkDurable refuses to start on a data dir that lost acknowledged
// writes, rather than serve from it: raft would otherwise replay from a
// hole, or a replica would vote and answer with a state its peers never
// saw. What must hold, all of it written before it was acknowledged:
//
//   - the state machine is at least at the snapshot marker's index (the
//     log below the marker is gone: nothing could replay it);
//   - the log holds every entry from the marker to its last index, with
//     no gap;
//   - the hard state's commit index is within the log.
//
// Each check reads keys only; the log holds a few thousand entries.
func (r *Replica) checkDurable(fresh bool) error {
	if fresh {
		return nil
	}
	s := r.store
	snapIdx := s.snapshotIndex()
	const lost = "the data dir lost writes that were acknowledged as durable (a disk or filesystem that does not honour fsync?); restore this replica as a new member (docs/node.md)"
	if r.smApplied < snapIdx {
		return fmt.Errorf("raftgroup: the state machine is at index %d but the snapshot marker says the state up to %d was durable: %s", r.smApplied, snapIdx, lost)
	}
	s.mu.RLock()
	first, last := s.compacted.index+1, s.last
	commit := s.hard.GetCommit()
	s.mu.RUnlock()
	if commit > last {
		return fmt.Errorf("raftgroup: the hard state says entry %d was committed but the log ends at %d: %s", commit, last, lost)
	}
	want := first
	err := r.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixLog})
		defer it.Close()
		for it.Seek(logKey(first)); it.ValidForPrefix(prefixLog); it.Next() {
			i := binary.BigEndian.Uint64(it.Item().Key()[len(prefixLog):])
			if i != want {
				return fmt.Errorf("raftgroup: the log holds entry %d but not %d (it should hold every entry from %d to %d): %s", i, want, first, last, lost)
			}
			want++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if want != last+1 {
		return fmt.Errorf("raftgroup: the log ends at %d, not at %d: %s", want-1, last, lost)
	}
	return nil
}
