package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// StorageOptions are the badger options a replica opens its DB with
// (logging discarded): for a state machine tested on its own DB, so that
// it meets the same transaction and value limits as in a replica.
func StorageOptions(dir string) badger.Options {
	o := badgerOptions(dir, slog.New(slog.DiscardHandler))
	o.Logger = nil
	return o
}

// badgerOptions sizes badger for a machine that hosts 10 to 20 replicas: the
// defaults (64 MiB memtables x5, 256 MiB block cache, 1 GiB value-log files,
// 4 compactors) are made for one big DB per machine. Numbers are in
// docs/engine.md.
func badgerOptions(dir string, log *slog.Logger) badger.Options {
	o := badger.DefaultOptions(dir)
	o.Logger = badgerLogger{l: log}
	// Every write is durable when it returns. DB.Sync syncs only the
	// active memtable's log: a write that went to a memtable rotated since
	// (a Ready split into several badger batches, an apply transaction
	// before the next Ready's write) was never synced, and a power cut
	// left a hole in the log or the state behind a durable later write
	// (TestPowerCutLog). docs/engine.md has the cost.
	o.SyncWrites = syncWrites
	o.DetectConflicts = false
	o.MemTableSize = 16 << 20 // also bounds one transaction: ~15% of it (2.4 MiB)
	o.NumMemtables = 2
	o.NumLevelZeroTables = 4
	o.NumLevelZeroTablesStall = 10
	o.BaseTableSize = 4 << 20
	o.BaseLevelSize = 16 << 20
	o.BlockCacheSize = 8 << 20
	o.IndexCacheSize = 4 << 20
	o.NumCompactors = 2
	o.ValueLogFileSize = 64 << 20
	// Every value up to 1 MiB (badger's maximum threshold) stays in the LSM
	// tree, the value log holds only larger ones. Most big values here are
	// Raft log entries (a moving shard's 256 KiB chunks), which live only
	// until the next log compaction: in the LSM tree their deletes reclaim
	// the space at the next compaction, while the value log would keep them
	// until a value-log GC that nothing runs (at a 64 KiB threshold, every
	// shard moved through a group stayed on its disk for good).
	o.ValueThreshold = 1 << 20
	o.NumGoroutines = 2
	o.CompactL0OnClose = false
	return o
}

// syncWrites is badger's SyncWrites: true, except in binaries built with
// the tag shardkv_nosync (nosync.go), which restore the old behaviour for
// the power-cut tests to show what it loses. Never build a release so.
var syncWrites = true

// badgerLogger adapts slog to badger's logger, and catches the one
// durability failure badger only logs.
type badgerLogger struct {
	l     *slog.Logger
	fault *syncFault // nil: not watched
}

func (b badgerLogger) Errorf(f string, a ...any) {
	msg := fmt.Sprintf(f, a...)
	b.l.Error(msg, "component", "badger")
	if b.fault != nil && strings.HasPrefix(f, vlogSyncFailure) {
		b.fault.set(errors.New(strings.TrimSpace(msg)))
	}
}

// vlogSyncFailure starts the message badger (v4.9.6, valueLog.write) logs
// when, under SyncWrites, the value log's fsync fails: the write still
// returns success. TestVlogSyncFailureStops guards the message.
const vlogSyncFailure = "Error while curlf sync"

// syncFault records an fsync failure badger did not return. It is sticky:
// after a failed fsync the kernel may have dropped the dirty pages, and a
// later fsync can succeed without them (so a retry proves nothing).
type syncFault struct{ err atomic.Pointer[error] }

func (f *syncFault) set(err error) { f.err.CompareAndSwap(nil, &err) }

// check returns the recorded failure, wrapped as fatal to durability.
func (f *syncFault) check() error {
	if p := f.err.Load(); p != nil {
		return fmt.Errorf("raftgroup: a value-log fsync failed, so writes acknowledged as durable may not be: %w", *p)
	}
	return nil
}
func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn(fmt.Sprintf(f, a...), "component", "badger")
}
func (b badgerLogger) Infof(f string, a ...any) { b.Debugf(f, a...) }

// Debugf formats only when enabled: badger logs several debug lines per
// write (~0.5% of the engine's CPU under load when formatted for nothing).
func (b badgerLogger) Debugf(f string, a ...any) {
	if b.l.Enabled(context.Background(), slog.LevelDebug) {
		b.l.Debug(fmt.Sprintf(f, a...), "component", "badger")
	}
}

// raftLogger adapts slog to raft's logger. raft's Info is chatty (every
// election step); it goes to Debug except for the lines worth keeping.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)              { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(f string, v ...any)   { r.l.Debug(fmt.Sprintf(f, v...)) }
func (r raftLogger) Info(v ...any)               { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(f string, v ...any)    { r.l.Debug(fmt.Sprintf(f, v...)) }
func (r raftLogger) Warning(v ...any)            { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) { r.l.Warn(fmt.Sprintf(f, v...)) }
func (r raftLogger) Error(v ...any)              { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any)   { r.l.Error(fmt.Sprintf(f, v...)) }
func (r raftLogger) Fatal(v ...any)              { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Fatalf(f string, v ...any)   { r.Fatal(fmt.Sprintf(f, v...)) }
func (r raftLogger) Panic(v ...any)              { r.l.Error(fmt.Sprint(v...)); panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(f string, v ...any)   { r.Panic(fmt.Sprintf(f, v...)) }
