package raftgroup

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Keys owned by the engine. They all start with 0x00; a state machine owns
// every key that does not.
var (
	keyHardState = []byte("\x00raft/hardstate")
	keySnapshot  = []byte("\x00raft/snapshot")  // latest snapshot marker (metadata only)
	keyCompacted = []byte("\x00raft/compacted") // index/term of the last entry deleted from the log
	keyRestore   = []byte("\x00raft/restore")   // a snapshot restore in progress
	keyIdentity  = []byte("\x00raft/identity")
	keyRemoved   = []byte("\x00raft/removed") // this replica applied its own removal
	prefixLog    = []byte("\x00raft/log/")
	prefixMember = []byte("\x00raft/member/")
)

// EngineKeyPrefix is the first byte of every key the engine owns.
const EngineKeyPrefix = 0x00

func logKey(i uint64) []byte {
	k := make([]byte, len(prefixLog)+8)
	copy(k, prefixLog)
	binary.BigEndian.PutUint64(k[len(prefixLog):], i)
	return k
}

func memberKey(id uint64) []byte {
	k := make([]byte, len(prefixMember)+8)
	copy(k, prefixMember)
	binary.BigEndian.PutUint64(k[len(prefixMember):], id)
	return k
}

// logStorage implements raft.Storage on badger. Writes happen only from the
// Ready loop; raft's goroutine reads concurrently, hence the lock.
//
// A small in-memory tail of recent entries serves the leader's reads when it
// replicates to followers, so the hot path rarely touches badger.
type logStorage struct {
	db *badger.DB

	mu   sync.RWMutex
	hard *pb.HardState
	// hardPending: hard differs from the stored one by its commit index
	// only (see save).
	hardPending bool
	snap        *pb.Snapshot // marker: metadata only, Data is empty
	compacted   struct{ index, term uint64 }
	last        uint64
	tail        []*pb.Entry // contiguous, ends at last; may be empty
	tailBytes   int

	syncs func() // called after every fsync, for counters
}

const maxTailBytes = 8 << 20

func openLogStorage(db *badger.DB) (*logStorage, error) {
	s := &logStorage{db: db, hard: &pb.HardState{}, snap: emptySnapshot(), syncs: func() {}}
	err := db.View(func(txn *badger.Txn) error {
		if err := getProto(txn, keyHardState, s.hard); err != nil {
			return err
		}
		if err := getProto(txn, keySnapshot, s.snap); err != nil {
			return err
		}
		var c pb.Entry // reuse Entry's Index/Term fields for the compaction point
		if err := getProto(txn, keyCompacted, &c); err != nil {
			return err
		}
		s.compacted.index, s.compacted.term = c.GetIndex(), c.GetTerm()
		s.last = s.compacted.index
		it := txn.NewIterator(badger.IteratorOptions{Reverse: true, Prefix: prefixLog})
		defer it.Close()
		it.Seek(logKey(^uint64(0)))
		if it.ValidForPrefix(prefixLog) {
			s.last = binary.BigEndian.Uint64(it.Item().Key()[len(prefixLog):])
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load raft log state: %w", err)
	}
	return s, nil
}

func emptySnapshot() *pb.Snapshot {
	return &pb.Snapshot{Metadata: &pb.SnapshotMetadata{ConfState: &pb.ConfState{}, Index: proto.Uint64(0), Term: proto.Uint64(0)}}
}

// getProto is GetProto for the engine's keys, where absent means "zero".
func getProto(txn *badger.Txn, key []byte, m proto.Message) error {
	_, err := GetProto(txn, key, m)
	return err
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err))
	}
	return b
}

// isEmpty reports whether nothing was ever persisted (a brand new replica).
func (s *logStorage) isEmpty() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last == 0 && s.snap.GetMetadata().GetIndex() == 0 && raft.IsEmptyHardState(s.hard)
}

func (s *logStorage) InitialState() (*pb.HardState, *pb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return proto.Clone(s.hard).(*pb.HardState), proto.Clone(s.snap.GetMetadata().GetConfState()).(*pb.ConfState), nil
}

func (s *logStorage) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.compacted.index + 1, nil
}

