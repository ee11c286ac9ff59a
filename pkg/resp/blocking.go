package resp

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Pops of the first of several keys (LMPOP, ZMPOP) and the blocking
// commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP, BZPOPMIN, BZPOPMAX,
// BZMPOP): a pop is a write like any other (so only the leader serves a
// blocking command: a follower answers MOVED); when there is nothing to
// pop, the command watches its keys (Backend.WatchKeys) and tries again
// after each write to one of them is applied, until its timeout. The
// connection runs nothing else meanwhile, as a blocked Redis client.

// popNow runs op, a pop, as a write of its own (due by deadline) for the
// item it. It reports false if it popped nothing (no key of its type); otherwise it
// sets it.out: render's reply, or the write's error or refusal.
func (c *conn) popNow(it *item, deadline time.Time, op *shardkvpb.WriteOp, render func([]*shardkvpb.WriteResult) []byte) bool {
	w := &item{slot: it.slot, tls: it.tls, ops: []*shardkvpb.WriteOp{op}, deadline: deadline, seq: it.seq, onWrite: render, blockedPop: true}
	c.s.runWrites([]*item{w})
	if len(w.res) == 1 && w.res[0].Error == "" && len(w.res[0].Values) == 0 {
		return false
	}
	it.out = w.out
	return true
}

// readColls reads which of keys hold something (typ says which type
// counts), at one point of the log, on the leader (a blocking command is a
// write: a follower answers MOVED). On failure it sets it.out and reports
// false.
func (c *conn) readColls(it *item, keys [][]byte, typ shardkv.ValueType) ([]shardkv.ElemsReply, bool) {
	s := c.s
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ReadTimeout)
	defer cancel()
	rs, err := s.b.ReadElemsOf(ctx, keys, shardkv.ElemQuery{Type: typ}, false, nil)
	if err == nil && len(rs) != len(keys) {
		err = fmt.Errorf("backend returned %d collections for %d keys", len(rs), len(keys))
	}
	if err != nil {
		c.readNowFailed(ctx, it, err, &replyBound{s: s, typ: typ})
		return nil, false
	}
	return rs, true
}

// popFirst pops from the first of keys that holds a typ (a list or a
// sorted set), as Redis's BLPOP, LMPOP and ZMPOP choose it (a missing key is skipped, one of another
// type answers WRONGTYPE, or is skipped too once the command has waited:
// Redis serves a blocked client from the lists pushed to only): pop makes
// the op for that key, render the reply. It reports whether it answered
// (done). One key is popped at once; several are read first (one read of
// them all), then the first list among them is popped, so another
// client's write between the two may make the pop find nothing (raced).
func (c *conn) popFirst(it *item, deadline time.Time, waited bool, keys [][]byte, typ shardkv.ValueType, pop func(key []byte) *shardkvpb.WriteOp, render func(key []byte) func([]*shardkvpb.WriteResult) []byte) (done, raced bool) {
	if len(keys) == 1 {
		return c.popNow(it, deadline, pop(keys[0]), render(keys[0])), false
	}
	rs, ok := c.readColls(it, keys, typ)
	if !ok {
		return true, false
	}
	for i, r := range rs {
		switch {
		case !r.Entry.Found, r.Entry.Type != typ && waited:
			continue
		case r.Entry.Type != typ:
			it.out = errReply(errWrongType)
			return true, false
		}
		done = c.popNow(it, deadline, pop(keys[i]), render(keys[i]))
		return done, !done
	}
	return false, false
}

