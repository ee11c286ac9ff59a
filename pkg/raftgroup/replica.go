package raftgroup

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Replica is one member of a Raft group: the Ready loop, its storage, its
// state machine and its transport.
type Replica struct {
	cfg   Config
	log   *slog.Logger
	db    *badger.DB
	fault *syncFault // an fsync failure badger logged but did not return
	store *logStorage
	sm    StateMachine
	node  raft.Node
	trans *transport

	// Owned by the Ready loop.
	confState   *pb.ConfState
	smApplied   uint64 // the state machine's applied index
	raftApplied uint64 // last index raft handed us (committed entries or snapshot)
	spool       spool
	// Sizes of the applied entries the log still holds (as far as seen since
	// the start or the last restored snapshot), oldest first, and the bytes
	// applied since the last marker: the size-based compaction policy.
	logSizes       []entrySize
	bytesSinceSnap uint64

	applied atomic.Uint64 // max(raft applied, smApplied): reads wait on it
	leader  atomic.Uint64
	term    atomic.Uint64
	commit  atomic.Uint64
	// leaderCommit is the highest commit index a leader has sent this
	// replica (MsgApp and MsgHeartbeat carry it): a follower that lags in
	// replication has a local commit that lags too, this does not.
	leaderCommit atomic.Uint64
	stateType    atomic.Int32 // raft.StateType
	removed      atomic.Bool
	roleMu       sync.Mutex
	rolec        chan struct{} // closed and replaced when the role changes (RoleChanged)
	ledUntil     time.Time     // when it last stopped leading (LedUntil)

	membersMu sync.RWMutex
	members   map[uint64]string // id -> advertised address
	conf      *pb.ConfState     // copy of confState for readers

	props   *proposals
	clock   *groupClock // peers' wall clocks, entry stamps
	heard   *contacts   // peers' last Raft messages (Status)
	reads   *readBatcher
	applyW  *indexWaiter
	confMu  sync.Mutex // one membership change at a time from this replica
	metrics Counters

	stopc   chan struct{}
	donec   chan struct{}
	gcDone  chan struct{} // closed when valueLogGC has returned
	clkDone chan struct{} // closed when keepClock has returned
	stopErr error
	closeMu sync.Mutex
	closed  bool
}

// Counters are cumulative, process-lifetime counters.
type Counters struct {
	Proposals, ProposalsFailed, Fsyncs, ReadIndexRounds, ReadIndexReads atomic.Uint64
	SnapshotsSent, SnapshotsReceived, MessagesDropped, AppliedEntries   atomic.Uint64
	// ReadIndexNanos is the total time callers waited in ReadIndex
	// (divide by ReadIndexReads for the mean).
	ReadIndexNanos atomic.Uint64
	// MaxTickGapNanos is the longest time between two Raft ticks: how long
	// the Ready loop was busy (persisting, applying) while time passed. A
	// leader sends heartbeats only from ticks, so a gap near the election
	// timeout means followers may start an election.
	MaxTickGapNanos atomic.Uint64
	// MaxReadyNanos is the longest time one Ready took to handle. With
	// ticks taken first (run), MaxTickGapNanos stays within it plus about
	// one tick.
	MaxReadyNanos atomic.Uint64
}

// Open starts a replica on cfg.Dir: a new group member (bootstrapping or
// joining) if the dir is empty, else it resumes from its log and state.
func Open(cfg Config, sm StateMachine) (*Replica, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("raftgroup: data dir: %w", err)
	}
	log := cfg.Logger.With("group", cfg.GroupID, "replica", cfg.ID)
	fault := &syncFault{}
	opts := badgerOptions(filepath.Join(cfg.Dir, "db"), log)
	opts.Logger = badgerLogger{l: log, fault: fault}
	db, err := openBadger(opts, log)
	if err != nil {
		return nil, fmt.Errorf("raftgroup: open badger in %s: %w", cfg.Dir, err)
	}
	r := &Replica{
		cfg: cfg, log: log, db: db, sm: sm, fault: fault,
		members: map[uint64]string{},
		stopc:   make(chan struct{}),
		donec:   make(chan struct{}),
		rolec:   make(chan struct{}),
		applyW:  newIndexWaiter(),
	}
	r.props = newProposals()
	r.clock = newGroupClock(cfg.ID, cfg.Now)
	r.heard = newContacts()
	if err := r.init(); err != nil {
		db.Close()
		return nil, err
	}
	r.reads = newReadBatcher(r)
	r.trans = newTransport(r)
	r.gcDone = make(chan struct{})
	r.clkDone = make(chan struct{})
	go r.run()
	go r.reads.run()
	go r.valueLogGC(r.stopc, r.gcDone)
	go r.keepClock(r.stopc, r.clkDone)
	return r, nil
}

