package shardkv

import (
	"io"

	"github.com/shardkv/shardkv/pkg/raftgroup"
)

func (sm *StateMachine) Snapshot() (raftgroup.Snapshot, error) {
	return raftgroup.PrefixSnapshot(sm.db, keyApplied, statePrefixes...)
}

// statePrefixes are every prefix the group state machine owns.
var statePrefixes = [][]byte{metaPrefix, {'s'}, {'d'}, {'e'}, {'t'}, {'x'}}

func (sm *StateMachine) Restore(r io.Reader) (uint64, error) {
	if err := raftgroup.RestorePrefixes(sm.db, r, statePrefixes...); err != nil {
		return 0, err
	}
	applied, err := sm.reload()
	sm.mu.Lock()
	close(sm.changed)
	sm.changed = make(chan struct{})
	sm.mu.Unlock()
	return applied, err
}
