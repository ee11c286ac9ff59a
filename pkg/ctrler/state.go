// Package ctrler is the shard controller: a replicated state machine (on
// pkg/raftgroup) that owns the numbered history of configurations the whole
// cluster follows, and its gRPC service. Clients use pkg/ctrler/ctrlerclient,
// which depends only on the wire API.
package ctrler

import (
	"cmp"
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
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Keys of the controller's state (all outside the engine's 0x00 prefix).
var (
	keyApplied  = []byte("m/applied")
	keyInit     = []byte("m/init")
	keyLatest   = []byte("m/latest")
	keyOldest   = []byte("m/oldest")
	prefixConf  = []byte("c/")
	prefixDedup = []byte("d/")
	prefixAll   = [][]byte{[]byte("m/"), prefixConf, prefixDedup}
)

// SessionTTL is how long a client's dedup entry lives after its last
// mutation, measured in log time. A client idle for longer that retries an
// old request gets it applied again; controller clients retry for seconds.
const SessionTTL = 24 * time.Hour

func confKey(n uint64) []byte  { return binary.BigEndian.AppendUint64(slices.Clone(prefixConf), n) }
func dedupKey(c uint64) []byte { return binary.BigEndian.AppendUint64(slices.Clone(prefixDedup), c) }
func u64(v uint64) []byte      { return binary.BigEndian.AppendUint64(nil, v) }
func readU64(b []byte) uint64  { return binary.BigEndian.Uint64(b) }

// Op names a controller command.
type Op string

const (
	OpInit    Op = "init"
	OpJoin    Op = "join"
	OpLeave   Op = "leave"
	OpMove    Op = "move"
	OpUnpin   Op = "unpin"
	OpCompact Op = "compact"
)

// Command is one entry of the controller's log (JSON: the controller's
// traffic is tiny, and a readable log is worth more than a few bytes).
type Command struct {
	Op        Op                 `json:"op"`
	ClientID  uint64             `json:"client,omitempty"`
	Seq       uint64             `json:"seq,omitempty"`
	Shards    int                `json:"shards,omitempty"`
	Placement string             `json:"placement,omitempty"`
	Groups    []*shardkvpb.Group `json:"groups,omitempty"`
	GIDs      []uint64           `json:"gids,omitempty"`
	Shard     int                `json:"shard,omitempty"`
	GID       uint64             `json:"gid,omitempty"`
	Below     uint64             `json:"below,omitempty"`
}

// Result is what applying a command returns to its proposer.
type Result struct {
	Config *shardkvpb.Config
	Err    error // a refusal (bad input); the config is unchanged
}

// session is a client's dedup entry: its last sequence number and outcome.
type session struct {
	Seq    uint64 `json:"seq"`
	Num    uint64 `json:"num"`
	Err    string `json:"err,omitempty"`
	TimeNS int64  `json:"t"`
}

// InputError is a refused request: bad input, the config is unchanged.
type InputError struct{ Msg string }

func (e *InputError) Error() string { return e.Msg }

func refuse(format string, a ...any) error { return &InputError{fmt.Sprintf(format, a...)} }

// StateMachine is the controller's replicated state.
type StateMachine struct {
	db *badger.DB

	mu       sync.Mutex
	nshards  int
	strategy placement.Strategy
	latest   uint64
	oldest   uint64
	inited   bool
	changed  chan struct{} // closed and replaced when a new config is made
}

// NewStateMachine returns an empty controller state machine.
func NewStateMachine() *StateMachine {
	return &StateMachine{changed: make(chan struct{})}
}

type initMeta struct {
	Shards    int    `json:"shards"`
	Placement string `json:"placement"`
}

func (sm *StateMachine) Open(db *badger.DB) (uint64, error) {
	sm.db = db
	return sm.reload()
}

// reload reads the applied index and the metadata from the DB (at Open and
// after a Restore).
func (sm *StateMachine) reload() (applied uint64, err error) {
	err = sm.db.View(func(txn *badger.Txn) error {
		if applied, err = raftgroup.LoadApplied(txn, keyApplied); err != nil {
			return err
		}
		return sm.loadMeta(txn)
	})
	return applied, err
}

func (sm *StateMachine) loadMeta(txn *badger.Txn) error {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	v, err := getRaw(txn, keyInit)
	if err != nil || v == nil {
		sm.inited = false
		return err
	}
	var m initMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return err
	}
	sm.nshards, sm.strategy, sm.inited = m.Shards, placement.Strategy(m.Placement), true
	if v, err = getRaw(txn, keyLatest); err != nil {
		return err
	}
	sm.latest = readU64(v)
	if v, err = getRaw(txn, keyOldest); err != nil {
		return err
	}
	sm.oldest = readU64(v)
	return nil
}

