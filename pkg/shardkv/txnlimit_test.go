package shardkv

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Entries that write many records in one badger transaction (expiry, GC,
// shard install, config steps) must stay within its limit (2.4 MiB with
// raftgroup's 16 MiB memtables) whatever the keys and values: past it
// Apply fails and the replica stops. Keys here are the longest a client
// may write (MaxKeyBytesLimit, 64,989 bytes): each of their records and
// index entries costs about 65 KB.

// longKey is a user key of MaxKeyBytesLimit bytes with hash tag tag; keys
// of one tag sort by i.
func longKey(tag string, i int) []byte {
	suffix := fmt.Sprintf("{%s}%04d", tag, i)
	return append(bytes.Repeat([]byte{'L'}, MaxKeyBytesLimit-len(suffix)), suffix...)
}

// longWrites applies op kind to keys, 4 per command (within what one
// command may write), with expiry at (0: none), in a session of client,
// and checks every op took.
func longWrites(h *smHarness, client uint64, kind shardkvpb.WriteOp_Kind, keys [][]byte, at int64) {
	h.t.Helper()
	for lo := 0; lo < len(keys); lo += 4 {
		cmd := &shardkvpb.GroupCommand{}
		for _, k := range keys[lo:min(lo+4, len(keys))] {
			cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: kind, Key: k, Value: []byte("v"), ExpireAtMs: at,
				Session: &shardkvpb.Session{ClientId: client, Seq: uint64(lo + 1 + len(cmd.Writes))}})
		}
		for _, r := range h.apply(cmd).([]OpResult) {
			if r.Code != OK || !r.Result.GetOk() {
				h.t.Fatalf("%v of a long key: %v", kind, r)
			}
		}
	}
}

// shardRecords counts the stored records of shard s: data and sessions,
// and the tombstone, key expiry and session expiry index entries.
func shardRecords(t *testing.T, sm *StateMachine, s int) int {
	t.Helper()
	n := 0
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			switch {
			case len(k) >= 3 && (k[0] == 'd' || k[0] == 't') && int(k[1])<<8|int(k[2]) == s,
				len(k) >= 11 && (k[0] == 'x' || k[0] == 'e') && int(k[9])<<8|int(k[10]) == s:
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExpireKeysLongKeys: expiring a key writes its tombstone, its
// tombstone index entry and deletes its expiry index entry, about 4 × 65 KB
// for a long key: 12 of them in one expiry entry (ExpireKeysBatch allows
// 1,000) passed the transaction limit. Each entry must stay within it and
// delete something, and the leader must still see keys due while some are.
func TestExpireKeysLongKeys(t *testing.T) {
	h := newSMHarness(t)
	const n = 12
	var keys [][]byte
	for i := range n {
		keys = append(keys, longKey("x", i))
	}
	longWrites(h, 5, shardkvpb.WriteOp_PUT, keys, h.now.UnixMilli()+1000)
	s := shardOf(h, string(keys[0]))
	h.now = h.now.Add(2 * time.Second)
	entries := 0
	for h.sm.expiryDue(h.now.UnixMilli()) {
		if entries++; entries > n {
			t.Fatalf("%d expiry entries and keys still due", entries)
		}
		if got, _ := h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}).(int); got == 0 {
			t.Fatalf("expiry entry %d deleted nothing while keys are due", entries)
		}
	}
	if entries < 2 {
		t.Fatalf("one expiry entry deleted all %d long keys: nothing bounds it in bytes", n)
	}
	for _, k := range keys {
		if rec := storedRecord(t, h.sm, dataKey(s, k)); rec == nil || !rec.Tombstone {
			t.Fatalf("expired key %q...: %+v, want a tombstone", k[len(k)-8:], rec)
		}
		if !hasKey(t, h.sm, tombstoneKey(s, k)) {
			t.Fatalf("expired key %q... has no tombstone index entry", k[len(k)-8:])
		}
	}
	if hasKey(t, h.sm, []byte{'x'}) {
		t.Fatal("expiry index entries left after every key expired")
	}
	t.Logf("%d long keys expired in %d entries", n, entries)
}

