package resp

import (
	"context"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
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
	maxLogReadKeys = 16
	// maxBatchOps: a pipeline of small commands runs one batch (one Raft
	// round) at a time, so this sets its rounds. 4,096 rather than 1,024
	// took the 20,000-triple (GET, INCR, APPEND) pipeline from about 1.5 s
	// to 1.1 s (docs/benchmarks.md); the byte bounds below still bound a
	// batch's entry and its apply.
	maxBatchOps     = 4096
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
	cmd      *command  // the command that added it (nil: refused first), for its stats
	started  time.Time // when it was dispatched
	slot     int
	tls      bool      // its client is on a TLS connection (redirects go to TLS ports)
	deadline time.Time // when the reply is due (the command's)
	arrived  time.Time // when the command reached the host (see queued)
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
	// blockedPop: a pop made for a blocked client (blocking.go), which
	// serves no other blocked client itself (see serveWoken).
	blockedPop bool
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
	c *conn
	// hold: the replies stay in items (EXEC's pipeline, whose replies go
	// out as one array).
	hold     bool
	items    []*item // not yet in the outbox, in order
	last     *item   // the last item added
	deadline time.Time
	arrived  time.Time // the command's (see queued)
	seq      uint64    // the command being dispatched
	// cmd, started: the command running now and since when (stamped on the
	// items it adds, for its stats).
	cmd     *command
	started time.Time

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
	it.deadline, it.arrived, it.seq, it.tls = p.deadline, p.arrived, p.seq, p.c.tls
	it.cmd, it.started = p.cmd, p.started
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
		// The batch is full (or cannot hold the value the read returns):
		// the read opens the next one, in the log after this one's writes. Made on its own it would wait for a
		// ReadIndex round, one more round per batch of a pipeline that
		// mixes reads and writes.
		p.flushWrites()
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

// logReadOps read keys inside a write batch: each a READ op, which
// changes nothing and returns the key's live value (and its type) as of
// its place in the log.
func logReadOps(keys [][]byte) []*shardkvpb.WriteOp {
	ops := make([]*shardkvpb.WriteOp, len(keys))
	for i, k := range keys {
		ops[i] = &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_READ, Key: k, ReturnPrev: true}
	}
	return ops
}

// opBytes is what op adds to a batch's ops (maxBatchBytes): its key,
// value and fields.
func opBytes(op *shardkvpb.WriteOp) int {
	n := len(op.Key) + len(op.Value) + 16
	for i, f := range op.Fields {
		n += len(f) + 16
		if i < len(op.FieldValues) {
			n += len(op.FieldValues[i])
		}
	}
	return n
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
		size += opBytes(op)
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
// leaves. For APPEND, SETRANGE, EXPIRE, PERSIST, RENAME and COPY, which
// write a value they do not carry, that is the value's size as last seen
// by this connection (a reply or an earlier op of its pipeline), or the
// value limit if unknown. It notes the size op leaves for the ops after it
// if commit.
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
	case shardkvpb.WriteOp_SET_RANGE:
		n = min(max(p.size(k), int(min(op.Delta, int64(limit)))+len(op.Value)), limit)
	case shardkvpb.WriteOp_SET_BIT:
		n = min(max(p.size(k), int(min(op.Delta>>3, int64(limit)))+1), limit)
	case shardkvpb.WriteOp_MSET_NX:
		w := 0
		for i, mk := range op.MoreKeys {
			if commit {
				p.noteSize(mk, len(op.MoreValues[i]))
			}
			w += len(mk) + len(op.MoreValues[i]) + 32
		}
		if commit {
			p.noteSize(op.Key, len(op.Value))
		}
		return w + len(op.Key) + len(op.Value) + 32
	case shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT:
		// Each field is a record of its own (with its change index
		// entry), and the key's record holds the hash's size. A hash has
		// no value size: an op that moves it (RENAME, COPY) is counted at
		// the value limit.
		w := len(op.Key) + 64
		for i, f := range op.Fields {
			w += 2 * (len(op.Key) + len(f) + 32)
			if i < len(op.FieldValues) {
				w += len(op.FieldValues[i])
			}
		}
		if op.Kind == shardkvpb.WriteOp_HINCR || op.Kind == shardkvpb.WriteOp_HINCR_FLOAT {
			w += 32
		}
		if commit {
			p.forgetSize(op.Key)
		}
		return w
	case shardkvpb.WriteOp_ZADD, shardkvpb.WriteOp_ZREM, shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX, shardkvpb.WriteOp_ZREMRANGE,
		shardkvpb.WriteOp_ZSTORE, shardkvpb.WriteOp_ZRANGESTORE:
		if commit {
			p.forgetSize(op.Key) // a sorted set: see HSET above
			p.forgetSize(op.Dest)
		}
		return zsetWritten(op)
	case shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM, shardkvpb.WriteOp_SMOVE, shardkvpb.WriteOp_SPOP,
		shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH, shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP,
		shardkvpb.WriteOp_LSET, shardkvpb.WriteOp_LMOVE:
		if commit {
			p.forgetSize(op.Key) // a set or a list: see HSET above
			p.forgetSize(op.Dest)
		}
		return collWritten(op)
	case shardkvpb.WriteOp_SSTORE, shardkvpb.WriteOp_LTRIM, shardkvpb.WriteOp_LREM, shardkvpb.WriteOp_LINSERT:
		// What they write is known only at apply, and an entry past its
		// budget fails whole: alone in their batch.
		if commit {
			p.forgetSize(op.Key)
			p.forgetSize(op.Dest)
		}
		return maxBatchWritten
	case shardkvpb.WriteOp_READ:
		return 0
	case shardkvpb.WriteOp_RENAME, shardkvpb.WriteOp_COPY:
		// The destination takes the source's value; a renamed source
		// becomes a tombstone.
		moved := p.size(k)
		if commit {
			p.noteSize(op.Dest, moved)
		}
		if op.Kind == shardkvpb.WriteOp_COPY {
			return len(op.Dest) + moved + 32
		}
		return len(op.Key) + len(op.Dest) + moved + 64
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
				p.noteEntry(it.ops[i].Key, shardkv.ValueEntry{Found: r.PrevFound, Type: shardkv.ValueType(r.PrevType), Value: r.Prev})
			}
			continue
		}
		for i, op := range it.ops {
			if r := it.res[i]; (op.Kind == shardkvpb.WriteOp_APPEND || op.Kind == shardkvpb.WriteOp_SET_RANGE) && r.Ok && r.Error == "" {
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
	if p.hold {
		return
	}
	// A full client output makes put wait: not with the transaction
	// lock held (see lockShared).
	if p.c.shared {
		p.c.unlockShared()
		defer p.c.lockShared()
	}
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
		now := time.Now()
		for _, it := range p.items[:n] {
			if it.cmd != nil {
				it.cmd.stats.record(it.out, now.Sub(it.started))
			}
		}
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
