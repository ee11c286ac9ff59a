package shardkv

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// tombWrites puts and then deletes keys prefix%05d for i in [from, to), in
// commands of at most 1000 ops: each key ends as a tombstone written at the
// index of its delete command.
func tombWrites(h *smHarness, prefix string, from, to int) {
	h.t.Helper()
	for _, kind := range []shardkvpb.WriteOp_Kind{shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_DELETE} {
		for lo := from; lo < to; lo += 1000 {
			cmd := &shardkvpb.GroupCommand{}
			for i := lo; i < min(lo+1000, to); i++ {
				cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: kind, Key: fmt.Appendf(nil, "%s%05d", prefix, i), Value: []byte("v")})
			}
			for i, r := range h.apply(cmd).([]OpResult) {
				if r.Code != OK || !r.Result.GetOk() {
					h.t.Fatalf("%v of %s%05d: %v", kind, prefix, lo+i, r)
				}
			}
		}
	}
}

// countTombstones counts the tombstone index entries of shard s whose user
// key starts with prefix, and checks that each has its tombstone record.
func countTombstones(t *testing.T, sm *StateMachine, s int, prefix string) int {
	t.Helper()
	n := 0
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: tombstoneKey(s, []byte(prefix))})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
			rec, err := tombRecord(txn, dataKey(s, it.Item().Key()[3:]))
			if err != nil || rec == nil || !rec.Tombstone {
				return fmt.Errorf("index entry %q without its tombstone: %v %v", it.Item().Key(), rec, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func tombRecord(txn *badger.Txn, k []byte) (*record, error) {
	v, err := raftgroup.GetValue(txn, k)
	if err != nil || v == nil {
		return nil, err
	}
	r, err := decodeRecord(v)
	return &r, err
}

func storedRecord(t *testing.T, sm *StateMachine, k []byte) *record {
	t.Helper()
	var rec *record
	if err := sm.store.DB().View(func(txn *badger.Txn) (err error) {
		rec, err = tombRecord(txn, k)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestTombstonePurgeNotBlockedByYoungOnes: young tombstones that sort first
// (more of them than one expiry entry looks at) must not keep the old ones
// behind them from being purged; each expiry entry purges at most
// DeleteChunkKeys, and repeated entries finish the job.
func TestTombstonePurgeNotBlockedByYoungOnes(t *testing.T) {
	h := newSMHarness(t)
	const young, old = 4500, 1200 // both above DeleteChunkKeys
	s := shardOf(h, "{t}a")
	tombWrites(h, "{t}z", 0, old) // old: sort after the young ones
	// TombstoneTTL entries later, young tombstones sorting before them.
	h.index += TombstoneTTL
	tombWrites(h, "{t}a", 0, young)
	if n := countTombstones(t, h.sm, s, "{t}z"); n != old {
		t.Fatalf("%d old tombstones before the purge, want %d", n, old)
	}
	left := old
	const rounds = 10
	for i := 0; i < rounds && left > 0; i++ {
		h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
		n := countTombstones(t, h.sm, s, "{t}z")
		if left-n > DeleteChunkKeys {
			t.Fatalf("one expiry entry purged %d tombstones, more than DeleteChunkKeys (%d)", left-n, DeleteChunkKeys)
		}
		left = n
	}
	if left > 0 {
		t.Fatalf("after %d expiry entries %d of %d old tombstones remain behind %d young ones in key order", rounds, left, old, young)
	}
	if n := countTombstones(t, h.sm, s, "{t}a"); n != young {
		t.Fatalf("%d young tombstones remain, want %d: purged before TombstoneTTL", n, young)
	}
	if hasKey(t, h.sm, dataKey(s, []byte("{t}z"))) {
		t.Fatal("a purged tombstone left its data record")
	}
}

// pullingHarness is group 7 pulling shard 3 from group 8 in config 2.
func pullingHarness(t *testing.T) *smHarness {
	h := &smHarness{t: t, sm: openFuzzSM(t), now: time.Unix(1_800_000_000, 0)}
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 8}, Groups: groups}})
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: []uint64{7, 7, 7, 7}, Groups: groups}})
	if m := h.sm.Shard(3); m.State != Pulling || m.Peer != 8 {
		t.Fatalf("shard 3: %v, want Pulling from 8", m)
	}
	return h
}

// TestTombstoneImportedAgedByLocalIndex: a shard pulled from another group
// carries that group's Raft indexes, which mean nothing in this group's
// log. A tombstone must be aged from the entry that installed it here: one
// whose source index is far above the local index was never purged, one
// whose source index is far below was purged as soon as it arrived.
func TestTombstoneImportedAgedByLocalIndex(t *testing.T) {
	h := pullingHarness(t)
	h.index += 3 * TombstoneTTL // the local log is long; the source's differs
	hi, lo, val := dataKey(3, []byte("hi")), dataKey(3, []byte("lo")), dataKey(3, []byte("val"))
	res := h.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, Last: true, TotalKeys: 3, Kvs: []*shardkvpb.KeyValue{
		{Key: hi, Record: record{Tombstone: true, Index: 1 << 40}.encode()}, // the source's log is far ahead
		{Key: lo, Record: record{Tombstone: true, Index: 1}.encode()},       // far behind
		{Key: val, Record: record{Index: 1 << 40, Value: []byte("v")}.encode()},
	}}})
	if res != nil {
		t.Fatalf("insert: %v", res)
	}
	installed := h.index
	for _, k := range [][]byte{hi, lo, val} {
		if r := storedRecord(t, h.sm, k); r == nil || r.Index != installed {
			t.Errorf("imported %q stored with index %v, want the local index of its insert, %d", k[4:], r, installed)
		}
	}

	// Well within TombstoneTTL of their arrival: both stay.
	h.index += 10
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	for _, k := range [][]byte{hi, lo} {
		if !hasKey(t, h.sm, k) {
			t.Errorf("imported tombstone %q purged 11 entries after it arrived (aged by the source's index)", k[4:])
		}
	}
	// TombstoneTTL after their arrival: both go.
	h.index += TombstoneTTL
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	for _, k := range [][]byte{hi, lo} {
		if hasKey(t, h.sm, k) || hasKey(t, h.sm, tombstoneKey(3, k[4:])) {
			t.Errorf("imported tombstone %q not purged %d entries after it arrived (aged by the source's index)", k[4:], h.index-installed)
		}
	}
}