func getRaw(txn *badger.Txn, k []byte) ([]byte, error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return item.ValueCopy(nil)
}

func getConfig(txn *badger.Txn, n uint64) (*shardkvpb.Config, error) {
	v, err := getRaw(txn, confKey(n))
	if err != nil || v == nil {
		return nil, err
	}
	c := &shardkvpb.Config{}
	return c, proto.Unmarshal(v, c)
}

// Apply applies controller commands. Every replica computes the same
// configs: placement is deterministic and nothing iterates a Go map.
func (sm *StateMachine) Apply(ents []raftgroup.Entry) error {
	txn := sm.db.NewTransaction(true)
	defer txn.Discard()
	made := false
	for i := range ents {
		e := &ents[i]
		if e.Cmd == nil {
			continue
		}
		var cmd Command
		if err := json.Unmarshal(e.Cmd, &cmd); err != nil {
			e.Result = Result{Err: refuse("undecodable command: %v", err)}
			continue
		}
		res, newConf, err := sm.applyOne(txn, &cmd, e.Time)
		if err != nil {
			return err // storage failure: fatal
		}
		made = made || newConf
		e.Result = res
	}
	if err := txn.Set(keyApplied, u64(ents[len(ents)-1].Index)); err != nil {
		return err
	}
	if err := txn.Commit(); err != nil {
		return err
	}
	if made {
		sm.mu.Lock()
		close(sm.changed)
		sm.changed = make(chan struct{})
		sm.mu.Unlock()
	}
	return nil
}

func (sm *StateMachine) applyOne(txn *badger.Txn, cmd *Command, now time.Time) (Result, bool, error) {
	if cmd.Op == OpInit {
		return sm.applyInit(txn, cmd)
	}
	sm.mu.Lock()
	inited := sm.inited
	sm.mu.Unlock()
	if !inited {
		return Result{Err: ErrNotInitialized}, false, nil
	}
	if cmd.Op == OpCompact {
		return Result{}, false, sm.applyCompact(txn, cmd.Below, now)
	}
	// Exactly once: a retried request gets the first outcome back.
	var sess session
	if cmd.ClientID != 0 {
		v, err := getRaw(txn, dedupKey(cmd.ClientID))
		if err != nil {
			return Result{}, false, err
		}
		if v != nil {
			if err := json.Unmarshal(v, &sess); err != nil {
				return Result{}, false, err
			}
			if cmd.Seq <= sess.Seq {
				if cmd.Seq < sess.Seq {
					return Result{Err: refuse("request %d of client %x is older than its latest (%d)", cmd.Seq, cmd.ClientID, sess.Seq)}, false, nil
				}
				c, err := getConfig(txn, sess.Num)
				if err != nil {
					return Result{}, false, err
				}
				res := Result{Config: c}
				if sess.Err != "" {
					res.Err = &InputError{sess.Err}
				}
				return res, false, nil
			}
		}
	}
	latest, err := getConfig(txn, sm.latestNum())
	if err != nil {
		return Result{}, false, err
	}
	next, refusal := sm.nextConfig(latest, cmd)
	res := Result{Config: latest, Err: refusal}
	made := false
	if refusal == nil && next != nil {
		if err := sm.storeConfig(txn, next); err != nil {
			return Result{}, false, err
		}
		res.Config, made = next, true
	}
	if cmd.ClientID != 0 {
		sess = session{Seq: cmd.Seq, Num: res.Config.GetNum(), TimeNS: now.UnixNano()}
		if refusal != nil {
			sess.Err = refusal.Error()
		}
		b, _ := json.Marshal(sess)
		if err := txn.Set(dedupKey(cmd.ClientID), b); err != nil {
			return Result{}, false, err
		}
	}
	return res, made, nil
}

func (sm *StateMachine) latestNum() uint64 {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.latest
}

func (sm *StateMachine) applyInit(txn *badger.Txn, cmd *Command) (Result, bool, error) {
	sm.mu.Lock()
	inited := sm.inited
	sm.mu.Unlock()
	if inited {
		c, err := getConfig(txn, sm.latestNum())
		return Result{Config: c}, false, err
	}
	if err := routing.ValidateShards(cmd.Shards); err != nil {
		return Result{Err: refuse("%v", err)}, false, nil
	}
	st, err := placement.Parse(cmd.Placement)
	if err != nil {
		return Result{Err: refuse("%v", err)}, false, nil
	}
	meta, _ := json.Marshal(initMeta{Shards: cmd.Shards, Placement: string(st)})
	if err := txn.Set(keyInit, meta); err != nil {
		return Result{}, false, err
	}
	c0 := &shardkvpb.Config{Num: 0, Shards: make([]uint64, cmd.Shards), Placement: string(st)}
	if err := txn.Set(keyOldest, u64(0)); err != nil {
		return Result{}, false, err
	}
	sm.mu.Lock()
	sm.nshards, sm.strategy, sm.inited = cmd.Shards, st, true
	sm.mu.Unlock()
	if err := sm.storeConfig(txn, c0); err != nil {
		return Result{}, false, err
	}
	return Result{Config: c0}, true, nil
}

