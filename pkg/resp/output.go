package resp

import (
	"sync"
	"time"
)

// outbox holds a connection's replies until its writer goroutine has
// written them, so that running commands never waits on the client reading
// its replies (a client that writes a whole pipeline before reading any
// reply, as go-redis does, would otherwise deadlock against a server that
// stopped reading to write). It is bounded: past max buffered bytes the
// executor waits, its command queue fills, and the reader stops reading the
// client's further commands. That is backpressure where Redis (whose normal
// clients have no output limit) would buffer without bound.
type outbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte // replies not yet handed to the writer
	closed bool   // no more replies: the writer exits once buf is written
	failed bool   // a write failed (or timed out): replies are dropped
	max    int
	// putSeq is the seq of the last command whose reply is in buf or was
	// written; handedSeq is putSeq as of the writer's last take of buf.
	putSeq, handedSeq uint64
	// budget is the server's output budget; held is what this outbox has
	// charged to it: the bytes of buf and of the batch being written.
	budget *memBudget
	held   int64
}

func newOutbox(max int, budget *memBudget) *outbox {
	o := &outbox{max: max, budget: budget}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// put appends replies, the last of them to the command numbered seq (0:
// none completes here), first waiting while the buffer is full, or while
// the server's output budget is spent and this connection already has
// replies waiting (its own writer frees them, or fails and drops them, so
// the wait ends; a connection with none may always add one). reserved is
// what the caller already charged to the budget for b (values read for
// it): it becomes part of what the outbox holds. It reports false once
// the connection can take no more replies; reserved is then given back.
func (o *outbox) put(b []byte, reserved int64, seq uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for (len(o.buf) >= o.max || (len(o.buf) > 0 && o.budget.full())) && !o.failed {
		o.cond.Wait()
	}
	if o.failed {
		o.budget.give(reserved)
		return false
	}
	if n := int64(len(b)); n > reserved {
		o.budget.force(n - reserved)
	} else {
		o.budget.give(reserved - n)
	}
	o.held += int64(len(b))
	o.buf = append(o.buf, b...)
	o.putSeq = max(o.putSeq, seq)
	o.cond.Broadcast()
	return true
}

// drop gives back everything the outbox holds: its replies will never be
// written. Called with o.mu held.
func (o *outbox) drop() {
	o.failed, o.buf = true, nil
	o.budget.give(o.held)
	o.held = 0
	o.cond.Broadcast()
}

// handed returns the seq of the last command whose reply the writer has
// taken to write (the client may have it).
func (o *outbox) handed() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handedSeq
}

// broken reports whether a write failed.
func (o *outbox) broken() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed
}

// close lets the writer exit once the buffered replies are written.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}

// writeLoop writes the outbox to the client until it is closed and
// drained, or a write fails; then it closes the connection (which also
// stops a reader blocked on it). A write that does not finish within
// flushTimeout fails: a client that stops reading cannot pin the
// connection forever.
func (c *conn) writeLoop() {
	defer c.nc.Close()
	o := c.out
	defer func() {
		// However the writer ends (a panic too), nothing stays charged.
		o.mu.Lock()
		if o.held != 0 {
			o.drop()
		}
		o.mu.Unlock()
	}()
	var spare []byte
	o.mu.Lock()
	for {
		for len(o.buf) == 0 && !o.closed {
			o.cond.Wait()
		}
		if len(o.buf) == 0 {
			o.mu.Unlock()
			return
		}
		b := o.buf
		o.buf = spare[:0]
		o.handedSeq = o.putSeq // before the write: see cmdQueue.push
		o.cond.Broadcast()     // room for the executor
		o.mu.Unlock()

		_ = c.nc.SetWriteDeadline(time.Now().Add(flushTimeout))
		_, err := c.w.Write(b)

		o.mu.Lock()
		o.held -= int64(len(b))
		o.budget.give(int64(len(b)))
		if cap(b) <= 2*o.max {
			spare = b // keep one buffer, unless a huge reply grew it
		} else {
			spare = nil
		}
		if err != nil {
			o.drop()
			o.mu.Unlock()
			return
		}
		o.cond.Broadcast() // a put waiting for the budget may go on
	}
}
