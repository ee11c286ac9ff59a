package shardkv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"sort"
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

// FuzzGroupStateMachine applies one random log (write commands of every
// kind and size, near the limits too, config steps, shard transfer and
// expiry entries) to two state machines on real badger DBs, one entry per
// Apply on the first and in random batches on the second. No entry may
// make Apply fail, and both must end with the same results and the same
// stored state, byte for byte.
func FuzzGroupStateMachine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("\x00\x05k\x01\x02\x03\x04\x10\x20\x30\x40\x06\x01\x07\x08\x09"))
	f.Add(bytes.Repeat([]byte{0x00, 0x01, 0xf0, 0x11}, 30))       // appends
	f.Add(bytes.Repeat([]byte{0x02, 0xff, 0x07, 0x80}, 20))       // big commands
	f.Add(bytes.Repeat([]byte{0x03, 0x0e, 0x33, 0xfe}, 25))       // long keys
	f.Add(bytes.Repeat([]byte{0x06, 0x02, 0x08, 0x05, 0x09}, 12)) // configs, transfer
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &logGen{in: data, now: time.Unix(1_800_000_000, 0)}
		ents := g.log()
		a, b := openFuzzSM(t), openFuzzSM(t)
		ra := applyAll(t, a, ents, nil)
		rb := applyAll(t, b, ents, g)
		for i := range ra {
			if ra[i] != rb[i] {
				t.Fatalf("entry %d: results differ:\n%s\n%s", ents[i].Index, ra[i], rb[i])
			}
		}
		da, db := dumpState(t, a), dumpState(t, b)
		if da != db {
			t.Fatalf("states differ after %d entries:\n%.2000s\n---\n%.2000s", len(ents), da, db)
		}
	})
}

// openFuzzSM opens a state machine of group 7 on a DB with raftgroup's
// transaction and value limits (16 MiB memtables, 1 MiB value threshold).
func openFuzzSM(t *testing.T) *StateMachine {
	// In memory-backed files where there are (the DB is real, its fsyncs
	// cost nothing): a fuzz run opens two DBs per input.
	dir, err := os.MkdirTemp("/dev/shm", "fuzzsm")
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
	sm := NewStateMachine(7)
	if _, err := sm.Open(db); err != nil {
		t.Fatal(err)
	}
	return sm
}

// applyAll applies ents (copies: Apply sets Result) one per call, or in
// batches cut by g; it returns each entry's result as text.
func applyAll(t *testing.T, sm *StateMachine, ents []raftgroup.Entry, g *logGen) []string {
	t.Helper()
	es := make([]raftgroup.Entry, len(ents))
	copy(es, ents)
	for i := 0; i < len(es); {
		n := 1
		if g != nil {
			n = 1 + g.intn(4)
		}
		n = min(n, len(es)-i)
		if err := raftgroup.ApplyAlone(sm, sm.store.DB(), es[i:i+n]); err != nil {
			t.Fatalf("Apply [%d,%d]: %.500v", es[i].Index, es[i+n-1].Index, err)
		}
		i += n
	}
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = resultText(e.Result)
	}
	return out
}

func resultText(r any) string {
	switch r := r.(type) {
	case []OpResult:
		var b strings.Builder
		for _, o := range r {
			fmt.Fprintf(&b, "[%d %s]", o.Code, prototext.Format(o.Result))
		}
		return b.String()
	case nil:
		return "<nil>"
	}
	return fmt.Sprintf("%T %v", r, r)
}

// dumpState is every stored key and value, and the in-memory view.
func dumpState(t *testing.T, sm *StateMachine) string {
	var b strings.Builder
	stored, err := rgtest.DumpDB(sm.store.DB())
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(stored)
	sm.mu.RLock()
	defer sm.mu.RUnlock()
	shards := make([]int, 0, len(sm.shards))
	for s := range sm.shards {
		shards = append(shards, s)
	}
	sort.Ints(shards)
	for _, s := range shards {
		fmt.Fprintf(&b, "shard %d %+v\n", s, sm.shards[s])
	}
	fmt.Fprintf(&b, "config %v prev %v logtime %d\n", prototext.Format(sm.config), prototext.Format(sm.prev), sm.logTime)
	return b.String()
}

// logGen turns fuzz bytes into a log; past the input it reads zeros (the
// cheap choices: small keys and values, few ops).
type logGen struct {
	in    []byte
	now   time.Time
	index uint64
	conf  uint64
}

func (g *logGen) byte() byte {
	if len(g.in) == 0 {
		return 0
	}
	c := g.in[0]
	g.in = g.in[1:]
	return c
}

func (g *logGen) intn(n int) int { return int(g.byte()) % n }

const fuzzShards = 4

