package ctrler

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// FuzzControllerStateMachine applies one random controller log (an init,
// then client mutations of every kind with edge arguments, compactions,
// cut-overs of planned moves (matching, stale and made up), repeated
// inits, JSON entries, garbage and empty entries) to two state
// machines on real badger DBs with the engine's transaction limits, one
// entry per Apply on the first and in random batches on the second. Apply
// must never fail, both must give every entry the same result and end
// with the same stored state, and every stored config must be well formed.
func FuzzControllerStateMachine(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add(bytes.Repeat([]byte{0x00, 0x01, 0x02, 0x11, 0x03}, 20))              // joins, leaves
	f.Add(bytes.Repeat([]byte{0x02, 0x05, 0x09, 0x01}, 30))                    // moves, unpins
	f.Add(append([]byte{0x01, 0x01}, bytes.Repeat([]byte{0x0b}, 40)...))       // consistent hash, big joins
	f.Add(append([]byte{0x03, 0x00}, bytes.Repeat([]byte{0x0c, 0xff}, 20)...)) // many moves in one batch
	f.Add([]byte{0x05, 0x02, 0x06, 0x07, 0x08, 0x04, 0x04, 0x04})
	// Joins, a leave, cut-overs of what is planned, moves, cut-overs again.
	f.Add([]byte{0x00, 0x00, 0x02, // init 4 shards, balanced
		0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x01, 0x02, // join 2
		0x00, 0x00, 0x01, 0x02, 0x01, 0x01, 0x01, 0x00, 0x01, 0x02, // join 3
		0x10, 0x01, 0x02, 0x01, 0x02, 0x02, // cut over both
		0x00, 0x00, 0x01, 0x03, 0x01, 0x01, 0x01, 0x00, 0x01, 0x02, // join 4
		0x03, 0x00, 0x01, 0x01, 0x02, // leave 2
		0x05, 0x00, 0x01, 0x02, 0x01, 0x02, // move shard 1 to 3
		0x05, 0x00, 0x00, 0x03, 0x00, 0x02, // move shard 0 to 4, stop and copy
		0x10, 0x01, 0x02, 0x00, 0x02, 0x01, 0x00, 0x01, 0x02, 0x02, // cut over some, one stale
		0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x01, 0x02, // rejoin 2
		0x10, 0x01, 0x02, 0x01, 0x02, 0x01, 0x02, 0x01, 0x02, 0x02, // cut over
		0x11, 0x01, 0x02, 0x01, 0x02, 0x02, 0x05, 0x01, 0x02, 0x03, 0x07, 0x00, 0x02})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &ctrlLogGen{in: data, now: time.Unix(1_800_000_000, 0), shadow: openFuzzSM(t)}
		ents := g.log()
		a, b := openFuzzSM(t), openFuzzSM(t)
		ra := applyCtrlLog(t, a, ents, nil)
		rb := applyCtrlLog(t, b, ents, g)
		for i := range ra {
			if ra[i] != rb[i] {
				t.Fatalf("entry %d: results differ:\n%.2000s\n%.2000s", ents[i].Index, ra[i], rb[i])
			}
		}
		da, db := ctrlState(t, a), ctrlState(t, b)
		if da != db {
			t.Fatalf("states differ after %d entries:\n%.2000s\n---\n%.2000s", len(ents), da, db)
		}
		checkHistory(t, a)
	})
}

// openFuzzSM opens a controller state machine on a DB with raftgroup's
// transaction and value limits (16 MiB memtables: 2.4 MiB per transaction).
func openFuzzSM(t *testing.T) *StateMachine {
	dir, err := os.MkdirTemp("/dev/shm", "fuzzctrl")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	o := raftgroup.StorageOptions(dir)
	db, err := badger.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sm := NewStateMachine()
	if _, err := sm.Open(db); err != nil {
		t.Fatal(err)
	}
	return sm
}

