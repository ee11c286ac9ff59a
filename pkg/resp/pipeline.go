package resp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Write batching bounds. A batch is one Raft entry, which the engine bounds
// (1 MiB by default); 256 KiB of keys and values keeps a batch well under
// that and its apply short. One command is never split, so a single large
// command goes alone.
//
// maxBatchWritten bounds what a batch is estimated to write to storage
// (written): a batch is applied in one badger transaction, whose limit
// (about 2.4 MiB) counts every write, so ten thousand APPENDs to one 50 KB
// key are 500 MB even though the ops carry a few bytes each.
const (
	// maxLogReadKeys: a read of more keys waits for the write batch rather
	// than joining it (each key read in the log is an op whose result, the
	// value, every replica computes and holds).
	maxLogReadKeys  = 16
	maxBatchOps     = 1024
	maxBatchBytes   = 256 << 10
	maxBatchWritten = 1 << 20
	// maxKnownSizes bounds a connection's map of value sizes (written).
	maxKnownSizes = 4096
)

// outcomeUnknown is the reply to a write that was proposed but whose result
// is unknown. It must not start with a word that clients retry on
// (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, LOADING, READONLY, MASTERDOWN): a
// retry could apply the write twice.
const outcomeUnknown = "ERR outcome unknown: the write was proposed but its result is unknown (leader change or timeout); read the key before retrying"

// readUnknown is the reply to a read made inside a write batch whose
// outcome is unknown. Not a retry error either: a client resending its
// whole pipeline for it would resend the writes.
const readUnknown = "ERR read failed: it was made in a write batch whose outcome is unknown (leader change or timeout)"

// errLate is the reply to a command still waiting for its turn when its
// pipeline's deadline was near: it did not execute and never will.
const errLate = "TRYAGAIN not executed: the command waited too long behind the rest of its pipeline; please retry"

// item is one command of a pipeline: its reply once known, or the read or
// write it waits for.
type item struct {
	out      []byte
	slot     int
	deadline time.Time // when the reply is due (the command's)
	seq      uint64    // the command's (see queued)
	// charge is what was reserved in the server's output budget for this
	// item's reply, and for replies before it (values read or returned for
	// them): handed to the outbox with the reply (see emit).
	charge int64

	// A keyed read: keys of slot, rendered by onRead.
	keys     [][]byte
	follower bool
	ttl      bool // it needs the keys' expiry times (not a log read)
	logRead  bool // made as ops of a write batch (see read)
	onRead   func(vals []shardkv.ValueEntry) []byte

	// A write: ops (of slot), rendered by onWrite when none was refused;
	// res are their results once known.
	ops     []*shardkvpb.WriteOp
	onWrite func(res []*shardkvpb.WriteResult) []byte
	res     []*shardkvpb.WriteResult
}

// pipeline runs queued commands of a connection in order, in rounds, and
// puts their replies in the outbox, in order, as each round completes (so a
// client's read timeout measures the server's latency, not the pipeline's
// length). Consecutive writes are combined into one WriteBatch (one log
// entry, applied in order), bounded so that a round stays short; a read
// after a write joins its batch as a log read, so (GET, INCR, APPEND)
// triples cost a round per batch rather than two per triple; other reads
// share one ReadKeys call per slot, run concurrently. A write after reads
// waits for them (they must not see it); commands that read local state
// call barrier first. Replies that need no backend (PING, errors) do not
// break a batch.
type pipeline struct {
	c        *conn
	items    []*item // not yet in the outbox, in order
	last     *item   // the last item added
	deadline time.Time
	seq      uint64 // the command being dispatched

	reads    []*item
	nkeys    int
	writes   []*item
	nops     int
	nbytes   int
	nwritten int
	// nreturn: the values the batch's ops may return (reads made in the
	// log, GETSET and the like), as estimated by returned; it is also
	// reserved in the output budget, and charged to the batch's last item.
	nreturn int
	// wkeys: the batch's estimate per key written (see written): the
	// backend buffers a batch's writes with the last write of each key
	// winning, so a key costs once whatever the number of its ops.
	wkeys map[string]int
}

func (p *pipeline) add(it *item) {
	it.deadline, it.seq = p.deadline, p.seq
	p.items = append(p.items, it)
	p.last = it
}

// reply adds a command whose reply is already known.
func (p *pipeline) reply(b []byte) { p.add(&item{out: b}) }