func (g *logGen) log() []raftgroup.Entry {
	var ents []raftgroup.Entry
	// Config 1: group 7 owns shards 0-2; shard 3 is group 8's.
	ents = append(ents, g.entry(&shardkvpb.GroupCommand{NextConfig: g.config([]uint64{7, 7, 7, 8})}))
	for n := 0; len(g.in) > 0 && n < 24; n++ {
		var cmd *shardkvpb.GroupCommand
		switch g.intn(10) {
		case 0, 1, 2, 3, 4, 5:
			cmd = g.writes()
		case 6:
			owners := make([]uint64, fuzzShards)
			for i := range owners {
				owners[i] = []uint64{7, 8, 0, 7}[g.intn(4)]
			}
			cmd = &shardkvpb.GroupCommand{NextConfig: g.config(owners)}
		case 7:
			ref := &shardkvpb.ShardRef{Shard: uint32(g.intn(fuzzShards)), ConfigNum: g.conf - uint64(g.intn(2))}
			switch g.intn(4) {
			case 0:
				cmd = &shardkvpb.GroupCommand{Acked: ref}
			case 1:
				cmd = &shardkvpb.GroupCommand{Gc: ref}
			case 2:
				cmd = &shardkvpb.GroupCommand{TrimChanges: ref}
			default:
				cmd = &shardkvpb.GroupCommand{DeleteChunk: ref}
			}
		case 8:
			cmd = &shardkvpb.GroupCommand{Insert: g.chunk()}
		default:
			switch g.intn(3) {
			case 0:
				cmd = &shardkvpb.GroupCommand{ExpireKeys: true}
			case 1:
				cmd = &shardkvpb.GroupCommand{CollectDead: true}
			default:
				cmd = &shardkvpb.GroupCommand{ExpireSessions: true}
			}
		}
		// Time moves on, now and then by more than the session TTL.
		switch g.intn(8) {
		case 0:
			g.now = g.now.Add(2 * time.Hour)
			if g.intn(2) == 0 {
				g.index += TombstoneTTL // tombstones come of age
			}
		case 1:
			g.now = g.now.Add(-time.Second) // a new leader's clock behind
		default:
			g.now = g.now.Add(time.Duration(g.byte()) * 10 * time.Millisecond)
		}
		ents = append(ents, g.entry(cmd))
		if g.intn(6) == 0 {
			g.index++
			e := raftgroup.Entry{Index: g.index, Term: 1} // no command
			if g.intn(2) == 0 {
				e.Time = g.now.Add(time.Duration(g.byte()) * 10 * time.Millisecond) // a clock entry
			}
			ents = append(ents, e)
		}
	}
	return ents
}

func (g *logGen) entry(cmd *shardkvpb.GroupCommand) raftgroup.Entry {
	b, err := proto.Marshal(cmd)
	if err != nil {
		panic(err)
	}
	g.index++
	return raftgroup.Entry{Index: g.index, Term: 1, Time: g.now, Cmd: b}
}

func (g *logGen) config(owners []uint64) *shardkvpb.Config {
	g.conf++
	c := &shardkvpb.Config{Num: g.conf, Shards: owners,
		Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}}
	// Planned moves between the two groups (the source keeps the shard).
	for sh, o := range owners {
		if o != 0 && g.intn(3) == 0 {
			c.Moves = append(c.Moves, &shardkvpb.PlannedMove{Shard: uint32(sh), FromGid: o, ToGid: 15 - o, SinceConfig: g.conf})
		}
	}
	return c
}

// fuzzSourceIndex is the source index every generated snapshot chunk
// names, so that generated rounds of changes can name the cursor a copy
// starts from (its position after that index).
const fuzzSourceIndex = 5

func (g *logGen) key() []byte {
	switch g.intn(16) {
	case 15:
		// Near the limits: the largest storable key and a little past it.
		return bytes.Repeat([]byte{'K'}, MaxKeyBytesLimit-2+g.intn(16))
	case 14:
		return []byte{}
	}
	return fmt.Appendf(nil, "{%d}k%d", g.intn(3), g.intn(6))
}

func (g *logGen) value() []byte {
	switch g.intn(12) {
	case 11:
		return bytes.Repeat([]byte{'v'}, 300<<10+g.intn(256)) // big
	case 1:
		return fmt.Appendf(nil, "%d", int64(g.byte())-100) // an integer
	case 2:
		return []byte("1.5")
	}
	return bytes.Repeat([]byte{g.byte()}, g.intn(40))
}

