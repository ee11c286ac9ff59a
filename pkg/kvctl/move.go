package kvctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The data groups' shard states a move goes through (ShardState.state).
const (
	statePreCopying = "PreCopying" // the target, while the source still serves
	statePulling    = "Pulling"    // the target, after the cut-over (the last changes)
	stateServing    = "Serving"
)

// moveWaitEvery is how often move --wait asks the controller for status.
const moveWaitEvery = 500 * time.Millisecond

func cmdMove(k *kvctl, args []string) error {
	fs := newFlags("move")
	stopAndCopy := fs.Bool("stop-and-copy", false, "")
	wait := fs.Bool("wait", false, "")
	cancelMove := fs.Bool("cancel", false, "")
	pos, err := k.parse(fs, args, 1, 2)
	if err != nil {
		return err
	}
	if *cancelMove {
		if len(pos) != 1 {
			return usagef(nil, "move --cancel takes the shard only (%d arguments)", len(pos))
		}
		if *stopAndCopy {
			return usagef(nil, "--stop-and-copy and --cancel do not go together")
		}
	} else if len(pos) != 2 {
		return usagef(nil, "wrong number of arguments (%d)", len(pos))
	}
	shard, err := parseShard(pos[0])
	if err != nil {
		return err
	}
	ctrl, ctx, cancel, err := k.ctrlerCall()
	if err != nil {
		return err
	}
	defer cancel()
	if *cancelMove {
		return k.cancelMove(ctx, ctrl, uint32(shard), *wait)
	}
	gid, err := parseUint("gid", pos[1])
	if err != nil {
		return err
	}
	var c *shardkvpb.Config
	if *stopAndCopy {
		c, err = ctrl.MoveStopAndCopy(ctx, int(shard), gid)
	} else {
		c, err = ctrl.Move(ctx, int(shard), gid)
	}
	if err != nil {
		return k.ctrlErr(err)
	}
	if *wait {
		return k.waitMove(ctx, ctrl, uint32(shard), gid, c, *stopAndCopy)
	}
	what := fmt.Sprintf("shard %d pinned to group %d", shard, gid)
	if m := plannedMove(c, uint32(shard)); m != nil && m.ToGid == gid {
		what += fmt.Sprintf("; move from group %d planned since config %d (pre-copy, then cut-over)", m.FromGid, m.SinceConfig)
	} else if *stopAndCopy && int(shard) < len(c.Shards) && c.Shards[shard] == gid {
		what += fmt.Sprintf(" (stop-and-copy: handed over in config %d)", c.Num)
	}
	return k.mutated(what, c, nil)
}

// cancelMove cancels the planned move of shard: a Move to the shard's
// current owner (which pins it there).
func (k *kvctl) cancelMove(ctx context.Context, ctrl *ctrlerclient.Client, shard uint32, wait bool) error {
	latest, err := ctrl.Query(ctx, -1)
	if err != nil {
		return k.ctrlErr(err)
	}
	if int(shard) >= len(latest.Shards) {
		return fmt.Errorf("shard %d is out of range [0, %d)", shard, len(latest.Shards))
	}
	m := plannedMove(latest, shard)
	if m == nil {
		return fmt.Errorf("shard %d has no planned move to cancel (config %d: it is on group %d)", shard, latest.Num, latest.Shards[shard])
	}
	c, err := ctrl.Move(ctx, int(shard), m.FromGid)
	if err != nil {
		return k.ctrlErr(err)
	}
	if cut := c.Shards[shard]; cut == m.ToGid {
		// The cut-over won the race: the shard is the target's now, and
		// this Move planned it back.
		return k.mutated(fmt.Sprintf("too late: shard %d was cut over to group %d before the cancel; it is now pinned to group %d and planned back", shard, m.ToGid, m.FromGid), c, nil)
	}
	if wait {
		fmt.Fprintf(k.stdout, "shard %d: planned move to group %d cancelled in config %d; it stays on group %d (pinned)\n", shard, m.ToGid, c.Num, m.FromGid)
		return nil
	}
	return k.mutated(fmt.Sprintf("planned move of shard %d to group %d cancelled; shard %d stays on group %d (pinned)", shard, m.ToGid, shard, m.FromGid), c, nil)
}

// moveEvent is one phase line of move --wait (with --json, one JSON
// object a line).
type moveEvent struct {
	Shard uint32 `json:"shard"`
	// Phase: announced, handed-over (stop-and-copy), pre-copying,
	// cut-over, pulling, served; already-there (nothing to move).
	Phase  string `json:"phase"`
	From   uint64 `json:"from"`
	To     uint64 `json:"to"`
	Config uint64 `json:"config"`
	// Copy progress (pre-copying, pulling), where the target reports it.
	CopyPhase    string `json:"copy_phase,omitempty"` // snapshot, delta
	Keys         uint64 `json:"keys"`
	TotalKeys    uint64 `json:"total_keys"`
	Bytes        uint64 `json:"bytes"`
	TotalBytes   uint64 `json:"total_bytes"`
	LagEntries   uint64 `json:"lag_entries"`
	CaughtUp     bool   `json:"caught_up"`
	WritePauseUs uint64 `json:"write_pause_us"` // served: the measured write pause
}

