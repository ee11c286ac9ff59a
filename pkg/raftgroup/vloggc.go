package raftgroup

import (
	"errors"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Values of badger's value threshold (1 MiB) and more live in the value log,
// not the LSM tree: large user values, and the log entries that carried
// them. Deleting or overwriting them, and compacting the Raft log, frees
// their space only when a value-log GC rewrites the file that holds them,
// which badger never starts on its own. valueLogGC runs it now and then, so
// large values are reclaimed like small ones.

// valueLogGCEvery is the pause between value-log GC passes; one pass
// rewrites files while at least half of a file is garbage (badger keeps
// the discard statistics from its compactions).
const (
	valueLogGCEvery    = time.Minute
	valueLogGCRatio    = 0.5
	valueLogGCMaxFiles = 8 // per pass, to bound the I/O of one pass
)

func (r *Replica) valueLogGC(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(valueLogGCEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for range valueLogGCMaxFiles {
			err := r.db.RunValueLogGC(valueLogGCRatio)
			if err != nil {
				if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) && !errors.Is(err, badger.ErrBlockedWrites) {
					r.log.Warn("value-log GC", "err", err)
				}
				break
			}
			r.log.Debug("value-log GC rewrote a file")
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}
