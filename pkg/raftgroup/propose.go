package raftgroup

import (
	"context"
	"encoding/binary"
	"errors"
	"sort"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Every proposed entry starts with a header: a magic byte, the proposer's id
// (a random per-process nonce plus a sequence number, so ids never collide
// across replicas or restarts) and the leader's clock.
const (
	headerMagic = 0xA7
	headerLen   = 1 + 8 + 8 + 8
)

type proposalID struct{ nonce, seq uint64 }

type header struct {
	id   proposalID
	time time.Time
}

func encodeHeader(h header, payload []byte) []byte {
	b := make([]byte, headerLen+len(payload))
	b[0] = headerMagic
	binary.BigEndian.PutUint64(b[1:], h.id.nonce)
	binary.BigEndian.PutUint64(b[9:], h.id.seq)
	binary.BigEndian.PutUint64(b[17:], uint64(unixNanos(h.time)))
	copy(b[headerLen:], payload)
	return b
}

func decodeHeader(b []byte) (header, []byte, bool) {
	if len(b) < headerLen || b[0] != headerMagic {
		return header{}, nil, false
	}
	return header{
		id:   proposalID{binary.BigEndian.Uint64(b[1:]), binary.BigEndian.Uint64(b[9:])},
		time: fromUnixNanos(int64(binary.BigEndian.Uint64(b[17:]))),
	}, b[headerLen:], true
}

type result struct {
	val any
	err error
}

type waiter struct {
	ch          chan result
	index, term uint64 // where the entry landed in our log; 0 until known
}

// proposals matches applied entries to the callers waiting for them. A caller
// gets the result of its own entry, identified by id and checked against the
// index and term the entry was appended at, never another entry's result.
type proposals struct {
	mu      sync.Mutex
	nonce   uint64
	seq     uint64
	byID    map[proposalID]*waiter
	byIndex map[uint64]proposalID
}

func newProposals() *proposals {
	return &proposals{nonce: randomUint64(), byID: map[proposalID]*waiter{}, byIndex: map[uint64]proposalID{}}
}

func (p *proposals) register() (proposalID, *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	id := proposalID{p.nonce, p.seq}
	w := &waiter{ch: make(chan result, 1)}
	p.byID[id] = w
	return id, w
}

func (p *proposals) cancel(id proposalID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.byID[id]; ok {
		delete(p.byID, id)
		if w.index != 0 {
			delete(p.byIndex, w.index)
		}
	}
}

// noteAppended records where this leader's proposals landed in the log.
func (p *proposals) noteAppended(ents []*pb.Entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.byID) == 0 {
		return
	}
	for _, e := range ents {
		id, ok := entryID(e)
		if !ok || id.nonce != p.nonce {
			continue
		}
		if w, ok := p.byID[id]; ok {
			if w.index != 0 {
				delete(p.byIndex, w.index)
			}
			w.index, w.term = e.GetIndex(), e.GetTerm()
			p.byIndex[w.index] = id
		}
	}
}

func entryID(e *pb.Entry) (proposalID, bool) {
	switch e.GetType() {
	case pb.EntryNormal:
		h, _, ok := decodeHeader(e.GetData())
		return h.id, ok
	case pb.EntryConfChangeV2:
		// The context sits inside the marshaled ConfChangeV2; such entries are
		// rare, so decode fully.
		var cc pb.ConfChangeV2
		if err := proto.Unmarshal(e.GetData(), &cc); err == nil {
			h, _, ok := decodeHeader(cc.GetContext())
			return h.id, ok
		}
	}
	return proposalID{}, false
}

// resolveApplied is called for every applied entry, in order. id is the
// entry's proposal id (zero if none). replayed marks entries whose effects
// were already in the state machine, so their result is unknown.
func (p *proposals) resolveApplied(index, term uint64, id proposalID, val any, replayed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.byID) == 0 {
		return
	}
	// Someone else's entry took the index our proposal was appended at: ours
	// was overwritten by a new leader and can never commit.
	if other, ok := p.byIndex[index]; ok && other != id {
		if w := p.byID[other]; w != nil && w.term != term {
			delete(p.byID, other)
			w.ch <- result{err: notExecuted("entry %d (term %d) was overwritten by a new leader's log", index, w.term)}
		}
		delete(p.byIndex, index)
	}
	if id.nonce != p.nonce {
		return
	}
	w, ok := p.byID[id]
	if !ok {
		return
	}
	delete(p.byID, id)
	delete(p.byIndex, index)
	if w.index != 0 && (w.index != index || w.term != term) {
		w.ch <- result{err: outcomeUnknown("entry applied at %d/%d, expected %d/%d", index, term, w.index, w.term)}
		return
	}
	if replayed {
		w.ch <- result{err: outcomeUnknown("entry %d was applied through a snapshot; its result is not available", index)}
		return
	}
	w.ch <- result{val: val}
}

