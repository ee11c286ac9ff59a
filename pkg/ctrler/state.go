// Package ctrler is the shard controller: a replicated state machine (on
// pkg/raftgroup) that owns the numbered history of configurations the whole
// cluster follows, and its gRPC service. Clients use pkg/ctrler/ctrlerclient,
// which depends only on the wire API.
package ctrler

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Keys of the controller's state (all outside the engine's 0x00 prefix).
var (
	keyApplied  = []byte("m/applied")
	keyInit     = []byte("m/init")
	keyLatest   = []byte("m/latest")
	keyOldest   = []byte("m/oldest")
	prefixConf  = []byte("c/")
	prefixDedup = []byte("d/")
	prefixAll   = [][]byte{[]byte("m/"), prefixConf, prefixDedup, prefixUser}
)

// SessionTTL is how long a client's dedup entry lives after its last
// mutation, measured in log time. A client idle for longer that retries an
// old request gets it applied again; controller clients retry for seconds.
const SessionTTL = 24 * time.Hour

func confKey(n uint64) []byte  { return binary.BigEndian.AppendUint64(slices.Clone(prefixConf), n) }
func dedupKey(c uint64) []byte { return binary.BigEndian.AppendUint64(slices.Clone(prefixDedup), c) }
func u64(v uint64) []byte      { return binary.BigEndian.AppendUint64(nil, v) }
func readU64(b []byte) uint64  { return binary.BigEndian.Uint64(b) }

// InputError is a refused request: bad input, the config is unchanged.
type InputError struct{ Msg string }

func (e *InputError) Error() string { return e.Msg }

func refuse(format string, a ...any) error { return &InputError{fmt.Sprintf(format, a...)} }

// ErrNotInitialized: the cluster's first config does not exist yet (its
// leader proposes it right after the first election). Retry.
var ErrNotInitialized = errors.New("the controller is not initialised yet")

// ErrCompacted: the requested config was dropped from history.
var ErrCompacted = errors.New("config compacted")

// StateMachine is the controller's replicated state.
type StateMachine struct {
	store *raftgroup.PrefixStore

	mu       sync.Mutex
	nshards  int
	strategy placement.Strategy
	latest   uint64
	oldest   uint64
	inited   bool
	changed  chan struct{} // closed and replaced when a new config is made
	// cached is the newest config Config has read, decoded. A stored
	// config never changes, and the leader reads the latest for every
	// Report, Query and Status: with 64 groups reporting each second,
	// reading and decoding it from badger each time was a sixth of the
	// leader's CPU.
	cached *shardkvpb.Config
}

// NewStateMachine returns an empty controller state machine.
func NewStateMachine() *StateMachine {
	sm := &StateMachine{changed: make(chan struct{})}
	sm.store = raftgroup.NewPrefixStore(keyApplied, prefixAll, sm.loadMeta)
	return sm
}

func (sm *StateMachine) Open(db *badger.DB) (uint64, error) { return sm.store.Open(db) }

func (sm *StateMachine) Snapshot() (raftgroup.Snapshot, error) { return sm.store.Snapshot() }

func (sm *StateMachine) Restore(r io.Reader) (uint64, error) {
	applied, err := sm.store.Restore(r)
	sm.notify()
	return applied, err
}

// notify wakes everyone waiting on Changed.
func (sm *StateMachine) notify() {
	sm.mu.Lock()
	close(sm.changed)
	sm.changed = make(chan struct{})
	sm.mu.Unlock()
}

// loadMeta reads the metadata from the DB (at Open and after a Restore).
func (sm *StateMachine) loadMeta(txn *badger.Txn) error {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.cached = nil // a restored state is read afresh
	v, err := raftgroup.GetValue(txn, keyInit)
	if err != nil || v == nil {
		sm.inited = false
		return err
	}
	var m initMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return err
	}
	sm.nshards, sm.strategy, sm.inited = m.Shards, placement.Strategy(m.Placement), true
	if v, err = raftgroup.GetValue(txn, keyLatest); err != nil {
		return err
	}
	sm.latest = readU64(v)
	if v, err = raftgroup.GetValue(txn, keyOldest); err != nil {
		return err
	}
	sm.oldest = readU64(v)
	return nil
}

func getConfig(txn *badger.Txn, n uint64) (*shardkvpb.Config, error) {
	c := &shardkvpb.Config{}
	found, err := raftgroup.GetProto(txn, confKey(n), c)
	if err != nil || !found {
		return nil, err
	}
	return c, nil
}

func (sm *StateMachine) latestNum() uint64 {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.latest
}

// Initialized reports whether the cluster's shard count and placement are set.
func (sm *StateMachine) Initialized() bool {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.inited
}

// Shards returns the cluster's shard count (0 before initialisation).
func (sm *StateMachine) Shards() int {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.nshards
}

// Bounds returns the oldest and latest config numbers held.
func (sm *StateMachine) Bounds() (oldest, latest uint64) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.oldest, sm.latest
}

// Changed returns a channel closed when the next config is made.
func (sm *StateMachine) Changed() <-chan struct{} {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.changed
}

// Config returns config n from local state; n < 0 or past the latest means
// the latest. Call after Replica.ReadIndex for a linearizable answer. The
// config may be shared with other callers: never modify it.
func (sm *StateMachine) Config(n int64) (*shardkvpb.Config, error) {
	oldest, latest := sm.Bounds()
	if !sm.Initialized() {
		return nil, ErrNotInitialized
	}
	num := latest
	if n >= 0 && uint64(n) < latest {
		num = uint64(n)
	}
	if num < oldest {
		return nil, fmt.Errorf("%w: config %d (history starts at %d)", ErrCompacted, num, oldest)
	}
	sm.mu.Lock()
	cached := sm.cached
	sm.mu.Unlock()
	if cached != nil && cached.Num == num {
		return cached, nil
	}
	var c *shardkvpb.Config
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		var err error
		c, err = getConfig(txn, num)
		return err
	})
	if err == nil && c == nil {
		err = fmt.Errorf("config %d missing", num)
	}
	if err == nil {
		sm.mu.Lock()
		if sm.cached == nil || c.Num > sm.cached.Num {
			sm.cached = c
		}
		sm.mu.Unlock()
	}
	return c, err
}
