package shardkv

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// StateMachine is a data group's replicated state.
type StateMachine struct {
	gid   uint64
	store *raftgroup.PrefixStore // the DB, the applied index, snapshots

	mu      sync.RWMutex
	config  *shardkvpb.Config // current
	prev    *shardkvpb.Config // the one before (source of pulls)
	shards  map[int]ShardMeta // shards not NotOwned
	logTime int64             // log clock (Unix ns), never moving back (docs/time.md)
	changed chan struct{}     // closed and replaced on every state change that loops care about
	txnMax  budget            // badger's per-transaction limits, from Open
	cache   recordCache       // apply's last writes (Apply and Restore only)

	// Process-lifetime counters of shard data received and deleted through
	// the log (every replica counts what it applies).
	MigratedKeys, MigratedBytes, GCKeys atomic.Uint64
	pauses                              pauseHist
	// deadPending: a dead collection version may have elements left to
	// collect (set by apply, cleared by a collection that found none;
	// only a hint for the leader's proposals, never read by apply).
	deadPending atomic.Bool
	watches     watches
	// strandedAt is 1 + the config at which this replica found the group
	// stranded (Group.stepPlan): the controller compacted configs the
	// group never applied and it owns shards on one side of the gap. Its
	// state is older than what it once reported, so while its applied
	// config is that one it serves nothing (route). 0: not stranded. Soft
	// state, per replica, never read by apply.
	strandedAt atomic.Uint64
}

// NewStateMachine returns the state machine of data group gid.
func NewStateMachine(gid uint64) *StateMachine {
	sm := &StateMachine{gid: gid, config: &shardkvpb.Config{}, prev: &shardkvpb.Config{}, shards: map[int]ShardMeta{}, changed: make(chan struct{})}
	sm.store = raftgroup.NewPrefixStore(keyApplied, statePrefixes, sm.load)
	return sm
}

// GID is the group's id.
func (sm *StateMachine) GID() uint64 { return sm.gid }

func (sm *StateMachine) Open(db *badger.DB) (uint64, error) {
	if err := checkLimits(db); err != nil {
		return 0, err
	}
	// The real per-transaction limits (badger refuses at or above them).
	sm.txnMax = budget{records: int(db.MaxBatchCount()), bytes: int(db.MaxBatchSize())}
	return sm.store.Open(db)
}

func (sm *StateMachine) load(txn *badger.Txn) error {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.config, sm.prev = &shardkvpb.Config{}, &shardkvpb.Config{}
	for k, c := range map[string]*shardkvpb.Config{string(keyConfig): sm.config, string(keyPrev): sm.prev} {
		v, err := raftgroup.GetValue(txn, []byte(k))
		if err != nil {
			return err
		}
		if v != nil {
			if err := proto.Unmarshal(v, c); err != nil {
				return err
			}
		}
	}
	var err error
	if sm.logTime, err = logTime(txn); err != nil {
		return err
	}
	sm.shards = map[int]ShardMeta{}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'s'}, PrefetchValues: true})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().Key()
		s := int(k[1])<<8 | int(k[2])
		var m ShardMeta
		if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &m) }); err != nil {
			return err
		}
		sm.shards[s] = m
	}
	sm.deadPending.Store(true) // a collection finds out
	return nil
}

// TimeDependent implements raftgroup.TimeDependent: while any key has an
// expiry, reads change as time passes, so the leader keeps the log clock
// fresh (docs/time.md). It is one seek in the expiry index.
func (sm *StateMachine) TimeDependent() bool {
	found := false
	_ = sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'x'}})
		defer it.Close()
		it.Rewind()
		found = it.Valid()
		return nil
	})
	return found
}

// LogTime is the log clock as of the last applied entry.
func (sm *StateMachine) LogTime() time.Time {
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	return time.Unix(0, sm.logTime).UTC()
}