// TestDeleteChunkLongKeys: a GC entry deletes a record and its index entry
// (expiry or tombstone), about 2 × 65 KB for a long key: 24 of them in one
// entry (DeleteChunkKeys allows 1,000) passed the transaction limit.
func TestDeleteChunkLongKeys(t *testing.T) {
	h := newSMHarness(t)
	const n = 24
	var keys [][]byte
	for i := range n {
		keys = append(keys, longKey("g", i))
	}
	longWrites(h, 5, shardkvpb.WriteOp_PUT, keys[:n/2], h.now.UnixMilli()+3600_000) // live, with expiry
	longWrites(h, 6, shardkvpb.WriteOp_PUT, keys[n/2:], 0)
	for lo := n / 2; lo < n; lo += 4 { // tombstones
		cmd := &shardkvpb.GroupCommand{}
		for _, k := range keys[lo:min(lo+4, n)] {
			cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: k})
		}
		h.apply(cmd)
	}
	s := shardOf(h, string(keys[0]))
	owners := []uint64{7, 7, 7, 7}
	owners[s] = 8
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: owners, Groups: []*shardkvpb.Group{
		{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}}})
	ref := &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}
	h.apply(&shardkvpb.GroupCommand{Gc: ref})
	if m := h.sm.Shard(s); m.State != GCing {
		t.Fatalf("shard %d: %v, want GCing", s, m)
	}
	left := shardRecords(t, h.sm, s)
	if left < 2*n {
		t.Fatalf("shard %d holds %d records before GC, want at least %d", s, left, 2*n)
	}
	entries := 0
	for h.sm.Shard(s).State == GCing {
		if entries++; entries > 2*n {
			t.Fatalf("%d GC entries and the shard is still GCing", entries)
		}
		h.apply(&shardkvpb.GroupCommand{DeleteChunk: ref})
		now := shardRecords(t, h.sm, s)
		if now >= left && h.sm.Shard(s).State == GCing {
			t.Fatalf("GC entry %d deleted nothing (%d records left)", entries, now)
		}
		left = now
	}
	if left != 0 {
		t.Fatalf("GC done with %d records of shard %d left", left, s)
	}
	if entries < 2 {
		t.Fatalf("one GC entry deleted all %d long keys: nothing bounds it in bytes", n)
	}
	t.Logf("%d long keys deleted in %d GC entries", n, entries)
}

