package resp

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// flushWrites runs the pending writes as one batch (runWrites), learns
// from their results and sends the replies that are ready.
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
// deadline, nor answered after it. Items that would not fit in the time
// left at the recent cost per op go in a batch after it (batchfit.go).
func (s *Server) runWrites(items []*item) {
	if items = s.late(items); len(items) == 0 {
		return
	}
	if k := s.writeCost.fit(items, time.Until(items[0].deadline)); k < len(items) {
		s.runWrites(items[:k])
		s.runWrites(items[k:])
		return
	}
	var ops []*shardkvpb.WriteOp
	for _, it := range items {
		ops = append(ops, it.ops...)
	}
	ctx, cancel := s.roundContext(s.cfg.WriteTimeout, items[0])
	t0 := time.Now()
	outs, err := s.b.WriteBatch(ctx, ops)
	cancel()
	if err == nil || errors.Is(err, shardkvpb.ErrOutcomeUnknown) {
		// An unknown outcome (a timeout) took at least this long.
		s.writeCost.note(len(ops), time.Since(t0))
	}
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
			it.out = s.refusal(ref, it.slot, it.tls)
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
	s.serveWoken(items)
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
		return s.refusal(ref, it.slot, it.tls)
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
			vals[i] = shardkv.ValueEntry{Found: r.PrevFound, Type: shardkv.ValueType(r.PrevType), Value: r.Prev}
		}
		if e := s.replyTooLarge(vals); e != nil {
			return e
		}
		return it.onRead(vals)
	}
	for i, r := range res {
		if r.Error != "" {
			// An error decided at apply; the op changed nothing.
			return redcon.AppendError(nil, opErrorTextFor(it.ops[i].Kind, r.Error))
		}
	}
	return it.onWrite(res)
}

// opErrorTextFor is opErrorText for an op of kind: a hash field's value
// that is not a number has its own text (Redis's hincrby and
// hincrbyfloat).
func opErrorTextFor(kind shardkvpb.WriteOp_Kind, code string) string {
	switch {
	case kind == shardkvpb.WriteOp_HINCR && code == shardkvpb.OpErrNotInteger:
		return "ERR hash value is not an integer"
	case kind == shardkvpb.WriteOp_HINCR_FLOAT && code == shardkvpb.OpErrNotFloat:
		return "ERR hash value is not a float"
	case kind == shardkvpb.WriteOp_LSET && code == shardkvpb.OpErrOffset:
		return "ERR index out of range"
	case (kind == shardkvpb.WriteOp_LREM || kind == shardkvpb.WriteOp_LINSERT || kind == shardkvpb.WriteOp_LTRIM) && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR the list is too long for this command: LREM and LINSERT rewrite lists of at most 12000 elements, LTRIM deletes at most 12000 (one log entry's write budget)"
	case kind == shardkvpb.WriteOp_SSTORE && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR a source set or the result has more members than one command may write (12000, one log entry's write budget)"
	case (kind == shardkvpb.WriteOp_SPOP || kind == shardkvpb.WriteOp_LPOP || kind == shardkvpb.WriteOp_RPOP) && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR the members popped are too large for one command (one log entry's write budget); pop fewer per command"
	case kind == shardkvpb.WriteOp_ZADD && code == shardkvpb.OpErrNaN:
		return "ERR resulting score is not a number (NaN)"
	case kind == shardkvpb.WriteOp_ZREMRANGE && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR the range holds more members than one command may remove (one log entry's write budget); remove it in parts"
	case (kind == shardkvpb.WriteOp_ZSTORE || kind == shardkvpb.WriteOp_ZRANGESTORE) && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR a source or the result has more members than one command may store (one log entry's write budget)"
	case (kind == shardkvpb.WriteOp_ZPOPMIN || kind == shardkvpb.WriteOp_ZPOPMAX) && code == shardkvpb.OpErrCommandTooLarge:
		return "ERR the members popped are too large for one command (one log entry's write budget); pop fewer per command"
	}
	return opErrorText(code)
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
	case shardkvpb.OpErrNoSuchKey:
		return "ERR no such key"
	case shardkvpb.OpErrCrossShard:
		return "CROSSSLOT Keys in request don't hash to the same slot"
	case shardkvpb.OpErrOffset:
		return "ERR offset is out of range"
	case shardkvpb.OpErrBadRecord:
		return "ERR a stored record could not be decoded (see the server log)"
	case shardkvpb.OpErrWrongType:
		return errWrongType
	case shardkvpb.OpErrInvalidOp:
		return "ERR the server refused a malformed write op (INVALID_OP)"
	}
	if strings.Contains(code, " ") {
		return code // already a Redis error text
	}
	return "ERR " + code
}
