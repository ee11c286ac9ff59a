package resp

import (
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, within one slot (as
// Redis Cluster allows them).
//
// MULTI queues the commands that follow (checked as Redis checks them
// when queued: an unknown command, a wrong arity, keys of another slot,
// or a slot this replica does not lead make EXEC answer EXECABORT). EXEC
// runs them in order while holding the server's transaction lock
// exclusively: every other connection takes it shared while it runs a
// round of commands (txShared), so no other Redis command of this node
// reads or writes between a transaction's commands. The commands run in
// one pipeline, so consecutive writes (and key reads after them) go in
// one log entry, as a pipeline's do: a transaction of writes and key
// reads that fits one batch is one entry, atomic across crashes and
// leader changes. A longer one, or one that reads a collection between
// its writes, is several entries: a crash or a leader change between them
// leaves the first applied, and a write through the gRPC API (Go client,
// kvctl) may land between them (docs/redis.md).
//
// WATCH watches keys (Backend.WatchKeys): a write to one of them applied
// after the WATCH (by any client, the transaction's own included), or a
// change of its shard's state, makes EXEC answer a null array and run
// nothing, as Redis does when a watched key is touched.

// transaction is a connection's MULTI state.
type transaction struct {
	cmds      [][][]byte
	slot      int  // the slot of its first keyed command (-1: none yet)
	crossSlot bool // commands of several slots: EXEC answers CROSSSLOT
	dirty     bool // a command was refused when queued: EXECABORT
}

// watch is a WATCHed set of keys.
type watch struct {
	changed <-chan struct{}
	stop    func()
}

func transactionCommands() []*command {
	none := func(name string, arity int, flags, acl []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, acl: acl, run: run}
	}
	tx := []string{"@fast", "@transaction"}
	return []*command{
		none("multi", 1, []string{"noscript", "loading", "stale", "fast", "allow_busy"}, tx, cmdMulti),
		none("exec", 1, []string{"noscript", "loading", "stale", "skip_slowlog"}, []string{"@slow", "@transaction"}, cmdExec),
		none("discard", 1, []string{"noscript", "loading", "stale", "fast", "allow_busy"}, tx, cmdDiscard),
		{name: "watch", arity: -2, flags: []string{"noscript", "loading", "stale", "fast", "allow_busy"}, first: 1, last: -1, step: 1,
			acl: tx, keyFlags: []string{"RO"}, run: cmdWatch},
		none("unwatch", 1, []string{"noscript", "loading", "stale", "fast", "allow_busy"}, tx, cmdUnwatch),
	}
}

// txControl names the commands that run at once inside MULTI rather than
// being queued.
func txControl(name string) bool {
	switch name {
	case "exec", "discard", "multi", "watch", "quit", "reset":
		return true
	}
	return false
}

// queue adds a checked command to the open transaction (or refuses it:
// a slot this replica does not lead) and answers QUEUED. Commands of
// different slots are refused by EXEC, as Redis Cluster does.
func (c *conn) queue(p *pipeline, args [][]byte, slot int) {
	tx := c.tx
	if slot >= 0 {
		if e := c.s.notLeading(slot, c.tls); e != nil {
			tx.dirty = true
			p.reply(e)
			return
		}
		switch {
		case tx.slot < 0:
			tx.slot = slot
		case slot != tx.slot:
			tx.crossSlot = true
		}
	}
	tx.cmds = append(tx.cmds, args)
	p.reply(redcon.AppendString(nil, "QUEUED"))
}

// execAbort is EXEC's reply when it is refused before it runs (e, as
// dispatch refuses a command): the transaction is discarded, as Redis's
// execCommandAbort does.
func (c *conn) execAbort(e []byte) []byte {
	c.tx = nil
	c.unwatch()
	msg := strings.TrimSuffix(strings.TrimPrefix(string(e), "-"), "\r\n")
	return errReply("EXECABORT Transaction discarded because of: " + strings.TrimPrefix(msg, "ERR "))
}

// notLeading is the redirect for a command of slot that this replica
// cannot run as its group's leader, as the newest config it knows says
// (nil if it can): a transaction is checked when its first keyed command
// is queued, as Redis Cluster checks it.
func (s *Server) notLeading(slot int, tls bool) []byte {
	t := s.b.Topology()
	conf := t.Newest
	if conf == nil {
		conf = t.Applied
	}
	if len(conf.GetShards()) == 0 {
		return errReply("CLUSTERDOWN Hash slot not served")
	}
	gid := conf.Shards[routing.Shard(slot, len(conf.Shards))]
	switch {
	case gid != t.GID:
		return s.refusal(&shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Owner: gid, Leader: t.Leaders[gid]}, slot, tls)
	case !t.Leads:
		return s.refusal(&shardkvpb.Refusal{Reason: shardkvpb.ReasonNotLeader, Owner: gid, Leader: t.Leaders[gid]}, slot, tls)
	}
	return nil
}