func (g *logGen) writes() *shardkvpb.GroupCommand {
	cmd := &shardkvpb.GroupCommand{MaxValueBytes: []uint64{0, 512 << 10, 100, 1 << 20}[g.intn(4)]}
	n := 1 + g.intn(5)
	many := g.intn(16) == 15
	if many {
		n = 2000 * (1 + g.intn(16)) // past what one transaction holds, at times
	}
	// Many distinct keys of the largest size, half with an expiry soon: what
	// expiry, purge and GC entries then delete by the dozen (bounded by
	// badger's transaction size, not only by count).
	long := !many && g.intn(16) == 14
	if long {
		n = 8 + g.intn(24)
	}
	for i := range n {
		op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_Kind(g.intn(int(shardkvpb.WriteOp_ZRANGESTORE) + 1)), Key: g.key(), Cond: shardkvpb.WriteOp_Cond(g.intn(6)),
			ReturnPrev: g.intn(3) == 0, KeepTtl: g.intn(5) == 0, Delta: int64(g.byte()) - 128, ExpectAbsent: g.intn(2) == 0}
		if many {
			op.Kind, op.Key = shardkvpb.WriteOp_Kind(i%3), fmt.Appendf(nil, "{0}m%d", i)
		}
		if long {
			op.Kind = []shardkvpb.WriteOp_Kind{shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_DELETE}[g.intn(2)]
			op.Key = fmt.Appendf(bytes.Repeat([]byte{'L'}, MaxKeyBytesLimit-6), "%06d", g.intn(4)*1000+i)
		}
		switch op.Kind {
		case shardkvpb.WriteOp_RENAME, shardkvpb.WriteOp_COPY:
			op.Dest = g.key() // at times in another shard: CROSS_SHARD
		case shardkvpb.WriteOp_MSET_NX:
			for range g.intn(4) {
				op.MoreKeys = append(op.MoreKeys, g.key()) // at times in another shard
				op.MoreValues = append(op.MoreValues, g.value())
			}
		case shardkvpb.WriteOp_SET_BIT:
			op.Value = []byte{byte(g.intn(3))} // 2: refused
			if g.intn(4) == 0 {
				op.Delta = int64(cmd.MaxValueBytes)*8 - int64(g.intn(64)) // at the limit
			}
		case shardkvpb.WriteOp_SET_RANGE:
			op.Value = g.value()
			if g.intn(4) == 0 {
				op.Delta = int64(cmd.MaxValueBytes) - int64(g.intn(64)) // at the limit
			}
		case shardkvpb.WriteOp_SSTORE:
			op.Dest, op.Delta = g.key(), int64(g.intn(4)) // 3: refused
			for range g.intn(3) {
				op.MoreKeys = append(op.MoreKeys, g.key())
			}
		case shardkvpb.WriteOp_ZADD, shardkvpb.WriteOp_ZREM:
			op.Delta = int64(g.intn(64)) // some flag sets are refused
			for range g.intn(4) {
				op.Fields = append(op.Fields, fmt.Appendf(nil, "m%d", g.intn(5)))
				sc := []float64{0, 1.5, -2, math.Inf(1), math.Inf(-1), math.NaN()}[g.intn(6)]
				if op.Kind == shardkvpb.WriteOp_ZADD {
					op.FieldValues = append(op.FieldValues, ScoreValue(sc))
				}
			}
		case shardkvpb.WriteOp_ZSTORE:
			op.Dest, op.Delta, op.Aggregate = g.key(), int64(g.intn(4)), int32(g.intn(4)) // 3: refused
			for range g.intn(3) {
				op.MoreKeys = append(op.MoreKeys, g.key())
			}
			if g.intn(2) == 0 {
				for range 1 + len(op.MoreKeys) + g.intn(2) - 1 {
					op.Weights = append(op.Weights, []float64{1, 0, -2.5, math.Inf(1), math.NaN()}[g.intn(5)])
				}
			}
		case shardkvpb.WriteOp_ZREMRANGE, shardkvpb.WriteOp_ZRANGESTORE:
			op.Dest, op.Rev, op.Offset, op.Count = g.key(), g.intn(2) == 0, int64(g.intn(4))-1, int64(g.intn(5))-1
			op.Delta = int64(g.intn(4)) // 3: refused
			for range 2 {
				b := Bound{Kind: g.intn(4), Rank: int64(g.intn(9)) - 4, Score: float64(g.intn(5)) - 2, Lex: fmt.Appendf(nil, "m%d", g.intn(5))}
				op.Fields = append(op.Fields, b.Encode(int(op.Delta)))
			}
		case shardkvpb.WriteOp_SPOP, shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP, shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX:
			op.Delta = int64(g.intn(6)) // 0: refused
		case shardkvpb.WriteOp_LPUSH, shardkvpb.WriteOp_RPUSH:
			for range g.intn(5) {
				op.Fields = append(op.Fields, g.value())
			}
		case shardkvpb.WriteOp_LSET, shardkvpb.WriteOp_LTRIM, shardkvpb.WriteOp_LREM, shardkvpb.WriteOp_LINSERT, shardkvpb.WriteOp_LMOVE:
			op.Delta, op.Stop = int64(g.intn(9))-4, int64(g.intn(9))-4
			if op.Kind == shardkvpb.WriteOp_LINSERT || op.Kind == shardkvpb.WriteOp_LMOVE {
				op.Delta = int64(g.intn(3)) // 2: refused before proposing
			}
			op.Value, op.Expect, op.Dest = g.value(), g.value(), g.key()
		case shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT,
			shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM, shardkvpb.WriteOp_SMOVE:
			op.Dest = g.key()
			// At times no field, or a field value missing: INVALID_OP.
			for range g.intn(5) {
				f := fmt.Appendf(nil, "f%d", g.intn(4))
				if g.intn(16) == 0 {
					f = bytes.Repeat([]byte{'F'}, max(0, MaxKeyBytesLimit-elemOverhead-len(op.Key)+g.intn(3)-1)) // at the limit
				}
				op.Fields = append(op.Fields, f)
				if g.intn(8) != 0 {
					op.FieldValues = append(op.FieldValues, g.value())
				}
			}
			op.Value = g.value()
		}
		switch op.Kind {
		case shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_APPEND, shardkvpb.WriteOp_CAS, shardkvpb.WriteOp_INCR_FLOAT, shardkvpb.WriteOp_MSET_NX:
			op.Value = g.value()
			if op.Kind == shardkvpb.WriteOp_CAS {
				op.Expect = g.value()
			}
		}
		if op.Kind == shardkvpb.WriteOp_PUT || op.Kind == shardkvpb.WriteOp_EXPIRE {
			switch g.intn(4) {
			case 0, 1:
				op.ExpireAtMs = g.now.UnixMilli() + int64(g.intn(200))*50 - 2000
			case 2:
				ttl := int64(g.intn(200))*50 - 2000 // relative: resolved at apply
				op.TtlMs = &ttl
			}
		}
		if c := g.intn(4); c > 0 {
			op.Session = &shardkvpb.Session{ClientId: uint64(c), Seq: uint64(g.byte()) + 1, Ack: uint64(g.intn(64))}
		}
		cmd.Writes = append(cmd.Writes, op)
	}
	return cmd
}