func (sm *StateMachine) storeConfig(txn *badger.Txn, c *shardkvpb.Config) error {
	b, err := proto.Marshal(c)
	if err != nil {
		return err
	}
	if err := txn.Set(confKey(c.Num), b); err != nil {
		return err
	}
	if err := txn.Set(keyLatest, u64(c.Num)); err != nil {
		return err
	}
	sm.mu.Lock()
	sm.latest = c.Num
	sm.mu.Unlock()
	return nil
}

// applyCompact drops configs below `below` (never the latest) and sessions
// idle for longer than SessionTTL.
func (sm *StateMachine) applyCompact(txn *badger.Txn, below uint64, now time.Time) error {
	sm.mu.Lock()
	oldest, latest := sm.oldest, sm.latest
	sm.mu.Unlock()
	below = min(below, latest)
	for n := oldest; n < below; n++ {
		if err := txn.Delete(confKey(n)); err != nil {
			return err
		}
	}
	if below > oldest {
		if err := txn.Set(keyOldest, u64(below)); err != nil {
			return err
		}
		sm.mu.Lock()
		sm.oldest = below
		sm.mu.Unlock()
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixDedup, PrefetchValues: true})
	defer it.Close()
	var expired [][]byte
	for it.Rewind(); it.Valid(); it.Next() {
		var s session
		if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &s) }); err != nil {
			return err
		}
		if now.Sub(time.Unix(0, s.TimeNS)) > SessionTTL {
			expired = append(expired, it.Item().KeyCopy(nil))
		}
	}
	for _, k := range expired {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// nextConfig computes the config a command makes from latest. It returns
// (nil, nil) when the command changes nothing, and a refusal for bad input.
func (sm *StateMachine) nextConfig(latest *shardkvpb.Config, cmd *Command) (*shardkvpb.Config, error) {
	sm.mu.Lock()
	nshards, strategy := sm.nshards, sm.strategy
	sm.mu.Unlock()
	next := proto.Clone(latest).(*shardkvpb.Config)
	next.Num = latest.Num + 1
	joining := map[uint64]bool{}
	switch cmd.Op {
	case OpJoin:
		if len(cmd.Groups) == 0 {
			return nil, refuse("join: no groups given")
		}
		seen := map[uint64]bool{}
		changed := false
		for _, g := range cmd.Groups {
			if err := validateGroup(g); err != nil {
				return nil, err
			}
			if seen[g.Gid] {
				return nil, refuse("join: gid %d given twice", g.Gid)
			}
			seen[g.Gid] = true
			ng := normalizeGroup(g)
			i := slices.IndexFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == g.Gid })
			if i < 0 {
				next.Groups = append(next.Groups, ng)
				joining[g.Gid] = true
				changed = true
			} else if !proto.Equal(next.Groups[i], ng) {
				// A join of a gid that is already in the config updates its
				// servers and weight (documented in docs/controller.md).
				next.Groups[i] = ng
				changed = true
			}
		}
		if !changed {
			return nil, nil
		}
		slices.SortFunc(next.Groups, func(a, b *shardkvpb.Group) int { return cmp.Compare(a.Gid, b.Gid) })
	case OpLeave:
		if len(cmd.GIDs) == 0 {
			return nil, refuse("leave: no gids given")
		}
		for _, gid := range cmd.GIDs {
			if gid == 0 {
				return nil, refuse("leave: gid 0 is not a group")
			}
			if !slices.ContainsFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == gid }) {
				return nil, refuse("leave: gid %d is not in config %d", gid, latest.Num)
			}
		}
		next.Groups = slices.DeleteFunc(next.Groups, func(x *shardkvpb.Group) bool { return slices.Contains(cmd.GIDs, x.Gid) })
		if len(next.Groups) == 0 {
			return nil, refuse("leave: refused, no group would remain to hold the data (config %d has %d groups)", latest.Num, len(latest.Groups))
		}
		next.Pins = slices.DeleteFunc(next.Pins, func(p *shardkvpb.Pin) bool { return slices.Contains(cmd.GIDs, p.Gid) })
	case OpMove:
		if cmd.Shard < 0 || cmd.Shard >= nshards {
			return nil, refuse("move: shard %d is out of range [0, %d)", cmd.Shard, nshards)
		}
		if cmd.GID == 0 || !slices.ContainsFunc(next.Groups, func(x *shardkvpb.Group) bool { return x.Gid == cmd.GID }) {
			return nil, refuse("move: gid %d is not in config %d", cmd.GID, latest.Num)
		}
		i := slices.IndexFunc(next.Pins, func(p *shardkvpb.Pin) bool { return int(p.Shard) == cmd.Shard })
		if i >= 0 && next.Pins[i].Gid == cmd.GID {
			return nil, nil
		}
		if i >= 0 {
			next.Pins[i].Gid = cmd.GID
		} else {
			next.Pins = append(next.Pins, &shardkvpb.Pin{Shard: uint32(cmd.Shard), Gid: cmd.GID})
			slices.SortFunc(next.Pins, func(a, b *shardkvpb.Pin) int { return int(a.Shard) - int(b.Shard) })
		}
	case OpUnpin:
		if cmd.Shard < 0 || cmd.Shard >= nshards {
			return nil, refuse("unpin: shard %d is out of range [0, %d)", cmd.Shard, nshards)
		}
		i := slices.IndexFunc(next.Pins, func(p *shardkvpb.Pin) bool { return int(p.Shard) == cmd.Shard })
		if i < 0 {
			return nil, refuse("unpin: shard %d is not pinned", cmd.Shard)
		}
		next.Pins = slices.Delete(next.Pins, i, i+1)
	default:
		return nil, refuse("unknown operation %q", cmd.Op)
	}
	var gs []placement.Group
	for _, g := range next.Groups {
		gs = append(gs, placement.Group{GID: g.Gid, Weight: g.Weight, Joining: joining[g.Gid]})
	}
	pins := make([]uint64, nshards)
	for _, p := range next.Pins {
		pins[p.Shard] = p.Gid
	}
	next.Shards = placement.Assign(strategy, latest.Shards, gs, pins)
	return next, nil
}