func (r *Replica) init() error {
	if err := r.checkIdentity(); err != nil {
		return err
	}
	store, err := openLogStorage(r.db)
	if err != nil {
		return err
	}
	store.syncs = func() { r.metrics.Fsyncs.Add(1) }
	r.store = store
	fresh := store.isEmpty()

	applied, err := r.sm.Open(r.db)
	if err != nil {
		return fmt.Errorf("raftgroup: open state machine: %w", err)
	}
	r.smApplied = applied
	if err := r.finishPendingRestore(); err != nil {
		return err
	}
	if err := r.checkDurable(fresh); err != nil {
		return err
	}
	if err := r.observeLastEntry(); err != nil {
		return err
	}
	if err := r.loadMembers(); err != nil {
		return err
	}
	if err := r.db.View(func(txn *badger.Txn) error {
		_, err := txn.Get(keyRemoved)
		if err == nil {
			r.removed.Store(true)
		}
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	for _, p := range r.cfg.Peers {
		if _, ok := r.members[p.ID]; !ok && p.Addr != "" {
			r.members[p.ID] = p.Addr
		}
	}
	if r.cfg.Addr != "" {
		r.members[r.cfg.ID] = r.cfg.Addr
	}

	snap, _ := store.Snapshot()
	r.confState = proto.Clone(snap.GetMetadata().GetConfState()).(*pb.ConfState)
	r.conf = proto.Clone(r.confState).(*pb.ConfState)
	// MaxCommittedSizePerReady: one Ready's committed entries are one
	// StateMachine.Apply call, which state machines make one badger
	// transaction; keep it well under badger's limit (15% of MemTableSize,
	// 2.4 MiB, see badgerOptions). At 8 MiB, ~40 commands of 60 KB committed
	// in one Ready failed with ErrTxnTooBig and stopped the replica for good.
	// MaxInflightMsgs: raft sends one MsgApp per proposal while the window is
	// open, so a small window is what batches entries into few messages under
	// load (16 vs 256: ~0.6 instead of ~6 messages per proposal with 256
	// concurrent proposers, ~25% less CPU per proposal; BenchmarkPropose).
	rc := &raft.Config{
		ID:                        r.cfg.ID,
		ElectionTick:              r.cfg.ElectionTicks,
		HeartbeatTick:             r.cfg.HeartbeatTicks,
		Storage:                   store,
		Applied:                   snap.GetMetadata().GetIndex(),
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  1 << 20, // see above
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           16, // see above
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{r.log},
	}
	r.raftApplied = snap.GetMetadata().GetIndex()
	r.applied.Store(max(r.raftApplied, r.smApplied))
	switch {
	case fresh && !r.cfg.Join:
		if len(r.cfg.Peers) == 0 {
			return errors.New("raftgroup: empty data dir: give the initial peers to bootstrap, or Join an existing group")
		}
		var peers []raft.Peer
		found := false
		for _, p := range r.cfg.Peers {
			if p.ID == 0 {
				return errors.New("raftgroup: peer id 0 is invalid")
			}
			found = found || p.ID == r.cfg.ID
			peers = append(peers, raft.Peer{ID: p.ID, Context: []byte(p.Addr)})
		}
		if !found {
			return fmt.Errorf("raftgroup: replica %d is not among the initial peers", r.cfg.ID)
		}
		r.log.Info("bootstrapping new group", "peers", len(peers))
		r.node = raft.StartNode(rc, peers)
	default:
		if fresh {
			r.log.Info("starting empty, waiting to be added to the group")
		}
		r.node = raft.RestartNode(rc)
	}
	return nil
}

// checkIdentity refuses a data dir that belongs to another group or replica:
// reusing another member's state under a new id would corrupt both.
func (r *Replica) checkIdentity() error {
	want := make([]byte, 16)
	binary.BigEndian.PutUint64(want, r.cfg.GroupID)
	binary.BigEndian.PutUint64(want[8:], r.cfg.ID)
	return r.db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get(keyIdentity)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return txn.Set(keyIdentity, want)
		}
		if err != nil {
			return err
		}
		got, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		if len(got) == 16 && string(got) != string(want) {
			return fmt.Errorf("raftgroup: data dir %s belongs to group %d replica %d, not group %d replica %d",
				r.cfg.Dir, binary.BigEndian.Uint64(got), binary.BigEndian.Uint64(got[8:]), r.cfg.GroupID, r.cfg.ID)
		}
		return nil
	})
}

