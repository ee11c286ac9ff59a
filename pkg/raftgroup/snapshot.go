package raftgroup

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/internal/durable"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Snapshots are never materialised on the sender. Raft's snapshot is only a
// marker (index, term, membership); when raft asks to send one, the sender
// opens a point-in-time view of its state machine (at an applied index A at
// or past the marker's index) and streams it. The receiver spools the stream
// to a file, then steps the marker into raft; when raft hands the snapshot
// back in a Ready, the state machine restores from the file. Entries between
// the marker and A arrive again through the log and are skipped, because the
// state machine already holds them (its applied index is A).
//
// Stream layout: a member table (uvarint count, then uvarint id, uvarint
// length and address for each member) followed by the state machine's data.

// spool holds the received snapshots raft may still hand back. Raft keeps
// at most one pending snapshot, but it may accept a newer one while an older
// one is being installed (the Ready loop is busy restoring it; the Snapshot
// handler steps into raft concurrently), so a file is only removed once no
// Ready can ask for it: see pruneSpool.
type spool struct {
	mu    sync.Mutex
	files map[[2]uint64]string // (index, term) -> path
}

func (r *Replica) snapDir() string { return filepath.Join(r.cfg.Dir, "snap") }

func (t *transport) startSnapshot(m *pb.Message) {
	to := m.GetTo()
	t.mu.Lock()
	select {
	case <-t.stopc:
		t.mu.Unlock()
		return
	default:
	}
	if t.snaps[to] {
		t.mu.Unlock()
		t.r.node.ReportSnapshot(to, raft.SnapshotFailure)
		return
	}
	t.snaps[to] = true
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		err := t.sendSnapshot(m)
		t.mu.Lock()
		delete(t.snaps, to)
		t.mu.Unlock()
		if err != nil {
			t.r.log.Warn("sending snapshot failed", "peer", to, "err", err)
			t.r.node.ReportSnapshot(to, raft.SnapshotFailure)
			return
		}
		t.r.metrics.SnapshotsSent.Add(1)
		t.r.node.ReportSnapshot(to, raft.SnapshotFinish)
	}()
}

