package raftgroup

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// TestOpenAfterEmptyLogFiles: a power cut right after badger created a
// memtable log or a value log, before anything in it was synced, leaves
// the file with its name and no bytes (its size was never made durable).
// A replica's DB opens after it, with everything that was written before;
// badger alone refuses ("while opening fid: N ... Create a new file").
func TestOpenAfterEmptyLogFiles(t *testing.T) {
	dir := t.TempDir()
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	db, err := openBadger(badgerOptions(dir, log), log)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("v"), 2<<20) // past the value threshold: in the value log
	write := func(db *badger.DB, k string, v []byte) {
		t.Helper()
		if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(k), v) }); err != nil {
			t.Fatal(err)
		}
	}
	write(db, "small", []byte("s"))
	write(db, "big", big)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// The cut's leftovers: the next memtable log and the next value log,
	// empty; and an empty value log below the highest one.
	maxMem, maxVlog := 0, 0
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "%d.mem", &n); err == nil && strings.HasSuffix(e.Name(), ".mem") {
			maxMem = max(maxMem, n)
		}
		if _, err := fmt.Sscanf(e.Name(), "%d.vlog", &n); err == nil && strings.HasSuffix(e.Name(), ".vlog") {
			maxVlog = max(maxVlog, n)
		}
	}
	if maxVlog == 0 {
		t.Fatalf("no value log in %s", dir)
	}
	empty := []string{fmt.Sprintf("%05d.mem", maxMem+1), fmt.Sprintf("%06d.vlog", maxVlog+2), fmt.Sprintf("%06d.vlog", maxVlog+1)}
	for _, name := range empty {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db, err = openBadger(badgerOptions(dir, log), log)
	if err != nil {
		t.Fatalf("open after a cut left empty log files %v: %v", empty, err)
	}
	for _, name := range empty {
		if !strings.Contains(logged.String(), name) {
			t.Errorf("the log does not say %s was removed:\n%s", name, logged.String())
		}
	}
	check := func(db *badger.DB, k string, want []byte) {
		t.Helper()
		err := db.View(func(txn *badger.Txn) error {
			it, err := txn.Get([]byte(k))
			if err != nil {
				return err
			}
			v, err := it.ValueCopy(nil)
			if err == nil && !bytes.Equal(v, want) {
				err = fmt.Errorf("%d bytes, want %d", len(v), len(want))
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	check(db, "small", []byte("s"))
	check(db, "big", big)
	// It writes on, large values too, and opens again.
	big2 := bytes.Repeat([]byte("w"), 2<<20)
	write(db, "big2", big2)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = openBadger(badgerOptions(dir, log), log)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	check(db, "big", big)
	check(db, "big2", big2)
}
