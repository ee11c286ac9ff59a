package raftgroup

import (
	"fmt"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// apply hands committed entries to the state machine, writing into b, and
// membership changes to raft; once b commits, it resolves the proposals
// they answer.
func (r *Replica) apply(b *Batch, ents []*pb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	batch := make([]Entry, 0, len(ents))
	var ids []proposalID
	type replayed struct {
		index, term uint64
		id          proposalID
	}
	var skipped []replayed
	for _, e := range ents {
		r.logSizes = append(r.logSizes, entrySize{e.GetIndex(), uint64(len(e.GetData()))})
		r.bytesSinceSnap += uint64(len(e.GetData()))
		ent := Entry{Index: e.GetIndex(), Term: e.GetTerm()}
		var id proposalID
		switch e.GetType() {
		case pb.EntryNormal:
			if h, cmd, ok := decodeHeader(e.GetData()); ok {
				id, ent.Cmd, ent.Time = h.id, cmd, h.time
			} else if t, ok := decodeClockEntry(e.GetData()); ok {
				ent.Time = t
			}
		case pb.EntryConfChange, pb.EntryConfChangeV2:
			var err error
			if id, err = r.applyConfChange(e); err != nil {
				return err
			}
		}
		if ent.Index <= r.smApplied {
			// Already in the state machine (replay after restart, or covered
			// by a restored snapshot). Its result is gone; only tell the
			// proposer, if any, that it did execute.
			skipped = append(skipped, replayed{ent.Index, ent.Term, id})
			continue
		}
		batch = append(batch, ent)
		ids = append(ids, id)
	}
	if len(batch) > 0 {
		if err := r.sm.Apply(b, batch); err != nil {
			return fmt.Errorf("state machine apply [%d,%d]: %w", batch[0].Index, batch[len(batch)-1].Index, err)
		}
		r.smApplied = batch[len(batch)-1].Index
	}
	last := ents[len(ents)-1].GetIndex()
	r.raftApplied = last
	// Proposers hear of their entries, and readers may read them, only
	// once they are durable.
	b.AfterCommit(func() {
		for _, s := range skipped {
			r.props.resolveApplied(s.index, s.term, s.id, nil, true)
		}
		r.metrics.AppliedEntries.Add(uint64(len(batch)))
		for i := range batch {
			r.props.resolveApplied(batch[i].Index, batch[i].Term, ids[i], batch[i].Result, false)
		}
		r.applied.Store(max(last, r.smApplied))
		r.applyW.advance(r.applied.Load())
	})
	return nil
}

func (r *Replica) applyConfChange(e *pb.Entry) (proposalID, error) {
	var cc pb.ConfChangeI
	var ctxData []byte
	if e.GetType() == pb.EntryConfChange {
		var c pb.ConfChange
		if err := proto.Unmarshal(e.GetData(), &c); err != nil {
			return proposalID{}, err
		}
		cc, ctxData = &c, c.GetContext()
	} else {
		var c pb.ConfChangeV2
		if err := proto.Unmarshal(e.GetData(), &c); err != nil {
			return proposalID{}, err
		}
		cc, ctxData = &c, c.GetContext()
	}
	var id proposalID
	addr := string(ctxData) // bootstrap entries carry just the address
	if h, rest, ok := decodeHeader(ctxData); ok {
		id, addr = h.id, string(rest)
	}
	r.confState = r.node.ApplyConfChange(cc)
	v2 := cc.AsV2()
	wb := r.db.NewWriteBatch()
	defer wb.Cancel()
	r.membersMu.Lock()
	for _, ch := range v2.GetChanges() {
		nid := ch.GetNodeId()
		switch ch.GetType() {
		case pb.ConfChangeAddNode, pb.ConfChangeAddLearnerNode:
			if addr != "" {
				r.members[nid] = addr
				if err := wb.Set(memberKey(nid), []byte(addr)); err != nil {
					r.membersMu.Unlock()
					return id, err
				}
			}
		case pb.ConfChangeRemoveNode:
			delete(r.members, nid)
			if err := wb.Delete(memberKey(nid)); err != nil {
				r.membersMu.Unlock()
				return id, err
			}
			if nid == r.cfg.ID {
				r.removed.Store(true)
				r.log.Warn("this replica was removed from the group")
				// Kept across restarts: a later snapshot marker no longer
				// replays this entry.
				if err := wb.Set(keyRemoved, []byte{1}); err != nil {
					r.membersMu.Unlock()
					return id, err
				}
			}
			r.trans.removePeer(nid)
		}
	}
	r.conf = proto.Clone(r.confState).(*pb.ConfState)
	r.membersMu.Unlock()
	if slices.Contains(r.confState.GetVoters(), r.cfg.ID) || slices.Contains(r.confState.GetLearners(), r.cfg.ID) {
		r.removed.Store(false)
		if err := wb.Delete(keyRemoved); err != nil {
			return id, err
		}
	}
	return id, wb.Flush()
}

// maybeCompact takes a snapshot marker and trims the log once enough entries
// were applied since the last one.
func (r *Replica) maybeCompact() error {
	applied := r.raftApplied
	snap, _ := r.store.Snapshot()
	snapIdx := snap.GetMetadata().GetIndex()
	// A marker must carry the membership in force at its index, and raft on
	// a replica added after the marker refuses a snapshot that does not list
	// it (the leader would resend it forever): a membership change takes a
	// new marker too.
	confChanged := applied > snapIdx && !sameConfState(r.confState, snap.GetMetadata().GetConfState())
	if applied < snapIdx+r.cfg.SnapshotEntries && !confChanged && r.bytesSinceSnap < r.cfg.SnapshotBytes {
		return nil
	}
	last, _ := r.store.LastIndex()
	applied = min(applied, last)
	term, err := r.store.Term(applied)
	if err != nil {
		return nil // compacted meanwhile by a received snapshot
	}
	// The state machine's writes up to applied must be durable before the
	// log that could replay them goes away.
	if err := r.db.Sync(); err != nil {
		return err
	}
	r.metrics.Fsyncs.Add(1)
	meta := &pb.SnapshotMetadata{Index: proto.Uint64(applied), Term: proto.Uint64(term), ConfState: proto.Clone(r.confState).(*pb.ConfState)}
	if err := r.store.setSnapshot(meta); err != nil {
		return err
	}
	r.bytesSinceSnap = 0
	// Keep TrailingEntries, or fewer if they add up to more than
	// TrailingBytes.
	var to, kept uint64
	if applied > r.cfg.TrailingEntries {
		to = applied - r.cfg.TrailingEntries
	}
	for i := len(r.logSizes) - 1; i >= 0; i-- {
		if e := r.logSizes[i]; e.index <= applied {
			if kept += e.size; kept > r.cfg.TrailingBytes {
				to = max(to, e.index)
				break
			}
		}
	}
	if to > 0 {
		if err := r.store.compact(to); err != nil {
			return err
		}
		i := 0
		for i < len(r.logSizes) && r.logSizes[i].index <= to {
			i++
		}
		r.logSizes = append(r.logSizes[:0], r.logSizes[i:]...)
	}
	r.log.Debug("log compacted", "snapshot_index", applied, "compacted_to", to)
	return nil
}

// entrySize is the size of one applied log entry's data.
type entrySize struct{ index, size uint64 }

func sameConfState(a, b *pb.ConfState) bool {
	return slices.Equal(a.GetVoters(), b.GetVoters()) && slices.Equal(a.GetLearners(), b.GetLearners()) &&
		slices.Equal(a.GetVotersOutgoing(), b.GetVotersOutgoing()) && slices.Equal(a.GetLearnersNext(), b.GetLearnersNext()) &&
		a.GetAutoLeave() == b.GetAutoLeave()
}
