package shardkv

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
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

// applyCtx is one Apply call: one badger transaction, or several when the
// batch is large (each covers whole entries and stores the index of its
// last). Shard metadata changes are staged and published after commit.
type applyCtx struct {
	sm      *StateMachine
	b       *raftgroup.Batch
	txn     *badger.Txn // b's open transaction
	index   uint64
	nowNS   int64
	metas   map[int]ShardMeta // staged shard metas
	config  *shardkvpb.Config
	prev    *shardkvpb.Config
	changed bool
	// used is the open transaction's size as badger counts it; last and
	// lastNS are the index and log time of the last entry in it (0: none).
	used   budget
	last   uint64
	lastNS int64
	// buf holds a write command's records until the whole command is known
	// to fit one transaction (nil for other commands: they write to txn).
	buf *entryBuf
	// maxValue is the current write command's value limit.
	maxValue int
	// returned is the bytes of previous values the current write
	// command's ops return (EntryMaxResultBytes bounds it).
	returned int
	// Client sessions read by the current entry, by session key, written
	// back once at its end (flushSessions).
	sessions map[string]*stagedSession
	// touched: keys written since the last commit, for key watchers.
	touched []string
}

// entryBuf is one write command's records, last write of each key wins.
// Commands are all or nothing: a command whose writes would not fit one
// transaction must leave nothing behind, and badger cannot take back part
// of a transaction.
type entryBuf struct {
	m     map[string]bufWrite
	order []string // first-write order: flushed in it
	size  budget
}

type bufWrite struct {
	v   []byte
	del bool
}

func (b *entryBuf) put(k, v []byte, del bool) {
	ks := string(k)
	if w, ok := b.m[ks]; ok {
		b.size.records--
		b.size.bytes -= recordCost(len(k), len(w.v))
	} else {
		b.order = append(b.order, ks)
	}
	b.m[ks] = bufWrite{v: v, del: del}
	b.size.add(len(k), len(v))
}

func (a *applyCtx) set(k, v []byte) error {
	if a.buf != nil {
		a.buf.put(k, v, false)
		return nil
	}
	a.used.add(len(k), len(v))
	a.sm.cache.put(k, v)
	return a.txn.Set(k, v)
}

func (a *applyCtx) del(k []byte) error {
	if a.buf != nil {
		a.buf.put(k, nil, true)
		return nil
	}
	a.used.add(len(k), 0)
	a.sm.cache.put(k, nil)
	return a.txn.Delete(k)
}

