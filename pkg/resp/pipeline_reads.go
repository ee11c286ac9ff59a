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
			it.out = s.readError(g, it.slot, it.tls)
		case complete:
			vals := make([]shardkv.ValueEntry, len(idx))
			for i, d := range idx {
				vals[i] = g.vals[d]
				p.noteEntry(it.keys[i], vals[i])
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

// noteEntry notes the value size a read found for key; a collection
// has none (what moves with it is its elements), so its size becomes
// unknown.
func (p *pipeline) noteEntry(key []byte, e shardkv.ValueEntry) {
	if e.Found && e.Type != shardkv.TypeString {
		p.forgetSize(key)
		return
	}
	p.noteSize(key, len(e.Value))
}

// forgetSize makes key's value size unknown (counted at the value limit).
func (p *pipeline) forgetSize(key []byte) { delete(p.c.sizes, string(key)) }

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
func (s *Server) readError(g *readGroup, slot int, tls bool) []byte {
	return s.readFailure(g.err, g.timedOut, slot, tls)
}

// readFailure is the reply to a read of slot that failed with err
// (timedOut: its context's deadline passed).
func (s *Server) readFailure(err error, timedOut bool, slot int, tls bool) []byte {
	var ref *shardkvpb.Refusal
	switch {
	case errors.As(err, &ref):
		return s.refusal(ref, slot, tls)
	case timedOut && s.ctx.Err() == nil:
		// A read has no side effect, so a retry is always safe: let the
		// client retry (no quorum reachable, or an election under way).
		s.stats.refused.Add(1)
		return redcon.AppendError(nil, "TRYAGAIN read timed out waiting for the group's quorum; please retry")
	}
	return redcon.AppendError(nil, "ERR read failed: "+err.Error())
}
