package resp

import (
	"sync"
	"time"
)

// queued is one command read from the client and not yet run.
type queued struct {
	args [][]byte
	// deadline is when the command must have its reply: it was read
	// PipelineTimeout before. A command not yet proposed near it is refused
	// as not executed; a proposed one is answered by then.
	deadline time.Time
	// arrived is when its bytes reached the host (connInput): the order
	// of blocked clients (blockQueue).
	arrived time.Time
	// seq numbers the connection's commands from 1, in the order read.
	seq uint64
	// first marks the first command of a burst: it was read once the
	// reply to every command before it had been handed to the writer, so
	// a client that waits for its replies, as every pipelining client
	// does, began a new pipeline with it.
	first bool
}

// cmdQueue hands commands from the connection's reader to its executor. It
// is bounded: the reader waits while max bytes of commands are queued, so a
// client whose commands run slower than it sends them, or who does not read
// its replies (the outbox fills and the executor waits), stops being read.
type cmdQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	cmds    []queued
	bytes   int
	max     int
	busy    bool   // the executor is running commands it took
	ended   bool   // the reader is done
	end     []byte // its last reply (a protocol error), if any
	stopped bool   // the executor is done: push refuses
	seq     uint64 // the last command's seq
	// gone is closed once the reader is done or the executor stopped: a
	// blocking command (BLPOP) stops waiting for a client that left.
	gone     chan struct{}
	goneOnce sync.Once
}

func newCmdQueue(max int) *cmdQueue {
	q := &cmdQueue{max: max, gone: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// left returns a channel closed once the client has left (the reader is
// done: EOF, an error, QUIT) or the executor stopped.
func (q *cmdQueue) left() <-chan struct{} { return q.gone }

func (q *cmdQueue) closeGone() { q.goneOnce.Do(func() { close(q.gone) }) }

// push queues the commands of one read, waiting while the queue is full.
// It reports false once the executor has stopped (QUIT, a failed write).
func (q *cmdQueue) push(cmds [][][]byte, out *outbox, timeout time.Duration, arrived time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.bytes >= q.max && !q.stopped {
		q.cond.Wait()
	}
	if q.stopped {
		return false
	}
	now := time.Now()
	// The outbox notes how far its replies went before it writes them, so
	// a reply the client has read is always counted here (a flag cleared
	// by the executor or writer after their work was raced by the client's
	// next command).
	first := out.handed() == q.seq
	for i, args := range cmds {
		q.seq++
		qc := queued{args: args, seq: q.seq, deadline: now.Add(timeout), arrived: arrived, first: first && i == 0}
		q.cmds = append(q.cmds, qc)
		for _, a := range args {
			q.bytes += len(a) + 16
		}
	}
	q.cond.Broadcast()
	return true
}

// finish tells the executor that no command follows; end, if not nil, is
// the reply to write after the queued commands' replies.
func (q *cmdQueue) finish(end []byte) {
	q.mu.Lock()
	q.ended, q.end = true, end
	q.cond.Broadcast()
	q.mu.Unlock()
	q.closeGone()
}

// take waits for commands and takes all of them. Once the reader is done
// and nothing is queued it returns done and the reader's last reply.
func (q *cmdQueue) take() (cmds []queued, end []byte, done bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.busy {
		q.busy = false
		q.cond.Broadcast() // waitDrained
	}
	for len(q.cmds) == 0 && !q.ended {
		q.cond.Wait()
	}
	if len(q.cmds) == 0 {
		return nil, q.end, true
	}
	cmds, q.cmds, q.bytes, q.busy = q.cmds, nil, 0, true
	q.cond.Broadcast()
	return cmds, nil, false
}

// waitDrained waits until the executor has run every queued command (or
// stopped).
func (q *cmdQueue) waitDrained() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for (len(q.cmds) > 0 || q.busy) && !q.stopped {
		q.cond.Wait()
	}
}

// stop refuses further commands; those queued will not run.
func (q *cmdQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	q.cond.Broadcast()
	q.mu.Unlock()
	q.closeGone()
}