// TestInsertChunkLongKeys: an install entry writes each record and its
// index entry. The puller cuts what it receives into pieces of ChunkLimit
// encoded bytes (installPieces), but apply trusted the entry: one of long
// keys with expiry, long tombstones and values just below badger's value
// threshold (which count in full) passed the transaction limit. Apply
// installs what fits, resumes from there and says so, so that the puller
// restarts the pull from the log's resume point and nothing is skipped.
func TestInsertChunkLongKeys(t *testing.T) {
	h := pullingHarness(t) // shard 3, Pulling from group 8 in config 2
	far := h.now.UnixMilli() + 3600_000
	var kvs []*shardkvpb.KeyValue
	for i := range 20 {
		kvs = append(kvs, &shardkvpb.KeyValue{Key: dataKey(3, longKey("i", i)), Record: record{Index: 9, ExpireAtMs: far, Value: []byte("v")}.encode()})
	}
	for i := 20; i < 28; i++ {
		kvs = append(kvs, &shardkvpb.KeyValue{Key: dataKey(3, longKey("i", i)), Record: record{Index: 9, Tombstone: true}.encode()})
	}
	for i := 28; i < 31; i++ {
		kvs = append(kvs, &shardkvpb.KeyValue{Key: dataKey(3, longKey("i", i)), Record: record{Index: 9, Value: bytes.Repeat([]byte{'V'}, valueInline-recordHeader-1)}.encode()})
	}
	var sess session
	sess.LastNS = h.now.UnixNano()
	sess.add(doneOp{Seq: 1, OK: true})
	kvs = append(kvs, &shardkvpb.KeyValue{Key: sessionKey(3, 9), Record: sess.encode()}) // sessions sort after data
	const total = 31

	entries, cuts := 0, 0
	for copyingSnapshot(h.sm.Shard(3)) {
		if entries++; entries > len(kvs) {
			t.Fatalf("%d install entries and shard 3 still Pulling: %v", entries, h.sm.Shard(3))
		}
		m := h.sm.Shard(3)
		rest := kvs
		if m.Resumed {
			i := 0
			for i < len(kvs) && bytes.Compare(kvs[i].Key, m.Resume) <= 0 {
				i++
			}
			rest = kvs[i:]
		}
		res := h.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, AfterKey: m.Resume, Resume: m.Resumed,
			Kvs: rest, Last: true, TotalKeys: total}})
		switch err, _ := res.(error); {
		case res == nil:
		case errors.Is(err, errChunkCut):
			cuts++
			if at := h.sm.Shard(3); at.State != Pulling || !at.Resumed || bytes.Compare(at.Resume, m.Resume) <= 0 {
				t.Fatalf("a cut install entry left %v, no further than before", at)
			}
			if cuts == 1 {
				// The puller's next piece would follow the whole entry: it
				// must be refused, or the records cut off would be skipped.
				next := h.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, AfterKey: rest[len(rest)-1].Key, Resume: true, Last: true, TotalKeys: total}})
				if next != errStaleChunk {
					t.Fatalf("the piece after a cut entry: %v, want %v", next, errStaleChunk)
				}
			}
		default:
			t.Fatalf("install entry %d: %v", entries, res)
		}
	}
	if cuts == 0 {
		t.Fatal("one install entry took every record: nothing bounds it")
	}
	h.finishCopy(3, 2)
	installed := h.sm.Shard(3)
	if installed.State != Acking || installed.Keys != total || installed.Total != total {
		t.Fatalf("after the install: %+v, want Acking with %d keys", installed, total)
	}
	for _, kv := range kvs {
		v := storedValue(t, h.sm, kv.Key)
		if kv.Key[3] == tagSession {
			if !bytes.Equal(v, kv.Record) || !hasKey(t, h.sm, expiryKey(sess.LastNS, 3, 9)) {
				t.Fatalf("session not installed with its expiry index entry")
			}
			continue
		}
		want, _ := decodeRecord(kv.Record)
		got, err := decodeRecord(v)
		if err != nil || got.Tombstone != want.Tombstone || got.ExpireAtMs != want.ExpireAtMs || !bytes.Equal(got.Value, want.Value) {
			t.Fatalf("record %q... installed as %+v (%v), want %+v", kv.Key[len(kv.Key)-8:], got.Tombstone, err, want.Tombstone)
		}
		user := kv.Key[4:]
		switch {
		case want.Tombstone && !hasKey(t, h.sm, tombstoneKey(3, user)):
			t.Fatalf("tombstone %q... installed without its index entry", user[len(user)-8:])
		case want.ExpireAtMs != 0 && !hasKey(t, h.sm, expiresKey(want.ExpireAtMs, 3, user)):
			t.Fatalf("key %q... installed without its expiry index entry", user[len(user)-8:])
		}
	}
	t.Logf("%d records installed in %d entries (%d cut)", len(kvs), entries, cuts)
}