func (s *logStorage) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last, nil
}

func (s *logStorage) Snapshot() (*pb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return proto.Clone(s.snap).(*pb.Snapshot), nil
}

func (s *logStorage) snapshotIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.snap.GetMetadata().GetIndex()
}

func (s *logStorage) tailFirst() uint64 {
	if len(s.tail) == 0 {
		return s.last + 1
	}
	return s.tail[0].GetIndex()
}

func (s *logStorage) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i == s.compacted.index {
		return s.compacted.term, nil
	}
	if i < s.compacted.index {
		return 0, raft.ErrCompacted
	}
	if i > s.last {
		return 0, raft.ErrUnavailable
	}
	if tf := s.tailFirst(); i >= tf {
		return s.tail[i-tf].GetTerm(), nil
	}
	var e pb.Entry
	err := s.db.View(func(txn *badger.Txn) error { return getProto(txn, logKey(i), &e) })
	if err != nil {
		return 0, err
	}
	if e.GetIndex() != i {
		return 0, fmt.Errorf("raft log: entry %d missing", i)
	}
	return e.GetTerm(), nil
}

func (s *logStorage) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if lo <= s.compacted.index {
		return nil, raft.ErrCompacted
	}
	if hi > s.last+1 {
		return nil, fmt.Errorf("raft log: entries [%d,%d) past last index %d", lo, hi, s.last)
	}
	var out []*pb.Entry
	var size uint64
	add := func(e *pb.Entry) bool {
		size += uint64(proto.Size(e))
		if len(out) > 0 && size > maxSize {
			return false
		}
		out = append(out, e)
		return true
	}
	if tf := s.tailFirst(); lo >= tf {
		for i := lo; i < hi; i++ {
			if !add(s.tail[i-tf]) {
				break
			}
		}
		return out, nil
	}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, PrefetchSize: 64, Prefix: prefixLog})
		defer it.Close()
		for it.Seek(logKey(lo)); it.ValidForPrefix(prefixLog); it.Next() {
			var e pb.Entry
			if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, &e) }); err != nil {
				return err
			}
			if e.GetIndex() >= hi {
				break
			}
			if e.GetIndex() != lo+uint64(len(out)) {
				return fmt.Errorf("raft log: gap at %d", lo+uint64(len(out)))
			}
			if !add(&e) {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 && lo < hi {
		return nil, raft.ErrUnavailable
	}
	return out, nil
}

// save persists one Ready's hard state and entries alone, durable when it
// returns: stage in a batch of their own, committed.
func (s *logStorage) save(hs *pb.HardState, ents []*pb.Entry, sync bool) error {
	b := NewBatch(s.db)
	b.syncs = s.syncs
	defer b.Discard()
	if err := s.stage(b, hs, ents, sync); err != nil {
		return err
	}
	return b.Commit()
}

// stage writes one Ready's hard state and entries into b, for the Ready's
// one commit, which makes them durable (badger's SyncWrites): the engine's
// durability point, before which nothing from this Ready is sent or
// applied. The in-memory log moves at that commit (an AfterCommit). A
// Ready whose writes take more than a third of a badger transaction is
// written on its own first, in as many transactions as it takes, each
// durable: the state machine's writes need the rest (they commit their own
// past 1 MiB, of 2.4 MiB with 16 MiB memtables).
//
// A hard state that only moved the commit index, with no entries (raft
// asks no sync for it), is kept in memory and written with the next
// write: alone it would cost a sync, and a commit index lost in a crash is
// learned again from the leader (raft restarts from the applied index,
// which is at most the persisted commit).
func (s *logStorage) stage(b *Batch, hs *pb.HardState, ents []*pb.Entry, sync bool) error {
	hasHS := hs != nil && !raft.IsEmptyHardState(hs)
	if !hasHS && len(ents) == 0 {
		return nil
	}
	if !sync && len(ents) == 0 {
		s.mu.Lock()
		s.hard, s.hardPending = proto.Clone(hs).(*pb.HardState), true
		s.mu.Unlock()
		return nil
	}
	s.mu.RLock()
	if !hasHS && s.hardPending {
		hs, hasHS = proto.Clone(s.hard).(*pb.HardState), true
	}
	oldLast := s.last
	s.mu.RUnlock()
	ops := saveOps(hs, hasHS, ents, oldLast)
	var size batchSize
	for _, op := range ops {
		size.add(op.key, op.val)
	}
	var newLast uint64
	if len(ents) > 0 {
		newLast = ents[len(ents)-1].GetIndex()
	}
	moved := func() { s.moved(hs, hasHS, ents, newLast) }
	if int64(size.records) > s.db.MaxBatchCount()/3 || int64(size.bytes) > s.db.MaxBatchSize()/3 {
		if err := s.writeAlone(ops); err != nil {
			return err
		}
		s.syncs()
		moved()
		return nil
	}
	if err := writeOps(ops, b.set, b.del); err != nil {
		return err
	}
	b.AfterCommit(moved)
	return nil
}