func (r *Replica) loadMembers() error {
	return r.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixMember, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			id := binary.BigEndian.Uint64(it.Item().Key()[len(prefixMember):])
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			r.members[id] = string(v)
		}
		return nil
	})
}

// run is the Ready loop: persist, send, apply, advance.
func (r *Replica) run() {
	defer close(r.donec)
	ticker := time.NewTicker(r.cfg.TickInterval)
	defer ticker.Stop()
	lastTick := time.Now()
	for {
		select {
		case <-ticker.C:
			r.tick(&lastTick)
		case rd := <-r.node.Ready():
			// A tick that came due while the last Ready was handled goes
			// first: select picks at random among ready cases, so a run of
			// Readys that each take long (large entries) could otherwise
			// starve the clock, and a leader heartbeats only from ticks.
			select {
			case <-ticker.C:
				r.tick(&lastTick)
			default:
			}
			start := time.Now()
			err := r.handleReady(rd)
			if d := uint64(time.Since(start)); d > r.metrics.MaxReadyNanos.Load() {
				r.metrics.MaxReadyNanos.Store(d)
			}
			if err != nil {
				r.fail(err)
				return
			}
			r.node.Advance()
		case <-r.stopc:
			return
		}
	}
}

// tick advances raft's clock and records the longest gap between ticks.
func (r *Replica) tick(last *time.Time) {
	now := time.Now()
	if gap := uint64(now.Sub(*last)); gap > r.metrics.MaxTickGapNanos.Load() {
		r.metrics.MaxTickGapNanos.Store(gap)
	}
	*last = now
	r.node.Tick()
}

// fail stops the replica on a storage fault (see docs/engine.md for the
// recovery). The message is cut short: errors from storage may quote whole
// keys or values (badger hex-dumps a key it refuses).
func (r *Replica) fail(err error) {
	r.stopErr = fmt.Errorf("%s", shortError(err))
	r.log.Error("replica stopped on a fatal error", "err", r.stopErr.Error())
	r.props.failAll(outcomeUnknown("replica failed: %v", r.stopErr))
}

// maxErrorText bounds an error quoted in a log line or sent to clients.
const maxErrorText = 300

// shortError is err's text, its first line, at most maxErrorText bytes.
func shortError(err error) string {
	s := err.Error()
	cut := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, cut = s[:i], true
	}
	if len(s) > maxErrorText {
		s, cut = s[:maxErrorText], true
	}
	if cut {
		s = strings.ToValidUTF8(s, "") + " …(cut)"
	}
	return s
}

func (r *Replica) handleReady(rd raft.Ready) error {
	if rd.SoftState != nil {
		r.leader.Store(rd.SoftState.Lead)
		if was := raft.StateType(r.stateType.Swap(int32(rd.SoftState.RaftState))); was != rd.SoftState.RaftState {
			if was == raft.StateLeader {
				r.roleMu.Lock()
				r.ledUntil = time.Now()
				r.roleMu.Unlock()
			}
			r.roleChanged()
		}
	}
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		r.term.Store(rd.HardState.GetTerm())
		r.commit.Store(rd.HardState.GetCommit())
	}

	// A leader sends before it persists, as etcd's server does (Raft
	// thesis 10.2.1): its heartbeats and appends then leave before a large
	// entry's write and fsync, not after. Raft counts the leader's own
	// copy toward a commit only at Advance (its self-ack waits for it), so
	// an entry is committed with the leader's copy only once this Ready has
	// persisted it. Followers and candidates answer (votes, append acks)
	// only from durable state.
	leading := raft.StateType(r.stateType.Load()) == raft.StateLeader
	if leading {
		r.trans.send(rd.Messages)
	}

	// 1. Persist and apply, one commit: the snapshot first (its own
	// writes), then the hard state and entries, and the state machine's
	// changes for the committed entries in the same transaction, so the
	// Ready costs one fsync. Entries committed in this Ready may be
	// among those it appends; they commit together.
	if rd.Snapshot != nil && !raft.IsEmptySnap(rd.Snapshot) {
		if err := r.installSnapshot(rd.Snapshot); err != nil {
			return fmt.Errorf("install snapshot: %w", err)
		}
	}
	b := NewBatch(r.db)
	b.syncs = r.store.syncs
	defer b.Discard()
	if err := r.store.stage(b, rd.HardState, rd.Entries, rd.MustSync); err != nil {
		return err
	}
	b.AfterCommit(func() {
		r.props.noteAppended(rd.Entries)
		for _, e := range rd.Entries {
			r.clock.observe(entryTime(e))
		}
	})
	if err := r.apply(b, rd.CommittedEntries); err != nil {
		return err
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("raft log and apply: %w", err)
	}
	if err := r.fault.check(); err != nil {
		return err
	}

	// 2. Send, now that our own copy is durable (a leader sent before).
	if !leading {
		r.trans.send(rd.Messages)
	}

	// 3. Hand read states to the read batcher.
	for _, rs := range rd.ReadStates {
		r.reads.readState(rs)
	}
	return r.maybeCompact()
}

