package shardkv

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Code is why a write did not execute.
type Code int

const (
	OK Code = iota
	// WrongGroup: the group does not own the key's shard in its current config.
	WrongGroup
	// NotReady: the shard is owned but still arriving.
	NotReady
	// ResultForgotten: the op's seq is one whose result the session dropped
	// (see MaxDonePerSession); it may or may not have been applied before.
	ResultForgotten
)

// OpResult is the outcome of one write op.
type OpResult struct {
	Code   Code
	Result *shardkvpb.WriteResult
}

// applyCtx is one Apply call: one badger transaction. Shard metadata changes
// are staged and published to readers after commit.
type applyCtx struct {
	sm      *StateMachine
	txn     *badger.Txn
	index   uint64
	nowNS   int64
	metas   map[int]ShardMeta // staged shard metas
	config  *shardkvpb.Config
	prev    *shardkvpb.Config
	changed bool
	// Size of the open transaction, to split before badger's limit.
	ops, bytes int
	// Client sessions read by the current entry, by session key, written
	// back once at its end (flushSessions).
	sessions map[string]*stagedSession
}

func (a *applyCtx) set(k, v []byte) error {
	a.ops++
	a.bytes += len(k) + len(v)
	return a.txn.Set(k, v)
}

func (a *applyCtx) del(k []byte) error {
	a.ops++
	a.bytes += len(k)
	return a.txn.Delete(k)
}

func (a *applyCtx) meta(s int) ShardMeta {
	if m, ok := a.metas[s]; ok {
		return m
	}
	a.sm.mu.RLock()
	defer a.sm.mu.RUnlock()
	return a.sm.shards[s]
}

func (a *applyCtx) setMeta(s int, m ShardMeta) error {
	a.metas[s] = m
	a.changed = true
	if m.State == NotOwned {
		return a.del(shardMetaKey(s))
	}
	b, _ := json.Marshal(m)
	return a.set(shardMetaKey(s), b)
}

// Apply applies a batch of the group's log entries in one transaction.
func (sm *StateMachine) Apply(ents []raftgroup.Entry) error {
	sm.mu.RLock()
	a := &applyCtx{sm: sm, txn: sm.store.DB().NewTransaction(true), metas: map[int]ShardMeta{}, config: sm.config, prev: sm.prev, nowNS: sm.logTime,
		sessions: map[string]*stagedSession{}}
	sm.mu.RUnlock()
	defer a.txn.Discard()
	for i := range ents {
		e := &ents[i]
		a.index = e.Index
		// Log time: the leader's clock from the entry, never moving back.
		if t := e.Time.UnixNano(); !e.Time.IsZero() && t > a.nowNS {
			a.nowNS = t
		}
		if e.Cmd == nil {
			continue
		}
		var cmd shardkvpb.GroupCommand
		if err := proto.Unmarshal(e.Cmd, &cmd); err != nil {
			e.Result = fmt.Errorf("undecodable command at %d: %v", e.Index, err)
			continue
		}
		res, err := a.apply(&cmd)
		if err == nil {
			err = a.flushSessions()
		}
		if err != nil {
			return fmt.Errorf("apply entry %d: %w", e.Index, err)
		}
		e.Result = res
		// Keep each badger transaction well below its size limit.
		if i < len(ents)-1 && (a.ops > 5000 || a.bytes > 1<<20) {
			if err := a.commit(e.Index, false); err != nil {
				return err
			}
			a.txn, a.ops, a.bytes = sm.store.DB().NewTransaction(true), 0, 0
		}
	}
	return a.commit(ents[len(ents)-1].Index, true)
}