// read adds a keyed read. After a write of this pipeline (which it must
// see) it is made inside the write batch, at its place in the log, rather
// than in a ReadIndex round after it; reads of a READONLY connection (a
// follower's) and reads of expiry times still wait for the batch.
//
// A read joins the batch only while the values the batch may return stay
// within MaxReplyBytes and the output budget (see reserveReturn): every
// replica holds them until the batch is applied, and a thousand reads of
// one 8 MiB key in one batch were 8 GiB.
func (p *pipeline) read(it *item) {
	if len(p.writes) > 0 && !it.follower && !it.ttl && len(it.keys) <= maxLogReadKeys {
		it.logRead, it.ops = true, logReadOps(it.keys)
		if p.write(it) {
			return
		}
		it.logRead, it.ops = false, nil
	}
	p.flushWrites()
	if len(p.reads) > 0 && p.nkeys+len(it.keys) > maxBatchOps {
		p.flushReads()
	}
	p.add(it)
	p.reads = append(p.reads, it)
	p.nkeys += len(it.keys)
}

// logReadOps read keys inside a write batch: each an EXPIRE that never
// applies (a time of 0 is never greater than a key's expiry, and no expiry
// counts as an infinite one) and returns the key's live value as of its
// place in the log.
func logReadOps(keys [][]byte) []*shardkvpb.WriteOp {
	ops := make([]*shardkvpb.WriteOp, len(keys))
	for i, k := range keys {
		ops[i] = &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Cond: shardkvpb.WriteOp_IF_GREATER, Key: k, ReturnPrev: true}
	}
	return ops
}

// write adds a write, or a read made in the log (it.logRead), to the
// batch. A read joins only a batch that has room for it and the values it
// returns (see reserveReturn); otherwise write reports false and adds
// nothing. A write that returns the previous value (GETSET, SET ... GET,
// GETDEL) counts it the same way, and is refused, not run, if the output
// budget cannot hold it.
func (p *pipeline) write(it *item) bool {
	if !it.logRead {
		p.flushReads()
	}
	size, ret := 0, 0
	for _, op := range it.ops {
		size += len(op.Key) + len(op.Value) + 16
		if op.ReturnPrev {
			ret += p.returned(string(op.Key))
		}
	}
	grow := func(commit bool) int {
		written := 0
		for _, op := range it.ops {
			if it.logRead {
				continue
			}
			k, n := string(op.Key), p.written(op, commit)
			if old, ok := p.wkeys[k]; ok {
				written += max(n-old, 0)
				n = max(n, old)
			} else {
				written += n
			}
			if commit {
				p.wkeys[k] = n
			}
		}
		return written
	}
	if p.wkeys == nil {
		p.wkeys = map[string]int{}
	}
	full := len(p.writes) > 0 && (p.nops+len(it.ops) > maxBatchOps || p.nbytes+size > maxBatchBytes || p.nwritten+grow(false) > maxBatchWritten)
	switch {
	case it.logRead:
		if full || !p.reserveReturn(ret, false) {
			return false
		}
	case full:
		p.flushWrites()
		fallthrough
	default:
		if ret > 0 && !p.reserveReturn(ret, false) {
			p.flushWrites()
			if !p.reserveReturn(ret, true) {
				p.c.s.stats.outputRefusals.Add(1)
				p.reply(errReply(p.c.s.outputFull()))
				return true
			}
		}
	}
	written := grow(true)
	p.add(it)
	p.writes = append(p.writes, it)
	p.nops += len(it.ops)
	p.nbytes += size
	p.nwritten += written
	return true
}

// returned estimates the bytes of key's value that an op returns: its size
// as last seen by this connection, or the value limit if unknown.
func (p *pipeline) returned(key string) int { return p.size(key) + 16 }

// size is key's value size as last seen by this connection, or the value
// limit if unknown.
func (p *pipeline) size(key string) int {
	if n, ok := p.c.sizes[key]; ok {
		return n
	}
	return p.c.s.cfg.MaxValueBytes
}

// reserveReturn adds est to what the pending batch may return, if that
// stays within the batch's result bound (unless alone: the first write
// of a batch always fits) and the output budget can hold it.
func (p *pipeline) reserveReturn(est int, alone bool) bool {
	s := p.c.s
	bound := min(s.cfg.MaxReplyBytes, shardkv.EntryMaxResultBytes)
	if (p.nreturn+est > bound && !(alone && p.nreturn == 0)) || !s.outBudget.take(int64(est)) {
		return false
	}
	p.nreturn += est
	return true
}

