package raftgroup

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func ents(from, to, term uint64) []*pb.Entry {
	var out []*pb.Entry
	for i := from; i <= to; i++ {
		out = append(out, &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte(fmt.Sprint(i))})
	}
	return out
}

func hardState(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

func openTestStorage(t *testing.T, dir string) (*badger.DB, *logStorage) {
	t.Helper()
	db, err := badger.Open(badgerOptions(dir, quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	s, err := openLogStorage(db)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	return db, s
}

// TestSaveEveryPrefixRestartable: badger splits a large write batch into
// transactions, and a power cut keeps a prefix of them. Whatever prefix of
// one Ready's writes survives, the replica must start (the start-up check
// passes: no commit past the log, no gap) with a log whose terms never go
// down. Hard state first, as save once wrote it, fails this: a commit
// index naming entries of the same Ready is durable before they are.
func TestSaveEveryPrefixRestartable(t *testing.T) {
	for _, tc := range []struct {
		name string
		hs   *pb.HardState
		ents []*pb.Entry
	}{
		{"append, commit inside the new entries", hardState(1, 1, 16), ents(11, 20, 1)},
		{"new leader overwrites a suffix", hardState(2, 2, 8), ents(6, 8, 2)},
		{"new term and vote only", hardState(3, 3, 5), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops := saveOps(tc.hs, true, tc.ents, 10)
			for k := 0; k <= len(ops); k++ {
				dir := filepath.Join(t.TempDir(), fmt.Sprint(k))
				db, s := openTestStorage(t, dir)
				// The state before the Ready: entries 1..10 of term 1, 5 committed.
				if err := s.save(hardState(1, 1, 5), ents(1, 10, 1), true); err != nil {
					t.Fatal(err)
				}
				// The surviving prefix, one transaction per write (the finest split).
				for _, op := range ops[:k] {
					err := db.Update(func(txn *badger.Txn) error {
						if op.del {
							return txn.Delete(op.key)
						}
						return txn.Set(op.key, op.val)
					})
					if err != nil {
						t.Fatal(err)
					}
				}
				db.Close()
				db, s = openTestStorage(t, dir)
				r := &Replica{store: s, db: db}
				if err := r.checkDurable(false); err != nil {
					t.Errorf("after %d of %d writes: %v", k, len(ops), err)
				}
				var prev uint64
				for i := uint64(1); i <= s.last; i++ {
					term, err := s.Term(i)
					if err != nil {
						t.Fatalf("after %d of %d writes: term of %d: %v", k, len(ops), i, err)
					}
					if term < prev {
						t.Errorf("after %d of %d writes: entry %d has term %d after term %d", k, len(ops), i, term, prev)
					}
					prev = term
				}
				db.Close()
			}
		})
	}
}

// TestCompactWhileReading: raft reads the log from its own goroutine while
// the Ready loop compacts it. A read must see either the entries or
// ErrCompacted, never a gap: raft treats any other error as fatal.
func TestCompactWhileReading(t *testing.T) {
	db, s := openTestStorage(t, t.TempDir())
	defer db.Close()
	const n = 4000
	for i := uint64(1); i <= n; i += 100 {
		if err := s.save(hardState(1, 1, i+99), ents(i, i+99, 1), true); err != nil {
			t.Fatal(err)
		}
	}
	// Past the in-memory tail, so reads go to badger.
	s.mu.Lock()
	s.tail, s.tailBytes = nil, 0
	s.mu.Unlock()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lo, _ := s.FirstIndex()
				_, err := s.Entries(lo, min(lo+500, n+1), 1<<30)
				if err != nil && !errors.Is(err, raft.ErrCompacted) {
					select {
					case errc <- fmt.Errorf("Entries(%d): %w", lo, err):
					default:
					}
					return
				}
			}
		}()
	}
	for i := uint64(10); i < n-10; i += 10 {
		if err := s.compact(i); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
}