func (p *proposals) failAll(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, w := range p.byID {
		w.ch <- result{err: err}
		delete(p.byID, id)
	}
	clear(p.byIndex)
}

// Propose replicates cmd and returns the state machine's result for it.
//
// Errors wrap shardkvpb.ErrNotExecuted (safe to retry; a *NotLeaderError
// names the leader) or shardkvpb.ErrOutcomeUnknown (the command may still
// apply).
func (r *Replica) Propose(ctx context.Context, cmd []byte) (any, error) {
	return r.ProposeNotify(ctx, cmd, nil)
}

// ProposeNotify is Propose; appended (if not nil) runs once the command is
// in the leader's log, ahead of anything proposed after that, before it
// commits.
func (r *Replica) ProposeNotify(ctx context.Context, cmd []byte, appended func()) (any, error) {
	if len(cmd) > r.cfg.MaxCommandBytes {
		return nil, errors.Join(notExecuted("command of %d bytes exceeds the limit of %d bytes", len(cmd), r.cfg.MaxCommandBytes), errTooLarge)
	}
	if r.Err() != nil || r.isClosed() {
		return nil, notExecuted("%v", ErrStopped)
	}
	if !r.IsLeader() {
		return nil, r.notLeader()
	}
	r.metrics.Proposals.Add(1)
	id, w := r.props.register()
	data := encodeHeader(header{id: id, time: r.stampNow()}, cmd)
	if err := r.node.Propose(ctx, data); err != nil {
		r.props.cancel(id)
		r.metrics.ProposalsFailed.Add(1)
		if errors.Is(err, raft.ErrProposalDropped) {
			if !r.IsLeader() {
				return nil, r.notLeader()
			}
			return nil, notExecuted("proposal dropped by raft (leadership transfer or too many uncommitted entries)")
		}
		return nil, outcomeUnknown("propose: %v", err)
	}
	if appended != nil {
		appended()
	}
	return r.waitResult(ctx, id, w)
}

func (r *Replica) waitResult(ctx context.Context, id proposalID, w *waiter) (any, error) {
	select {
	case res := <-w.ch:
		if res.err != nil {
			r.metrics.ProposalsFailed.Add(1)
		}
		return res.val, res.err
	case <-ctx.Done():
		r.props.cancel(id)
		r.metrics.ProposalsFailed.Add(1)
		return nil, outcomeUnknown("%v while waiting for the entry to apply", ctx.Err())
	case <-r.donec:
		select {
		case res := <-w.ch:
			return res.val, res.err
		default:
		}
		r.props.cancel(id)
		return nil, outcomeUnknown("replica stopped while waiting for the entry to apply")
	}
}

func (r *Replica) isClosed() bool {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	return r.closed
}

// indexWaiter wakes callers once the applied index reaches theirs.
type indexWaiter struct {
	mu      sync.Mutex
	reached uint64
	waits   []indexWait // sorted by index
}

type indexWait struct {
	index uint64
	ch    chan struct{}
}

func newIndexWaiter() *indexWaiter { return &indexWaiter{} }

func (iw *indexWaiter) advance(to uint64) {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	if to <= iw.reached {
		return
	}
	iw.reached = to
	n := 0
	for n < len(iw.waits) && iw.waits[n].index <= to {
		close(iw.waits[n].ch)
		n++
	}
	iw.waits = iw.waits[n:]
}

func (iw *indexWaiter) wait(ctx context.Context, index uint64, stopped <-chan struct{}) error {
	iw.mu.Lock()
	if index <= iw.reached {
		iw.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	i := sort.Search(len(iw.waits), func(i int) bool { return iw.waits[i].index > index })
	iw.waits = append(iw.waits, indexWait{})
	copy(iw.waits[i+1:], iw.waits[i:])
	iw.waits[i] = indexWait{index, ch}
	iw.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stopped:
		return ErrStopped
	}
}
