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
	mu      sync.Mutex
	cond    *sync.Cond
	buf     []byte // replies not yet handed to the writer
	writing bool   // the writer is writing a batch
	closed  bool   // no more replies: the writer exits once buf is written
	failed  bool   // a write failed (or timed out): replies are dropped
	max     int
}

func newOutbox(max int) *outbox {
	o := &outbox{max: max}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// put appends replies, first waiting while the buffer is full. It reports
// false once the connection can take no more replies.
func (o *outbox) put(b []byte) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.buf) >= o.max && !o.failed {
		o.cond.Wait()
	}
	if o.failed {
		return false
	}
	o.buf = append(o.buf, b...)
	o.cond.Broadcast()
	return true
}

// idle reports whether every reply put so far has been written.
func (o *outbox) idle() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.buf) == 0 && !o.writing
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
		o.buf, o.writing = spare[:0], true
		o.cond.Broadcast() // room for the executor
		o.mu.Unlock()

		_ = c.nc.SetWriteDeadline(time.Now().Add(flushTimeout))
		_, err := c.w.Write(b)

		o.mu.Lock()
		o.writing = false
		if cap(b) <= 2*o.max {
			spare = b // keep one buffer, unless a huge reply grew it
		} else {
			spare = nil
		}
		if err != nil {
			o.failed, o.buf = true, nil
			o.cond.Broadcast()
			o.mu.Unlock()
			return
		}
	}
}