// applyCtrlLog applies copies of ents one per call, or in batches cut by g,
// and returns each entry's result as text.
func applyCtrlLog(t *testing.T, sm *StateMachine, ents []raftgroup.Entry, g *ctrlLogGen) []string {
	t.Helper()
	es := slices.Clone(ents)
	for i := 0; i < len(es); {
		n := 1
		if g != nil {
			n = 1 + g.intn(8)
		}
		n = min(n, len(es)-i)
		if err := raftgroup.ApplyAlone(sm, sm.store.DB(), es[i:i+n]); err != nil {
			t.Fatalf("Apply [%d,%d]: %.500v", es[i].Index, es[i+n-1].Index, err)
		}
		i += n
	}
	out := make([]string, len(es))
	for i, e := range es {
		switch r := e.Result.(type) {
		case nil:
			out[i] = "<nil>"
		case Result:
			out[i] = fmt.Sprintf("%s err=%q", prototext.Format(r.Config), errString(r.Err))
		default:
			t.Fatalf("entry %d: result %T", e.Index, e.Result)
		}
	}
	return out
}

// ctrlState is every stored key and value, and the in-memory view.
func ctrlState(t *testing.T, sm *StateMachine) string {
	var b strings.Builder
	stored, err := rgtest.DumpDB(sm.store.DB())
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(stored)
	sm.mu.Lock()
	defer sm.mu.Unlock()
	fmt.Fprintf(&b, "inited %v shards %d strategy %q oldest %d latest %d\n", sm.inited, sm.nshards, sm.strategy, sm.oldest, sm.latest)
	return b.String()
}

// checkHistory checks every kept config: numbered in sequence, shards on
// groups of that config (0 only when it has none), groups sorted by gid
// and unique, some group not leaving (if any), and every leaving group
// owning a shard; planned moves sorted by shard and unique, each from its
// shard's owner to another group of the config that is not leaving,
// announced no later than the config; pins on groups that are not leaving,
// each honoured by the owner or by a planned move.
func checkHistory(t *testing.T, sm *StateMachine) {
	t.Helper()
	if !sm.Initialized() {
		return
	}
	oldest, latest := sm.Bounds()
	if oldest > latest {
		t.Fatalf("oldest %d > latest %d", oldest, latest)
	}
	for n := oldest; n <= latest; n++ {
		c, err := sm.Config(int64(n))
		if err != nil {
			t.Fatalf("config %d: %v", n, err)
		}
		if c.Num != n || len(c.Shards) != sm.Shards() {
			t.Fatalf("config %d: num %d, %d shards (want %d)", n, c.Num, len(c.Shards), sm.Shards())
		}
		gids := map[uint64]bool{}
		leavingGIDs := map[uint64]bool{}
		for i, g := range c.Groups {
			if g.Gid == 0 || gids[g.Gid] || (i > 0 && c.Groups[i-1].Gid >= g.Gid) {
				t.Fatalf("config %d: groups not unique, sorted, non-zero: %v", n, c.Groups)
			}
			gids[g.Gid] = true
			if g.Leaving {
				leavingGIDs[g.Gid] = true
				if !slices.Contains(c.Shards, g.Gid) {
					t.Fatalf("config %d: leaving group %d owns nothing", n, g.Gid)
				}
			}
		}
		if len(c.Groups) > 0 && len(leavingGIDs) == len(c.Groups) {
			t.Fatalf("config %d: every group is leaving: %v", n, c.Groups)
		}
		for s, gid := range c.Shards {
			if (len(c.Groups) == 0) != (gid == 0) || (gid != 0 && !gids[gid]) {
				t.Fatalf("config %d: shard %d on gid %d; groups %v", n, s, gid, slices.Collect(mapKeys(gids)))
			}
		}
		planned := map[uint32]uint64{}
		for i, m := range c.Moves {
			if (i > 0 && c.Moves[i-1].Shard >= m.Shard) || int(m.Shard) >= len(c.Shards) || c.Shards[m.Shard] != m.FromGid ||
				m.FromGid == m.ToGid || !gids[m.ToGid] || leavingGIDs[m.ToGid] || m.SinceConfig > c.Num || m.SinceConfig == 0 {
				t.Fatalf("config %d: bad planned move %v; shards %v, groups %v", n, m, c.Shards, c.Groups)
			}
			planned[m.Shard] = m.ToGid
		}
		for _, p := range c.Pins {
			if !gids[p.Gid] || leavingGIDs[p.Gid] || int(p.Shard) >= len(c.Shards) || (c.Shards[p.Shard] != p.Gid && planned[p.Shard] != p.Gid) {
				t.Fatalf("config %d: pin %v not honoured (planned %v)", n, p, c.Moves)
			}
		}
	}
}

