package shardkv

// The Redis protocol front end (pkg/resp) serves clients that carry no
// request ids: they resend a command after MOVED or TRYAGAIN. This file is
// the group's side of that contract. A *Refusal means the command did not
// execute and never will, so resending it is safe; ErrOutcomeUnknown means
// it was proposed and may or may not take effect, which the front end must
// not turn into a redirect.

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// RefusalKind is how a refused command is answered.
type RefusalKind int

const (
	// Moved: another replica serves the slot (MOVED <slot> <addr>).
	Moved RefusalKind = iota + 1
	// TryAgain: the slot is here but not servable yet (arriving, or no
	// leader known).
	TryAgain
	// ClusterDown: no group serves the slot (no config yet).
	ClusterDown
)

// Refusal is a command that did not execute and never will.
type Refusal struct {
	Kind RefusalKind
	Slot int
	Addr string // Moved: the target's RESP address
	Why  string
}

func (r *Refusal) Error() string {
	switch r.Kind {
	case Moved:
		return fmt.Sprintf("MOVED %d %s", r.Slot, r.Addr)
	case TryAgain:
		return "TRYAGAIN " + r.Why
	}
	return "CLUSTERDOWN " + r.Why
}

// ErrOutcomeUnknown: the command was proposed, and whether it takes effect
// is unknown (a timeout, or leadership lost after the entry was appended).
var ErrOutcomeUnknown = errors.New("outcome unknown")

// ValueEntry is a key as read.
type ValueEntry struct {
	Found      bool
	Value      []byte
	ExpireAtMs int64 // 0: no expiry
}

// NodeID is a replica's Redis Cluster node id: 40 hex characters, stable
// across restarts (derived from the group and replica ids).
func NodeID(gid, replica uint64) string {
	h := sha1.Sum([]byte("shardkv-node:" + strconv.FormatUint(gid, 10) + ":" + strconv.FormatUint(replica, 10)))
	return hex.EncodeToString(h[:])
}

// RedisNode is one replica as Redis Cluster clients see it.
type RedisNode struct {
	ID        string // NodeID
	GID       uint64
	ReplicaID uint64
	Addr      string // RESP host:port (a hostname is allowed)
	Leader    bool
	Self      bool
}

// RedisGroup is one data group of the config.
type RedisGroup struct {
	GID   uint64
	Nodes []RedisNode // the leader first when known, then by replica id
}

// SlotOwner is a contiguous slot range and the group that owns it.
type SlotOwner struct {
	Start, End int // inclusive
	GID        uint64
}

// ClusterView is this replica's applied config, in Redis Cluster terms.
type ClusterView struct {
	ConfigNum uint64
	Self      RedisNode
	Groups    []RedisGroup // by gid; groups of the config that serve RESP
	Slots     []SlotOwner  // by start slot
}

// Group returns gid's entry (nil if absent).
func (v *ClusterView) Group(gid uint64) *RedisGroup {
	for i := range v.Groups {
		if v.Groups[i].GID == gid {
			return &v.Groups[i]
		}
	}
	return nil
}

// KeyCounts counts the keys a replica holds, tombstones excluded and
// keys past their expiry but not yet deleted included (as Redis's DBSIZE).
type KeyCounts struct {
	Total   int
	Expires int                // keys with an expiry
	ByState map[ShardState]int // keys by their shard's state
	Shards  map[ShardState]int // shards by state
}

// refusal says why key's slot is not served here, as a redirect to the
// replica that serves it when known.
func (g *Group) refusal(key []byte, code Code) *Refusal {
	slot := routing.Slot(key)
	conf := g.sm.Config()
	if len(conf.Shards) == 0 {
		return &Refusal{Kind: ClusterDown, Slot: slot, Why: "Hash slot not served"}
	}
	s := routing.Shard(slot, len(conf.Shards))
	if code == NotReady {
		return &Refusal{Kind: TryAgain, Slot: slot, Why: fmt.Sprintf("shard %d (slot %d) is still arriving at config %d", s, slot, conf.Num)}
	}
	owner := conf.Shards[s]
	if owner == 0 {
		return &Refusal{Kind: ClusterDown, Slot: slot, Why: "Hash slot not served"}
	}
	if owner == g.sm.gid {
		return &Refusal{Kind: TryAgain, Slot: slot, Why: fmt.Sprintf("shard %d (slot %d) is changing owner", s, slot)}
	}
	if addr := g.respAddrOf(owner, g.leaderOf(owner)); addr != "" {
		return &Refusal{Kind: Moved, Slot: slot, Addr: addr}
	}
	return &Refusal{Kind: TryAgain, Slot: slot, Why: fmt.Sprintf("group %d serves slot %d but has no known Redis address", owner, slot)}
}