func cmdMulti(c *conn, p *pipeline, _ [][]byte, _ int) {
	if c.tx != nil {
		p.reply(errReply("ERR MULTI calls can not be nested"))
		return
	}
	c.tx = &transaction{slot: -1}
	p.reply(okReply())
}

func cmdDiscard(c *conn, p *pipeline, _ [][]byte, _ int) {
	if c.tx == nil {
		p.reply(errReply("ERR DISCARD without MULTI"))
		return
	}
	c.tx = nil
	c.unwatch()
	p.reply(okReply())
}

func cmdWatch(c *conn, p *pipeline, args [][]byte, slot int) {
	if c.tx != nil {
		p.reply(errReply("ERR WATCH inside MULTI is not allowed"))
		return
	}
	if e := c.s.notLeading(slot, c.tls); e != nil {
		p.reply(e)
		return
	}
	changed, stop := c.s.b.WatchKeys(args[1:])
	c.watches = append(c.watches, watch{changed, stop})
	p.reply(okReply())
}

func cmdUnwatch(c *conn, p *pipeline, _ [][]byte, _ int) {
	c.unwatch()
	p.reply(okReply())
}

// unwatch forgets the connection's watches.
func (c *conn) unwatch() {
	for _, w := range c.watches {
		w.stop()
	}
	c.watches = nil
}

// touched reports whether a watched key was written since its WATCH.
func (c *conn) touched() bool {
	for _, w := range c.watches {
		select {
		case <-w.changed:
			return true
		default:
		}
	}
	return false
}

// cmdExec runs the open transaction (see the top of this file): an array
// of its commands' replies, a null array if a watched key was touched, or
// EXECABORT if a command was refused when queued.
func cmdExec(c *conn, p *pipeline, _ [][]byte, _ int) {
	tx := c.tx
	if tx == nil {
		p.reply(errReply("ERR EXEC without MULTI"))
		return
	}
	c.tx = nil
	defer c.unwatch()
	// Redis Cluster checks the transaction's keys before EXEC runs.
	switch {
	case tx.crossSlot:
		p.reply(errReply("CROSSSLOT Keys in request don't hash to the same slot"))
		return
	case tx.slot >= 0:
		if e := c.s.notLeading(tx.slot, c.tls); e != nil {
			p.reply(e)
			return
		}
	}
	if tx.dirty {
		p.reply(errReply("EXECABORT Transaction discarded because of previous errors."))
		return
	}
	// What this pipeline holds runs first, under the shared lock; then
	// the lock is taken whole for the transaction.
	p.barrier()
	unlock := c.lockExclusive()
	out, charge := func() ([]byte, int64) {
		defer unlock()
		return c.runTransaction(tx)
	}()
	p.add(&item{out: out, charge: charge})
}

// lockExclusive takes the transaction lock whole for a command that reads
// and then writes (EXEC, BITOP, SORT ... STORE), letting go of the
// connection's shared hold first; the returned func gives it back. Inside
// EXEC, which holds it already, it does nothing.
func (c *conn) lockExclusive() (unlock func()) {
	if c.execing {
		return func() {}
	}
	c.unlockShared()
	c.s.tx.Lock()
	return func() {
		c.s.tx.Unlock()
		c.lockShared()
	}
}

// lockShared takes the server's transaction lock shared: a connection
// holds it while it runs a round of commands (run), so that no EXEC runs
// meanwhile, and lets go of it while it waits for its client (emit) or
// for a key (block), so that an EXEC never waits for a client.
func (c *conn) lockShared() {
	if !c.shared {
		c.s.tx.RLock()
		c.shared = true
	}
}

// unlockShared lets go of the shared lock, if held.
func (c *conn) unlockShared() {
	if c.shared {
		c.shared = false
		c.s.tx.RUnlock()
	}
}

// runTransaction runs tx's commands, the transaction lock held: their
// replies as one array, and what they hold of the output budget.
func (c *conn) runTransaction(tx *transaction) ([]byte, int64) {
	if c.touched() {
		return c.nullArray(), 0
	}
	// The transaction's own pipeline, which keeps its replies: they go
	// out as one array once all have run. Its deadline starts now, the
	// lock held, so that no command of it is refused as late after the
	// wait for the lock.
	tp := &pipeline{c: c, hold: true, deadline: time.Now().Add(c.s.cfg.PipelineTimeout)}
	defer tp.release()
	c.execing = true
	for _, args := range tx.cmds {
		c.s.stats.commands.Add(1)
		c.dispatch(tp, args)
	}
	tp.barrier()
	c.execing = false
	out := redcon.AppendArray(nil, len(tp.items))
	var charge int64
	now := time.Now()
	for _, it := range tp.items {
		out = append(out, it.out...)
		charge += it.charge
		it.charge = 0
		if it.cmd != nil {
			it.cmd.stats.record(it.out, now.Sub(it.started))
		}
	}
	return out, charge
}