func storedValue(t *testing.T, sm *StateMachine, k []byte) []byte {
	t.Helper()
	var v []byte
	if err := sm.store.DB().View(func(txn *badger.Txn) (err error) {
		v, err = raftgroup.GetValue(txn, k)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// entryLog builds a log of commands, applying each to sm alone as it is
// added (so that later commands may depend on the state).
type entryLog struct {
	t     *testing.T
	sm    *StateMachine
	ents  []raftgroup.Entry
	res   []string
	index uint64
	now   time.Time
}

func (l *entryLog) add(cmd *shardkvpb.GroupCommand) any {
	l.t.Helper()
	b, err := proto.Marshal(cmd)
	if err != nil {
		l.t.Fatal(err)
	}
	l.index++
	e := raftgroup.Entry{Index: l.index, Term: 1, Time: l.now, Cmd: b}
	l.ents = append(l.ents, e)
	es := []raftgroup.Entry{e}
	if l.sm != nil {
		if err := raftgroup.ApplyAlone(l.sm, l.sm.store.DB(), es); err != nil {
			l.t.Fatalf("Apply %d: %.500v", e.Index, err)
		}
	}
	l.res = append(l.res, resultText(es[0].Result))
	return es[0].Result
}

// TestNextConfigLargeConfigsInBatch: a config step stores the new config
// and the previous one, each up to the controller's 1 MiB; below badger's
// value threshold both count in full. After a large write in the same
// Apply batch (a transaction holds up to 1 MiB before an entry starts),
// two 900 KB configs passed the transaction limit.
func TestNextConfigLargeConfigsInBatch(t *testing.T) {
	sm := openFuzzSM(t)
	l := &entryLog{t: t, now: time.Unix(1_800_000_000, 0)}
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: strings.Repeat("a", 900_000)}}}}
	l.add(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 7}, Groups: groups}})
	l.add(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, 1_000_000)}}})
	l.add(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: []uint64{7, 7, 7, 7}, Groups: groups}})
	if err := raftgroup.ApplyAlone(sm, sm.store.DB(), l.ents[:1]); err != nil {
		t.Fatal(err)
	}
	if err := raftgroup.ApplyAlone(sm, sm.store.DB(), l.ents[1:]); err != nil {
		t.Fatalf("a config step after a large write in one Apply: %.300v", err)
	}
	if r := l.ents[2].Result; r != nil || sm.Config().Num != 2 {
		t.Fatalf("config step: %v, at config %d", r, sm.Config().Num)
	}
	if v, found, _, err := sm.Get([]byte("k"), l.now.UnixMilli()); err != nil || !found || len(v) != 1_000_000 {
		t.Fatalf("the write before it: %d bytes, found %v, %v", len(v), found, err)
	}
}

