package ctrler

import (
	"encoding/json"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/ctrler/placement"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Result is what applying a command returns to its proposer.
type Result struct {
	Config *shardkvpb.Config
	Users  *shardkvpb.UsersReply // of a SetUsers entry
	Err    error                 // a refusal (bad input); the config is unchanged
}

// session is a client's dedup entry: its last sequence number and outcome.
type session struct {
	Seq    uint64 `json:"seq"`
	Num    uint64 `json:"num"`
	Err    string `json:"err,omitempty"`
	TimeNS int64  `json:"t"`
}

type initMeta struct {
	Shards    int    `json:"shards"`
	Placement string `json:"placement"`
}

// Apply applies controller commands. Every replica computes the same
// configs: placement is deterministic and nothing iterates a Go map.
func (sm *StateMachine) Apply(rb *raftgroup.Batch, ents []raftgroup.Entry) error {
	b := newBatch(rb, sm.store.DB())
	made := false
	for i := range ents {
		e := &ents[i]
		if e.Cmd == nil {
			continue
		}
		cmd, err := decodeCommand(e.Cmd)
		if err != nil {
			e.Result = Result{Err: refuse("undecodable command: %v", err)}
			continue
		}
		b.prev = e.Index - 1
		res, newConf, err := sm.applyOne(b, cmd, e.Time)
		if err == nil {
			err = b.flush()
		}
		if err != nil {
			return err // storage failure: fatal
		}
		made = made || newConf
		e.Result = res
	}
	if err := b.done(ents[len(ents)-1].Index); err != nil {
		return err
	}
	if made {
		rb.AfterCommit(sm.notify)
	}
	return nil
}

func (sm *StateMachine) applyOne(b *batch, cmd *shardkvpb.ControllerCommand, now time.Time) (Result, bool, error) {
	if initOp := cmd.GetInit(); initOp != nil {
		return sm.applyInit(b, initOp)
	}
	sm.mu.Lock()
	inited, nshards, strategy := sm.inited, sm.nshards, sm.strategy
	sm.mu.Unlock()
	if !inited {
		return Result{Err: ErrNotInitialized}, false, nil
	}
	if compact := cmd.GetCompact(); compact != nil {
		return Result{}, false, sm.applyCompact(b, compact.GetBelow(), now)
	}
	if cut := cmd.GetCutOver(); cut != nil {
		return sm.applyCutOver(b, cut)
	}
	if su := cmd.GetSetUsers(); su != nil {
		res, err := sm.applySetUsers(b, su)
		return res, false, err
	}
	// Exactly once: a retried request gets the first outcome back.
	var client, seq uint64
	if req := request(cmd); req != nil {
		client, seq = req.GetClientId(), req.GetSeq()
	}
	var sess session
	if client != 0 {
		v, err := raftgroup.GetValue(b.txn, dedupKey(client))
		if err != nil {
			return Result{}, false, err
		}
		if v != nil {
			if err := json.Unmarshal(v, &sess); err != nil {
				return Result{}, false, err
			}
			if seq <= sess.Seq {
				if seq < sess.Seq {
					return Result{Err: refuse("request %d of client %x is older than its latest (%d)", seq, client, sess.Seq)}, false, nil
				}
				c, err := getConfig(b.txn, sess.Num)
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
	latest, err := getConfig(b.txn, sm.latestNum())
	if err != nil {
		return Result{}, false, err
	}
	next, refusal := nextConfig(latest, nshards, strategy, cmd)
	res := Result{Config: latest, Err: refusal}
	made := false
	if refusal == nil && next != nil {
		if err := sm.storeConfig(b, next); err != nil {
			return Result{}, false, err
		}
		res.Config, made = next, true
	}
	if client != 0 {
		sess = session{Seq: seq, Num: res.Config.GetNum(), TimeNS: now.UnixNano()}
		if refusal != nil {
			sess.Err = refusal.Error()
		}
		enc, _ := json.Marshal(sess)
		b.set(dedupKey(client), enc)
	}
	return res, made, nil
}

// applyCutOver hands over the planned moves the leader found caught up
// (the leader's own entry: no client session). A move no longer planned
// exactly so (cancelled, retargeted, or already cut over) is skipped; if
// none is left, no config is made and the result is the latest.
func (sm *StateMachine) applyCutOver(b *batch, cut *shardkvpb.ControllerCutOver) (Result, bool, error) {
	latest, err := getConfig(b.txn, sm.latestNum())
	if err != nil {
		return Result{}, false, err
	}
	next := cutOverConfig(latest, cut)
	if next == nil {
		return Result{Config: latest}, false, nil
	}
	if err := sm.storeConfig(b, next); err != nil {
		return Result{}, false, err
	}
	return Result{Config: next}, true, nil
}

func (sm *StateMachine) applyInit(b *batch, cmd *shardkvpb.ControllerInit) (Result, bool, error) {
	sm.mu.Lock()
	inited := sm.inited
	sm.mu.Unlock()
	if inited {
		c, err := getConfig(b.txn, sm.latestNum())
		return Result{Config: c}, false, err
	}
	shards := int(cmd.GetShards())
	if err := routing.ValidateShards(shards); err != nil {
		return Result{Err: refuse("%v", err)}, false, nil
	}
	st, err := placement.Parse(cmd.GetPlacement())
	if err != nil {
		return Result{Err: refuse("%v", err)}, false, nil
	}
	meta, _ := json.Marshal(initMeta{Shards: shards, Placement: string(st)})
	b.set(keyInit, meta)
	c0 := &shardkvpb.Config{Num: 0, Shards: make([]uint64, shards), Placement: string(st)}
	b.set(keyOldest, u64(0))
	sm.mu.Lock()
	sm.nshards, sm.strategy, sm.inited = shards, st, true
	sm.mu.Unlock()
	if err := sm.storeConfig(b, c0); err != nil {
		return Result{}, false, err
	}
	return Result{Config: c0}, true, nil
}

func (sm *StateMachine) storeConfig(b *batch, c *shardkvpb.Config) error {
	enc, err := proto.Marshal(c)
	if err != nil {
		return err
	}
	b.set(confKey(c.Num), enc)
	b.set(keyLatest, u64(c.Num))
	sm.mu.Lock()
	sm.latest = c.Num
	sm.mu.Unlock()
	return nil
}

// applyCompact drops configs below `below` (never the latest) and sessions
// idle for longer than SessionTTL. It may drop more than one transaction
// holds, so it writes in steps that each leave a consistent state (the
// oldest config kept is stored with its deletes): a crash between two
// steps leaves the entry to be applied again, which finishes the job.
func (sm *StateMachine) applyCompact(b *batch, below uint64, now time.Time) error {
	sm.mu.Lock()
	oldest, latest := sm.oldest, sm.latest
	sm.mu.Unlock()
	below = min(below, latest)
	for oldest < below {
		step := min(below, oldest+compactStep)
		for n := oldest; n < step; n++ {
			b.del(confKey(n))
		}
		b.set(keyOldest, u64(step))
		if err := b.flush(); err != nil {
			return err
		}
		oldest = step
		sm.mu.Lock()
		sm.oldest = step
		sm.mu.Unlock()
	}
	expired, err := expiredSessions(b.txn, now)
	if err != nil {
		return err
	}
	for i, k := range expired {
		b.del(k)
		if (i+1)%compactStep == 0 {
			if err := b.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// compactStep is how many deletes compaction writes per step.
const compactStep = 1024

func expiredSessions(txn *badger.Txn, now time.Time) ([][]byte, error) {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixDedup, PrefetchValues: true})
	defer it.Close()
	var expired [][]byte
	for it.Rewind(); it.Valid(); it.Next() {
		var s session
		if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &s) }); err != nil {
			return nil, err
		}
		if now.Sub(time.Unix(0, s.TimeNS)) > SessionTTL {
			expired = append(expired, it.Item().KeyCopy(nil))
		}
	}
	return expired, nil
}
