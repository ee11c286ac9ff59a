package raftgroup

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// runOneReplica bootstraps a one-replica group in dir, proposes n
// commands, and closes it; the marker and compaction come every 10
// entries, 5 kept behind.
func runOneReplica(t *testing.T, dir string, n int) {
	t.Helper()
	r, err := openOne(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !r.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatal("no leader elected")
		case <-time.After(10 * time.Millisecond):
		}
	}
	for i := range n {
		if _, err := r.Propose(ctx, []byte{byte(i)}); err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
	}
}

func openOne(dir string) (*Replica, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := lis.Addr().String()
	lis.Close()
	return Open(Config{
		GroupID: 7, ID: 1, Addr: addr, Dir: dir, Peers: []Peer{{ID: 1, Addr: addr}},
		TickInterval: 10 * time.Millisecond, SnapshotEntries: 10, TrailingEntries: 5,
		Logger: quietLogger(),
	}, &spoolSM{})
}

// TestStartRefusesLostWrites: a data dir that lost writes it had
// acknowledged as durable (what a disk that ignores fsync leaves after a
// power cut) is refused at start with the reason, not served.
func TestStartRefusesLostWrites(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, db *badger.DB, s *logStorage)
		want   string
	}{
		{"a gap in the log", func(t *testing.T, db *badger.DB, s *logStorage) {
			del(t, db, logKey(s.last-2))
		}, "the log holds entry"},
		{"the log's tail under the commit index", func(t *testing.T, db *badger.DB, s *logStorage) {
			// The last entries and the marker of where the log ends go;
			// the hard state still says they were committed.
			for i := s.last - 1; i <= s.last; i++ {
				del(t, db, logKey(i))
			}
		}, "was committed but the log ends"},
		{"state behind the snapshot marker", func(t *testing.T, db *badger.DB, s *logStorage) {
			del(t, db, spoolApplied)
		}, "the state machine is at index 0 but the snapshot marker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "r")
			runOneReplica(t, dir, 25)
			r, err := openOne(dir)
			if err != nil {
				t.Fatalf("an intact data dir is refused: %v", err)
			}
			r.Close()
			db, err := badger.Open(badgerOptions(filepath.Join(dir, "db"), quietLogger()))
			if err != nil {
				t.Fatal(err)
			}
			s, err := openLogStorage(db)
			if err != nil {
				t.Fatal(err)
			}
			if s.snapshotIndex() == 0 {
				t.Fatal("no snapshot marker was taken: the test needs one")
			}
			tc.tamper(t, db, s)
			db.Close()
			r, err = openOne(dir)
			if err == nil {
				r.Close()
				t.Fatalf("a data dir with %s was served", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "lost writes") {
				t.Fatalf("refused with %q, want %q and the reason", err, tc.want)
			}
		})
	}
}

func del(t *testing.T, db *badger.DB, k []byte) {
	t.Helper()
	if err := db.Update(func(txn *badger.Txn) error { return txn.Delete(k) }); err != nil {
		t.Fatal(err)
	}
}