func (t *transport) sendSnapshot(m *pb.Message) error {
	r := t.r
	to := m.GetTo()
	addr := r.memberAddr(to)
	if addr == "" {
		return fmt.Errorf("no address for replica %d", to)
	}
	view, err := r.sm.Snapshot()
	if err != nil {
		return fmt.Errorf("open state machine snapshot: %w", err)
	}
	defer view.Close()
	if view.Index() < m.GetSnapshot().GetMetadata().GetIndex() {
		return fmt.Errorf("state machine view at %d is behind snapshot marker %d", view.Index(), m.GetSnapshot().GetMetadata().GetIndex())
	}
	conn, err := r.dialPeer(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	stream, err := shardkvpb.NewRaftClient(conn).Snapshot(ctx)
	if err != nil {
		return err
	}
	hdr, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	cw := &chunkWriter{send: stream.Send, first: &shardkvpb.SnapshotChunk{
		GroupId: r.cfg.GroupID, From: r.cfg.ID, To: to, FromAddr: r.cfg.Addr, Message: hdr}}
	bw := bufio.NewWriterSize(cw, snapshotChunk)
	if _, err := bw.Write(r.encodeMembers()); err != nil {
		return err
	}
	if _, err := view.WriteTo(bw); err != nil {
		return fmt.Errorf("stream state: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := cw.flushHeader(); err != nil {
		return err
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		return err
	}
	r.log.Info("snapshot sent", "peer", to, "marker_index", m.GetSnapshot().GetMetadata().GetIndex(), "state_index", view.Index(), "bytes", ack.GetBytes())
	return nil
}

type chunkWriter struct {
	send  func(*shardkvpb.SnapshotChunk) error
	first *shardkvpb.SnapshotChunk
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += snapshotChunk {
		end := min(off+snapshotChunk, len(p))
		ch := &shardkvpb.SnapshotChunk{Data: p[off:end]}
		if c.first != nil {
			ch.GroupId, ch.From, ch.To, ch.FromAddr, ch.Message = c.first.GroupId, c.first.From, c.first.To, c.first.FromAddr, c.first.Message
			c.first = nil
		}
		if err := c.send(ch); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func (c *chunkWriter) flushHeader() error {
	if c.first == nil {
		return nil
	}
	_, err := c.Write([]byte{})
	if c.first != nil { // empty write sends nothing: send the header alone
		err = c.send(c.first)
		c.first = nil
	}
	return err
}

func (r *Replica) encodeMembers() []byte {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	ids := make([]uint64, 0, len(r.members))
	for id := range r.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
		b = binary.AppendUvarint(b, uint64(len(r.members[id])))
		b = append(b, r.members[id]...)
	}
	return b
}

func decodeMembers(br *bufio.Reader) (map[uint64]string, error) {
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, err
	}
	if n > 1<<16 {
		return nil, fmt.Errorf("snapshot member table: %d members", n)
	}
	out := make(map[uint64]string, n)
	for range n {
		id, err := binary.ReadUvarint(br)
		if err != nil {
			return nil, err
		}
		l, err := binary.ReadUvarint(br)
		if err != nil || l > 4096 {
			return nil, fmt.Errorf("snapshot member table: bad address length")
		}
		addr := make([]byte, l)
		if _, err := io.ReadFull(br, addr); err != nil {
			return nil, err
		}
		out[id] = string(addr)
	}
	return out, nil
}

// Snapshot receives a streamed snapshot, spools it durably, then hands the
// marker to raft.
func (s *raftServer) Snapshot(stream shardkvpb.Raft_SnapshotServer) error {
	r := s.r
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := s.check(first.GroupId, first.To, first.From, first.FromAddr); err != nil {
		return err
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(first.Message, m); err != nil || m.GetType() != pb.MsgSnap {
		return status.Error(codes.InvalidArgument, "snapshot stream must start with a MsgSnap header")
	}
	meta := m.GetSnapshot().GetMetadata()
	if err := os.MkdirAll(r.snapDir(), 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(r.snapDir(), "recv-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // no-op once renamed
	var total uint64
	for ch := first; ; {
		if _, err := f.Write(ch.Data); err != nil {
			f.Close()
			return err
		}
		total += uint64(len(ch.Data))
		ch, err = stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	path := filepath.Join(r.snapDir(), fmt.Sprintf("%016x-%016x.snap", meta.GetTerm(), meta.GetIndex()))
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	if err := durable.SyncDir(r.snapDir()); err != nil {
		return err
	}
	r.spool.mu.Lock()
	if r.spool.files == nil {
		r.spool.files = map[[2]uint64]string{}
	}
	r.spool.files[[2]uint64{meta.GetIndex(), meta.GetTerm()}] = path
	r.spool.mu.Unlock()
	if err := r.node.Step(stream.Context(), m); err != nil {
		return status.Errorf(codes.Unavailable, "step snapshot: %v", err)
	}
	r.metrics.SnapshotsReceived.Add(1)
	return stream.SendAndClose(&shardkvpb.SnapshotAck{Bytes: total})
}

// installSnapshot runs in the Ready loop when raft accepted a snapshot.
func (r *Replica) installSnapshot(snap *pb.Snapshot) error {
	meta := snap.GetMetadata()
	r.spool.mu.Lock()
	path := r.spool.files[[2]uint64{meta.GetIndex(), meta.GetTerm()}]
	r.spool.mu.Unlock()
	if path == "" {
		return fmt.Errorf("raft accepted snapshot %d/%d but no spooled data exists for it", meta.GetIndex(), meta.GetTerm())
	}
	// Record the restore first: a crash part-way through the state machine's
	// Restore is finished on the next start from the same file.
	pending := &pb.Snapshot{Data: []byte(path), Metadata: meta}
	if err := r.db.Update(func(txn *badger.Txn) error { return txn.Set(keyRestore, mustMarshal(pending)) }); err != nil {
		return err
	}
	if err := r.db.Sync(); err != nil {
		return err
	}
	return r.restoreFrom(pending)
}

func (r *Replica) restoreFrom(pending *pb.Snapshot) error {
	meta := pending.GetMetadata()
	path := string(pending.GetData())
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open spooled snapshot: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	members, err := decodeMembers(br)
	if err != nil {
		return fmt.Errorf("snapshot member table: %w", err)
	}
	applied, err := r.sm.Restore(br)
	if err != nil {
		return fmt.Errorf("state machine restore: %w", err)
	}
	if applied < meta.GetIndex() {
		return fmt.Errorf("restored state at %d is behind snapshot %d", applied, meta.GetIndex())
	}
	if r.cfg.Addr != "" {
		members[r.cfg.ID] = r.cfg.Addr
	}
	if err := r.replaceMembers(members); err != nil {
		return err
	}
	if err := r.store.applySnapshot(&pb.Snapshot{Metadata: meta}); err != nil {
		return err
	}
	r.confState = proto.Clone(meta.GetConfState()).(*pb.ConfState)
	r.membersMu.Lock()
	r.conf = proto.Clone(r.confState).(*pb.ConfState)
	r.membersMu.Unlock()
	r.smApplied = applied
	r.raftApplied = meta.GetIndex()
	r.logSizes, r.bytesSinceSnap = nil, 0 // the log was replaced
	// Pruned before the applied index is published, so that whoever waits
	// for it finds the spool settled.
	r.pruneSpool(meta.GetIndex())
	r.applied.Store(max(applied, meta.GetIndex()))
	r.applyW.advance(r.applied.Load())
	r.log.Info("restored snapshot", "marker_index", meta.GetIndex(), "state_index", applied)
	return nil
}

func (r *Replica) replaceMembers(m map[uint64]string) error {
	wb := r.db.NewWriteBatch()
	defer wb.Cancel()
	r.membersMu.Lock()
	defer r.membersMu.Unlock()
	for id := range r.members {
		if _, ok := m[id]; !ok {
			if err := wb.Delete(memberKey(id)); err != nil {
				return err
			}
		}
	}
	for id, addr := range m {
		if err := wb.Set(memberKey(id), []byte(addr)); err != nil {
			return err
		}
	}
	r.members = m
	return wb.Flush()
}

// pruneSpool deletes the spooled snapshots at or below index, once the
// snapshot at index is installed: raft accepts a snapshot only above its
// commit index, which is now at least index, so it never hands those back
// (superseded, refused, or just consumed). Newer files stay: raft may have
// accepted one while this snapshot was being installed, and hands it back
// in the next Ready. Files raft refused above index are left to a later
// install or to the start-up clean.
func (r *Replica) pruneSpool(index uint64) {
	r.spool.mu.Lock()
	defer r.spool.mu.Unlock()
	for k, path := range r.spool.files {
		if k[0] > index {
			continue
		}
		delete(r.spool.files, k)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("removing spooled snapshot", "path", path, "err", err)
		}
	}
}

// cleanSpool deletes every spooled snapshot file and partial receive. Only
// at start-up, before the replica serves: raft's pending snapshot does not
// survive a restart, so no file is needed any more (the one an interrupted
// restore reads is consumed first); later, a receive in progress or a
// snapshot raft still holds could be deleted under it.
func (r *Replica) cleanSpool() {
	r.spool.mu.Lock()
	r.spool.files = nil
	r.spool.mu.Unlock()
	ents, _ := os.ReadDir(r.snapDir())
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".snap") || strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(r.snapDir(), e.Name()))
		}
	}
}

// finishPendingRestore completes a snapshot restore interrupted by a crash.
func (r *Replica) finishPendingRestore() error {
	pending := &pb.Snapshot{}
	err := r.db.View(func(txn *badger.Txn) error { return getProto(txn, keyRestore, pending) })
	if err != nil {
		return err
	}
	if pending.GetMetadata() == nil {
		r.cleanSpool()
		return nil
	}
	r.log.Warn("finishing a snapshot restore interrupted by a crash", "index", pending.GetMetadata().GetIndex())
	if err := r.loadMembers(); err != nil {
		return err
	}
	if err := r.restoreFrom(pending); err != nil {
		return fmt.Errorf("resume snapshot restore: %w", err)
	}
	r.cleanSpool() // the spool map is empty after a restart: prune saw no file
	return nil
}