// written estimates what op writes to storage: its key and the value it
// leaves. For APPEND, EXPIRE and PERSIST, which rewrite a value they do not
// carry, that is the value's size as last seen by this connection (a reply
// or an earlier op of its pipeline), or the value limit if unknown. It
// notes the size op leaves for the ops after it if commit.
func (p *pipeline) written(op *shardkvpb.WriteOp, commit bool) int {
	k, limit := string(op.Key), p.c.s.cfg.MaxValueBytes
	var n int
	switch op.Kind {
	case shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_CAS:
		n = len(op.Value)
	case shardkvpb.WriteOp_APPEND:
		n = min(p.size(k)+len(op.Value), limit)
	case shardkvpb.WriteOp_EXPIRE, shardkvpb.WriteOp_PERSIST:
		n = p.size(k)
	case shardkvpb.WriteOp_INCR, shardkvpb.WriteOp_INCR_FLOAT:
		n = 32
	}
	if commit {
		p.noteSize(op.Key, n)
	}
	return len(op.Key) + n + 32
}

// learn notes the value sizes that write results tell (see written).
func (p *pipeline) learn(items []*item) {
	for _, it := range items {
		if len(it.res) != len(it.ops) {
			continue
		}
		if it.logRead {
			for i, r := range it.res {
				p.noteSize(it.ops[i].Key, len(r.Prev))
			}
			continue
		}
		for i, op := range it.ops {
			if r := it.res[i]; op.Kind == shardkvpb.WriteOp_APPEND && r.Ok && r.Error == "" {
				p.noteSize(op.Key, int(r.Num))
			}
		}
	}
}

// barrier runs whatever batch is pending.
func (p *pipeline) barrier() {
	p.flushReads()
	p.flushWrites()
}

// emit puts the replies known so far, up to the first one still pending,
// into the outbox (waiting there while the client's output is full).
//
// Replies go in pieces of at most the outbox's bound (a large reply alone),
// so that each piece waits for room: one put of a whole round's replies
// would hold them all at once, whatever the client had read.
func (p *pipeline) emit() {
	for len(p.items) > 0 && p.items[0].out != nil {
		n, size := 0, 0
		var charge int64
		for n < len(p.items) && p.items[n].out != nil && (n == 0 || size+len(p.items[n].out) <= p.c.s.cfg.MaxOutputBytes) {
			size += len(p.items[n].out)
			charge += p.items[n].charge
			n++
		}
		b := p.items[0].out
		if n > 1 {
			b = make([]byte, 0, size)
			for _, it := range p.items[:n] {
				b = append(b, it.out...)
			}
		}
		seq := p.items[n-1].seq
		clear(p.items[:n])
		p.items = p.items[n:]
		p.c.out.put(b, charge, seq)
	}
}

// release gives back what the pipeline's items still hold of the output
// budget: after a panic, or once the client is gone, they are never
// emitted.
func (p *pipeline) release() {
	for _, it := range p.items {
		p.c.s.outBudget.give(it.charge)
		it.charge = 0
	}
	p.items = nil
}

// late answers the items whose deadline is too near to start them (less
// than a quarter of PipelineTimeout left) with errLate and returns the
// others. Items are in the order they were read, so the late ones come
// first.
func (s *Server) late(items []*item) []*item {
	cut := time.Now().Add(s.cfg.PipelineTimeout / 4)
	n := 0
	for n < len(items) && items[n].deadline.Before(cut) {
		s.stats.refused.Add(1)
		items[n].out = errReply(errLate)
		n++
	}
	return items[n:]
}

// roundContext bounds a round: timeout, and the deadline of its first
// command (the earliest).
func (s *Server) roundContext(timeout time.Duration, first *item) (context.Context, context.CancelFunc) {
	d := time.Now().Add(timeout)
	if !first.deadline.IsZero() && first.deadline.Before(d) {
		d = first.deadline
	}
	return context.WithDeadline(s.ctx, d)
}

// readGroup is the reads of one slot (and READONLY state) in a round.
type readGroup struct {
	follower bool
	first    *item // the earliest
	keys     [][]byte
	items    []*item

	// Set by read: each distinct key is read once; idx maps keys to
	// distinct, of which the first got have values in vals.
	idx      []int
	vals     []shardkv.ValueEntry
	got      int
	used     int  // bytes reserved in the output budget for vals
	noMemory bool // the read stopped at the output budget, not MaxReplyBytes
	err      error
	timedOut bool
}