// commit stores the applied index with the changes and publishes the new
// metadata. Splitting a batch over several transactions is safe: each one
// records the index of the last entry it covers.
func (a *applyCtx) commit(index uint64, final bool) error {
	if err := raftgroup.StoreApplied(a.txn, keyApplied, index); err != nil {
		return err
	}
	if err := a.txn.Set(keyLogTime, binary.BigEndian.AppendUint64(nil, uint64(a.nowNS))); err != nil {
		return err
	}
	if err := a.txn.Commit(); err != nil {
		return err
	}
	sm := a.sm
	sm.mu.Lock()
	for s, m := range a.metas {
		if m.State == NotOwned {
			delete(sm.shards, s)
		} else {
			sm.shards[s] = m
		}
	}
	sm.config, sm.prev, sm.logTime = a.config, a.prev, a.nowNS
	var notify chan struct{}
	if a.changed {
		notify = sm.changed
		sm.changed = make(chan struct{})
	}
	sm.mu.Unlock()
	if notify != nil {
		close(notify)
	}
	a.metas = map[int]ShardMeta{}
	a.changed = false
	return nil
}

func (a *applyCtx) apply(cmd *shardkvpb.GroupCommand) (any, error) {
	switch {
	case len(cmd.Writes) > 0:
		out := make([]OpResult, len(cmd.Writes))
		for i, op := range cmd.Writes {
			r, err := a.write(op)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case cmd.NextConfig != nil:
		return a.nextConfig(cmd.NextConfig)
	case cmd.Insert != nil:
		return a.insertChunk(cmd.Insert)
	case cmd.Acked != nil:
		return a.acked(cmd.Acked)
	case cmd.Gc != nil:
		return a.startGC(cmd.Gc)
	case cmd.DeleteChunk != nil:
		return a.deleteChunk(cmd.DeleteChunk)
	case cmd.ExpireSessions:
		return nil, a.expire()
	case cmd.ExpireKeys:
		return a.expireKeys()
	}
	return errors.New("empty command"), nil
}

func (a *applyCtx) write(op *shardkvpb.WriteOp) (OpResult, error) {
	s, code := ownership(a.sm.gid, a.config, a.meta, op.Key)
	if code != OK {
		// Not executed, and not recorded: a retry elsewhere is safe.
		return OpResult{Code: code}, nil
	}
	var sess *session
	var staged *stagedSession
	if c := op.Session.GetClientId(); c != 0 {
		var err error
		if staged, err = a.session(s, c); err != nil {
			return OpResult{}, err
		}
		sess = staged.sess
		sess.ack(op.Session.Ack)
		if op.Session.Seq <= sess.Floor {
			// Acknowledged long ago: the client no longer waits for it.
			return OpResult{Result: &shardkvpb.WriteResult{}}, nil
		}
		if d, ok := sess.find(op.Session.Seq); ok {
			return OpResult{Result: &shardkvpb.WriteResult{Ok: d.OK, Prev: d.Prev, PrevFound: d.PrevFound}}, nil
		}
		if op.Session.Seq <= sess.Trimmed {
			return OpResult{Code: ResultForgotten}, nil
		}
	}
	dk := dataKey(s, op.Key)
	old, err := a.get(dk)
	if err != nil {
		return OpResult{}, err
	}
	nowMs := a.nowNS / 1e6
	oldLive := old != nil && old.live(nowMs)
	res := &shardkvpb.WriteResult{}
	if op.ReturnPrev && oldLive {
		res.Prev, res.PrevFound = old.Value, true
	}
	next, err := applyOp(op, old, oldLive, nowMs, res)
	if err != nil {
		return OpResult{}, err
	}
	if next != nil {
		next.Index = a.index
		if err := a.putRecord(s, op.Key, old, next); err != nil {
			return OpResult{}, err
		}
	}
	if sess != nil {
		sess.LastNS = a.nowNS
		d := doneOp{Seq: op.Session.Seq, OK: res.Ok}
		if op.ReturnPrev {
			d.Prev, d.PrevFound = res.Prev, res.PrevFound
		}
		sess.add(d)
		staged.dirty = true
	}
	return OpResult{Result: res}, nil
}

func (a *applyCtx) get(k []byte) (*record, error) {
	v, err := raftgroup.GetValue(a.txn, k)
	if err != nil || v == nil {
		return nil, err
	}
	r, err := decodeRecord(v)
	return &r, err
}