// toLeader is the refusal of a follower: MOVED to the leader, or TRYAGAIN
// while no leader is known.
func (g *Group) toLeader(key []byte) *Refusal {
	slot := routing.Slot(key)
	id := g.leaderOf(g.sm.gid)
	if addr := g.respAddrOf(g.sm.gid, id); addr != "" && id != g.r.ID() {
		return &Refusal{Kind: Moved, Slot: slot, Addr: addr}
	}
	return &Refusal{Kind: TryAgain, Slot: slot, Why: "no leader is known for this group right now"}
}

// respAddrOf is the RESP address of replica id of group gid, or of the
// group's first member with one if id is unknown (0 or not a member).
func (g *Group) respAddrOf(gid, id uint64) string {
	var first string
	for _, c := range []*shardkvpb.Config{g.sm.Config(), g.sm.PrevConfig()} {
		for _, grp := range c.Groups {
			if grp.Gid != gid {
				continue
			}
			for _, s := range grp.Servers {
				if s.RespAddr == "" {
					continue
				}
				if s.Id == id && id != 0 {
					return s.RespAddr
				}
				if first == "" {
					first = s.RespAddr
				}
			}
		}
	}
	if gid == g.sm.gid {
		// Our own leader: learned from Raft, even if the config predates it.
		return ""
	}
	return first
}

// leaderOf is the leader of gid as last known: Raft for our group, the
// controller's status for the others.
func (g *Group) leaderOf(gid uint64) uint64 {
	if gid == g.sm.gid {
		if id, _ := g.r.Leader(); id != 0 {
			return id
		}
		// A replica that just started (a pod restart) knows no leader
		// until the leader's first message: fall back to the one the
		// controller last heard from, so clients are redirected rather
		// than told to retry here. A stale leader costs one more redirect.
	}
	g.respMu.Lock()
	defer g.respMu.Unlock()
	return g.respLeaders[gid]
}

// refreshLeaders keeps the other groups' leaders, from the controller's
// status, for MOVED targets and CLUSTER replies (soft state: a stale leader
// only costs the client one more redirect).
func (g *Group) refreshLeaders() {
	defer g.wg.Done()
	if g.cfg.Ctrler == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := g.cfg.Ctrler.Status(ctx)
		cancel()
		if err == nil {
			m := map[uint64]uint64{}
			for _, gs := range st.Groups {
				if r := gs.GetReport(); r != nil && r.LeaderId != 0 {
					m[r.Gid] = r.LeaderId
				}
			}
			g.respMu.Lock()
			g.respLeaders = m
			g.respMu.Unlock()
		}
		select {
		case <-g.stopc:
			return
		case <-t.C:
		}
	}
}

// RedisRead reads keys (of one slot) linearizably: a ReadIndex round, then
// local state with the local clock deciding expiry. A follower serves it
// only if followerReads (READONLY); otherwise it answers Moved to the leader.
func (g *Group) RedisRead(ctx context.Context, keys [][]byte, followerReads bool) ([]ValueEntry, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	for _, k := range keys {
		if _, code := g.sm.route(k); code != OK {
			return nil, g.refusal(k, code)
		}
	}
	if !followerReads && !g.r.IsLeader() {
		return nil, g.toLeader(keys[0])
	}
	if err := g.r.ReadIndex(ctx); err != nil {
		if raftgroup.IsNotExecuted(err) {
			// A read has no effect: a refusal is always safe. Without
			// READONLY the client belongs at the leader; with it, on any
			// replica once a leader is known again.
			if !followerReads {
				return nil, g.toLeader(keys[0])
			}
			return nil, &Refusal{Kind: TryAgain, Slot: routing.Slot(keys[0]), Why: "no leader is known for this group right now"}
		}
		return nil, fmt.Errorf("read barrier: %w", err)
	}
	now := time.Now().UnixMilli()
	out := make([]ValueEntry, len(keys))
	for i, k := range keys {
		e, code, err := g.sm.GetEntry(k, now)
		if err != nil {
			return nil, err
		}
		if code != OK {
			// The config moved on while we waited for the barrier.
			return nil, g.refusal(k, code)
		}
		out[i] = e
	}
	return out, nil
}

