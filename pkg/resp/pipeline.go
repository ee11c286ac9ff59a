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

	reads    []*item
	nkeys    int
	writes   []*item
	nops     int
	nbytes   int
	nwritten int
	// wkeys: the batch's estimate per key written (see written): the
	// backend buffers a batch's writes with the last write of each key
	// winning, so a key costs once whatever the number of its ops.
	wkeys map[string]int
}

func (p *pipeline) add(it *item) {
	it.deadline = p.deadline
	p.items = append(p.items, it)
	p.last = it
}

// reply adds a command whose reply is already known.
func (p *pipeline) reply(b []byte) { p.add(&item{out: b}) }

// read adds a keyed read. After a write of this pipeline (which it must
// see) it is made inside the write batch, at its place in the log, rather
// than in a ReadIndex round after it; reads of a READONLY connection (a
// follower's) and reads of expiry times still wait for the batch.
func (p *pipeline) read(it *item) {
	if len(p.writes) > 0 && !it.follower && !it.ttl && len(it.keys) <= maxLogReadKeys {
		it.logRead, it.ops = true, logReadOps(it.keys)
		p.write(it)
		return
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

// write adds a write.
func (p *pipeline) write(it *item) {
	p.flushReads()
	size := 0
	for _, op := range it.ops {
		size += len(op.Key) + len(op.Value) + 16
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
	if len(p.writes) > 0 && (p.nops+len(it.ops) > maxBatchOps || p.nbytes+size > maxBatchBytes || p.nwritten+grow(false) > maxBatchWritten) {
		p.flushWrites()
	}
	written := grow(true)
	p.add(it)
	p.writes = append(p.writes, it)
	p.nops += len(it.ops)
	p.nbytes += size
	p.nwritten += written
}

// written estimates what op writes to storage: its key and the value it
// leaves. For APPEND, EXPIRE and PERSIST, which rewrite a value they do not
// carry, that is the value's size as last seen by this connection (a reply
// or an earlier op of its pipeline), or the value limit if unknown. It
// notes the size op leaves for the ops after it if commit.
func (p *pipeline) written(op *shardkvpb.WriteOp, commit bool) int {
	sizes := p.c.sizes
	if len(sizes) >= maxKnownSizes {
		clear(sizes)
	}
	k, limit := string(op.Key), p.c.s.cfg.MaxValueBytes
	known := func() int {
		if n, ok := sizes[k]; ok {
			return n
		}
		return limit
	}
	var n int
	switch op.Kind {
	case shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_CAS:
		n = len(op.Value)
	case shardkvpb.WriteOp_APPEND:
		n = min(known()+len(op.Value), limit)
	case shardkvpb.WriteOp_EXPIRE, shardkvpb.WriteOp_PERSIST:
		n = known()
	case shardkvpb.WriteOp_INCR, shardkvpb.WriteOp_INCR_FLOAT:
		n = 32
	}
	if commit {
		sizes[k] = n
	}
	return len(op.Key) + n + 32
}

// learn notes the value sizes that write results tell (see written).
func (p *pipeline) learn(items []*item) {
	for _, it := range items {
		if it.logRead || len(it.res) != len(it.ops) {
			continue
		}
		for i, op := range it.ops {
			if r := it.res[i]; op.Kind == shardkvpb.WriteOp_APPEND && r.Ok && r.Error == "" {
				p.c.sizes[string(op.Key)] = int(r.Num)
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
func (p *pipeline) emit() {
	n, size := 0, 0
	for n < len(p.items) && p.items[n].out != nil {
		size += len(p.items[n].out)
		n++
	}
	if n == 0 {
		return
	}
	b := make([]byte, 0, size)
	for _, it := range p.items[:n] {
		b = append(b, it.out...)
	}
	clear(p.items[:n])
	p.items = p.items[n:]
	p.c.out.put(b)
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

// readGroup is the reads of one slot (and READONLY state) in a batch.
type readGroup struct {
	follower bool
	first    *item // the earliest
	keys     [][]byte
	items    []*item
	vals     []shardkv.ValueEntry
	err      error
	timedOut bool
}

func (p *pipeline) flushReads() {
	if len(p.reads) == 0 {
		return
	}
	items := p.c.s.late(p.reads)
	p.reads, p.nkeys = nil, 0
	defer p.emit()
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
		off := 0
		for _, it := range g.items {
			if g.err != nil {
				it.out = s.readError(g, it.slot)
			} else if vals := g.vals[off : off+len(it.keys)]; s.replyTooLarge(vals) != nil {
				it.out = s.replyTooLarge(vals)
			} else {
				it.out = it.onRead(vals)
			}
			off += len(it.keys)
		}
	}
}

// read runs one read group.
func (s *Server) read(g *readGroup) {
	ctx, cancel := s.roundContext(s.cfg.ReadTimeout, g.first)
	defer cancel()
	// Each distinct key is read once: MGET of one large key repeated holds
	// one copy of its value, not one per argument.
	idx := make([]int, len(g.keys))
	at := map[string]int{}
	var distinct [][]byte
	for i, k := range g.keys {
		j, ok := at[string(k)]
		if !ok {
			j = len(distinct)
			at[string(k)] = j
			distinct = append(distinct, k)
		}
		idx[i] = j
	}
	vals, err := s.b.ReadKeys(ctx, distinct, g.follower)
	g.err = err
	if err == nil && len(vals) != len(distinct) {
		g.err = fmt.Errorf("backend returned %d values for %d keys", len(vals), len(distinct))
	}
	if g.err == nil {
		g.vals = make([]shardkv.ValueEntry, len(g.keys))
		for i, j := range idx {
			g.vals[i] = vals[j]
		}
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
	p.writes, p.nops, p.nbytes, p.nwritten = nil, 0, 0, 0
	clear(p.wkeys)
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
	case shardkvpb.OpErrBadRecord:
		return "ERR a stored record could not be decoded (see the server log)"
	}
	if strings.Contains(code, " ") {
		return code // already a Redis error text
	}
	return "ERR " + code
}