// block serves a blocking command on keys. It joins the server's queue
// of blocked clients (see serveBlocked) at once, in the order commands
// arrive: if no client before it waits on one of its keys, it tries its
// pop at once (see popFirst; try reports whether it answered), else its
// first try comes in its turn. When there was nothing to pop, the replies
// before this one go out and the command waits until it is served, or its
// timeout (0: for ever) ends it with a null array, as in Redis. The wait
// ends early if the client leaves or the server closes. A shard that
// moves away wakes the waiter too: its next read or pop is refused
// (MOVED, and the client resends the command where the shard went).
// Inside a transaction (EXEC) it does not wait: nothing to pop answers
// inTx.
func (c *conn) block(p *pipeline, slot int, keys [][]byte, typ shardkv.ValueType, timeout time.Duration, inTx []byte, try func(it *item, deadline time.Time, waited bool) bool) {
	s := c.s
	start := time.Now()
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	if c.execing {
		// Inside a transaction a blocking command does not wait, as in
		// Redis: nothing to pop answers inTx.
		if !try(it, it.deadline, false) {
			it.out = inTx
		}
		return
	}
	w := &blocker{c: c, it: it, arrived: p.arrived, keys: keys, typ: typ, try: try, done: make(chan struct{})}
	if s.blocked.add(w) {
		// First in line for its keys: its own try, which no pass makes
		// meanwhile (nor for a client behind it).
		done, tried := c.firstTry(w)
		s.blocked.tried(w, done, tried)
		if done {
			s.serveBlocked(s.blocked.passes.Load()) // those behind it
			return
		}
	}
	p.emit()
	s.stats.blocked.Add(1)
	defer s.stats.blocked.Add(-1)
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(max(timeout-time.Since(start), 0))
		defer t.Stop()
		expired = t.C
	}
	changed, stop := s.b.WatchKeys(keys)
	// A write may have come before the watch: serve once.
	s.serveBlocked(s.blocked.passes.Load())
	for {
		if s.blocked.served(w) {
			stop()
			return
		}
		// No transaction waits for this one (lockShared).
		c.unlockShared()
		var end []byte
		select {
		case <-w.done:
		case <-changed:
		case <-expired:
			end = c.nullArray()
		case <-c.q.left():
			end = c.nullArray() // nobody reads it
		case <-s.ctx.Done():
			end = errReply("ERR the server is shutting down")
		}
		stop()
		c.lockShared()
		if end != nil {
			if s.blocked.remove(w) {
				it.out = end
			} // else served meanwhile: its reply stands
			return
		}
		// Woken by a write: watch again first, so that no later write
		// is missed, then serve the queue unless a pass began since.
		changed, stop = s.b.WatchKeys(keys)
		s.serveBlocked(s.blocked.passes.Load())
	}
}

// firstTry is a blocking command's own first try. It reads its keys
// first, and pops only if one holds something (of any type: one of
// another type answers WRONGTYPE) and no client that came before it has
// queued on its keys meanwhile: a push sent just after this command may
// be committed while that client's goroutine has not yet read its
// command, and popping now would take the element ahead of it (Redis's
// suite: "BRPOPLPUSH with multiple blocked clients"). The read gives
// such a client the time to queue; if one did, this one leaves the pop
// to a pass, which serves them in the order they came (tried false).
func (c *conn) firstTry(w *blocker) (done, tried bool) {
	rs, ok := c.readColls(w.it, w.keys, w.typ)
	if !ok {
		return true, true // it.out is the failure
	}
	found := false
	for _, r := range rs {
		found = found || r.Entry.Found
	}
	if !found {
		return false, true
	}
	if !c.s.blocked.firstInLine(w) {
		return false, false
	}
	return w.try(w.it, w.it.deadline, false), true
}

// blocker is a client in a blocking command.
type blocker struct {
	c       *conn
	it      *item
	arrived time.Time // when its command reached the host (queued)
	keys    [][]byte
	typ     shardkv.ValueType
	try     func(it *item, deadline time.Time, waited bool) bool
	done    chan struct{} // closed once served (it.out set)
	// Under blockQueue.mu: own, its own first try is running (no pass
	// serves it, nor a client behind it on one of its keys); tried, it
	// has had a try (a key of another type then no longer answers
	// WRONGTYPE, as in Redis); served, it is answered.
	own, tried, served bool
}

// blockQueue is the server's blocked clients, in the order their commands
// came: Redis serves the clients blocked on a key first come, first
// served, so a write wakes them all but one pass (serveBlocked) serves
// them in this order.
type blockQueue struct {
	mu     sync.Mutex
	list   []*blocker
	passes atomic.Int64 // passes begun
}

// add queues w in the order commands reached the host (the kernel's
// arrival stamps, connInput), as Redis's one event loop mostly serves
// them: with two cores shared by the replicas, the goroutine of the
// connection whose bytes came first may run milliseconds after the
// other's, so the order commands are read in is not it. It reports
// whether w is alone on its keys (no client queued shares one): it then
// makes its own first try (own), which it reports with tried. A command
// that arrives after a write that woke the clients on its keys still
// comes after them, even if it was sent first (docs/redis.md).
func (q *blockQueue) add(w *blocker) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	at := len(q.list)
	for at > 0 && readAfter(q.list[at-1], w) {
		at--
	}
	first := true
	for _, o := range q.list {
		first = first && !sharesKey(o, w)
	}
	w.own = first
	q.list = slices.Insert(q.list, at, w)
	return first
}

// tried ends w's own try: served if done; tried false if it left its
// try to a pass (firstTry).
func (q *blockQueue) tried(w *blocker, done, tried bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.own, w.tried = false, tried
	if done {
		w.served = true
		close(w.done)
		q.list = slices.DeleteFunc(q.list, func(o *blocker) bool { return o == w })
	}
}