// chunk is a shard chunk from the previous owner: well-formed records (the
// source streams them from its own store) for the state's resume point,
// or a stale one.
func (g *logGen) chunk() *shardkvpb.InsertChunk {
	s := g.intn(fuzzShards)
	c := &shardkvpb.InsertChunk{Shard: uint32(s), ConfigNum: g.conf, Last: g.intn(2) == 0, TotalKeys: uint64(g.intn(5))}
	for i := range g.intn(4) {
		rec := record{Tombstone: g.intn(4) == 0, Index: uint64(g.byte()), Value: g.value()}
		if g.intn(2) == 0 {
			rec.ExpireAtMs = g.now.UnixMilli() + int64(g.intn(100))*100 - 1000
		}
		c.Kvs = append(c.Kvs, &shardkvpb.KeyValue{Key: dataKey(s, fmt.Appendf(nil, "c%d", i)), Record: rec.encode()})
	}
	if g.intn(3) == 0 {
		var sess session
		sess.LastNS = g.now.UnixNano()
		sess.add(doneOp{Seq: 1, OK: true})
		c.Kvs = append(c.Kvs, &shardkvpb.KeyValue{Key: sessionKey(s, 9), Record: sess.encode()})
	}
	if g.intn(4) == 0 {
		c.AfterKey = binary.BigEndian.AppendUint16(nil, uint16(s)) // stale
	}
	if g.intn(2) == 0 {
		c.LogTimeNs = g.now.Add(time.Duration(g.intn(64)-32) * time.Second).UnixNano() // the source's clock
	}
	c.Precopy = g.intn(2) == 0
	c.SourceIndex = fuzzSourceIndex
	if g.intn(3) == 0 {
		// A round of changes: from the cursor a copy starts at (or a stale
		// one), records to replace and keys removed (empty records).
		c.Delta, c.AfterKey = true, nil
		c.Cursor = changePos(s, fuzzSourceIndex+1+uint64(g.intn(2)))
		c.NextCursor = changePos(s, fuzzSourceIndex+1+uint64(g.intn(3)))
		c.CaughtUp, c.FrozeAtNs = g.intn(2) == 0, g.now.Add(-time.Duration(g.intn(100))*time.Millisecond).UnixNano()
		for _, kv := range c.Kvs {
			if g.intn(3) == 0 {
				kv.Record = nil
			}
		}
	}
	return c
}
