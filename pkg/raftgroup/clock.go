package raftgroup

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// The log clock: every entry carries a time that the whole group agrees
// on, so that one replica's wall clock jumping (an NTP step, a VM resume)
// cannot move it. Each replica's Raft traffic carries its wall clock
// (RaftBatch.sent_unix_nanos); the leader stamps an entry with the lower
// median over the voters of their last report advanced by the local
// monotonic time since it arrived, and never earlier than the last time it
// stamped or saw in its log. docs/time.md has the argument.

// ClockLag is how far the log clock may fall behind the group's time while
// the state machine says its reads depend on time (TimeDependent): the
// leader then proposes a clock entry, at most one per ClockLag.
const ClockLag = 250 * time.Millisecond

// TimeDependent is an optional StateMachine interface. A state machine
// whose reads change as time passes (keys with a TTL) returns true while
// that is so, and the leader keeps the log clock within about ClockLag of
// the group's time by proposing clock entries when the group is otherwise
// idle. It is called from another goroutine than Apply.
type TimeDependent interface {
	TimeDependent() bool
}

// clockMagic starts a clock entry: no command, only a time (Entry.Cmd nil,
// Entry.Time set).
const clockMagic = 0xA8

func encodeClockEntry(t time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte{clockMagic}, uint64(unixNanos(t)))
}

func decodeClockEntry(b []byte) (time.Time, bool) {
	if len(b) != 9 || b[0] != clockMagic {
		return time.Time{}, false
	}
	return fromUnixNanos(int64(binary.BigEndian.Uint64(b[1:]))), true
}

// unixNanos encodes t, the zero time as 0 ("no time").
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// clockReport is a peer's wall clock as it last reported it, and the local
// monotonic instant the report arrived.
type clockReport struct {
	wall time.Time // no monotonic reading
	at   time.Time // time.Now(): has one
}

// groupClock estimates the group's time and hands out entry stamps.
type groupClock struct {
	now  func() time.Time // this replica's wall clock (Config.Now)
	self uint64

	mu      sync.Mutex
	reports map[uint64]clockReport
	last    time.Time // the latest stamp given or seen in the log
}

func newGroupClock(self uint64, now func() time.Time) *groupClock {
	return &groupClock{now: now, self: self, reports: map[uint64]clockReport{}}
}

// report records a peer's wall clock (Unix ns, 0: the peer predates it).
func (c *groupClock) report(from uint64, wallNanos int64) {
	if wallNanos == 0 || from == c.self {
		return
	}
	r := clockReport{wall: time.Unix(0, wallNanos), at: time.Now()}
	c.mu.Lock()
	c.reports[from] = r
	c.mu.Unlock()
}

// groupTime is the lower median over voters of their estimated wall
// clocks, this replica's own included. ok is false until a quorum of the
// voters has an estimate (only with peers that predate the reports).
func (c *groupClock) groupTime(voters []uint64) (time.Time, bool) {
	est := make([]time.Time, 0, len(voters))
	c.mu.Lock()
	for _, id := range voters {
		if id == c.self {
			est = append(est, c.now())
		} else if r, ok := c.reports[id]; ok {
			est = append(est, r.wall.Add(time.Since(r.at)))
		}
	}
	c.mu.Unlock()
	if len(est) == 0 || len(est) < len(voters)/2+1 {
		return time.Time{}, false
	}
	slices.SortFunc(est, func(a, b time.Time) int { return a.Compare(b) })
	return est[(len(est)-1)/2].Round(0), true
}

// observe notes an entry's time seen in the log, so that this replica,
// should it lead, never stamps earlier.
func (c *groupClock) observe(t time.Time) {
	if t.IsZero() {
		return
	}
	c.mu.Lock()
	if t.After(c.last) {
		c.last = t
	}
	c.mu.Unlock()
}

// lastStamp is the latest time stamped or seen.
func (c *groupClock) lastStamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// stamp is the next entry's time: the group's time, never before the
// last stamp. Without a quorum of reports it falls back to this replica's
// own clock (also never before the last stamp), as before the reports.
func (c *groupClock) stamp(voters []uint64) time.Time {
	t, ok := c.groupTime(voters)
	if !ok {
		t = c.now().Round(0)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Before(c.last) {
		t = c.last
	}
	c.last = t
	return t.UTC()
}

// stampNow is the time for an entry this replica proposes now.
func (r *Replica) stampNow() time.Time { return r.clock.stamp(r.voters()) }

func (r *Replica) voters() []uint64 {
	r.membersMu.RLock()
	defer r.membersMu.RUnlock()
	return slices.Clone(r.conf.GetVoters())
}

// GroupTime is the group's time as this replica estimates it (the lower
// median of the voters' reported wall clocks); ok is false while too few
// voters have reported. It is what a leader stamps entries with, so a
// leader's loops that propose time-driven work (expiry) should ask it, not
// the local clock.
func (r *Replica) GroupTime() (t time.Time, ok bool) {
	return r.clock.groupTime(r.voters())
}

// keepClock proposes a clock entry when this replica leads, the state
// machine's reads depend on time and the last stamp lags the group's time
// by more than ClockLag: at most one per ClockLag, none in a busy group
// (its own entries keep the clock fresh) or one without TTLs.
func (r *Replica) keepClock(stopc <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	td, ok := r.sm.(TimeDependent)
	if !ok {
		return
	}
	tick := time.NewTicker(ClockLag / 5)
	defer tick.Stop()
	var sent time.Time
	for {
		// A follower only waits to lead: no timer wakes it (a ticker
		// nobody receives from fires nothing).
		if !r.AwaitLeading(stopc) {
			return
		}
		select {
		case <-tick.C:
		case <-stopc:
			return
		}
		if !r.IsLeader() || time.Since(sent) < ClockLag {
			continue
		}
		gt, ok := r.GroupTime()
		if !ok || gt.Sub(r.clock.lastStamp()) <= ClockLag || !td.TimeDependent() {
			continue
		}
		sent = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.cfg.ElectionTicks)*r.cfg.TickInterval)
		go func() {
			// Give up at once when the replica stops.
			select {
			case <-stopc:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := r.node.Propose(ctx, encodeClockEntry(r.stampNow())); err != nil {
			r.log.Debug("clock entry not proposed", "err", err)
		}
		cancel()
	}
}

// entryTime is a log entry's time (zero if it carries none: Raft's own
// no-ops, membership changes).
func entryTime(e *pb.Entry) time.Time {
	if e.GetType() != pb.EntryNormal {
		return time.Time{}
	}
	if h, _, ok := decodeHeader(e.GetData()); ok {
		return h.time
	}
	t, _ := decodeClockEntry(e.GetData())
	return t
}

// observeLastEntry starts the clock at the time of the last entry in the
// log: a restarted replica that leads never stamps before it.
func (r *Replica) observeLastEntry() error {
	first, _ := r.store.FirstIndex()
	last, _ := r.store.LastIndex()
	if last < first {
		return nil // empty log (new, or all of it in a snapshot)
	}
	ents, err := r.store.Entries(last, last+1, math.MaxUint64)
	if err != nil {
		return fmt.Errorf("raftgroup: read last log entry %d: %w", last, err)
	}
	for _, e := range ents {
		r.clock.observe(entryTime(e))
	}
	return nil
}