// TestBulkEntriesSameStateBatched: the bounds of expiry, GC and install
// entries, and where Apply ends a transaction to make room for one, are
// replicated state: a log of them on long keys must end in the same state
// applied one entry per Apply, in random batches and in one Apply.
func TestBulkEntriesSameStateBatched(t *testing.T) {
	a := openFuzzSM(t)
	l := &entryLog{t: t, sm: a, now: time.Unix(1_800_000_000, 0)}
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	l.add(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 7, 8}, Groups: groups}})
	// Long keys in a shard s of group 7 that it gives away; big writes in
	// another one that it keeps.
	tag := func(not ...int) string {
		for i := 0; ; i++ {
			if tg := fmt.Sprint(i); !slices.Contains(not, shardOfKey(a, []byte("{"+tg+"}"))) {
				return tg
			}
		}
	}
	ktag := tag(3)
	s := shardOfKey(a, []byte("{"+ktag+"}"))
	bigKey := []byte("{" + tag(3, s) + "}big")
	var keys [][]byte
	for i := range 24 {
		keys = append(keys, longKey(ktag, i))
	}
	put := func(ks [][]byte, at int64, kind shardkvpb.WriteOp_Kind) {
		for lo := 0; lo < len(ks); lo += 4 {
			cmd := &shardkvpb.GroupCommand{}
			for _, k := range ks[lo:min(lo+4, len(ks))] {
				cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: kind, Key: k, Value: []byte("v"), ExpireAtMs: at})
			}
			l.add(cmd)
		}
	}
	big := func(n int) { // a large write before bulk entries: less room in the transaction
		l.add(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: bigKey, Value: bytes.Repeat([]byte{'v'}, n)}}})
	}
	put(keys[:12], l.now.UnixMilli()+1000, shardkvpb.WriteOp_PUT)
	put(keys[12:], l.now.UnixMilli()+3600_000, shardkvpb.WriteOp_PUT)
	put(keys[18:], 0, shardkvpb.WriteOp_DELETE)
	l.now = l.now.Add(2 * time.Second)
	for a.expiryDue(l.now.UnixMilli()) {
		big(900_000)
		l.add(&shardkvpb.GroupCommand{ExpireKeys: true})
	}
	// Shard s goes to group 8; shard 3 comes from it.
	owners := []uint64{7, 7, 7, 7}
	owners[s] = 8
	l.add(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: owners, Groups: groups}})
	ref := &shardkvpb.ShardRef{Shard: uint32(s), ConfigNum: 2}
	l.add(&shardkvpb.GroupCommand{Gc: ref})
	var kvs []*shardkvpb.KeyValue
	for i := range 20 {
		kvs = append(kvs, &shardkvpb.KeyValue{Key: dataKey(3, longKey("c", i)), Record: record{Index: 3, ExpireAtMs: l.now.UnixMilli() + int64(i%2)*3600_000, Value: []byte("v")}.encode()})
	}
	for a.Shard(s).State == GCing || copyingSnapshot(a.Shard(3)) {
		if m := a.Shard(3); copyingSnapshot(m) {
			rest := kvs
			for m.Resumed && len(rest) > 0 && bytes.Compare(rest[0].Key, m.Resume) <= 0 {
				rest = rest[1:]
			}
			big(600_000)
			l.add(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, AfterKey: m.Resume, Resume: m.Resumed, Kvs: rest, Last: true, TotalKeys: 20}})
		}
		big(900_000)
		l.add(&shardkvpb.GroupCommand{DeleteChunk: ref})
		if len(l.ents) > 500 {
			t.Fatal("GC and install do not finish")
		}
	}
	// The last round of changes (none) ends the copy.
	cur := a.Shard(3).Cursor
	l.add(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: 3, ConfigNum: 2, Delta: true, Cursor: cur, NextCursor: cur, CaughtUp: true, Last: true}})
	if m := a.Shard(3); m.State != Acking {
		t.Fatalf("shard 3 after its last round: %v", m)
	}
	l.now = l.now.Add(time.Hour)
	for a.expiryDue(l.now.UnixMilli()) {
		big(900_000)
		l.add(&shardkvpb.GroupCommand{ExpireKeys: true})
	}

	b, c := openFuzzSM(t), openFuzzSM(t)
	rb := applyAll(t, b, l.ents, &logGen{in: bytes.Repeat([]byte{3, 0, 2, 1, 3, 3, 1}, 40)})
	es := append([]raftgroup.Entry(nil), l.ents...)
	if err := raftgroup.ApplyAlone(c, c.store.DB(), es); err != nil {
		t.Fatalf("the whole log in one Apply: %.500v", err)
	}
	for i := range l.ents {
		if rb[i] != l.res[i] || resultText(es[i].Result) != l.res[i] {
			t.Fatalf("entry %d: results differ: %s / %s / %s", l.ents[i].Index, l.res[i], rb[i], resultText(es[i].Result))
		}
	}
	da := dumpState(t, a)
	if db, dc := dumpState(t, b), dumpState(t, c); da != db || da != dc {
		t.Fatalf("states differ")
	}
	if n := shardRecords(t, a, s); n != 0 {
		t.Fatalf("%d records of the GC'd shard left", n)
	}
	t.Logf("%d entries", len(l.ents))
}

func shardOfKey(sm *StateMachine, key []byte) int {
	return routing.ShardOf(key, len(sm.Config().Shards))
}