func mapKeys(m map[uint64]bool) func(func(uint64) bool) {
	return func(yield func(uint64) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ctrlLogGen turns fuzz bytes into a controller log; past the input it
// reads zeros.
type ctrlLogGen struct {
	in     []byte
	now    time.Time
	index  uint64
	seq    [4]uint64
	shards int
	// shadow applies the log as it is generated, so that cut-overs can
	// name the moves actually planned; shadowed entries are applied.
	shadow   *StateMachine
	shadowed int
}

// planned applies the entries generated so far to the shadow and returns
// its latest config's planned moves.
func (g *ctrlLogGen) planned(ents []raftgroup.Entry) []*shardkvpb.PlannedMove {
	if g.shadow == nil {
		return nil
	}
	if g.shadowed < len(ents) {
		if err := raftgroup.ApplyAlone(g.shadow, g.shadow.store.DB(), slices.Clone(ents[g.shadowed:])); err != nil {
			g.shadow = nil // the comparison reports it
			return nil
		}
		g.shadowed = len(ents)
	}
	c, err := g.shadow.Config(-1)
	if err != nil {
		return nil
	}
	return c.Moves
}

// cutOver is a cut-over of some of the moves planned now, sometimes one
// of them changed (a stale report), sometimes with a made-up move.
func (g *ctrlLogGen) cutOver(ents []raftgroup.Entry, madeUp bool) *shardkvpb.ControllerCommand {
	cut := &shardkvpb.ControllerCutOver{}
	for _, m := range g.planned(ents) {
		if g.intn(4) == 0 {
			continue
		}
		m = proto.Clone(m).(*shardkvpb.PlannedMove)
		switch g.intn(16) {
		case 0:
			m.SinceConfig--
		case 1:
			m.ToGid = g.gid()
		}
		cut.Moves = append(cut.Moves, m)
	}
	if madeUp {
		for range g.intn(4) {
			cut.Moves = append(cut.Moves, &shardkvpb.PlannedMove{Shard: g.shard(), FromGid: g.gid(), ToGid: g.gid(), SinceConfig: uint64(g.intn(64))})
		}
		if g.intn(2) == 0 {
			rand := g.intn(len(cut.Moves) + 1)
			slices.Reverse(cut.Moves[:rand])
		}
	}
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_CutOver{CutOver: cut}}
}

func (g *ctrlLogGen) byte() byte {
	if len(g.in) == 0 {
		return 0
	}
	c := g.in[0]
	g.in = g.in[1:]
	return c
}

func (g *ctrlLogGen) intn(n int) int { return int(g.byte()) % n }

// gid is mostly one of a few small gids, sometimes an edge value.
func (g *ctrlLogGen) gid() uint64 {
	switch c := g.byte(); {
	case c < 200:
		return uint64(c%8) + 1
	case c < 220:
		return 0
	case c < 240:
		return math.MaxUint64 - uint64(c%4)
	default:
		return uint64(c) << 40
	}
}

func (g *ctrlLogGen) shard() uint32 {
	switch c := g.byte(); {
	case c < 230:
		return uint32(int(c) % (g.shards + 2))
	case c < 245:
		return math.MaxUint32
	default:
		return 16384
	}
}

func (g *ctrlLogGen) weight() uint32 {
	switch c := g.byte(); {
	case c < 200:
		return uint32(c % 4)
	case c < 230:
		return uint32(c) * 64
	default:
		return math.MaxUint32 - uint32(c%2)
	}
}

func (g *ctrlLogGen) group() *shardkvpb.Group {
	grp := &shardkvpb.Group{Gid: g.gid(), Weight: g.weight()}
	for range g.intn(4) {
		s := &shardkvpb.Server{Id: uint64(g.intn(4)), Addr: []string{"a:1", "", "b:2", "c:3"}[g.intn(4)]}
		if g.intn(8) == 0 {
			s.Addr = strings.Repeat("x", 1<<uint(g.intn(17)))
		}
		grp.Servers = append(grp.Servers, s)
	}
	return grp
}

// bigJoin is a join of n groups, each of servers with long addresses:
// configs near and past any size limit.
func (g *ctrlLogGen) bigJoin(base uint64, n, servers, addr int) *shardkvpb.JoinRequest {
	req := &shardkvpb.JoinRequest{}
	for i := range n {
		grp := &shardkvpb.Group{Gid: base + uint64(i), Weight: 1}
		for j := range servers {
			grp.Servers = append(grp.Servers, &shardkvpb.Server{Id: uint64(j + 1), Addr: fmt.Sprintf("%0*d", addr, i)})
		}
		req.Groups = append(req.Groups, grp)
	}
	return req
}

// client picks a client (0: none) and a sequence number: usually the next,
// sometimes a retry or an older one.
func (g *ctrlLogGen) client() (uint64, uint64) {
	c := g.intn(4)
	if c == 0 {
		return 0, 0
	}
	switch g.intn(8) {
	case 0: // retry
	case 1:
		return uint64(c), g.seq[c] / 2
	default:
		g.seq[c]++
	}
	return uint64(c), g.seq[c]
}

func (g *ctrlLogGen) entry(cmd *shardkvpb.ControllerCommand) raftgroup.Entry {
	if request(cmd) != nil {
		// Mostly this controller's mutations; now and then one logged by
		// an earlier controller (no plans: owners change at once).
		cmd.PlanMoves = g.intn(8) != 0
	}
	b, err := encodeCommand(cmd)
	if err != nil {
		panic(err)
	}
	return g.raw(b)
}

func (g *ctrlLogGen) raw(b []byte) raftgroup.Entry {
	g.index++
	// Log time moves forward, mostly by seconds, sometimes by days (session
	// expiry), sometimes back (a new leader's clock).
	switch g.intn(16) {
	case 0:
		g.now = g.now.Add(25 * time.Hour)
	case 1:
		g.now = g.now.Add(-time.Minute)
	default:
		g.now = g.now.Add(time.Second)
	}
	return raftgroup.Entry{Index: g.index, Term: 1, Time: g.now, Cmd: b}
}

func (g *ctrlLogGen) init() *shardkvpb.ControllerCommand {
	shards := []uint32{4, 16, 1, 3, 0, 16384, 1 << 20, 64}[g.intn(8)]
	placement := []string{"balanced", "consistent-hash", "", "frobnicate"}[g.intn(4)]
	return &shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: shards, Placement: placement}}}
}