func validateGroup(g *shardkvpb.Group) error {
	if g.GetGid() == 0 {
		return refuse("join: gid 0 is reserved for unassigned shards")
	}
	if len(g.Servers) == 0 {
		return refuse("join: group %d has an empty server list", g.Gid)
	}
	ids := map[uint64]bool{}
	for _, s := range g.Servers {
		if s.Id == 0 {
			return refuse("join: group %d: server id 0 is invalid (ids start at 1)", g.Gid)
		}
		if s.Addr == "" {
			return refuse("join: group %d server %d has no address", g.Gid, s.Id)
		}
		if ids[s.Id] {
			return refuse("join: group %d lists server %d twice", g.Gid, s.Id)
		}
		ids[s.Id] = true
	}
	return nil
}

func normalizeGroup(g *shardkvpb.Group) *shardkvpb.Group {
	ng := proto.Clone(g).(*shardkvpb.Group)
	ng.Weight = max(ng.Weight, 1)
	slices.SortFunc(ng.Servers, func(a, b *shardkvpb.Server) int { return cmp.Compare(a.Id, b.Id) })
	return ng
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

// ErrNotInitialized: the cluster's first config does not exist yet (its
// leader proposes it right after the first election). Retry.
var ErrNotInitialized = errors.New("the controller is not initialised yet")

// ErrCompacted: the requested config was dropped from history.
var ErrCompacted = errors.New("config compacted")

// Config returns config n from local state; n < 0 or past the latest means
// the latest. Call after Replica.ReadIndex for a linearizable answer.
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
	var c *shardkvpb.Config
	err := sm.db.View(func(txn *badger.Txn) error {
		var err error
		c, err = getConfig(txn, num)
		return err
	})
	if err == nil && c == nil {
		err = fmt.Errorf("config %d missing", num)
	}
	return c, err
}

func (sm *StateMachine) Snapshot() (raftgroup.Snapshot, error) {
	return raftgroup.PrefixSnapshot(sm.db, keyApplied, prefixAll...)
}

func (sm *StateMachine) Restore(r io.Reader) (uint64, error) {
	if err := raftgroup.RestorePrefixes(sm.db, r, prefixAll...); err != nil {
		return 0, err
	}
	applied, err := sm.reload()
	sm.mu.Lock()
	close(sm.changed)
	sm.changed = make(chan struct{})
	sm.mu.Unlock()
	return applied, err
}
