package shardkv

import (
	"io"

	"github.com/shardkv/shardkv/pkg/raftgroup"
)

func (sm *StateMachine) Snapshot() (raftgroup.Snapshot, error) {
	return sm.store.Snapshot()
}

// statePrefixes are every prefix the group state machine owns.
var statePrefixes = [][]byte{metaPrefix, {'c'}, {'s'}, {'d'}, {'e'}, {'t'}, {'x'}}

func (sm *StateMachine) Restore(r io.Reader) (uint64, error) {
	sm.cache.reset()
	applied, err := sm.store.Restore(r)
	sm.mu.Lock()
	close(sm.changed)
	sm.changed = make(chan struct{})
	sm.mu.Unlock()
	return applied, err
}
