package shardkv

import (
	"encoding/binary"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// ValueEntry is a key as read.
type ValueEntry struct {
	Found bool
	// Type is the value's type; a collection's Value is empty (its
	// elements are read with ReadElems).
	Type       ValueType
	Value      []byte
	ExpireAtMs int64 // 0: no expiry
	// NowMs is the log time (Unix ms) the read judged expiry at: that of
	// the state it read. A TTL is ExpireAtMs-NowMs (docs/time.md).
	NowMs int64
}

// Config returns the current config.
func (sm *StateMachine) Config() *shardkvpb.Config {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.config
}

// PrevConfig returns the config before the current one.
func (sm *StateMachine) PrevConfig() *shardkvpb.Config {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.prev
}

// Shard returns shard s's state.
func (sm *StateMachine) Shard(s int) ShardMeta {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.shards[s]
}

// Shards returns every shard that is not NotOwned.
func (sm *StateMachine) Shards() map[int]ShardMeta {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	out := make(map[int]ShardMeta, len(sm.shards))
	for s, m := range sm.shards {
		out[s] = m
	}
	return out
}

// Changed returns a channel closed at the next config or shard state change.
func (sm *StateMachine) Changed() <-chan struct{} {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.changed
}

// Stable reports whether no shard is in motion (tests and tools; stepping
// asks CanStep).
func (sm *StateMachine) Stable() bool {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	for _, m := range sm.shards {
		if m.State != Serving || m.TrimBelow != 0 {
			return false
		}
	}
	return true
}

// CanStep reports whether the group may step to next now: no shard that
// next changes for it is in motion (stepBlockers).
func (sm *StateMachine) CanStep(next *shardkvpb.Config) bool {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return len(stepBlockers(sm.gid, sm.config, next, func(s int) ShardMeta { return sm.shards[s] })) == 0
}

// serves reports whether the group serves shard s now.
func serves(m ShardMeta) bool { return m.State == Serving || m.State == Acking }

// route checks that the group serves key now (by its applied state). A
// stranded replica (strandedAt) serves nothing: its shards are NotReady.
func (sm *StateMachine) route(key []byte) (int, Code) {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	s, code := ownership(sm.gid, sm.config, func(s int) ShardMeta { return sm.shards[s] }, key)
	if code == OK && sm.strandedAt.Load() == sm.config.Num+1 {
		code = NotReady
	}
	return s, code
}

// stranded reports whether this replica found the group stranded at its
// applied config (strandedAt).
func (sm *StateMachine) stranded() bool {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return sm.strandedAt.Load() == sm.config.Num+1
}

// ownership decides whether group gid serves key's shard under conf, with
// the shards' states from meta: OK (served), NotReady (owned, still
// arriving) or WrongGroup. The applied state (route) and the entry being
// applied (applyCtx.write) decide with it, each over its own config and
// shard states.
func ownership(gid uint64, conf *shardkvpb.Config, meta func(int) ShardMeta, key []byte) (int, Code) {
	if len(conf.Shards) == 0 {
		return 0, WrongGroup
	}
	s := routing.ShardOf(key, len(conf.Shards))
	if conf.Shards[s] != gid {
		return s, WrongGroup
	}
	switch m := meta(s); {
	case serves(m):
		return s, OK
	case m.State == Pulling:
		return s, NotReady
	}
	return s, WrongGroup
}

// Get reads key from local state with nowMs deciding expiry (tests and
// tools; the service reads by the log clock, GetEntry).
func (sm *StateMachine) Get(key []byte, nowMs int64) ([]byte, bool, Code, error) {
	e, code, err := sm.getEntry(key, nowMs)
	return e.Value, e.Found, code, err
}

// GetEntry reads key and its expiry from local state, judging expiry by
// the log clock stored with the state it reads (ValueEntry.NowMs), never
// by a local clock: every replica, leader or not, and every write at the
// same point of the log decide the same.
func (sm *StateMachine) GetEntry(key []byte) (ValueEntry, Code, error) {
	return sm.getEntry(key, -1)
}

// GetEntries reads keys as GetEntry does, all from one view of the state
// (one log time), and calls f with each key's entry, or the Code that
// refuses it, in order, until f returns false.
func (sm *StateMachine) GetEntries(keys [][]byte, f func(i int, e ValueEntry, code Code) bool) error {
	return sm.store.DB().View(func(txn *badger.Txn) error {
		ns, err := logTime(txn)
		if err != nil {
			return err
		}
		for i, k := range keys {
			e, code, err := sm.readEntry(txn, k, ns/1e6)
			if err != nil {
				return err
			}
			if !f(i, e, code) {
				return nil
			}
		}
		return nil
	})
}

// getEntry reads key; nowMs < 0: at the log time of the state read.
func (sm *StateMachine) getEntry(key []byte, nowMs int64) (e ValueEntry, code Code, err error) {
	err = sm.store.DB().View(func(txn *badger.Txn) error {
		if nowMs < 0 {
			ns, err := logTime(txn)
			if err != nil {
				return err
			}
			nowMs = ns / 1e6
		}
		e, code, err = sm.readEntry(txn, key, nowMs)
		return err
	})
	return e, code, err
}

// readEntry reads key in txn, nowMs deciding expiry.
func (sm *StateMachine) readEntry(txn *badger.Txn, key []byte, nowMs int64) (ValueEntry, Code, error) {
	s, code := sm.route(key)
	if code != OK {
		return ValueEntry{}, code, nil
	}
	e := ValueEntry{NowMs: nowMs}
	v, err := raftgroup.GetValue(txn, dataKey(s, key))
	if err != nil || v == nil {
		return e, code, err
	}
	r, err := decodeRecord(v)
	if err != nil {
		return e, code, err
	}
	if r.live(nowMs) {
		e = ValueEntry{Found: true, Type: r.Type, Value: r.Value, ExpireAtMs: r.ExpireAtMs, NowMs: nowMs}
		if r.Type.collection() {
			e.Value = nil
		}
	}
	return e, code, nil
}

// logTime is the log clock (Unix ns) stored with the state txn reads: the
// apply stores it in the same transaction as the changes.
func logTime(txn *badger.Txn) (int64, error) {
	v, err := raftgroup.GetValue(txn, keyLogTime)
	if err != nil || len(v) != 8 {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// CountChanges counts shard s's change index entries (tests and tools).
func (sm *StateMachine) CountChanges(s int) (n int) {
	_ = sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: append(shardPrefix(s), tagChange)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	return n
}

// CountKeys counts the live and tombstoned keys held for shard s (any state).
func (sm *StateMachine) CountKeys(s int) (n int, err error) {
	prefix := append(shardPrefix(s), tagData)
	err = sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	})
	return n, err
}