// Close stops the replica. It does not transfer leadership: a caller that
// wants a graceful handover calls TransferLeadership first.
func (r *Replica) Close() error {
	r.closeMu.Lock()
	if r.closed {
		r.closeMu.Unlock()
		return nil
	}
	r.closed = true
	r.closeMu.Unlock()
	close(r.stopc)
	<-r.donec
	<-r.gcDone
	<-r.clkDone
	r.leader.Store(0)
	if raft.StateType(r.stateType.Swap(int32(raft.StateFollower))) != raft.StateFollower {
		r.roleChanged()
	}
	r.node.Stop()
	r.trans.stop()
	r.reads.stop()
	r.props.failAll(outcomeUnknown("replica stopped"))
	return r.db.Close()
}

// Err returns the fatal error that stopped the replica, if any.
func (r *Replica) Err() error {
	select {
	case <-r.donec:
		return r.stopErr
	default:
		return nil
	}
}

// DB returns the replica's badger DB (shared with the state machine).
func (r *Replica) DB() *badger.DB { return r.db }

// ID returns this replica's id.
func (r *Replica) ID() uint64 { return r.cfg.ID }

// Leader returns the current leader's id and address, 0 and "" if unknown.
func (r *Replica) Leader() (uint64, string) {
	l := r.leader.Load()
	if l == 0 {
		return 0, ""
	}
	return l, r.memberAddr(l)
}

// IsLeader reports whether this replica currently believes it leads.
func (r *Replica) IsLeader() bool {
	return raft.StateType(r.stateType.Load()) == raft.StateLeader
}

// RoleChanged returns a channel closed at this replica's next change of
// Raft role (follower, candidate, leader). Loops that work only while
// leading wait on it instead of polling IsLeader, so followers stay idle.
func (r *Replica) RoleChanged() <-chan struct{} {
	r.roleMu.Lock()
	defer r.roleMu.Unlock()
	return r.rolec
}

// AwaitLeading blocks until this replica leads, and reports false if done
// closes first: a leader-only loop's follower wait, with no timer.
func (r *Replica) AwaitLeading(done <-chan struct{}) bool {
	for {
		changed := r.RoleChanged() // before the check: no change is missed
		if r.IsLeader() {
			return true
		}
		select {
		case <-changed:
		case <-done:
			return false
		}
	}
}

// LedUntil is when this replica last stopped leading; zero if it has not
// led since it started.
func (r *Replica) LedUntil() time.Time {
	r.roleMu.Lock()
	defer r.roleMu.Unlock()
	return r.ledUntil
}

func (r *Replica) roleChanged() {
	r.roleMu.Lock()
	close(r.rolec)
	r.rolec = make(chan struct{})
	r.roleMu.Unlock()
}

// Term is the current Raft term.
func (r *Replica) Term() uint64 { return r.term.Load() }

// AppliedIndex is the highest index whose effects are in the state machine.
func (r *Replica) AppliedIndex() uint64 { return r.applied.Load() }

func (r *Replica) memberAddr(id uint64) string {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	return r.members[id]
}

func (r *Replica) notLeader() error {
	id, addr := r.Leader()
	if id == r.cfg.ID {
		id, addr = 0, ""
	}
	return &NotLeaderError{Leader: id, Addr: addr}
}

// WaitApplied blocks until the applied index reaches index.
func (r *Replica) WaitApplied(ctx context.Context, index uint64) error {
	return r.applyW.wait(ctx, index, r.donec)
}

func randomUint64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return binary.BigEndian.Uint64(b[:])
}

// Done is closed when the replica's Ready loop has stopped (Close, or a
// fatal error: see Err).
func (r *Replica) Done() <-chan struct{} { return r.donec }