// flushReads runs the pending reads in rounds: each round reads every
// slot's keys at once (one ReadKeys per slot), and holds at most
// MaxReplyBytes of values per slot; the reads it could not finish within
// that go to the next round, after its replies went out. So a pipeline of
// large values holds a bounded part of them at a time.
func (p *pipeline) flushReads() {
	if len(p.reads) == 0 {
		return
	}
	items := p.reads
	p.reads, p.nkeys = nil, 0
	for len(items) > 0 {
		items = p.readRound(p.c.s.late(items))
		p.emit()
	}
}

// readRound runs one round of items and returns those left for the next.
func (p *pipeline) readRound(items []*item) (again []*item) {
	type gkey struct {
		slot     int
		follower bool
	}
	byKey := map[gkey]*readGroup{}
	var groups []*readGroup
	for _, it := range items {
		k := gkey{it.slot, it.follower}
		g := byKey[k]
		if g == nil {
			g = &readGroup{follower: it.follower, first: it}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.keys = append(g.keys, it.keys...)
		g.items = append(g.items, it)
	}
	s := p.c.s
	if len(groups) == 1 {
		s.read(groups[0])
	} else {
		var wg sync.WaitGroup
		for _, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A panic here is outside the connection's recovery: make
				// it this read's error.
				defer func() {
					if r := recover(); r != nil {
						s.log.Error("panic in a read; answered with an error", "panic", fmt.Sprint(r))
						g.err = fmt.Errorf("internal error")
					}
				}()
				s.read(g)
			}()
		}
		wg.Wait()
	}
	for _, g := range groups {
		again = append(again, p.answer(g)...)
	}
	return again
}

// answer sets the replies of g's items that its read finished, and
// returns those it must read again. What g reserved goes with its last
// answered reply, as the values are now in the replies up to it.
func (p *pipeline) answer(g *readGroup) (again []*item) {
	s := p.c.s
	var last *item
	off := 0
	for j, it := range g.items {
		idx := g.idx[off : off+len(it.keys)]
		off += len(it.keys)
		complete := g.err == nil
		for _, i := range idx {
			complete = complete && i < g.got
		}
		switch {
		case g.err != nil:
			it.out = s.readError(g, it.slot)
		case complete:
			vals := make([]shardkv.ValueEntry, len(idx))
			for i, d := range idx {
				vals[i] = g.vals[d]
				p.noteSize(it.keys[i], len(vals[i].Value))
			}
			if e := s.replyTooLarge(vals); e != nil {
				it.out = e
			} else {
				it.out = it.onRead(vals)
				last = it
			}
		case g.noMemory:
			s.stats.outputRefusals.Add(1)
			it.out = errReply(s.outputFull())
		case j == 0:
			// The first read of the round stopped at MaxReplyBytes: it
			// alone passes it.
			s.stats.refused.Add(1)
			it.out = errReply(fmt.Sprintf("ERR the reply would be more than %d bytes, over the limit of %d bytes; read fewer or smaller keys per command", s.cfg.MaxReplyBytes, s.cfg.MaxReplyBytes))
		default:
			again = append(again, it)
		}
	}
	if last != nil {
		last.charge += int64(g.used)
	} else {
		s.outBudget.give(int64(g.used))
	}
	g.vals = nil
	return again
}

// noteSize notes key's value size for the estimates of written and
// returned.
func (p *pipeline) noteSize(key []byte, n int) {
	if len(p.c.sizes) >= maxKnownSizes {
		clear(p.c.sizes)
	}
	p.c.sizes[string(key)] = n
}

// outputFull is the error for a read refused for the output budget.
func (s *Server) outputFull() string {
	return fmt.Sprintf("ERR the server's output buffers are full (limit %d bytes); try again later", s.cfg.OutputBudgetBytes)
}