// WriteOutcome is one op's outcome: a result, or a *Refusal.
type WriteOutcome struct {
	Result *shardkvpb.WriteResult
	Err    error
}

// RedisWrite proposes ops as one log entry, in order. It returns a *Refusal
// if none executed (not the leader, or every key refused before proposing),
// an error wrapping ErrOutcomeUnknown if the outcome is unknown, another
// error for invalid input (nothing executed), or one outcome per op.
func (g *Group) RedisWrite(ctx context.Context, ops []*shardkvpb.WriteOp) ([]WriteOutcome, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	for _, op := range ops {
		if err := g.checkOp(op); err != nil {
			return nil, err
		}
		if op.Session != nil {
			return nil, errors.New("a RESP write carries no client session")
		}
	}
	out := make([]WriteOutcome, len(ops))
	var send []*shardkvpb.WriteOp
	var idx []int
	for i, op := range ops {
		if _, code := g.sm.route(op.Key); code != OK {
			out[i].Err = g.refusal(op.Key, code)
			continue
		}
		send = append(send, op)
		idx = append(idx, i)
	}
	if len(send) == 0 {
		return nil, out[0].Err
	}
	if !g.r.IsLeader() {
		return nil, g.toLeader(send[0].Key)
	}
	v, err := g.propose(ctx, &shardkvpb.GroupCommand{Writes: send})
	switch {
	case err == nil:
	case raftgroup.IsTooLarge(err):
		// Invalid input: retrying cannot help, so no TRYAGAIN.
		return nil, fmt.Errorf("the batch is too large for one log entry: %w", err)
	case raftgroup.IsNotExecuted(err):
		var nl *raftgroup.NotLeaderError
		if errors.As(err, &nl) {
			return nil, g.toLeader(send[0].Key)
		}
		return nil, &Refusal{Kind: TryAgain, Slot: routing.Slot(send[0].Key), Why: err.Error()}
	case raftgroup.IsOutcomeUnknown(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
	default:
		// Anything else after proposing: we cannot say it did not run.
		return nil, fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
	}
	res, ok := v.([]OpResult)
	if !ok || len(res) != len(send) {
		return nil, fmt.Errorf("%w: unexpected apply result %T", ErrOutcomeUnknown, v)
	}
	for j, r := range res {
		i := idx[j]
		if r.Code == OK {
			out[i].Result = r.Result
		} else {
			out[i].Err = g.refusal(ops[i].Key, r.Code)
		}
	}
	return out, nil
}

// ClusterView describes the applied config with RESP addresses and the
// leaders this replica knows.
func (g *Group) ClusterView() ClusterView {
	conf := g.sm.Config()
	v := ClusterView{ConfigNum: conf.Num}
	self := g.r.ID()
	for _, grp := range conf.Groups {
		lead := g.leaderOf(grp.Gid)
		rg := RedisGroup{GID: grp.Gid}
		for _, s := range grp.Servers {
			if s.RespAddr == "" {
				continue
			}
			n := RedisNode{ID: NodeID(grp.Gid, s.Id), GID: grp.Gid, ReplicaID: s.Id, Addr: s.RespAddr,
				Leader: s.Id == lead && lead != 0, Self: grp.Gid == g.sm.gid && s.Id == self}
			rg.Nodes = append(rg.Nodes, n)
		}
		if len(rg.Nodes) == 0 {
			continue
		}
		slices.SortStableFunc(rg.Nodes, func(a, b RedisNode) int {
			if a.Leader != b.Leader {
				if a.Leader {
					return -1
				}
				return 1
			}
			return int(a.ReplicaID) - int(b.ReplicaID)
		})
		v.Groups = append(v.Groups, rg)
	}
	slices.SortFunc(v.Groups, func(a, b RedisGroup) int { return int(a.GID) - int(b.GID) })
	id, _ := g.r.Leader()
	v.Self = RedisNode{ID: NodeID(g.sm.gid, self), GID: g.sm.gid, ReplicaID: self, Addr: g.cfg.RESPAddr, Leader: id == self, Self: true}
	n := len(conf.Shards)
	for _, r := range routing.Ranges(conf.Shards) {
		if r.GID == 0 {
			continue
		}
		first, _ := routing.SlotRange(r.First, n)
		_, last := routing.SlotRange(r.Last, n)
		v.Slots = append(v.Slots, SlotOwner{Start: first, End: last, GID: r.GID})
	}
	return v
}

// KeyCounts counts every key this replica holds, from local state.
func (g *Group) KeyCounts() (KeyCounts, error) {
	shards := g.sm.Shards()
	kc := KeyCounts{ByState: map[ShardState]int{}, Shards: map[ShardState]int{}}
	for _, m := range shards {
		kc.Shards[m.State]++
	}
	err := g.sm.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'d'}, PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) < 4 || k[3] != tagData {
				continue
			}
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.Tombstone {
				continue
			}
			kc.Total++
			if rec.ExpireAtMs != 0 {
				kc.Expires++
			}
			st := shards[int(k[1])<<8|int(k[2])].State
			if st == NotOwned {
				st = "NotOwned"
			}
			kc.ByState[st]++
		}
		return nil
	})
	return kc, err
}