func (g *ctrlLogGen) log() []raftgroup.Entry {
	var ents []raftgroup.Entry
	first := g.init()
	g.shards = int(first.GetInit().GetShards())
	if g.shards > 16384 {
		g.shards = 4
	}
	ents = append(ents, g.entry(first))
	for n := 0; len(g.in) > 0 && n < 40 && len(ents) < maxFuzzEntries; n++ {
		op := &shardkvpb.ControllerCommand{}
		switch g.intn(18) {
		case 0, 1, 2:
			c, s := g.client()
			req := &shardkvpb.JoinRequest{ClientId: c, Seq: s}
			for range g.intn(4) {
				req.Groups = append(req.Groups, g.group())
			}
			op.Op = &shardkvpb.ControllerCommand_Join{Join: req}
		case 3, 4:
			c, s := g.client()
			req := &shardkvpb.LeaveRequest{ClientId: c, Seq: s}
			for range g.intn(4) {
				req.Gids = append(req.Gids, g.gid())
			}
			op.Op = &shardkvpb.ControllerCommand_Leave{Leave: req}
		case 5, 6:
			c, s := g.client()
			op.Op = &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: c, Seq: s, Shard: g.shard(), Gid: g.gid(), StopAndCopy: g.intn(4) == 0}}
		case 7:
			c, s := g.client()
			op.Op = &shardkvpb.ControllerCommand_Unpin{Unpin: &shardkvpb.UnpinRequest{ClientId: c, Seq: s, Shard: g.shard()}}
		case 8:
			below := uint64(g.intn(64))
			if g.intn(8) == 0 {
				below = math.MaxUint64
			}
			op.Op = &shardkvpb.ControllerCommand_Compact{Compact: &shardkvpb.ControllerCompact{Below: below}}
		case 9:
			op = g.init()
		case 10: // garbage, or an empty entry
			if g.intn(2) == 0 {
				ents = append(ents, raftgroup.Entry{Index: g.index + 1})
				g.index++
			} else {
				ents = append(ents, g.raw(g.take(g.intn(32))))
			}
			continue
		case 11: // a join of many groups or long addresses
			c, s := g.client()
			req := []*shardkvpb.JoinRequest{
				g.bigJoin(100, 64, 3, 20),
				g.bigJoin(1000, 2000, 3, 40),
				g.bigJoin(10000, 300, 7, 1000),
				g.bigJoin(20000, 5000, 1, 8),
			}[g.intn(4)]
			req.ClientId, req.Seq = c, s
			op.Op = &shardkvpb.ControllerCommand_Join{Join: req}
		case 12: // many moves, committed together (one Ready holds up to 1 MiB)
			n := 20 + g.intn(100)
			if g.shards > 1024 { // configs of up to 160 KB: 20 fill a transaction
				n = 20 + g.intn(20)
			}
			for range n {
				c, s := g.client()
				ents = append(ents, g.entry(&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: c, Seq: s, Shard: g.shard(), Gid: g.gid()}}}))
			}
			continue
		case 13: // a JSON entry of earlier controllers
			e := jsonEntries[g.intn(len(jsonEntries))]
			ents = append(ents, g.raw([]byte(e.json)))
			continue
		case 14: // a command without an operation, or an unknown field
			ents = append(ents, g.raw([]byte{0x08 | byte(g.intn(2))<<6, 0x01}))
			continue
		case 16: // the leader's cut-over of what its reports say caught up
			op = g.cutOver(ents, false)
		case 17: // a cut-over with stale or made-up moves
			op = g.cutOver(ents, true)
		default: // many clients: sessions to expire
			for range 10 + g.intn(100) {
				ents = append(ents, g.entry(&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Unpin{Unpin: &shardkvpb.UnpinRequest{ClientId: uint64(1000 + g.index), Seq: 1, Shard: 0}}}))
			}
			continue
		}
		ents = append(ents, g.entry(op))
	}
	return ents
}

// maxFuzzEntries bounds one input's log: a mutation stores a whole config
// (up to 160 KB at 16384 shards), and both state machines are compared in
// full at the end.
const maxFuzzEntries = 300

func (g *ctrlLogGen) take(n int) []byte {
	n = min(n, len(g.in))
	b := slices.Clone(g.in[:n])
	g.in = g.in[n:]
	return b
}