// read runs one read group: each distinct key once (MGET of one large key
// repeated holds one copy of its value, not one per argument), holding at
// most MaxReplyBytes of values (but always the first) and only what the
// output budget grants.
func (s *Server) read(g *readGroup) {
	ctx, cancel := s.roundContext(s.cfg.ReadTimeout, g.first)
	defer cancel()
	g.idx = make([]int, len(g.keys))
	at := map[string]int{}
	var distinct [][]byte
	for i, k := range g.keys {
		j, ok := at[string(k)]
		if !ok {
			j = len(distinct)
			at[string(k)] = j
			distinct = append(distinct, k)
		}
		g.idx[i] = j
	}
	reserve := func(n int) bool {
		n += 16
		if g.used > 0 && g.used+n > s.cfg.MaxReplyBytes {
			return false
		}
		if !s.outBudget.take(int64(n)) {
			g.noMemory = true
			return false
		}
		g.used += n
		return true
	}
	vals, err := s.b.ReadKeys(ctx, distinct, g.follower, reserve)
	switch {
	case errors.Is(err, shardkv.ErrReadLimit) && len(vals) < len(distinct):
	case err != nil:
		g.err = err
	case len(vals) != len(distinct):
		g.err = fmt.Errorf("backend returned %d values for %d keys", len(vals), len(distinct))
	}
	if g.err == nil {
		g.vals, g.got = vals, len(vals)
	}
	g.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
}

// readError is the reply to a failed read.
func (s *Server) readError(g *readGroup, slot int) []byte {
	var ref *shardkvpb.Refusal
	switch {
	case errors.As(g.err, &ref):
		return s.refusal(ref, slot)
	case g.timedOut && s.ctx.Err() == nil:
		// A read has no side effect, so a retry is always safe: let the
		// client retry (no quorum reachable, or an election under way).
		s.stats.refused.Add(1)
		return redcon.AppendError(nil, "TRYAGAIN read timed out waiting for the group's quorum; please retry")
	}
	return redcon.AppendError(nil, "ERR read failed: "+g.err.Error())
}

func (p *pipeline) flushWrites() {
	if len(p.writes) == 0 {
		return
	}
	items := p.writes
	reserved := p.nreturn
	p.writes, p.nops, p.nbytes, p.nwritten, p.nreturn = nil, 0, 0, 0, 0
	clear(p.wkeys)
	// What the batch reserved for the values it returns goes with its
	// last reply (they are in the replies up to it).
	items[len(items)-1].charge += int64(reserved)
	p.c.s.runWrites(items)
	p.learn(items)
	p.emit()
}

// runWrites proposes the ops of items as one WriteBatch and sets each
// item's reply. Items too near their deadline are refused instead
// (nothing is proposed for them), and the wait for the batch ends at the
// deadline of its first item: a write is never proposed after its
// deadline, nor answered after it.
func (s *Server) runWrites(items []*item) {
	if items = s.late(items); len(items) == 0 {
		return
	}
	var ops []*shardkvpb.WriteOp
	for _, it := range items {
		ops = append(ops, it.ops...)
	}
	ctx, cancel := s.roundContext(s.cfg.WriteTimeout, items[0])
	outs, err := s.b.WriteBatch(ctx, ops)
	cancel()
	var ref *shardkvpb.Refusal
	switch {
	case err == nil && len(outs) != len(ops):
		// Cannot tell which ran.
		s.log.Error("backend returned the wrong number of outcomes", "ops", len(ops), "outcomes", len(outs))
		s.unknown(items)
		return
	case err == nil:
	case errors.As(err, &ref):
		// Nothing executed. The refusal is about the batch's first key:
		// right for every command of that slot, and for every command if
		// this replica is not the leader, but a batch of several slots may
		// have been refused for different reasons (owners). Rerunning each
		// command alone gives each its own answer, and is safe since none
		// ran.
		if len(items) > 1 && !sameSlot(items) {
			for _, it := range items {
				s.runWrites([]*item{it})
			}
			return
		}
		for _, it := range items {
			it.out = s.refusal(ref, it.slot)
		}
		return
	case errors.Is(err, shardkvpb.ErrOutcomeUnknown):
		// Worth an operator's attention: a client now has to find out.
		s.log.Warn("write outcome unknown", "ops", len(ops), "err", err)
		s.unknown(items)
		return
	default:
		// Invalid input: nothing executed. Run each command alone so a bad
		// command fails alone.
		if len(items) > 1 {
			for _, it := range items {
				s.runWrites([]*item{it})
			}
			return
		}
		items[0].out = redcon.AppendError(nil, "ERR "+err.Error())
		return
	}
	off := 0
	for _, it := range items {
		it.out = s.writeReply(it, outs[off:off+len(it.ops)])
		off += len(it.ops)
	}
}

