package ctrler

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
)

// batch is the transaction Apply writes through. One Ready's entries can
// write far more than one badger transaction holds (each mutation stores a
// whole config): an entry's writes are held until the entry is applied,
// then go into the open transaction, or into a new one when they would push
// it past badger's limits. Each transaction commits with the index of its
// last entry, so a crash between two leaves a prefix of the entries applied
// and the rest is applied again at restart, as with any Apply.
// Reads go to the open transaction (b.txn): they see every write flushed.
type batch struct {
	rb          *raftgroup.Batch
	db          *badger.DB
	txn         *badger.Txn // rb's open transaction
	pending     []write
	size, count int64  // of the open transaction's writes
	prev        uint64 // the index before the entry being applied
}

type write struct {
	key, val []byte
	del      bool
}

// writeCost is badger's estimate of one write (key, value, meta, the key's
// version) for values kept in the LSM tree, plus slack; a larger value
// costs less (its pointer), so this is an upper bound.
func writeCost(w write) int64 { return int64(len(w.key)+len(w.val)) + 32 }

func newBatch(rb *raftgroup.Batch, db *badger.DB) *batch {
	records, bytes := rb.Size() // the engine's log writes share the transaction
	return &batch{rb: rb, db: db, txn: rb.Txn(), size: int64(bytes), count: int64(records)}
}

func (b *batch) set(k, v []byte) { b.pending = append(b.pending, write{key: k, val: v}) }
func (b *batch) del(k []byte)    { b.pending = append(b.pending, write{key: k, del: true}) }

// flush moves the writes held into the transaction, at the end of an entry
// or at a step of one that leaves a consistent state (see applyCompact).
func (b *batch) flush() error {
	var size, count int64
	for _, w := range b.pending {
		size, count = size+writeCost(w), count+1
	}
	// The applied index is one more write at commit.
	const appliedCost = 64
	if b.count > 0 && (b.size+size+appliedCost >= b.db.MaxBatchSize() || b.count+count+1 >= b.db.MaxBatchCount()) {
		if err := b.commit(b.prev); err != nil {
			return err
		}
	}
	for _, w := range b.pending {
		var err error
		if w.del {
			err = b.txn.Delete(w.key)
		} else {
			err = b.txn.Set(w.key, w.val)
		}
		if err != nil {
			return fmt.Errorf("write %q (%d writes, %d bytes in the transaction): %w", w.key[:min(len(w.key), 16)], b.count, b.size, err)
		}
	}
	b.size, b.count, b.pending = b.size+size, b.count+count, b.pending[:0]
	return nil
}

// commit commits the open transaction with applied, its last entry, and
// opens the next (applied 0: the log's first entry is the one being
// applied, so nothing of the state machine is in it).
func (b *batch) commit(applied uint64) error {
	if applied != 0 {
		if err := raftgroup.StoreApplied(b.txn, keyApplied, applied); err != nil {
			return err
		}
	}
	if err := b.rb.Commit(); err != nil {
		return err
	}
	b.txn, b.size, b.count = b.rb.Txn(), 0, 0
	return nil
}

// done stores applied, the batch's last entry, for the engine to commit
// with the Ready.
func (b *batch) done(applied uint64) error {
	return raftgroup.StoreApplied(b.txn, keyApplied, applied)
}