// TestTombstoneLegacyImportPurged: a tombstone imported before imports were
// re-stamped holds its source's index, which may be above the local one (no
// local write can be): it is re-stamped at the next expiry entry and purged
// TombstoneTTL entries later, instead of never.
func TestTombstoneLegacyImportPurged(t *testing.T) {
	h := newSMHarness(t)
	s := shardOf(h, "legacy")
	dk, tk := dataKey(s, []byte("legacy")), tombstoneKey(s, []byte("legacy"))
	if err := h.sm.store.DB().Update(func(txn *badger.Txn) error {
		if err := txn.Set(dk, record{Tombstone: true, Index: 1 << 40}.encode()); err != nil {
			return err
		}
		return txn.Set(tk, nil)
	}); err != nil {
		t.Fatal(err)
	}
	h.index += TombstoneTTL
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	stamped := h.index
	if r := storedRecord(t, h.sm, dk); r == nil || r.Index != stamped {
		t.Fatalf("legacy tombstone after an expiry entry: %+v, want re-stamped at %d", r, stamped)
	}
	h.index += TombstoneTTL
	h.apply(&shardkvpb.GroupCommand{ExpireSessions: true})
	if hasKey(t, h.sm, dk) || hasKey(t, h.sm, tk) {
		t.Fatal("legacy tombstone not purged TombstoneTTL entries after it was re-stamped")
	}
}

// TestTombstonePurgeSameStateBatched: the purge (its cursor, its bounds) is
// part of the replicated state: one entry per Apply and random batches
// must end in the same stored state, byte for byte.
func TestTombstonePurgeSameStateBatched(t *testing.T) {
	var ents []raftgroup.Entry
	index := uint64(0)
	now := time.Unix(1_800_000_000, 0)
	add := func(cmd *shardkvpb.GroupCommand) {
		b, err := proto.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		index++
		now = now.Add(time.Second)
		ents = append(ents, raftgroup.Entry{Index: index, Term: 1, Time: now, Cmd: b})
	}
	add(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7}}})
	writes := func(kind shardkvpb.WriteOp_Kind, prefix string, n int) {
		for lo := 0; lo < n; lo += 1000 {
			cmd := &shardkvpb.GroupCommand{}
			for i := lo; i < min(lo+1000, n); i++ {
				cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: kind, Key: fmt.Appendf(nil, "%s%d", prefix, i), Value: []byte("v")})
			}
			add(cmd)
		}
	}
	for round := range 3 {
		p := fmt.Sprintf("r%d-", round)
		writes(shardkvpb.WriteOp_PUT, p, 2500)
		writes(shardkvpb.WriteOp_DELETE, p, 2500)
		writes(shardkvpb.WriteOp_PUT, p, 300) // some come back to life
		index += TombstoneTTL / 2
		for range 4 {
			add(&shardkvpb.GroupCommand{ExpireSessions: true})
		}
	}
	a, b := openFuzzSM(t), openFuzzSM(t)
	applyAll(t, a, ents, nil)
	applyAll(t, b, ents, &logGen{in: bytes.Repeat([]byte{3, 0, 2, 1, 3, 3, 1}, 20)})
	if da, db := dumpState(t, a), dumpState(t, b); da != db {
		t.Fatalf("states differ:\n%.2000s\n---\n%.2000s", da, db)
	}
	n := 0
	for s := range 4 {
		n += countTombstones(t, a, s, "")
	}
	if n == 0 || n >= 3*2200 {
		t.Fatalf("%d tombstones left: want the oldest purged and the youngest kept", n)
	}
}

// TestTombstonePurgeLongKeys: purging tombstones of the longest keys must
// keep one expiry entry within badger's transaction limit (2.4 MiB):
// DeleteChunkKeys purges of 60 KB keys are 120 MB of deletes.
func TestTombstonePurgeLongKeys(t *testing.T) {
	h := newSMHarness(t)
	const n = 40 // 40 × 2 × 60 KB: twice the transaction limit
	key := func(i int) []byte { return fmt.Appendf(bytes.Repeat([]byte{'L'}, 60_000), "{l}%03d", i) }
	for _, kind := range []shardkvpb.WriteOp_Kind{shardkvpb.WriteOp_PUT, shardkvpb.WriteOp_DELETE} {
		for lo := 0; lo < n; lo += 5 {
			cmd := &shardkvpb.GroupCommand{}
			for i := lo; i < lo+5; i++ {
				cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: kind, Key: key(i), Value: []byte("v")})
			}
			for _, r := range h.apply(cmd).([]OpResult) {
				if r.Code != OK || !r.Result.GetOk() {
					t.Fatalf("%v: %v", kind, r)
				}
			}
		}
	}
	s := shardOf(h, string(key(0)))
	h.index += TombstoneTTL
	for i := 0; i < n && countTombstones(t, h.sm, s, "L") > 0; i++ {
		h.apply(&shardkvpb.GroupCommand{ExpireSessions: true}) // fails the test if Apply fails
	}
	if left := countTombstones(t, h.sm, s, "L"); left > 0 {
		t.Fatalf("%d long tombstones left", left)
	}
}