// value is the value under k as the current entry sees it: its own
// buffered writes first. nil: absent (every record read here is non-empty).
func (a *applyCtx) value(k []byte) ([]byte, error) {
	if a.buf != nil {
		if w, ok := a.buf.m[string(k)]; ok {
			if w.del {
				return nil, nil
			}
			return w.v, nil
		}
	}
	if v, ok := a.sm.cache.get(k); ok {
		return v, nil
	}
	return raftgroup.GetValue(a.txn, k)
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

// Apply applies a batch of the group's log entries. An error is a storage
// fault (badger failed to read or commit); everything an entry's content can
// cause, from a bad record to a command too large for one transaction, is
// that entry's result, the same on every replica.
func (sm *StateMachine) Apply(b *raftgroup.Batch, ents []raftgroup.Entry) error {
	sm.mu.RLock()
	a := &applyCtx{sm: sm, b: b, txn: b.Txn(), metas: map[int]ShardMeta{}, config: sm.config, prev: sm.prev, nowNS: sm.logTime,
		sessions: map[string]*stagedSession{}}
	sm.mu.RUnlock()
	a.used.records, a.used.bytes = b.Size()
	for i := range ents {
		e := &ents[i]
		a.index = e.Index
		// Log time: the leader's clock from the entry, never moving back.
		if t := e.Time.UnixNano(); !e.Time.IsZero() && t > a.nowNS {
			a.nowNS = t
		}
		if e.Cmd != nil {
			var cmd shardkvpb.GroupCommand
			if err := proto.Unmarshal(e.Cmd, &cmd); err != nil {
				e.Result = fmt.Errorf("undecodable command at %d: %v", e.Index, err)
			} else {
				res, err := a.apply(&cmd)
				if err == nil {
					err = a.flushSessions()
				}
				if err != nil {
					return fmt.Errorf("apply entry %d: %w", e.Index, err)
				}
				e.Result = res
			}
		}
		a.last, a.lastNS = e.Index, a.nowNS
		// Keep each badger transaction well below its size limit.
		if i < len(ents)-1 && (a.used.records > 5000 || a.used.bytes > 1<<20) {
			if err := a.commit(false); err != nil {
				return err
			}
		}
	}
	return a.commit(true)
}

// commit stores the applied index with the changes, and publishes the new
// metadata once they are committed: by the engine with the Ready (final),
// or here, to open the next transaction. Splitting a batch over several
// transactions is safe: each one covers whole entries and records the
// index of the last.
func (a *applyCtx) commit(final bool) error {
	if err := raftgroup.StoreApplied(a.txn, keyApplied, a.last); err != nil {
		return err
	}
	if err := a.txn.Set(keyLogTime, binary.BigEndian.AppendUint64(nil, uint64(a.lastNS))); err != nil {
		return err
	}
	metas, config, prev, logTime, changed := a.metas, a.config, a.prev, a.lastNS, a.changed
	touched := a.touched
	a.touched = nil
	sm := a.sm
	a.b.AfterCommit(func() {
		defer sm.watches.notify(touched, changed)
		sm.mu.Lock()
		for s, m := range metas {
			if m.State == NotOwned {
				delete(sm.shards, s)
			} else {
				sm.shards[s] = m
			}
		}
		sm.config, sm.prev, sm.logTime = config, prev, logTime
		var notify chan struct{}
		if changed {
			notify = sm.changed
			sm.changed = make(chan struct{})
		}
		sm.mu.Unlock()
		if notify != nil {
			close(notify)
		}
	})
	a.metas = map[int]ShardMeta{}
	a.changed = false
	if final {
		return nil
	}
	if err := a.b.Commit(); err != nil {
		return fmt.Errorf("commit up to entry %d: %w", a.last, err)
	}
	a.txn, a.used, a.last = a.b.Txn(), budget{}, 0
	return nil
}

func (a *applyCtx) apply(cmd *shardkvpb.GroupCommand) (any, error) {
	switch {
	case len(cmd.Writes) > 0:
		return a.writes(cmd)
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
	case cmd.TrimChanges != nil:
		return a.trimChanges(cmd.TrimChanges)
	case cmd.ExpireSessions:
		return a.expire()
	case cmd.ExpireKeys:
		return a.expireKeys()
	case cmd.CollectDead:
		return a.collectDead()
	}
	return errors.New("empty command"), nil
}

// room makes sure the open transaction can take b more, the most the
// current entry writes: if the entries before it in the transaction leave
// less, they are committed first. Apply commits only past 1 MiB, so up to
// that much may be there when an entry starts; where a batch is cut into
// transactions does not change the state.
func (a *applyCtx) room(b budget) error {
	lim := a.sm.txnMax
	if a.used.records+b.records+commitRecords < lim.records && a.used.bytes+b.bytes+commitCost < lim.bytes {
		return nil
	}
	switch {
	case a.last != 0:
		return a.commit(false)
	case a.used != budget{}:
		// Only the engine's log writes are in the transaction (no entry
		// applied in it yet): they go first, alone.
		if err := a.b.Commit(); err != nil {
			return fmt.Errorf("commit the log writes: %w", err)
		}
		a.txn, a.used = a.b.Txn(), budget{}
	}
	return nil
}

// writes applies a write command: all its ops, or, if their records do
// not fit one transaction, none (each executed op gets COMMAND_TOO_LARGE;
// the check before proposing keeps every command it accepts below that).
func (a *applyCtx) writes(cmd *shardkvpb.GroupCommand) (any, error) {
	a.buf = &entryBuf{m: map[string]bufWrite{}}
	a.returned = 0
	defer func() { a.buf = nil }()
	a.maxValue = MaxValueBytesLimit
	if m := cmd.MaxValueBytes; m > 0 && m < MaxValueBytesLimit {
		a.maxValue = int(m)
	}
	out := make([]OpResult, len(cmd.Writes))
	for i, op := range cmd.Writes {
		r, err := a.write(op)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	if err := a.flushSessions(); err != nil {
		return nil, err
	}
	b := a.buf
	a.buf = nil
	if !b.size.fits() {
		for i := range out {
			if out[i].Code == OK {
				out[i].Result = &shardkvpb.WriteResult{Error: shardkvpb.OpErrCommandTooLarge}
			}
		}
		return out, nil
	}
	if err := a.room(b.size); err != nil {
		return nil, err
	}
	for _, k := range b.order {
		w := b.m[k]
		var err error
		if w.del {
			err = a.del([]byte(k))
		} else {
			err = a.set([]byte(k), w.v)
		}
		if err != nil {
			return nil, fmt.Errorf("write %d records (%d bytes): %w", b.size.records, b.size.bytes, err)
		}
	}
	return out, nil
}

// failed is the result of an op that its content refused at apply: it
// changed nothing.
func failed(code string) OpResult {
	return OpResult{Result: &shardkvpb.WriteResult{Error: code}}
}

// write applies one op. The error is a storage fault; a refusal is the
// op's result.
func (a *applyCtx) write(op *shardkvpb.WriteOp) (OpResult, error) {
	s, code := ownership(a.sm.gid, a.config, a.meta, op.Key)
	if code != OK {
		// Not executed, and not recorded: a retry elsewhere is safe.
		return OpResult{Code: code}, nil
	}
	if len(dataKey(s, op.Key)) > badgerMaxKey {
		// Only an entry proposed without submit's check gets here.
		return failed(shardkvpb.OpErrKeyTooLarge), nil
	}
	var sess *session
	var staged *stagedSession
	if c := op.Session.GetClientId(); c != 0 {
		var err error
		if staged, err = a.session(s, c); errors.Is(err, errBadRecord) {
			return failed(shardkvpb.OpErrBadRecord), nil
		} else if err != nil {
			return OpResult{}, err
		}
		sess = staged.sess
		sess.ack(op.Session.Ack)
		if op.Session.Seq <= sess.Floor {
			// Acknowledged long ago: the client no longer waits for it.
			return OpResult{Result: &shardkvpb.WriteResult{}}, nil
		}
		if d, ok := sess.find(op.Session.Seq); ok {
			return OpResult{Result: d.result()}, nil
		}
		if op.Session.Seq <= sess.Trimmed {
			return OpResult{Code: ResultForgotten}, nil
		}
	}
	res, err := a.mutate(s, op)
	if err != nil {
		return OpResult{}, err
	}
	a.noteWrite(op.Key, op.Dest)
	a.noteWrite(op.MoreKeys...)
	if sess != nil {
		sess.LastNS = a.nowNS
		sess.add(doneOf(op.Session.Seq, res, op.ReturnPrev))
		staged.dirty = true
	}
	return OpResult{Result: res}, nil
}

// mutate runs op on its key's record; a refusal is res.Error.
func (a *applyCtx) mutate(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	switch op.Kind {
	case shardkvpb.WriteOp_RENAME, shardkvpb.WriteOp_COPY:
		return a.mutatePair(s, op)
	case shardkvpb.WriteOp_MSET_NX:
		return a.msetNX(s, op)
	case shardkvpb.WriteOp_SMOVE:
		return a.smove(s, op)
	case shardkvpb.WriteOp_SSTORE:
		return a.sstore(s, op)
	case shardkvpb.WriteOp_ZSTORE:
		return a.zstore(s, op)
	case shardkvpb.WriteOp_ZRANGESTORE:
		return a.zrangeStore(s, op)
	}
	switch collType(op.Kind) {
	case TypeList:
		return a.mutateList(s, op)
	case TypeZSet:
		return a.mutateZSet(s, op)
	case TypeHash, TypeSet:
		return a.mutateColl(s, op)
	}
	old, err := a.get(dataKey(s, op.Key))
	if err != nil {
		return readFailed(err)
	}
	nowMs := a.nowNS / 1e6
	oldLive := old != nil && old.live(nowMs)
	if oldLive && old.Type != TypeString {
		switch {
		case op.Kind == shardkvpb.WriteOp_READ:
			return &shardkvpb.WriteResult{PrevFound: true, PrevType: uint32(old.Type)}, nil
		case op.ReturnPrev || stringOnly(op.Kind):
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrWrongType}, nil
		}
	}
	if op.ReturnPrev && oldLive {
		if a.returned+len(old.Value) > EntryMaxResultBytes {
			return &shardkvpb.WriteResult{Error: shardkvpb.OpErrResultTooLarge}, nil
		}
		a.returned += len(old.Value)
	}
	res := &shardkvpb.WriteResult{}
	next, err := applyOp(op, old, oldLive, nowMs, a.maxValue, res)
	switch {
	case err != nil:
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrBadRecord}, nil
	case res.Error != "":
		return &shardkvpb.WriteResult{Error: res.Error}, nil
	case next == nil:
	case !next.Tombstone && next.ExpireAtMs != 0 && len(expiresKey(0, s, op.Key)) > badgerMaxKey:
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
	default:
		next.Index = a.index
		if err := a.putRecord(s, op.Key, old, next); err != nil {
			return nil, err
		}
	}
	if op.ReturnPrev && oldLive {
		res.Prev, res.PrevFound = old.Value, true
	}
	return res, nil
}