// copyProgress is "1200 of 5000 keys, 1.2 MiB of 4.8 MiB copied".
func copyProgress(keys, totalKeys, bytes, totalBytes uint64, verb string) string {
	k := fmt.Sprintf("%d keys", keys)
	if totalKeys > 0 {
		k = fmt.Sprintf("%d of %d keys", keys, totalKeys)
	}
	b := humanBytes(bytes)
	if totalBytes > 0 {
		b = fmt.Sprintf("%s of %s", humanBytes(bytes), humanBytes(totalBytes))
	}
	return fmt.Sprintf("%s, %s %s", k, b, verb)
}

func pauseText(us uint64) string {
	if us == 0 {
		return "write pause not reported"
	}
	return "write pause " + (time.Duration(us) * time.Microsecond).String()
}

func (e moveEvent) text() string {
	p := fmt.Sprintf("shard %d: ", e.Shard)
	switch e.Phase {
	case "announced":
		return p + fmt.Sprintf("move from group %d to group %d announced in config %d; waiting for group %d to pre-copy", e.From, e.To, e.Config, e.To)
	case "handed-over":
		return p + fmt.Sprintf("handed over to group %d in config %d (stop-and-copy: writes pause until it has pulled the shard)", e.To, e.Config)
	case "pre-copying":
		s := p + fmt.Sprintf("pre-copying (%s) from group %d: %s, lag %d entries", orDash(e.CopyPhase), e.From, copyProgress(e.Keys, e.TotalKeys, e.Bytes, e.TotalBytes, "copied"), e.LagEntries)
		if e.CaughtUp {
			s += ", caught up; waiting for the cut-over"
		}
		return s
	case "cut-over":
		return p + fmt.Sprintf("cut over in config %d: group %d owns it; group %d pulls the last changes", e.Config, e.To, e.To)
	case "pulling":
		return p + fmt.Sprintf("pulling (%s) from group %d: %s", orDash(e.CopyPhase), e.From, copyProgress(e.Keys, e.TotalKeys, e.Bytes, e.TotalBytes, "received"))
	case "already-there":
		return p + fmt.Sprintf("already on group %d (config %d); nothing to move", e.To, e.Config)
	case "served":
		return p + fmt.Sprintf("served by group %d (config %d), %s", e.To, e.Config, pauseText(e.WritePauseUs))
	}
	return p + e.Phase
}

// mover follows one move through the controller's status.
type mover struct {
	k     *kvctl
	shard uint32
	from  uint64
	to    uint64
	// planned: the last config seen that still planned the move; cut: the
	// config that handed the shard to the target (0: not yet).
	planned, cut uint64
	last         string // the last line printed
}

func (mv *mover) emit(e moveEvent) error {
	e.Shard, e.From, e.To = mv.shard, mv.from, mv.to
	line := e.text()
	if line == mv.last {
		return nil
	}
	mv.last = line
	if mv.k.json {
		b, err := jsonLine(e)
		if err != nil {
			return err
		}
		_, err = mv.k.stdout.Write(b)
		return err
	}
	_, err := fmt.Fprintln(mv.k.stdout, line)
	return err
}

// targetShard returns the target's latest report and its state of the shard.
func (mv *mover) targetShard(st *shardkvpb.ClusterStatus) (*shardkvpb.GroupReport, *shardkvpb.ShardState) {
	for _, g := range st.GetGroups() {
		if r := g.GetReport(); r != nil && r.Gid == mv.to {
			for _, s := range r.Shards {
				if s.Shard == mv.shard {
					return r, s
				}
			}
			return r, nil
		}
	}
	return nil, nil
}

