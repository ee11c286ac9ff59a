package raftgroup

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Batch is the badger transaction that one Ready's log writes and the
// state machine's changes share. Badger syncs every commit (SyncWrites,
// options.go), so a Ready whose log write and apply commit together costs
// one fsync where it cost two. Under load nearly every Ready both appends
// entries and applies earlier ones.
//
// The state machine reads and writes through Txn (reads see the writes
// already in it), may Commit to make room (a badger transaction is
// bounded: Size says how much the engine's writes took), and leaves the
// rest for the engine, which commits it with the Ready. What must happen
// only once the writes are durable (publishing in-memory state that
// readers trust) goes in AfterCommit.
type Batch struct {
	db    *badger.DB
	txn   *badger.Txn // opened at first use: a Ready with nothing to write opens none
	size  batchSize   // the engine's writes in txn
	after []func()
	used  bool   // txn was handed out or written since the last commit
	syncs func() // counts commits that wrote (each one fsync); may be nil
}

type batchSize struct{ records, bytes int }

// add counts one write of k (v nil for a delete) as badger does toward a
// transaction's limits.
func (z *batchSize) add(k, v []byte) {
	z.records++
	z.bytes += len(k) + len(v) + recordOverhead
}

// NewBatch opens a batch on db. The engine makes one per Ready; a state
// machine tested on its own applies through one (see ApplyAlone).
func NewBatch(db *badger.DB) *Batch {
	return &Batch{db: db}
}

func (b *Batch) open() *badger.Txn {
	if b.txn == nil {
		b.txn = b.db.NewTransaction(true)
	}
	return b.txn
}

// Txn is the open transaction.
func (b *Batch) Txn() *badger.Txn {
	b.used = true
	return b.open()
}

// Size is what the engine's own writes take of the open transaction, as
// badger counts toward its limits (DB.MaxBatchCount, DB.MaxBatchSize):
// records, and bytes (key, value and badger's 12 bytes of meta and
// version per record, for values kept in the LSM tree).
func (b *Batch) Size() (records, bytes int) { return b.size.records, b.size.bytes }

// AfterCommit runs f once everything written so far is committed, at the
// next Commit. Functions run in the order given.
func (b *Batch) AfterCommit(f func()) { b.after = append(b.after, f) }

// Commit commits the open transaction, durable when it returns, and runs
// the AfterCommit functions; the next write opens the next transaction.
// Committing an empty transaction writes nothing.
func (b *Batch) Commit() error {
	if b.txn != nil {
		if err := b.txn.Commit(); err != nil {
			b.txn = nil
			return fmt.Errorf("commit: %w", err)
		}
	}
	if b.used && b.syncs != nil {
		b.syncs()
	}
	b.txn, b.size, b.used = nil, batchSize{}, false
	after := b.after
	b.after = nil
	for _, f := range after {
		f()
	}
	return nil
}

// Discard drops whatever was not committed.
func (b *Batch) Discard() {
	if b.txn != nil {
		b.txn.Discard()
	}
}

// set and del are the engine's writes, counted in Size.
func (b *Batch) set(k, v []byte) error {
	b.used = true
	b.size.add(k, v)
	return b.open().Set(k, v)
}

func (b *Batch) del(k []byte) error {
	b.used = true
	b.size.add(k, nil)
	return b.open().Delete(k)
}

// recordOverhead is what badger adds per record toward a transaction's
// size: 2 meta bytes, an 8-byte version, and slack.
const recordOverhead = 12

// ApplyAlone applies ents to sm in a batch of their own and commits it: for
// a state machine driven without a replica (tests, tools).
func ApplyAlone(sm StateMachine, db *badger.DB, ents []Entry) error {
	b := NewBatch(db)
	defer b.Discard()
	if err := sm.Apply(b, ents); err != nil {
		return err
	}
	return b.Commit()
}
