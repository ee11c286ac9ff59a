package resp

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Write batching bounds. A batch is one Raft entry, which the engine bounds
// (1 MiB by default); 256 KiB of keys and values keeps a batch well under
// that and its apply short. One command is never split, so a single large
// command goes alone.
const (
	maxBatchOps   = 1024
	maxBatchBytes = 256 << 10
)

// outcomeUnknown is the reply to a write that was proposed but whose result
// is unknown. It must not start with a word that clients retry on
// (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, LOADING, READONLY, MASTERDOWN): a
// retry could apply the write twice.
const outcomeUnknown = "ERR outcome unknown: the write was proposed but its result is unknown (leader change or timeout); read the key before retrying"

// item is one command of a pipeline: its reply once known, or the read or
// write it waits for.
type item struct {
	out  []byte
	slot int

	// A keyed read: keys of slot, rendered by onRead.
	keys     [][]byte
	follower bool
	onRead   func(vals []shardkv.ValueEntry) []byte

	// A write: ops (of slot), rendered by onWrite when none was refused.
	ops     []*shardkvpb.WriteOp
	onWrite func(res []*shardkvpb.WriteResult) []byte
}

// pipeline runs the commands of one read from a connection, in order, and
// keeps their replies in order. Consecutive writes are combined into one
// WriteBatch (one log entry, applied in order); consecutive reads share one
// ReadKeys call per slot, run concurrently. A read after a write waits for the
// write batch (it must see it), and a write after reads waits for them (they
// must not see it); commands that read local state call barrier first.
// Replies that need no backend (PING, errors) do not break a batch.
type pipeline struct {
	c      *conn
	items  []*item
	reads  []*item
	writes []*item
	nops   int
	nbytes int
}

// reply adds a command whose reply is already known.
func (p *pipeline) reply(b []byte) { p.items = append(p.items, &item{out: b}) }

// read adds a keyed read.
func (p *pipeline) read(it *item) {
	p.flushWrites()
	p.items = append(p.items, it)
	p.reads = append(p.reads, it)
}

// write adds a write.
func (p *pipeline) write(it *item) {
	p.flushReads()
	size := 0
	for _, op := range it.ops {
		size += len(op.Key) + len(op.Value) + 16
	}
	if len(p.writes) > 0 && (p.nops+len(it.ops) > maxBatchOps || p.nbytes+size > maxBatchBytes) {
		p.flushWrites()
	}
	p.items = append(p.items, it)
	p.writes = append(p.writes, it)
	p.nops += len(it.ops)
	p.nbytes += size
}

// barrier runs whatever batch is pending.
func (p *pipeline) barrier() {
	p.flushReads()
	p.flushWrites()
}

// readGroup is the reads of one slot (and READONLY state) in a batch.
type readGroup struct {
	follower bool
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
	items := p.reads
	p.reads = nil
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
			g = &readGroup{follower: it.follower}
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
			} else {
				it.out = it.onRead(g.vals[off : off+len(it.keys)])
			}
			off += len(it.keys)
		}
	}
}

// read runs one read group.
func (s *Server) read(g *readGroup) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReadTimeout)
	defer cancel()
	g.vals, g.err = s.b.ReadKeys(ctx, g.keys, g.follower)
	if g.err == nil && len(g.vals) != len(g.keys) {
		g.err = fmt.Errorf("backend returned %d values for %d keys", len(g.vals), len(g.keys))
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
	p.writes, p.nops, p.nbytes = nil, 0, 0
	p.c.s.runWrites(items)
}

// runWrites proposes the ops of items as one WriteBatch and sets each
// item's reply.
func (s *Server) runWrites(items []*item) {
	var ops []*shardkvpb.WriteOp
	for _, it := range items {
		ops = append(ops, it.ops...)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.WriteTimeout)
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

func (s *Server) unknown(items []*item) {
	for _, it := range items {
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
	}
	return code
}
