//go:build !race

// Built only without the race detector: its children are this test binary,
// and badger under it made one seed take 8 minutes. `make test` runs it in
// its non-race step.

package raftgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/internal/lazyfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The power-cut tests run the storage in a child process (this test
// binary, re-executed) on a lazyfs mount served by the test: a power cut
// there forgets whatever was not fsynced, which killing a process cannot
// show (the page cache survives it).
func TestMain(m *testing.M) {
	switch os.Getenv("RAFTGROUP_POWERCUT_CHILD") {
	case "":
		os.Exit(m.Run())
	case "log":
		exitOn(powerCutLogChild(os.Getenv("RAFTGROUP_POWERCUT_DIR")))
	case "check":
		exitOn(powerCutCheckChild(os.Getenv("RAFTGROUP_POWERCUT_DIR")))
	case "vlogfail":
		exitOn(vlogFailChild(os.Getenv("RAFTGROUP_POWERCUT_DIR")))
	}
	os.Exit(2)
}

func exitOn(err error) {
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// cutEntry is entry i of the power-cut log: from 1 KiB to 128 KiB, so
// that the test's 4 MiB memtables rotate every few dozen entries.
func cutEntry(i uint64) *pb.Entry {
	h := fnv.New64a()
	fmt.Fprint(h, i)
	size := 1<<10 + int(h.Sum64()%(127<<10))
	return &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(i), Type: pb.EntryNormal.Enum(), Data: bytes.Repeat([]byte{byte(i)}, size)}
}

// openCutStorage opens the engine's storage with smaller memtables than a
// replica's: rotations, the instants under test, come four times as often.
func openCutStorage(dir string) (*badger.DB, *logStorage, error) {
	// As a replica's open does (openBadger).
	if err := removeEmptyLogs(dir, slog.New(slog.DiscardHandler)); err != nil {
		return nil, nil, err
	}
	o := badgerOptions(dir, slog.New(slog.DiscardHandler))
	o.MemTableSize = 4 << 20
	o.ValueThreshold = 256 << 10 // under the batch limit (15% of a memtable)
	db, err := badger.Open(o)
	if err != nil {
		return nil, nil, err
	}
	s, err := openLogStorage(db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, s, nil
}

// powerCutLogChild runs Readies as the Ready loop does, forever: save the
// hard state and new entries with one sync (printing "acked N" once entry
// N is durable), then apply the committed ones in a transaction that
// records each entry's key and the applied index, unsynced (the next
// Ready's sync covers it). One Ready in eight carries several MiB, more
// than one badger batch holds; one in sixteen is followed by a compaction
// of the log behind the applied index.
func powerCutLogChild(dir string) error {
	db, s, err := openCutStorage(dir)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	next := s.last + 1
	// As a replica does at start: apply what the log holds past the
	// applied index.
	applied, err := cutApplied(db)
	if err != nil {
		return err
	}
	if err := cutApply(db, applied+1, s.last); err != nil {
		return err
	}
	for r := 0; ; r++ {
		n := 1 + int(next%3)
		if r%8 == 7 {
			n = 24
		}
		var ents []*pb.Entry
		for range n {
			ents = append(ents, cutEntry(next))
			next++
		}
		last := next - 1
		hs := &pb.HardState{Term: proto.Uint64(last), Vote: proto.Uint64(last%3 + 1), Commit: proto.Uint64(last)}
		if err := s.save(hs, ents, true); err != nil {
			return err
		}
		fmt.Fprintf(w, "acked %d\n", last)
		w.Flush()
		if err := cutApply(db, ents[0].GetIndex(), last); err != nil {
			return err
		}
		// Compact now and then, as a replica does behind its applied
		// index: a cut can fall inside the deletes.
		if r%16 == 15 && last > 64 {
			if err := s.compact(last - 64); err != nil {
				return err
			}
		}
	}
}

// cutApply applies entries from to last: one key each, and the index.
func cutApply(db *badger.DB, from, last uint64) error {
	if from > last {
		return nil
	}
	return db.Update(func(txn *badger.Txn) error {
		for i := from; i <= last; i++ {
			if err := txn.Set(cutAppliedKey(i), []byte{1}); err != nil {
				return err
			}
		}
		return txn.Set([]byte("applied"), []byte(strconv.FormatUint(last, 10)))
	})
}

func cutApplied(db *badger.DB) (uint64, error) {
	var applied uint64
	err := db.View(func(txn *badger.Txn) error {
		it, err := txn.Get([]byte("applied"))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		v, err := it.ValueCopy(nil)
		if err != nil {
			return err
		}
		applied, err = strconv.ParseUint(string(v), 10, 64)
		return err
	})
	return applied, err
}

func cutAppliedKey(i uint64) []byte { return []byte(fmt.Sprintf("applied/%020d", i)) }

// powerCutCheckChild opens the storage after a cut, checks every entry
// the log holds and that the applied state has no hole (every entry up to
// the applied index has its key), and prints "last N term T applied A".
func powerCutCheckChild(dir string) error {
	db, s, err := openCutStorage(dir)
	if err != nil {
		return err
	}
	defer db.Close()
	first, _ := s.FirstIndex()
	for i := first; i <= s.last; i++ {
		ents, err := s.Entries(i, i+1, 1<<30)
		if err != nil {
			return fmt.Errorf("entry %d of [%d,%d]: %w", i, first, s.last, err)
		}
		if !proto.Equal(ents[0], cutEntry(i)) {
			return fmt.Errorf("entry %d differs from what was written", i)
		}
	}
	if c := s.hard.GetCommit(); c > s.last {
		return fmt.Errorf("the hard state's commit %d is past the log's last entry %d", c, s.last)
	}
	applied, err := cutApplied(db)
	if err != nil {
		return err
	}
	if applied < first-1 {
		return fmt.Errorf("the log was compacted to %d, but the applied index is %d", first-1, applied)
	}
	if applied > s.last {
		return fmt.Errorf("applied index %d past the log's last entry %d", applied, s.last)
	}
	err = db.View(func(txn *badger.Txn) error {
		for i := uint64(1); i <= applied; i++ {
			if _, err := txn.Get(cutAppliedKey(i)); err != nil {
				return fmt.Errorf("applied index %d, but entry %d's write is gone: %w", applied, i, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("last %d term %d applied %d\n", s.last, s.hard.GetTerm(), applied)
	return nil
}

func child(t *testing.T, mode, dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RAFTGROUP_POWERCUT_CHILD="+mode, "RAFTGROUP_POWERCUT_DIR="+dir)
	cmd.Stderr = os.Stderr
	// The writer never stops by itself: it dies with the test, even one
	// killed by go test's timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// powerCutRuns is how many randomized runs a power-cut test makes: a few
// in CI, more by hand (SHARDKV_POWERCUT_RUNS).
func powerCutRuns(t *testing.T, def int) int {
	if s := os.Getenv("SHARDKV_POWERCUT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("SHARDKV_POWERCUT_RUNS=%q: %v", s, err)
		}
		return n
	}
	return def
}

// TestPowerCutLog: every entry and hard state the log storage acknowledged
// (save with sync returned) survives a power cut at any instant, with
// none, some or most of the unsynced pages written back before it.
// Entries are sized so that memtables rotate often: a rotated memtable's
// write-ahead log must be durable too.
func TestPowerCutLog(t *testing.T) {
	if err := lazyfs.Check(); err != nil {
		t.Fatalf("power-cut tests need FUSE: %v (CI installs fuse3 and runs as root)", err)
	}
	runs := powerCutRuns(t, 3)
	for run := 1; run <= runs; run++ {
		seed := uint64(run)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { powerCutLogRun(t, seed) })
	}
}

func powerCutLogRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5ca1ab1e))
	mnt, backing := t.TempDir(), t.TempDir()
	fs, err := lazyfs.Mount(mnt, backing)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Unmount()
	// Tables are slow to sync: a rotated memtable waits about a second
	// for its flush, its write-ahead log the only copy of its entries.
	if err := fs.DelaySync("*.sst", time.Second); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "db")
	var acked uint64
	for cut := 1; cut <= 3; cut++ {
		cmd := child(t, "log", dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Cut after a random number of acknowledged entries, or a random
		// delay after one: between Readies and inside them.
		want := 20 + rng.IntN(150)
		lines := bufio.NewScanner(out)
		n, lastLine := 0, ""
		for n < want && lines.Scan() {
			lastLine = lines.Text()
			n++
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		rest, _ := io.ReadAll(out)
		cmd.Wait()
		for _, l := range append([]string{lastLine}, strings.Split(string(rest), "\n")...) {
			if strings.HasPrefix(l, "error:") {
				t.Fatalf("writer: %s", l)
			}
			if a, ok := strings.CutPrefix(l, "acked "); ok {
				v, _ := strconv.ParseUint(a, 10, 64)
				acked = max(acked, v)
			}
		}
		keep := []float64{0, 0.3, 0.9}[rng.IntN(3)]
		cs, err := fs.Cut(keep, rng)
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.Restart(); err != nil {
			t.Fatal(err)
		}
		res, err := child(t, "check", dir).Output()
		if err != nil || !strings.HasPrefix(string(res), "last ") {
			t.Fatalf("cut %d (%+v, keep %.1f): after %d acknowledged entries the log does not open clean: %v: %s", cut, cs, keep, acked, err, res)
		}
		var last, term, applied uint64
		fmt.Sscanf(string(res), "last %d term %d applied %d", &last, &term, &applied)
		t.Logf("cut %d: acknowledged %d, after the cut: last %d term %d applied %d (%d unsynced pages dropped, %d kept)", cut, acked, last, term, applied, cs.DroppedPage, cs.KeptPages)
		if last < acked || term < acked {
			t.Fatalf("cut %d (keep %.1f): entry %d was acknowledged durable; after the power cut the log ends at %d, term %d", cut, keep, acked, last, term)
		}
	}
}

// vlogFailChild runs a one-replica group, says "ready", waits for a line
// on stdin (the parent then fails the value log's fsyncs), proposes a
// command large enough for the value log, and prints how it ended.
func vlogFailChild(dir string) error {
	r, err := openOne(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !r.IsLeader() {
		if ctx.Err() != nil {
			return errors.New("no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	_, err = r.Propose(ctx, bytes.Repeat([]byte{'v'}, 2<<20))
	fmt.Printf("proposal: %v\n", err)
	return nil
}

// TestVlogSyncFailureStops: badger, under SyncWrites, only logs a failed
// value-log fsync and returns success for the write. The replica must not
// acknowledge such a write: it stops instead (a later fsync could succeed
// without the dropped pages, so there is no retrying).
func TestVlogSyncFailureStops(t *testing.T) {
	if err := lazyfs.Check(); err != nil {
		t.Fatalf("power-cut tests need FUSE: %v (CI installs fuse3 and runs as root)", err)
	}
	mnt, backing := t.TempDir(), t.TempDir()
	fs, err := lazyfs.Mount(mnt, backing)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Unmount()
	cmd := child(t, "vlogfail", filepath.Join(mnt, "r"))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("child: %q", lines.Text())
	}
	if err := fs.FailSyncOf("*.vlog", -1, syscall.EIO); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(in, "go")
	rest, _ := io.ReadAll(out)
	cmd.Wait()
	got := string(rest)
	if !strings.Contains(got, "proposal: ") || strings.Contains(got, "proposal: <nil>") {
		t.Fatalf("a command whose value-log fsync failed: %q; want the proposal refused", got)
	}
	t.Logf("child: %s", strings.TrimSpace(got))
}