// firstInLine reports whether no client ahead of w in the queue shares
// one of its keys.
func (q *blockQueue) firstInLine(w *blocker) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, o := range q.list {
		if o == w {
			return true
		}
		if sharesKey(o, w) {
			return false
		}
	}
	return true
}

// remove takes w out of the queue unless it was served: false if it was.
func (q *blockQueue) remove(w *blocker) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.served {
		return false
	}
	q.list = slices.DeleteFunc(q.list, func(o *blocker) bool { return o == w })
	return true
}

func (q *blockQueue) served(w *blocker) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.served
}

// readAfter reports whether a goes after b in the queue (see add): it
// arrived later, or at the same instant on a newer connection.
func readAfter(a, b *blocker) bool {
	if !a.arrived.Equal(b.arrived) {
		return a.arrived.After(b.arrived)
	}
	return a.c.id > b.c.id
}

func sharesKey(a, b *blocker) bool {
	for _, k := range a.keys {
		for _, l := range b.keys {
			if bytes.Equal(k, l) {
				return true
			}
		}
	}
	return false
}

// serveBlocked serves the blocked clients, in the order they came, after
// a write to some of their keys (or a change of a shard's state): each,
// in turn, whose keys hold a collection of its type pops (its try, run
// here for it), and is answered. A client making its own first try holds
// its keys: no one behind it on them is served in this pass (its try
// ends with a pass). Reads are shared within a pass: a key read empty is
// not read again for a later client until a pop. seen is the number of
// passes begun when the caller was woken: if another has begun since, it
// covers the caller's wake and this one is skipped (so a write that wakes
// a thousand waiters makes one pass, not a thousand).
func (s *Server) serveBlocked(seen int64) {
	q := &s.blocked
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.passes.Load() != seen {
		return
	}
	q.passes.Add(1)
	empty := map[string]bool{} // keys known to hold nothing of use
	held := map[string]bool{}  // keys of clients making their own try
	keep := q.list[:0]
	for _, w := range q.list {
		skip := w.own
		for _, k := range w.keys {
			skip = skip || held[string(k)]
		}
		if w.own {
			for _, k := range w.keys {
				held[string(k)] = true
			}
		}
		if !skip {
			all := true
			for _, k := range w.keys {
				all = all && empty[string(k)]
			}
			skip = all
		}
		if !skip && w.c.serveOne(w, empty) {
			w.served = true
			close(w.done)
			clear(empty) // its pop may have filled another key (BLMOVE)
			continue
		}
		keep = append(keep, w)
	}
	clear(q.list[len(keep):])
	q.list = keep
}

// cmdClientUnblock serves CLIENT UNBLOCK id [TIMEOUT|ERROR]: the client
// blocked in a blocking command on this node is answered as if its
// timeout had come (a null array) or with Redis's UNBLOCKED error: 1, or
// 0 if it is not blocked here.
func cmdClientUnblock(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) > 4 {
		p.reply(errReply(fmt.Sprintf("ERR unknown subcommand or wrong number of arguments for '%s'. Try CLIENT HELP.", args[1])))
		return
	}
	id, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	asError := false
	switch {
	case len(args) == 4 && strings.EqualFold(string(args[3]), "error"):
		asError = true
	case len(args) == 4 && strings.EqualFold(string(args[3]), "timeout"), len(args) == 3:
	default:
		p.reply(errReply("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"))
		return
	}
	q := &c.s.blocked
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range q.list {
		if w.c.id != id || w.served || w.own {
			continue
		}
		w.it.out = w.c.nullArray()
		if asError {
			w.it.out = redcon.AppendError(nil, "UNBLOCKED client unblocked via CLIENT UNBLOCK")
		}
		w.served = true
		close(w.done)
		q.list = slices.Delete(q.list, i, i+1)
		p.reply(redcon.AppendInt(nil, 1))
		return
	}
	p.reply(redcon.AppendInt(nil, 0))
}

// serveWoken serves the clients blocked on keys that items (a write
// batch just applied) wrote, before their replies go: as in Redis, where
// the clients a command unblocks are served before the next command runs,
// so a read after a push sees what the blocked clients took (BLMOVE
// chains included). A batch of pops made for blocked clients serves no
// one: the pass that made them goes on.
func (s *Server) serveWoken(items []*item) {
	for _, it := range items {
		if it.blockedPop {
			return // made by a pass, which holds q.mu
		}
	}
	q := &s.blocked
	q.mu.Lock()
	hit := false
	if len(q.list) > 0 { // else no work on the write path
		keys := writtenKeys(items)
		for _, w := range q.list {
			for _, k := range w.keys {
				hit = hit || keys[string(k)]
			}
		}
	}
	q.mu.Unlock()
	if hit {
		s.serveBlocked(q.passes.Load())
	}
}