// openSM opens a state machine of group gid as openFuzzSM does.
func openSM(t testing.TB, gid uint64) *StateMachine {
	db, err := badger.Open(raftgroup.StorageOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sm := NewStateMachine(gid)
	if _, err := sm.Open(db); err != nil {
		t.Fatal(err)
	}
	return sm
}

// TestPulledChunksFitOneEntry: the source side of a move. A frozen shard of
// long keys (with expiry, tombstones), values just below and above badger's
// value threshold and sessions is streamed as the source serves it
// (StreamShard), cut by the puller (installPieces) and applied, each piece
// after a large write in the same Apply: every install entry, with the
// index entries it writes, fits one transaction without being cut, and the
// shard arrives whole.
func TestPulledChunksFitOneEntry(t *testing.T) {
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	const s, other = 1, 2 // the shard that moves, and one the puller serves
	tagOf := func(shard int) string {
		for i := 0; ; i++ {
			if tg := fmt.Sprint(i); routing.ShardOf([]byte("{"+tg+"}"), 4) == shard {
				return tg
			}
		}
	}
	conf1 := &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 8, 7}, Groups: groups}
	conf2 := &shardkvpb.Config{Num: 2, Shards: []uint64{7, 8, 8, 7}, Groups: groups}

	src := &smHarness{t: t, sm: openSM(t, 7), now: time.Unix(1_800_000_000, 0)}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	tag := tagOf(s)
	far := src.now.UnixMilli() + 3600_000
	var long [][]byte
	for i := range 24 {
		long = append(long, longKey(tag, i))
	}
	longWrites(src, 1, shardkvpb.WriteOp_PUT, long[:8], far)
	longWrites(src, 2, shardkvpb.WriteOp_PUT, long[8:16], 0)
	for _, k := range long[8:16] {
		src.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: k})
	}
	for i, k := range long[16:] { // values just below the threshold (in full) and above it
		n := valueInline - recordHeader - 1
		if i%2 == 1 {
			n = 2 * valueInline
		}
		if r := src.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: k, Value: bytes.Repeat([]byte{'V'}, n), ExpireAtMs: far}); !r.Result.GetOk() {
			t.Fatalf("put: %v", r)
		}
	}
	for i := range 300 {
		src.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: fmt.Appendf(nil, "{%s}small%d", tag, i), Value: []byte("v"),
			Session: &shardkvpb.Session{ClientId: uint64(10 + i), Seq: 1}})
	}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	if m := src.sm.Shard(s); m.State != BePulling {
		t.Fatalf("source shard %d: %v", s, m)
	}

	dst := &smHarness{t: t, sm: openSM(t, 8), now: src.now}
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	bigKey := []byte("{" + tagOf(other) + "}big")
	maxCommand := EntryBytesFor(DefaultMaxValueBytes, MaxKeyBytesLimit)
	entries := 0
	err := src.sm.StreamShard(s, nil, false, func(chunk *shardkvpb.ShardChunk) error {
		at := dst.sm.Shard(s)
		pieces := installPieces(chunk.Kvs, at.Resume, maxCommand)
		for i, kvs := range pieces {
			at = dst.sm.Shard(s)
			ins := &shardkvpb.InsertChunk{Shard: s, ConfigNum: 2, AfterKey: at.Resume, Resume: at.Resumed, Kvs: kvs,
				Last: chunk.Last && i == len(pieces)-1, TotalKeys: chunk.TotalKeys}
			l := &entryLog{t: t, index: dst.index, now: dst.now}
			l.add(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: bigKey, Value: bytes.Repeat([]byte{'v'}, 1_000_000)}}})
			l.add(&shardkvpb.GroupCommand{Insert: ins})
			if err := raftgroup.ApplyAlone(dst.sm, dst.sm.store.DB(), l.ents); err != nil {
				return fmt.Errorf("install entry after a large write: %.300v", err)
			}
			dst.index = l.index
			if r := l.ents[1].Result; r != nil {
				return fmt.Errorf("install entry of %d records: %v", len(kvs), r)
			}
			entries++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The last round from the frozen source: no changes, the sessions.
	err = src.sm.StreamChanges(int(s), dst.sm.Shard(int(s)).Cursor, 0, true, 0, func(chunk *shardkvpb.ShardChunk) error {
		ins := &shardkvpb.InsertChunk{Shard: s, ConfigNum: 2, Delta: true, Cursor: dst.sm.Shard(int(s)).Cursor, NextCursor: chunk.NextCursor,
			Kvs: chunk.Kvs, Last: chunk.Last, CaughtUp: chunk.CaughtUp}
		if r := dst.apply(&shardkvpb.GroupCommand{Insert: ins}); r != nil {
			return fmt.Errorf("last round: %v", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m := dst.sm.Shard(s); m.State != Acking || m.Keys != 324 {
		t.Fatalf("puller's shard %d after the stream: %+v, want Acking with 324 keys", s, m)
	}
	if a, b := shardRecords(t, src.sm, s), shardRecords(t, dst.sm, s); a != b {
		t.Fatalf("source holds %d records and index entries of shard %d, the puller %d", a, s, b)
	}
	t.Logf("shard of %d records moved in %d install entries", shardRecords(t, dst.sm, s), entries)
}
