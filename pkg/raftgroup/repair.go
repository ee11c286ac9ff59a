package raftgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/internal/durable"
)

// openBadger opens the replica's DB (opts.Dir), after removing the log
// files a power cut left empty (removeEmptyLogs).
func openBadger(opts badger.Options, log *slog.Logger) (*badger.DB, error) {
	if err := removeEmptyLogs(opts.Dir, log); err != nil {
		return nil, err
	}
	if opts.ValueDir != opts.Dir {
		if err := removeEmptyLogs(opts.ValueDir, log); err != nil {
			return nil, err
		}
	}
	return badger.Open(opts)
}

// removeEmptyLogs removes the zero-length memtable logs (*.mem) and value
// logs (*.vlog) of a badger directory.
//
// Badger creates such a file, sizes it (ftruncate) and maps it, and only
// its first sync makes that size durable. A power cut in between leaves
// the file with no bytes, and badger then refuses to open the directory
// ("while opening fid: N ... Create a new file": it takes an empty file
// for one it must create, and an existing one it cannot). An empty file
// never held a synced byte, so nothing acknowledged was in it (every
// write is synced before it returns, badgerOptions), and without it
// badger opens on what was durable:
//   - an empty memtable log held no entry; badger numbers the next one
//     from the highest remaining (reusing the empty one's number is
//     harmless: nothing refers to memtable numbers);
//   - an empty value log held no value a durable key points to (a value
//     is synced in the value log before the key's write is, and a value
//     log is synced whole and truncated before the next one is created).
//     Badger's value log GC only ever creates files above the highest
//     one. If the empty one was the highest, badger writes on in the
//     highest remaining one (after truncating it to its last valid
//     entry, as at every open), or creates fid 1 again if it was the
//     only one; either way no durable pointer names the removed number.
//
// A file of one or more bytes is left to badger's own recovery (which
// truncates a log at its first invalid entry).
func removeEmptyLogs(dir string, log *slog.Logger) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("raftgroup: read %s: %w", dir, err)
	}
	removed := false
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !(strings.HasSuffix(name, ".mem") || strings.HasSuffix(name, ".vlog")) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("raftgroup: stat %s: %w", name, err)
		}
		if fi.Size() != 0 {
			continue
		}
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("raftgroup: remove empty %s: %w", path, err)
		}
		removed = true
		log.Warn("removed an empty badger log file (created, never synced: a crash or power cut before its first write was durable; it held nothing)", "file", path)
	}
	if removed {
		if err := durable.SyncDir(dir); err != nil {
			return fmt.Errorf("raftgroup: sync %s: %w", dir, err)
		}
	}
	return nil
}