// step looks at one status; done when the target serves the shard.
func (mv *mover) step(ctx context.Context, ctrl *ctrlerclient.Client, st *shardkvpb.ClusterStatus) (done bool, err error) {
	latest := st.GetLatest()
	if int(mv.shard) >= len(latest.GetShards()) {
		return false, fmt.Errorf("shard %d is not in config %d", mv.shard, latest.GetNum())
	}
	rep, ss := mv.targetShard(st)
	if mv.cut == 0 {
		m := plannedMove(latest, mv.shard)
		switch {
		case m != nil && m.ToGid == mv.to && m.FromGid == mv.from:
			mv.planned = latest.Num
			if ss != nil && ss.State == statePreCopying {
				return false, mv.emit(moveEvent{Phase: "pre-copying", Config: m.SinceConfig, CopyPhase: ss.Phase, Keys: ss.Keys, TotalKeys: ss.TotalKeys,
					Bytes: ss.Bytes, TotalBytes: ss.TotalBytes, LagEntries: ss.LagEntries, CaughtUp: ss.CaughtUp})
			}
			return false, nil
		case latest.Shards[mv.shard] == mv.to:
			mv.cut = mv.cutConfig(ctx, ctrl, latest)
			if err := mv.emit(moveEvent{Phase: "cut-over", Config: mv.cut}); err != nil {
				return false, err
			}
		default:
			now := fmt.Sprintf("on group %d", latest.Shards[mv.shard])
			if m != nil {
				now += fmt.Sprintf(", planned to group %d", m.ToGid)
			}
			return false, fmt.Errorf("shard %d: the move to group %d was cancelled or changed (config %d: %s)", mv.shard, mv.to, latest.Num, now)
		}
	}
	if latest.Shards[mv.shard] != mv.to {
		return false, fmt.Errorf("shard %d: moved away from group %d again (config %d: on group %d)", mv.shard, mv.to, latest.Num, latest.Shards[mv.shard])
	}
	if ss == nil {
		return false, nil
	}
	switch {
	case ss.State == stateServing && rep.ConfigNum >= mv.cut:
		return true, mv.emit(moveEvent{Phase: "served", Config: max(ss.ConfigNum, mv.cut), WritePauseUs: ss.WritePauseUs})
	case ss.State == statePulling:
		return false, mv.emit(moveEvent{Phase: "pulling", Config: ss.ConfigNum, CopyPhase: ss.Phase, Keys: ss.Keys, TotalKeys: ss.TotalKeys,
			Bytes: ss.Bytes, TotalBytes: ss.TotalBytes, LagEntries: ss.LagEntries})
	}
	return false, nil
}

// cutConfig finds the config that handed the shard to the target: the
// first after the last one seen planning the move (the latest if history
// is gone).
func (mv *mover) cutConfig(ctx context.Context, ctrl *ctrlerclient.Client, latest *shardkvpb.Config) uint64 {
	for n := mv.planned + 1; mv.planned > 0 && n < latest.Num; n++ {
		c, err := ctrl.Query(ctx, int64(n))
		if err != nil {
			break
		}
		if c.Shards[mv.shard] == mv.to {
			return n
		}
	}
	return latest.Num
}

// waitMove prints the phases of the move c started until the target
// serves the shard, or the command's time is up.
func (k *kvctl) waitMove(ctx context.Context, ctrl *ctrlerclient.Client, shard uint32, gid uint64, c *shardkvpb.Config, stopAndCopy bool) error {
	if int(shard) >= len(c.GetShards()) {
		return fmt.Errorf("shard %d is not in config %d", shard, c.GetNum())
	}
	mv := &mover{k: k, shard: shard, to: gid}
	if m := plannedMove(c, shard); m != nil && m.ToGid == gid {
		mv.from, mv.planned = m.FromGid, c.Num
		if err := mv.emit(moveEvent{Phase: "announced", Config: m.SinceConfig}); err != nil {
			return err
		}
	} else if c.Shards[shard] == gid && !stopAndCopy {
		return mv.emit(moveEvent{Phase: "already-there", Config: c.Num})
	} else if c.Shards[shard] == gid {
		// Handed over now, or there already: wait until the target
		// serves it at this config.
		mv.cut = c.Num
		if err := mv.emit(moveEvent{Phase: "handed-over", Config: c.Num}); err != nil {
			return err
		}
	} else {
		return fmt.Errorf("shard %d: config %d neither plans nor makes the move to group %d", shard, c.Num, gid)
	}
	tick := time.NewTicker(moveWaitEvery)
	defer tick.Stop()
	var lastErr error
	for {
		st, err := ctrl.Status(ctx)
		if err == nil {
			done, err := mv.step(ctx, ctrl, st)
			if err != nil || done {
				return err
			}
		} else if ctx.Err() == nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			where := "waiting for the pre-copy and cut-over"
			if mv.cut != 0 {
				where = fmt.Sprintf("group %d has the shard since config %d but does not report serving it yet", gid, mv.cut)
			}
			msg := fmt.Sprintf("shard %d: gave up after %v (%s); the move goes on: see kvctl status, or wait longer with --timeout", shard, k.timeout, where)
			if lastErr != nil && !errors.Is(lastErr, context.DeadlineExceeded) {
				msg += "; last error: " + oneLine(lastErr)
			}
			return errors.New(msg)
		case <-tick.C:
		}
	}
}

// jsonLine is v as one line of JSON.
func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(b, '\n'), err
}