// itemHeader decodes a value record's header (tombstone, index, expiry)
// from a data item; the value itself is not kept.
func itemHeader(item *badger.Item) (record, error) {
	var rec record
	err := item.Value(func(v []byte) error {
		var err error
		rec, err = decodeRecord(v)
		rec.Value = nil // only valid inside Value
		return err
	})
	return rec, err
}

// slotKeys calls f for the live keys of slot held here, until f says stop.
func (g *Group) slotKeys(slot int, f func(key []byte) bool) error {
	if slot < 0 || slot >= routing.Slots {
		return fmt.Errorf("slot %d out of range", slot)
	}
	n := len(g.sm.Config().Shards)
	if n == 0 {
		return nil
	}
	prefix := append(shardPrefix(routing.Shard(slot, n)), tagData)
	now := time.Now().UnixMilli()
	return g.sm.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key := it.Item().Key()[len(prefix):]
			if routing.Slot(key) != slot {
				continue
			}
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.live(now) && !f(bytes.Clone(key)) {
				return nil
			}
		}
		return nil
	})
}

// CountKeysInSlot counts the live keys of slot held here (local state).
func (g *Group) CountKeysInSlot(slot int) (int, error) {
	n := 0
	err := g.slotKeys(slot, func([]byte) bool { n++; return true })
	return n, err
}

// KeysInSlot returns up to count live keys of slot held here (local state).
func (g *Group) KeysInSlot(slot, count int) ([][]byte, error) {
	var out [][]byte
	if count <= 0 {
		return nil, nil
	}
	err := g.slotKeys(slot, func(k []byte) bool { out = append(out, k); return len(out) < count })
	return out, err
}

// Scan examines up to count keys of the shards this replica serves, in
// order, after position `after` (nil: from the start), and returns the live
// ones match accepts (match nil: all) and the position to continue from;
// next is nil when the scan is complete. Local state: any replica.
func (g *Group) Scan(after []byte, count int, match func(key []byte) bool) (keys [][]byte, next []byte, err error) {
	if count <= 0 {
		count = 10
	}
	shards := g.sm.Shards()
	now := time.Now().UnixMilli()
	err = g.sm.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{'d'}})
		defer it.Close()
		it.Rewind()
		if after != nil {
			it.Seek(after)
			if it.Valid() && bytes.Equal(it.Item().Key(), after) {
				it.Next()
			}
		}
		examined := 0
		for it.Valid() {
			k := it.Item().Key()
			s := int(k[1])<<8 | int(k[2])
			if !serves(shards[s]) || k[3] != tagData {
				// Skip the rest of a shard we do not serve, or its sessions.
				if !serves(shards[s]) {
					it.Seek(shardPrefix(s + 1))
				} else {
					it.Seek(append(shardPrefix(s), tagData+1))
				}
				continue
			}
			if examined == count {
				next = bytes.Clone(after)
				return nil
			}
			examined++
			after = it.Item().KeyCopy(nil)
			key := after[4:]
			rec, err := itemHeader(it.Item())
			if err != nil {
				return err
			}
			if rec.live(now) && (match == nil || match(key)) {
				keys = append(keys, bytes.Clone(key))
			}
			it.Next()
		}
		return nil
	})
	return keys, next, err
}

// RaftStatus is this replica's Raft status (INFO raft).
func (g *Group) RaftStatus() *shardkvpb.MemberStatus { return g.r.StatusProto() }

// MaxValueBytes is the group's value size limit.
func (g *Group) MaxValueBytes() int { return g.cfg.MaxValueBytes }

// MaxKeyBytes is the group's key size limit.
func (g *Group) MaxKeyBytes() int { return g.cfg.MaxKeyBytes }
