package raftgroup

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// This is an internal test (rgtest imports this package, so it cannot be
// used here): a real Replica on real badger and a real raft node, fed
// snapshots through its real gRPC Snapshot handler. The interleaving is made
// deterministic by blocking the state machine's first Restore.

var (
	spoolPrefix  = []byte("s/")
	spoolApplied = []byte("s/applied")
)

// spoolSM stores each entry's command under its index. The first Restore
// signals entered and waits for release.
type spoolSM struct {
	store            *PrefixStore
	entered, release chan struct{}
	restores         int
}

func (s *spoolSM) Open(db *badger.DB) (uint64, error) {
	s.store = NewPrefixStore(spoolApplied, [][]byte{spoolPrefix}, nil)
	return s.store.Open(db)
}

func (s *spoolSM) Apply(b *Batch, ents []Entry) error {
	txn := b.Txn()
	for _, e := range ents {
		if err := txn.Set(fmt.Appendf(nil, "s/%016x", e.Index), e.Cmd); err != nil {
			return err
		}
	}
	return StoreApplied(txn, spoolApplied, ents[len(ents)-1].Index)
}

func (s *spoolSM) Snapshot() (Snapshot, error) { return s.store.Snapshot() }

func (s *spoolSM) Restore(r io.Reader) (uint64, error) {
	s.restores++
	if s.restores == 1 && s.entered != nil {
		close(s.entered)
		<-s.release
	}
	return s.store.Restore(r)
}

func (s *spoolSM) has(index uint64) bool {
	v, _ := getValue(s.store.DB(), fmt.Appendf(nil, "s/%016x", index))
	return v != nil
}

func getValue(db *badger.DB, k []byte) (v []byte, err error) {
	err = db.View(func(txn *badger.Txn) error {
		v, err = GetValue(txn, k)
		return err
	})
	return v, err
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// spoolSource builds snapshot streams (member table + state) from a state
// machine on its own badger DB, as a leader would send them.
type spoolSource struct {
	sm      *spoolSM
	applied uint64
}

func newSpoolSource(t *testing.T) *spoolSource {
	t.Helper()
	db, err := badger.Open(badgerOptions(filepath.Join(t.TempDir(), "src"), quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sm := &spoolSM{}
	if _, err := sm.Open(db); err != nil {
		t.Fatal(err)
	}
	return &spoolSource{sm: sm}
}

// stream applies entries up to index and returns the snapshot stream at it.
func (s *spoolSource) stream(t *testing.T, index uint64, members map[uint64]string) []byte {
	t.Helper()
	var ents []Entry
	for s.applied < index {
		s.applied++
		ents = append(ents, Entry{Index: s.applied, Term: 1, Cmd: fmt.Appendf(nil, "v%d", s.applied)})
	}
	if err := ApplyAlone(s.sm, s.sm.store.DB(), ents); err != nil {
		t.Fatal(err)
	}
	ids := slices.Sorted(func(yield func(uint64) bool) {
		for id := range members {
			if !yield(id) {
				return
			}
		}
	})
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
		b = binary.AppendUvarint(b, uint64(len(members[id])))
		b = append(b, members[id]...)
	}
	view, err := s.sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	var buf bytes.Buffer
	buf.Write(b)
	if _, err := view.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sendSpoolSnapshot streams one snapshot to the replica at addr through
// its gRPC Snapshot handler; it returns once the replica has spooled it and
// stepped the marker into raft.
func sendSpoolSnapshot(t *testing.T, conn *grpc.ClientConn, group, from, to uint64, fromAddr string, index, term uint64, data []byte) {
	t.Helper()
	m := &pb.Message{
		Type: pb.MessageType_MsgSnap.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term),
		Snapshot: &pb.Snapshot{Metadata: &pb.SnapshotMetadata{
			Index: proto.Uint64(index), Term: proto.Uint64(term),
			ConfState: &pb.ConfState{Voters: []uint64{from, to}},
		}},
	}
	hdr, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := shardkvpb.NewRaftClient(conn).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&shardkvpb.SnapshotChunk{GroupId: group, From: from, To: to, FromAddr: fromAddr, Message: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("send snapshot %d: %v", index, err)
	}
}

func spooledFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "snap"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// startSpoolReplica opens a joining replica (id 2 of group 7) serving gRPC
// on loopback.
func startSpoolReplica(t *testing.T, dir string, sm *spoolSM) (*Replica, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Open(Config{
		GroupID: 7, ID: 2, Addr: lis.Addr().String(), Dir: dir, Join: true,
		ElectionTicks: 1000, // no campaign while the test runs: the leader is absent
		Logger:        quietLogger(),
	}, sm)
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptionsFor(DefaultMaxCommandBytes)...)
	r.RegisterGRPC(srv)
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		r.Close()
	})
	return r, conn
}