// replyTooLarge is the error reply to a read whose values together pass
// MaxReplyBytes (nil if they do not): one reply is built whole in memory,
// and MGET of one 8 MiB key a million times would be 8 TB of it.
func (s *Server) replyTooLarge(vals []shardkv.ValueEntry) []byte {
	n := 0
	for _, v := range vals {
		n += len(v.Value) + 16
	}
	if n <= s.cfg.MaxReplyBytes {
		return nil
	}
	s.stats.refused.Add(1)
	return errReply(fmt.Sprintf("ERR the reply would be %d bytes, over the limit of %d bytes; read fewer or smaller keys per command", n, s.cfg.MaxReplyBytes))
}

func (s *Server) unknown(items []*item) {
	for _, it := range items {
		if it.logRead {
			it.out = redcon.AppendError(nil, readUnknown)
			continue
		}
		s.stats.unknown.Add(1)
		it.out = redcon.AppendError(nil, outcomeUnknown)
	}
}

func sameSlot(items []*item) bool {
	for _, it := range items[1:] {
		if it.slot != items[0].slot {
			return false
		}
	}
	return true
}

// writeReply renders one command's outcomes.
func (s *Server) writeReply(it *item, outs []shardkv.WriteOutcome) []byte {
	var ref *shardkvpb.Refusal
	refused := 0
	res := make([]*shardkvpb.WriteResult, len(outs))
	for i, o := range outs {
		switch {
		case o.Err != nil && errors.As(o.Err, &ref):
			refused++
		case o.Err != nil || o.Result == nil:
			// Not a refusal: nothing proves it did not run.
			s.log.Error("unexpected write outcome", "err", o.Err)
			if it.logRead {
				return redcon.AppendError(nil, readUnknown)
			}
			s.stats.unknown.Add(1)
			return redcon.AppendError(nil, outcomeUnknown)
		}
		res[i] = o.Result
	}
	switch {
	case refused == len(outs):
		return s.refusal(ref, it.slot)
	case refused > 0:
		// The ops of one command share a slot, hence a shard: the backend
		// refuses all or none. Should it not, part ran: no redirect.
		s.log.Error("command partially refused", "ops", len(outs), "refused", refused)
		return redcon.AppendError(nil, "ERR the command was partially executed (its slot changed owner meanwhile)")
	}
	it.res = res
	if it.logRead {
		vals := make([]shardkv.ValueEntry, len(res))
		for i, r := range res {
			if r.Error != "" {
				// RESULT_TOO_LARGE: the batch returned more than the
				// estimates allowed for (another client grew a value).
				return redcon.AppendError(nil, opErrorText(r.Error))
			}
			vals[i] = shardkv.ValueEntry{Found: r.PrevFound, Value: r.Prev}
		}
		if e := s.replyTooLarge(vals); e != nil {
			return e
		}
		return it.onRead(vals)
	}
	for _, r := range res {
		if r.Error != "" {
			// An error decided at apply; the op changed nothing.
			return redcon.AppendError(nil, opErrorText(r.Error))
		}
	}
	return it.onWrite(res)
}

// opErrorText is Redis's text for an op error decided at apply; an error
// it does not know is passed on as it is.
func opErrorText(code string) string {
	switch code {
	case shardkvpb.OpErrNotInteger:
		return errNotInteger
	case shardkvpb.OpErrOverflow:
		return "ERR increment or decrement would overflow"
	case shardkvpb.OpErrNotFloat:
		return errNotFloat
	case shardkvpb.OpErrNaN:
		return "ERR increment would produce NaN or Infinity"
	case shardkvpb.OpErrValueTooLarge:
		return "ERR string exceeds maximum allowed size (the server's value limit)"
	case shardkvpb.OpErrKeyTooLarge:
		return "ERR key exceeds the maximum key length"
	case shardkvpb.OpErrCommandTooLarge:
		return "ERR the command writes too much for one transaction; send fewer keys per command"
	case shardkvpb.OpErrResultTooLarge:
		return "ERR the values returned by this command and the others of its batch are too large; read fewer or smaller keys per command"
	case shardkvpb.OpErrBadRecord:
		return "ERR a stored record could not be decoded (see the server log)"
	}
	if strings.Contains(code, " ") {
		return code // already a Redis error text
	}
	return "ERR " + code
}