// writtenKeys: the keys a write batch's ops write.
func writtenKeys(items []*item) map[string]bool {
	keys := map[string]bool{}
	for _, it := range items {
		for _, op := range it.ops {
			if op.Kind != shardkvpb.WriteOp_READ {
				keys[string(op.Key)] = true
				if op.Dest != nil {
					keys[string(op.Dest)] = true
				}
			}
		}
	}
	return keys
}

// serveOne tries w's pop if one of its keys holds its type (or, before
// its first try, anything: a key of another type answers WRONGTYPE):
// whether w was answered (popped, or its read or pop failed). Keys it
// reads empty go into empty.
func (c *conn) serveOne(w *blocker, empty map[string]bool) bool {
	rs, ok := c.readColls(w.it, w.keys, w.typ)
	if !ok {
		return true // it.out is the failure
	}
	found := false
	for i, r := range rs {
		if r.Entry.Found && (r.Entry.Type == w.typ || !w.tried) {
			found = true
		} else {
			empty[string(w.keys[i])] = true
		}
	}
	if !found {
		return false
	}
	waited := w.tried
	w.tried = true
	return w.try(w.it, time.Now().Add(c.s.cfg.PipelineTimeout), waited)
}

// blockingArgs parses BLPOP's and BZPOPMIN's key [key ...] timeout: the
// timeout first, then each key against keyError (the type's key limits),
// as Redis checks them.
func blockingArgs(args [][]byte, keyError func(key []byte) []byte) ([][]byte, time.Duration, []byte) {
	timeout, e := parseTimeout(args[len(args)-1])
	if e != nil {
		return nil, 0, e
	}
	keys := args[1 : len(args)-1]
	for _, k := range keys {
		if e := keyError(k); e != nil {
			return nil, 0, e
		}
	}
	return keys, timeout, nil
}

// mpopArgs are the arguments of LMPOP and ZMPOP, and of their blocking
// forms.
type mpopArgs struct {
	keys     [][]byte
	side     int64 // 0: LEFT or MIN; 1: RIGHT or MAX
	count    int64 // 1 without COUNT
	timeout  time.Duration
	blocking bool
}

// parseMPop parses [timeout] numkeys key [key ...] where [COUNT count]
// (the timeout for BLMPOP and BZMPOP), with Redis's checks in its order;
// first and second name the two sides (left and right, min and max).
func parseMPop(args [][]byte, first, second string) (mpopArgs, []byte) {
	a := mpopArgs{blocking: args[0][0]|0x20 == 'b', count: -1}
	at := 1 // numkeys
	if a.blocking {
		at = 2
	}
	n, ok := parseInt(args[at])
	if !ok || n < 1 {
		return a, errReply("ERR numkeys should be greater than 0")
	}
	whereAt := int64(at) + n + 1
	if whereAt >= int64(len(args)) {
		return a, errReply(errSyntax)
	}
	switch strings.ToLower(string(args[whereAt])) {
	case first:
	case second:
		a.side = 1
	default:
		return a, errReply(errSyntax)
	}
	for j := int(whereAt) + 1; j < len(args); j++ {
		if a.count != -1 || !strings.EqualFold(string(args[j]), "count") || j+1 >= len(args) {
			return a, errReply(errSyntax)
		}
		j++
		m, ok := parseInt(args[j])
		if !ok || m < 1 {
			return a, errReply("ERR count should be greater than 0")
		}
		a.count = m
	}
	a.count = max(a.count, 1)
	if a.blocking {
		var e []byte
		if a.timeout, e = parseTimeout(args[1]); e != nil {
			return a, e
		}
	}
	a.keys = args[at+1 : whereAt]
	return a, nil
}

// popAny pops from the first of keys that holds a typ (see popFirst):
// pop makes the op for that key, render the reply. A blocking command
// waits for one until timeout (see block); any other answers a null array
// if none holds a typ.
func (c *conn) popAny(p *pipeline, slot int, keys [][]byte, typ shardkv.ValueType, blocking bool, timeout time.Duration,
	pop func(key []byte) *shardkvpb.WriteOp, render func(key []byte) func([]*shardkvpb.WriteResult) []byte) {
	if blocking {
		c.block(p, slot, keys, typ, timeout, c.nullArray(), func(it *item, deadline time.Time, waited bool) bool {
			done, _ := c.popFirst(it, deadline, waited, keys, typ, pop, render)
			return done
		})
		return
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	// A pop that found nothing after the read found a key lost a race
	// with another client: read again (a few times).
	for range 3 {
		done, raced := c.popFirst(it, it.deadline, false, keys, typ, pop, render)
		if done {
			return
		}
		if !raced {
			break
		}
	}
	it.out = c.nullArray()
}