// returns reserves n bytes of the values the current command returns
// (pops), within EntryMaxResultBytes; false: they would pass it.
func (a *applyCtx) returns(n int) bool {
	if a.returned+n > EntryMaxResultBytes {
		return false
	}
	a.returned += n
	return true
}

// stringOnly reports whether op kind works on strings only: any other
// type fails WRONGTYPE. The rest (PUT, DELETE, EXPIRE, PERSIST) take any
// type, unless they return the previous value (GETSET, GETDEL, GETEX).
func stringOnly(k shardkvpb.WriteOp_Kind) bool {
	switch k {
	case shardkvpb.WriteOp_APPEND, shardkvpb.WriteOp_CAS, shardkvpb.WriteOp_INCR, shardkvpb.WriteOp_INCR_FLOAT,
		shardkvpb.WriteOp_SET_RANGE, shardkvpb.WriteOp_SET_BIT:
		return true
	}
	return false
}

// mutatePair runs RENAME or COPY, which read the records of two keys of
// shard s and may write both.
func (a *applyCtx) mutatePair(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	if e := a.otherKeyError(s, op.Dest); e != "" {
		return &shardkvpb.WriteResult{Error: e}, nil
	}
	src, err := a.get(dataKey(s, op.Key))
	if err != nil {
		return readFailed(err)
	}
	dst, err := a.get(dataKey(s, op.Dest))
	if err != nil {
		return readFailed(err)
	}
	return a.putPair(s, op, src, dst)
}

