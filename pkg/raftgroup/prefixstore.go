package raftgroup

import (
	"bytes"
	"fmt"
	"io"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// PrefixStore is the storage side of a state machine that keeps all its
// state in the replica's badger DB under a few key prefixes, with its applied
// index under one key (written by its Apply with StoreApplied). It
// implements StateMachine's Open, Snapshot and Restore; the state machine
// keeps Apply and any in-memory view of its state, which load rebuilds from
// the DB at Open and after every Restore.
type PrefixStore struct {
	appliedKey []byte
	prefixes   [][]byte
	load       func(txn *badger.Txn) error
	db         *badger.DB
}

// NewPrefixStore returns the store of a state machine whose keys are under
// prefixes, one of which must hold appliedKey (so a snapshot carries it).
// load, called in one read transaction with the applied index, must reset
// the whole in-memory view: it also runs after a Restore. It may be nil.
func NewPrefixStore(appliedKey []byte, prefixes [][]byte, load func(txn *badger.Txn) error) *PrefixStore {
	if !slices.ContainsFunc(prefixes, func(p []byte) bool { return bytes.HasPrefix(appliedKey, p) }) {
		panic(fmt.Sprintf("raftgroup: applied key %q is under none of the state's prefixes", appliedKey))
	}
	if load == nil {
		load = func(*badger.Txn) error { return nil }
	}
	return &PrefixStore{appliedKey: appliedKey, prefixes: prefixes, load: load}
}

// Open keeps db and loads the state from it (StateMachine.Open).
func (s *PrefixStore) Open(db *badger.DB) (uint64, error) {
	s.db = db
	return s.reload()
}

// DB is the replica's DB, as given to Open.
func (s *PrefixStore) DB() *badger.DB { return s.db }

// reload reads the applied index and runs load, in one read transaction.
func (s *PrefixStore) reload() (applied uint64, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		if applied, err = LoadApplied(txn, s.appliedKey); err != nil {
			return err
		}
		return s.load(txn)
	})
	if err != nil {
		return 0, fmt.Errorf("load state: %w", err)
	}
	return applied, nil
}

// Snapshot is a PrefixSnapshot of the state (StateMachine.Snapshot).
func (s *PrefixStore) Snapshot() (Snapshot, error) {
	return PrefixSnapshot(s.db, s.appliedKey, s.prefixes...)
}

// Restore replaces the state by a PrefixSnapshot's stream and loads it
// (StateMachine.Restore).
func (s *PrefixStore) Restore(r io.Reader) (uint64, error) {
	if err := RestorePrefixes(s.db, r, s.prefixes...); err != nil {
		return 0, err
	}
	return s.reload()
}
