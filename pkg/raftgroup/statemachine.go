package raftgroup

import (
	"io"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Entry is one committed log entry as a state machine sees it.
type Entry struct {
	Index uint64
	Term  uint64
	// Time is the group's time when the leader proposed the entry: the
	// lower median of the voters' wall clocks, so no one replica's clock
	// jump moves it (docs/time.md). It is part of the log, so every replica
	// sees the same value: use it for anything time-based (TTLs, session
	// expiry) to stay deterministic. A leader never stamps an entry before
	// the last one it saw in its log, but concurrent proposals may enter
	// the log in another order than stamped (microseconds apart), and a
	// log written by an older version may step back further: clamp it to a
	// value the state machine stored itself if you need it monotonic
	// (never to in-memory state, which a restarted replica rebuilds from a
	// different point of the log). It is zero for entries without a time
	// (Raft no-ops at elections, membership changes).
	Time time.Time
	// Cmd is the proposed command. It is nil for entries that carry none
	// (Raft no-ops at elections, membership changes, and the leader's clock
	// entries, which carry only a Time: see TimeDependent); those only
	// advance the applied index and, with a Time, the log clock.
	Cmd []byte
	// Result is set by Apply and handed back to the proposer, if it waits on
	// this replica. It never leaves the process.
	Result any
}

// StateMachine is what a replicated service implements. The engine calls it
// from a single goroutine, in log order, except Snapshot (see there).
//
// The state machine's data lives in the replica's own badger DB, next to the
// Raft log (see docs/engine.md for why): keys starting with byte 0x00 belong to
// the engine, all others to the state machine.
type StateMachine interface {
	// Open is called once with the replica's DB, before any other method. It
	// returns the index of the last entry whose effects are stored.
	Open(db *badger.DB) (applied uint64, err error)

	// Apply applies committed entries in order, writing through b (see
	// Batch): the engine commits b with the Ready's log writes, one fsync
	// for both. It must be deterministic: the same entries on the same
	// state give the same state on every replica. It must store the index
	// of the last entry in the same transaction as the changes, so a
	// restart neither applies an entry twice nor loses one; when it
	// commits b to make room, the part committed must hold whole entries
	// and the index of its last. In-memory state that readers trust is
	// published after the commit (Batch.AfterCommit): until then the
	// changes are not durable, and the replica stops if the commit fails.
	// Return an error only for a storage fault (badger failed to read or
	// commit): it stops the replica (docs/engine.md: recovery). Anything an
	// entry's content can cause (a bad record, a limit, a decode error)
	// must be that entry's Result, the same on every replica: an error
	// here would stop every replica at the same entry, and again at every
	// restart, since the entry stays in the log.
	Apply(b *Batch, entries []Entry) error

	// Snapshot returns a consistent point-in-time view of the whole state,
	// typically a badger read transaction. It may be called from another
	// goroutine while Apply runs; the view must not change under it.
	Snapshot() (Snapshot, error)

	// Restore replaces the entire state with the one read from r, as written
	// by Snapshot.WriteTo, and returns its applied index. It must stream: the
	// state may be far larger than memory. It may be called again with the
	// same input after a crash part-way through, so it must start by clearing
	// whatever state exists.
	Restore(r io.Reader) (applied uint64, err error)
}

// Snapshot is a consistent, point-in-time view of a state machine.
type Snapshot interface {
	// Index is the applied index the view reflects.
	Index() uint64
	// WriteTo streams the view. It must not hold the state in memory at once.
	WriteTo(w io.Writer) (int64, error)
	Close()
}