// writeOps writes ops in order through set and del.
func writeOps(ops []logOp, set func(k, v []byte) error, del func(k []byte) error) error {
	for _, op := range ops {
		var err error
		if op.del {
			err = del(op.key)
		} else {
			err = set(op.key, op.val)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeAlone writes a large Ready's log writes in a badger write batch,
// which splits them into transactions, each durable (badger's SyncWrites)
// and each a prefix saveOps keeps restartable.
func (s *logStorage) writeAlone(ops []logOp) error {
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	if err := writeOps(ops, wb.Set, wb.Delete); err != nil {
		return err
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("raft log write: %w", err)
	}
	return nil
}

// moved updates the in-memory log once a Ready's writes are durable.
func (s *logStorage) moved(hs *pb.HardState, hasHS bool, ents []*pb.Entry, newLast uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hasHS {
		s.hard, s.hardPending = proto.Clone(hs).(*pb.HardState), false
	}
	if len(ents) > 0 {
		first := ents[0].GetIndex()
		if tf := s.tailFirst(); first >= tf && first <= s.last+1 {
			for _, e := range s.tail[first-tf:] {
				s.tailBytes -= proto.Size(e)
			}
			s.tail = s.tail[:first-tf]
		} else {
			s.tail, s.tailBytes = nil, 0
		}
		for _, e := range ents {
			s.tail = append(s.tail, e)
			s.tailBytes += proto.Size(e)
		}
		s.last = newLast
		for s.tailBytes > maxTailBytes && len(s.tail) > 1 {
			s.tailBytes -= proto.Size(s.tail[0])
			s.tail[0] = nil
			s.tail = s.tail[1:]
		}
	}
}

// logOp is one write of save, in the order it reaches the disk.
type logOp struct {
	key, val []byte
	del      bool
}

// saveOps orders one Ready's writes so that every prefix of them is a state
// raft can restart from: badger splits a large batch into transactions, each
// atomic, and a power cut keeps a prefix of them.
//
//   - A conflicting suffix (a new leader overwrites entries from first on)
//     is deleted, last entry first, before the new entries are written, so
//     the log is always a contiguous run with terms that never go down.
//   - The hard state comes last, as in etcd's WAL: its commit index may
//     name entries of this very Ready, and a commit past the durable log
//     is a replica that cannot start. Entries durable without their term
//     or vote are safe: nothing of this Ready was acknowledged, and a vote
//     that was never recorded was never sent.
func saveOps(hs *pb.HardState, hasHS bool, ents []*pb.Entry, oldLast uint64) []logOp {
	var ops []logOp
	if len(ents) > 0 {
		first := ents[0].GetIndex()
		for i := oldLast; i >= first; i-- { // from the end: no gap midway
			ops = append(ops, logOp{key: logKey(i), del: true})
		}
		for _, e := range ents {
			ops = append(ops, logOp{key: logKey(e.GetIndex()), val: mustMarshal(e)})
		}
	}
	if hasHS {
		ops = append(ops, logOp{key: keyHardState, val: mustMarshal(hs)})
	}
	return ops
}

// setSnapshot records a new snapshot marker; the state machine must already
// hold (durably) every entry up to its index.
//
// raft restarts from the marker's index as applied, which must not pass the
// stored commit index: a commit index kept in memory only (see save) is
// written with the marker.
func (s *logStorage) setSnapshot(meta *pb.SnapshotMetadata) error {
	snap := &pb.Snapshot{Metadata: proto.Clone(meta).(*pb.SnapshotMetadata)}
	s.mu.RLock()
	pending := s.hardPending
	hs := proto.Clone(s.hard).(*pb.HardState)
	s.mu.RUnlock()
	err := s.db.Update(func(txn *badger.Txn) error {
		if pending {
			if err := txn.Set(keyHardState, mustMarshal(hs)); err != nil {
				return err
			}
		}
		return txn.Set(keySnapshot, mustMarshal(snap))
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.snap = snap
	if pending && proto.Equal(s.hard, hs) {
		s.hardPending = false
	}
	s.mu.Unlock()
	return nil
}

// compact deletes log entries up to and including index. The deletes are
// chunked so they never stall other writers (badger's DropPrefix would).
func (s *logStorage) compact(index uint64) error {
	s.mu.RLock()
	from := s.compacted.index + 1
	if index <= s.compacted.index {
		s.mu.RUnlock()
		return nil
	}
	if index > s.last {
		s.mu.RUnlock()
		return fmt.Errorf("compact %d past last index %d", index, s.last)
	}
	s.mu.RUnlock()
	term, err := s.Term(index)
	if err != nil {
		return err
	}
	// Raft learns that the entries are gone before they go: a reader that
	// saw the old first index could otherwise find a gap where it expects
	// entries, which raft treats as fatal. Readers hold the read lock for
	// their whole read, so none is still reading when the deletes start.
	s.mu.Lock()
	s.compacted.index, s.compacted.term = index, term
	for len(s.tail) > 0 && s.tail[0].GetIndex() <= index {
		s.tailBytes -= proto.Size(s.tail[0])
		s.tail[0] = nil
		s.tail = s.tail[1:]
	}
	s.mu.Unlock()
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	if err := wb.Set(keyCompacted, mustMarshal(&pb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term)})); err != nil {
		return err
	}
	for i := from; i <= index; i++ {
		if err := wb.Delete(logKey(i)); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// applySnapshot replaces the whole log by a received snapshot: the log is
// emptied and starts after the snapshot's index. Must be durable before the
// Ready that carried the snapshot is acknowledged.
func (s *logStorage) applySnapshot(snap *pb.Snapshot) error {
	meta := snap.GetMetadata()
	s.mu.RLock()
	from, to := s.compacted.index+1, s.last
	s.mu.RUnlock()
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	marker := &pb.Snapshot{Metadata: proto.Clone(meta).(*pb.SnapshotMetadata)}
	if err := wb.Set(keySnapshot, mustMarshal(marker)); err != nil {
		return err
	}
	if err := wb.Set(keyCompacted, mustMarshal(&pb.Entry{Index: proto.Uint64(meta.GetIndex()), Term: proto.Uint64(meta.GetTerm())})); err != nil {
		return err
	}
	for i := from; i <= to; i++ {
		if err := wb.Delete(logKey(i)); err != nil {
			return err
		}
	}
	if err := wb.Delete(keyRestore); err != nil {
		return err
	}
	// raft refuses to start with a commit index below the snapshot's, so the
	// hard state moves with the snapshot in the same batch.
	s.mu.RLock()
	hs := proto.Clone(s.hard).(*pb.HardState)
	s.mu.RUnlock()
	if hs.GetCommit() < meta.GetIndex() {
		hs.Commit = proto.Uint64(meta.GetIndex())
	}
	if hs.GetTerm() < meta.GetTerm() {
		hs.Term = proto.Uint64(meta.GetTerm())
	}
	if err := wb.Set(keyHardState, mustMarshal(hs)); err != nil {
		return err
	}
	if err := wb.Flush(); err != nil {
		return err
	}
	if err := s.db.Sync(); err != nil {
		return err
	}
	s.syncs()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hard, s.hardPending = hs, false
	s.snap = marker
	s.compacted.index, s.compacted.term = meta.GetIndex(), meta.GetTerm()
	s.last = meta.GetIndex()
	s.tail, s.tailBytes = nil, 0
	return nil
}