// readFailed is the outcome of an op whose record could not be read: a
// record that does not decode is the op's result (BAD_RECORD: every
// replica reads the same bytes), anything else a storage fault.
func readFailed(err error) (*shardkvpb.WriteResult, error) {
	if errors.Is(err, errBadRecord) {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrBadRecord}, nil
	}
	return nil, err
}

// otherKeyError checks a second key of an op on shard s (RENAME's and
// COPY's destination, MSETNX's other keys): "" if it is in s and fits
// storage, else the op's error.
func (a *applyCtx) otherKeyError(s int, key []byte) string {
	switch {
	case routing.ShardOf(key, len(a.config.Shards)) != s:
		return shardkvpb.OpErrCrossShard
	case len(dataKey(s, key)) > badgerMaxKey:
		return shardkvpb.OpErrKeyTooLarge
	}
	return ""
}

func (a *applyCtx) putPair(s int, op *shardkvpb.WriteOp, src, dst *record) (*shardkvpb.WriteResult, error) {
	nowMs := a.nowNS / 1e6
	res := &shardkvpb.WriteResult{}
	nextSrc, nextDst := applyPair(op, src, src != nil && src.live(nowMs), dst, dst != nil && dst.live(nowMs), res)
	if res.Error != "" {
		return &shardkvpb.WriteResult{Error: res.Error}, nil
	}
	if nextDst != nil && nextDst.ExpireAtMs != 0 && len(expiresKey(0, s, op.Dest)) > badgerMaxKey {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrKeyTooLarge}, nil
	}
	if nextDst != nil && nextDst.Type.collection() {
		if e, err := a.copyElems(s, op.Key, src, op.Dest, dst, nextDst); err != nil || e != "" {
			return &shardkvpb.WriteResult{Error: e}, err
		}
	}
	for _, w := range []struct {
		key       []byte
		old, next *record
	}{{op.Dest, dst, nextDst}, {op.Key, src, nextSrc}} {
		if w.next == nil {
			continue
		}
		w.next.Index = a.index
		if err := a.putRecord(s, w.key, w.old, w.next); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// msetNX sets every pair of op (all in shard s) if none of its keys
// exists; a key named twice takes its last value.
func (a *applyCtx) msetNX(s int, op *shardkvpb.WriteOp) (*shardkvpb.WriteResult, error) {
	if len(op.MoreKeys) != len(op.MoreValues) {
		return &shardkvpb.WriteResult{Error: shardkvpb.OpErrInvalidOp}, nil // submit refuses it first
	}
	keys := append([][]byte{op.Key}, op.MoreKeys...)
	vals := append([][]byte{op.Value}, op.MoreValues...)
	olds := make([]*record, len(keys))
	nowMs := a.nowNS / 1e6
	for i, k := range keys {
		if len(vals[i]) > a.maxValue {
			return &shardkvpb.WriteResult{Error: errValueTooLarge}, nil
		}
		if e := a.otherKeyError(s, k); e != "" {
			return &shardkvpb.WriteResult{Error: e}, nil
		}
		old, err := a.get(dataKey(s, k))
		if err != nil {
			return readFailed(err)
		}
		if old != nil && old.live(nowMs) {
			return &shardkvpb.WriteResult{}, nil
		}
		olds[i] = old
	}
	last := map[string]int{}
	for i, k := range keys {
		last[string(k)] = i
	}
	for i, k := range keys {
		if last[string(k)] != i {
			continue
		}
		if err := a.putRecord(s, k, olds[i], &record{Value: vals[i], Index: a.index}); err != nil {
			return nil, err
		}
	}
	return &shardkvpb.WriteResult{Ok: true}, nil
}

// errBadRecord: a stored record did not decode (a result, not a fault:
// every replica reads the same bytes).
var errBadRecord = errors.New("bad stored record")

func (a *applyCtx) get(k []byte) (*record, error) {
	v, err := a.value(k)
	if err != nil || v == nil {
		return nil, err
	}
	r, err := decodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRecord, err)
	}
	return &r, nil
}