// TestSpoolNewerSnapshotSurvivesOlderRestore: snapshot A (index 10) is being
// restored when snapshot B (index 20) arrives, is spooled and accepted by
// raft. Restoring A must not delete B's spooled file: raft hands B back in
// the next Ready.
func TestSpoolNewerSnapshotSurvivesOlderRestore(t *testing.T) {
	dir := t.TempDir()
	sm := &spoolSM{entered: make(chan struct{}), release: make(chan struct{})}
	r, conn := startSpoolReplica(t, dir, sm)
	const leader, leaderAddr = 1, "127.0.0.1:1" // nothing listens there
	members := map[uint64]string{leader: leaderAddr, 2: r.cfg.Addr}
	src := newSpoolSource(t)
	snapA, snapB := src.stream(t, 10, members), src.stream(t, 20, members)

	sendSpoolSnapshot(t, conn, 7, leader, 2, leaderAddr, 10, 1, snapA)
	select {
	case <-sm.entered: // the Ready loop is inside A's restore
	case <-r.Done():
		t.Fatalf("replica stopped before restoring A: %v", r.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("snapshot A was never restored")
	}
	// Raft accepts B (20 > its commit, 10) while A is being installed; it
	// stays raft's pending snapshot past A's Advance.
	sendSpoolSnapshot(t, conn, 7, leader, 2, leaderAddr, 20, 1, snapB)
	if got := spooledFiles(t, dir); len(got) != 2 {
		t.Fatalf("spool before A's restore finishes = %v, want A's and B's files", got)
	}
	close(sm.release)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.WaitApplied(ctx, 20); err != nil {
		t.Fatalf("snapshot B not installed: %v (replica error: %v)", err, r.Err())
	}
	if !sm.has(20) || sm.restores != 2 {
		t.Fatalf("state after B: has 20 = %v, restores = %d", sm.has(20), sm.restores)
	}
	// Both files are at or below the installed index: gone.
	if got := spooledFiles(t, dir); len(got) != 0 {
		t.Fatalf("spool after installing B = %v, want empty", got)
	}
}

// TestSpoolInstallKeepsOnlyNewer: installing a snapshot removes the spooled
// files at or below its index (superseded ones raft will never hand back)
// and keeps newer ones; a restart removes whatever is left, including
// partial receives.
func TestSpoolInstallKeepsOnlyNewer(t *testing.T) {
	dir := t.TempDir()
	sm := &spoolSM{entered: make(chan struct{}), release: make(chan struct{})}
	r, conn := startSpoolReplica(t, dir, sm)
	const leader, leaderAddr = 1, "127.0.0.1:1"
	members := map[uint64]string{leader: leaderAddr, 2: r.cfg.Addr}
	src := newSpoolSource(t)
	snap5, snap10 := src.stream(t, 5, members), src.stream(t, 10, members)

	// 5 and 10 are spooled and stepped before any Ready takes them: raft
	// keeps only 10, so 5 is superseded and never handed back.
	sendSpoolSnapshot(t, conn, 7, leader, 2, leaderAddr, 10, 1, snap10)
	<-sm.entered
	sendSpoolSnapshot(t, conn, 7, leader, 2, leaderAddr, 5, 1, snap5) // raft refuses it: 5 <= commit 10
	// A newer one, spooled under the replica's feet while 10 is restored,
	// must survive the install of 10.
	newer := filepath.Join(dir, "snap", fmt.Sprintf("%016x-%016x.snap", 1, 30))
	if err := os.WriteFile(newer, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.spool.mu.Lock()
	r.spool.files[[2]uint64{30, 1}] = newer
	r.spool.mu.Unlock()
	close(sm.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.WaitApplied(ctx, 10); err != nil {
		t.Fatalf("snapshot 10 not installed: %v (replica error: %v)", err, r.Err())
	}
	want := []string{filepath.Base(newer)}
	if got := spooledFiles(t, dir); !slices.Equal(got, want) {
		t.Fatalf("spool after installing 10 = %v, want %v", got, want)
	}

	// A restart cleans stale files, also partial receives.
	if err := os.WriteFile(filepath.Join(dir, "snap", "recv-1.tmp"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r2, err := Open(Config{GroupID: 7, ID: 2, Addr: r.cfg.Addr, Dir: dir, ElectionTicks: 1000, Logger: quietLogger()}, &spoolSM{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if got := spooledFiles(t, dir); len(got) != 0 {
		t.Fatalf("spool after restart = %v, want empty", got)
	}
	if r2.AppliedIndex() != 10 || r2.Err() != nil {
		t.Fatalf("restarted replica: applied %d, err %v", r2.AppliedIndex(), r2.Err())
	}
}
