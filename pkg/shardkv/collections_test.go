package shardkv

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func fields(kv ...string) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) {
		for i := 0; i < len(kv); i += 2 {
			o.Fields = append(o.Fields, []byte(kv[i]))
			if i+1 < len(kv) {
				o.FieldValues = append(o.FieldValues, []byte(kv[i+1]))
			}
		}
	}
}

func names(f ...string) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) {
		for _, x := range f {
			o.Fields = append(o.Fields, []byte(x))
		}
	}
}

// hash reads key's hash whole (nil: absent; WRONGTYPE: another type).
func (h *smHarness) hash(key string) map[string]string {
	h.t.Helper()
	r, code, err := h.sm.ReadElems([]byte(key), ElemQuery{Type: TypeHash, All: true}, nil)
	if err != nil || code != OK {
		h.t.Fatalf("read hash %q: %v %v", key, code, err)
	}
	if !r.Entry.Found {
		return nil
	}
	if r.Entry.Type != TypeHash {
		return map[string]string{"WRONGTYPE": r.Entry.Type.String()}
	}
	m := map[string]string{}
	for _, e := range r.Elems {
		m[string(e.Field)] = string(e.Value)
	}
	if int64(len(m)) != r.Len {
		h.t.Fatalf("hash %q: %d fields, its record says %d", key, len(m), r.Len)
	}
	return m
}

// countPrefix counts the records under prefix.
func countPrefix(t *testing.T, sm *StateMachine, prefix []byte) int {
	t.Helper()
	n := 0
	if err := sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// collectAll applies collection entries until one reports no more work.
func (h *smHarness) collectAll() int {
	h.t.Helper()
	for i := 1; ; i++ {
		more, ok := h.apply(&shardkvpb.GroupCommand{CollectDead: true}).(moreWork)
		if !ok {
			h.t.Fatal("collection entry without a moreWork result")
		}
		if !more {
			return i
		}
		if i > 10_000 {
			h.t.Fatal("collection does not end")
		}
	}
}

// TestHashOps: HSET counts the fields it adds, HSETNX (IF_ABSENT) keeps
// fields, HDEL removes and the hash goes with its last field, HINCR and
// HINCR_FLOAT refuse non-numbers and overflow without a change.
func TestHashOps(t *testing.T) {
	h := newSMHarness(t)
	HS, HD, HI, HF := shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL, shardkvpb.WriteOp_HINCR, shardkvpb.WriteOp_HINCR_FLOAT
	if r := h.write(op(HS, "h", fields("a", "1", "b", "2", "a", "3"))); r.Result.Num != 2 || r.Result.Error != "" {
		t.Fatalf("hset: %v", r.Result)
	}
	if got := h.hash("h"); !maps.Equal(got, map[string]string{"a": "3", "b": "2"}) {
		t.Fatalf("hash: %v", got)
	}
	if r := h.write(op(HS, "h", fields("a", "x", "c", ""), cond(shardkvpb.WriteOp_IF_ABSENT))); r.Result.Num != 1 {
		t.Fatalf("hsetnx: %v", r.Result)
	}
	if got := h.hash("h"); !maps.Equal(got, map[string]string{"a": "3", "b": "2", "c": ""}) {
		t.Fatalf("after hsetnx: %v", got)
	}
	if r := h.write(op(HI, "h", names("a"), delta(-5))); r.Result.Num != -2 || r.Result.Error != "" {
		t.Fatalf("hincrby: %v", r.Result)
	}
	if r := h.write(op(HI, "h", names("c"), delta(1))); r.Result.Error != errNotInteger {
		t.Fatalf("hincrby of an empty field: %v", r.Result)
	}
	h.write(op(HS, "h", fields("big", "9223372036854775807")))
	if r := h.write(op(HI, "h", names("big"), delta(1))); r.Result.Error != errOverflow || h.hash("h")["big"] != "9223372036854775807" {
		t.Fatalf("overflow: %v", r.Result)
	}
	if r := h.write(op(HF, "h", names("f"), val("1.5"))); string(r.Result.Value) != "1.5" {
		t.Fatalf("hincrbyfloat on a new field: %v", r.Result)
	}
	if r := h.write(op(HF, "h", names("f"), val("0.1"))); string(r.Result.Value) != "1.6" || h.hash("h")["f"] != "1.6" {
		t.Fatalf("hincrbyfloat: %v", r.Result)
	}
	if r := h.write(op(HD, "h", names("a", "nope", "a"))); r.Result.Num != 1 {
		t.Fatalf("hdel: %v", r.Result)
	}
	if r := h.write(op(HD, "h", names("b", "c", "big", "f"))); r.Result.Num != 4 {
		t.Fatalf("hdel of the rest: %v", r.Result)
	}
	if got := h.hash("h"); got != nil || h.entry("h").Found {
		t.Fatalf("an empty hash stays: %v", got)
	}
	if r := h.write(op(HD, "h", names("a"))); r.Result.Num != 0 || r.Result.Error != "" {
		t.Fatalf("hdel on no hash: %v", r.Result)
	}
	if n := countPrefix(t, h.sm, append(shardPrefix(shardOfKey4([]byte("h"))), tagElem)); n != 0 {
		t.Fatalf("%d elements left after the last HDEL", n)
	}
}

// TestWrongType: string ops on a hash and hash ops on a string fail
// WRONGTYPE and change nothing; SET, EXPIRE and DEL take either; a read in
// the log reports the type.
func TestWrongType(t *testing.T) {
	h := newSMHarness(t)
	h.write(op(shardkvpb.WriteOp_HSET, "h", fields("a", "1")))
	h.write(op(shardkvpb.WriteOp_PUT, "s", val("1")))
	for _, o := range []*shardkvpb.WriteOp{
		op(shardkvpb.WriteOp_APPEND, "h", val("x")),
		op(shardkvpb.WriteOp_INCR, "h", delta(1)),
		op(shardkvpb.WriteOp_INCR_FLOAT, "h", val("1")),
		op(shardkvpb.WriteOp_SET_RANGE, "h", val("x")),
		op(shardkvpb.WriteOp_SET_BIT, "h", val("\x01")),
		op(shardkvpb.WriteOp_CAS, "h", val("x")),
		op(shardkvpb.WriteOp_PUT, "h", val("x"), func(o *shardkvpb.WriteOp) { o.ReturnPrev = true }),
		op(shardkvpb.WriteOp_DELETE, "h", func(o *shardkvpb.WriteOp) { o.ReturnPrev = true }),
		op(shardkvpb.WriteOp_HSET, "s", fields("a", "1")),
		op(shardkvpb.WriteOp_HDEL, "s", names("a")),
		op(shardkvpb.WriteOp_HINCR, "s", names("a"), delta(1)),
	} {
		if r := h.write(o); r.Result.Error != shardkvpb.OpErrWrongType {
			t.Errorf("%v on %q: %v, want WRONGTYPE", o.Kind, o.Key, r.Result)
		}
	}
	if got := h.hash("h"); !maps.Equal(got, map[string]string{"a": "1"}) || h.get("s") != "1" {
		t.Fatalf("a refused op changed something: %v %q", got, h.get("s"))
	}
	read := op(shardkvpb.WriteOp_READ, "h", func(o *shardkvpb.WriteOp) { o.ReturnPrev = true })
	if r := h.write(read); !r.Result.PrevFound || r.Result.PrevType != uint32(TypeHash) || r.Result.Error != "" {
		t.Fatalf("a read in the log of a hash: %v", r.Result)
	}
	if e := h.entry("h"); !e.Found || e.Type != TypeHash || e.Value != nil {
		t.Fatalf("entry of a hash: %+v", e)
	}
	// SET replaces the hash; its field is gone for a new hash of that name.
	h.write(op(shardkvpb.WriteOp_PUT, "h", val("str")))
	if h.get("h") != "str" || h.entry("h").Type != TypeString {
		t.Fatalf("SET over a hash: %q", h.get("h"))
	}
	if r := h.write(op(shardkvpb.WriteOp_HSET, "h", fields("b", "2"))); r.Result.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("HSET on the string: %v", r.Result)
	}
	h.write(op(shardkvpb.WriteOp_DELETE, "h"))
	h.write(op(shardkvpb.WriteOp_HSET, "h", fields("b", "2")))
	if got := h.hash("h"); !maps.Equal(got, map[string]string{"b": "2"}) {
		t.Fatalf("a new hash sees its predecessor's fields: %v", got)
	}
}

// TestDeadVersionsCollected: DEL of a hash of thousands of fields is one
// record write, whatever its size; the collection entries then delete its
// elements in bounded batches, and a hash created again under the name in
// the same entry as the DEL sees none of them.
func TestDeadVersionsCollected(t *testing.T) {
	h := newSMHarness(t)
	s := shardOfKey4([]byte("big"))
	elems := append(shardPrefix(s), tagElem)
	const n = 5000
	for i := 0; i < n; i += 1000 {
		var kv []string
		for j := i; j < i+1000; j++ {
			kv = append(kv, fmt.Sprintf("f%05d", j), strings.Repeat("v", 10))
		}
		if r := h.write(op(shardkvpb.WriteOp_HSET, "big", fields(kv...))); r.Result.Num != 1000 {
			t.Fatalf("hset: %v", r.Result)
		}
	}
	// DEL and HSET of the same name in one entry (a pipeline).
	res := h.apply(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{
		op(shardkvpb.WriteOp_DELETE, "big"),
		op(shardkvpb.WriteOp_HSET, "big", fields("f00001", "new")),
	}}).([]OpResult)
	if !res[0].Result.Ok || res[1].Result.Num != 1 {
		t.Fatalf("del and hset: %v %v", res[0].Result, res[1].Result)
	}
	if got := h.hash("big"); !maps.Equal(got, map[string]string{"f00001": "new"}) {
		t.Fatalf("the new hash: %d fields, want 1", len(got))
	}
	if got := countPrefix(t, h.sm, elems); got != n+1 {
		t.Fatalf("%d elements right after the DEL, want the %d dead ones still there and the new one", got, n+1)
	}
	if !h.sm.deadPending.Load() {
		t.Fatal("no collection pending after a DEL of a hash")
	}
	if entries := h.collectAll(); entries < n/DeleteChunkKeys {
		t.Fatalf("collected %d elements in %d entries: more than DeleteChunkKeys per entry", n, entries)
	}
	if got := countPrefix(t, h.sm, elems); got != 1 {
		t.Fatalf("%d elements after the collection, want the new hash's 1", got)
	}
	if got := countPrefix(t, h.sm, []byte{'c'}); got != 0 || h.sm.deadPending.Load() {
		t.Fatalf("%d dead marks left (pending %v)", got, h.sm.deadPending.Load())
	}
	if got := h.hash("big"); !maps.Equal(got, map[string]string{"f00001": "new"}) {
		t.Fatalf("the collection touched the live hash: %v", got)
	}
}

// TestHashExpiryAndRename: a hash's expiry deletes it (its elements then
// collected); RENAME moves fields and expiry, COPY copies them, and each
// leaves an independent hash.
func TestHashExpiryAndRename(t *testing.T) {
	h := newSMHarness(t)
	now := h.now.UnixMilli()
	h.write(op(shardkvpb.WriteOp_HSET, "{t}a", fields("x", "1", "y", "2")))
	h.write(op(shardkvpb.WriteOp_EXPIRE, "{t}a", exp(now+1000)))
	if e := h.entry("{t}a"); e.ExpireAtMs != now+1000 || e.Type != TypeHash {
		t.Fatalf("expire on a hash: %+v", e)
	}
	if r := h.write(op(shardkvpb.WriteOp_RENAME, "{t}a", dest("{t}b"))); !r.Result.Ok {
		t.Fatalf("rename: %v", r.Result)
	}
	if h.entry("{t}a").Found || !maps.Equal(h.hash("{t}b"), map[string]string{"x": "1", "y": "2"}) || h.entry("{t}b").ExpireAtMs != now+1000 {
		t.Fatalf("after rename: a %v, b %v", h.entry("{t}a"), h.hash("{t}b"))
	}
	if r := h.write(op(shardkvpb.WriteOp_COPY, "{t}b", dest("{t}c"))); !r.Result.Ok {
		t.Fatalf("copy: %v", r.Result)
	}
	h.write(op(shardkvpb.WriteOp_HSET, "{t}c", fields("z", "3")))
	if got := h.hash("{t}b"); len(got) != 2 {
		t.Fatalf("a write to the copy changed the original: %v", got)
	}
	h.collectAll()
	s := shardOfKey4([]byte("{t}a"))
	if got := countPrefix(t, h.sm, append(shardPrefix(s), tagElem)); got != 5 {
		t.Fatalf("%d elements, want b's 2 and c's 3 (a's collected)", got)
	}
	h.now = h.now.Add(2 * time.Second)
	if n := h.apply(&shardkvpb.GroupCommand{ExpireKeys: true}); n != 2 {
		t.Fatalf("expired %v keys, want b and c", n)
	}
	h.collectAll()
	if got := countPrefix(t, h.sm, append(shardPrefix(s), tagElem)); got != 0 || h.hash("{t}b") != nil {
		t.Fatalf("%d elements after the expiry and collection", got)
	}
}

// TestHashesMigrate: a shard with hashes moves by snapshot and rounds of
// changes, field-level (HSET, HDEL, a DEL and re-create, a hash dying
// between rounds); the copy equals the source, holds no element of a dead
// version once its own collection ran, and a dead version's elements never
// travel.
func TestHashesMigrate(t *testing.T) {
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	const s = 1
	conf1 := &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 8, 7}, Groups: groups}
	conf2 := &shardkvpb.Config{Num: 2, Shards: []uint64{7, 7, 8, 7}, Groups: groups,
		Moves: []*shardkvpb.PlannedMove{{Shard: s, FromGid: 7, ToGid: 8, SinceConfig: 2}}}
	conf3 := &shardkvpb.Config{Num: 3, Shards: []uint64{7, 8, 8, 7}, Groups: groups}
	var keys []string
	for j := 0; len(keys) < 7; j++ {
		if k := fmt.Sprintf("h%d", j); shardOfKey4([]byte(k)) == s {
			keys = append(keys, k)
		}
	}
	src := &smHarness{t: t, sm: openSM(t, 7), now: time.Unix(1_800_000_000, 0)}
	dst := &smHarness{t: t, sm: openSM(t, 8), now: src.now}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	HS, HD := shardkvpb.WriteOp_HSET, shardkvpb.WriteOp_HDEL
	for i, k := range keys[:6] {
		var kv []string
		for j := range 50 * (i + 1) {
			kv = append(kv, fmt.Sprint("f", j), fmt.Sprint(i, "-", j))
		}
		src.write(op(HS, k, fields(kv...)))
	}
	src.write(op(shardkvpb.WriteOp_PUT, "str1", val("plain")))
	// A dead version before the snapshot: not to travel.
	src.write(op(shardkvpb.WriteOp_DELETE, keys[0]))
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	var sent int
	if err := src.sm.StreamShard(s, nil, false, func(c *shardkvpb.ShardChunk) error {
		at := dst.sm.Shard(s)
		for _, kv := range c.Kvs {
			if _, v, _, ok := elemOf(kv.Key); ok {
				sent++
				if k, _, _, _ := elemOf(kv.Key); string(k) == keys[0] {
					t.Errorf("an element of a dead version travelled (version %d)", v)
				}
			}
		}
		if r := dst.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: s, ConfigNum: 2, Precopy: true, AfterKey: at.Resume, Resume: at.Resumed,
			Kvs: c.Kvs, Last: c.Last, TotalKeys: c.TotalKeys, SourceIndex: c.SourceIndex, LogTimeNs: c.LogTimeNs}}); r != nil {
			return fmt.Errorf("snapshot chunk: %v", r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := 50 * (2 + 3 + 4 + 5 + 6); sent != want {
		t.Fatalf("the snapshot sent %d elements, want the live %d", sent, want)
	}
	round := func(num uint64, precopy, frozen bool) {
		t.Helper()
		at := dst.sm.Shard(s)
		if err := src.sm.StreamChanges(s, at.Cursor, at.SessionsAt, frozen, 0, func(c *shardkvpb.ShardChunk) error {
			cur := dst.sm.Shard(s)
			if r := dst.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: s, ConfigNum: num, Precopy: precopy, Delta: true,
				Cursor: cur.Cursor, NextCursor: c.NextCursor, Kvs: c.Kvs, Last: c.Last, CaughtUp: c.CaughtUp,
				SourceIndex: c.SourceIndex, LogTimeNs: c.LogTimeNs, SessionsAt: c.SessionsAt}}); r != nil {
				return fmt.Errorf("round chunk: %v", r)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Round 1: field writes, a delete and re-create, a hash emptied.
	src.write(op(HS, keys[1], fields("f0", "changed", "new", "1")))
	src.write(op(HD, keys[1], names("f1", "f2")))
	src.write(op(shardkvpb.WriteOp_DELETE, keys[2]))
	src.write(op(HS, keys[2], fields("again", "yes")))
	var all []string
	for j := range 200 {
		all = append(all, fmt.Sprint("f", j))
	}
	src.write(op(HD, keys[3], names(all...)))
	round(2, true, false)
	// Round 2 (last, frozen): a hash written and then deleted since the
	// last round; its elements still wait for the source's collection.
	src.write(op(HS, keys[4], fields("late", "1")))
	src.write(op(shardkvpb.WriteOp_DELETE, keys[4]))
	src.write(op(shardkvpb.WriteOp_RENAME, keys[5], dest(keys[0])))
	// A hash born after the snapshot and dead before the round: the copy
	// never holds its record, so nothing there would mark its elements.
	src.write(op(HS, keys[6], fields("born", "1", "late", "2")))
	src.write(op(shardkvpb.WriteOp_DELETE, keys[6]))
	want := map[string]map[string]string{}
	for _, k := range keys {
		want[k] = src.hash(k)
	}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf3})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf3})
	round(3, false, true)
	if m := dst.sm.Shard(s); m.State != Acking {
		t.Fatalf("target after the last round: %v", m)
	}
	total := 0
	for _, k := range keys {
		want, got := want[k], dst.hash(k)
		if !maps.Equal(want, got) {
			t.Errorf("hash %s: source %d fields, copy %d (%v)", k, len(want), len(got), slices.Sorted(maps.Keys(got))[:min(5, len(got))])
		}
		total += len(want)
	}
	if dst.get("str1") != "plain" {
		t.Errorf("the string did not travel")
	}
	dst.collectAll()
	if got := countPrefix(t, dst.sm, append(shardPrefix(s), tagElem)); got != total {
		t.Fatalf("the copy holds %d elements after its collection, want the %d of its live hashes", got, total)
	}
}

func members(m ...string) func(*shardkvpb.WriteOp) { return names(m...) }

// set reads key's set whole as sorted members (nil: absent).
func (h *smHarness) set(key string) []string {
	h.t.Helper()
	r, code, err := h.sm.ReadElems([]byte(key), ElemQuery{Type: TypeSet, All: true}, nil)
	if err != nil || code != OK {
		h.t.Fatalf("read set %q: %v %v", key, code, err)
	}
	if !r.Entry.Found {
		return nil
	}
	if r.Entry.Type != TypeSet {
		return []string{"WRONGTYPE " + r.Entry.Type.String()}
	}
	out := []string{}
	for _, e := range r.Elems {
		out = append(out, string(e.Field))
	}
	if int64(len(out)) != r.Len {
		h.t.Fatalf("set %q: %d members, its record says %d", key, len(out), r.Len)
	}
	return out
}

// TestSetOps: SADD and SREM count what they change and the set goes with
// its last member; SPOP removes what it returns, the same on every replica
// (the entry's random source); SMOVE moves between sets of one shard;
// SSTORE stores intersection, union and difference; WRONGTYPE both ways.
func TestSetOps(t *testing.T) {
	h := newSMHarness(t)
	SA, SR := shardkvpb.WriteOp_SADD, shardkvpb.WriteOp_SREM
	if r := h.write(op(SA, "{s}a", members("x", "y", "z", "x"))); r.Result.Num != 3 {
		t.Fatalf("sadd: %v", r.Result)
	}
	if r := h.write(op(SA, "{s}a", members("x", "w"))); r.Result.Num != 1 {
		t.Fatalf("sadd again: %v", r.Result)
	}
	if got := h.set("{s}a"); !slices.Equal(got, []string{"w", "x", "y", "z"}) {
		t.Fatalf("set: %v", got)
	}
	if r := h.write(op(SR, "{s}a", members("w", "nope"))); r.Result.Num != 1 {
		t.Fatalf("srem: %v", r.Result)
	}
	h.write(op(SA, "{s}b", members("y", "q")))
	for d, want := range map[int64][]string{SetInter: {"y"}, SetUnion: {"q", "x", "y", "z"}, SetDiff: {"x", "z"}} {
		o := op(shardkvpb.WriteOp_SSTORE, "{s}a", dest("{s}d"), delta(d), func(o *shardkvpb.WriteOp) { o.MoreKeys = [][]byte{[]byte("{s}b"), []byte("{s}none")} })
		if d == SetInter {
			o.MoreKeys = o.MoreKeys[:1]
		}
		if r := h.write(o); r.Result.Num != int64(len(want)) || !slices.Equal(h.set("{s}d"), want) {
			t.Fatalf("sstore %d: %v %v, want %v", d, r.Result, h.set("{s}d"), want)
		}
	}
	h.write(op(shardkvpb.WriteOp_PUT, "{s}str", val("1")))
	if r := h.write(op(shardkvpb.WriteOp_SSTORE, "{s}a", dest("{s}d"), delta(SetUnion), func(o *shardkvpb.WriteOp) { o.MoreKeys = [][]byte{[]byte("{s}str")} })); r.Result.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("sstore of a string: %v", r.Result)
	}
	if r := h.write(op(SA, "{s}str", members("a"))); r.Result.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("sadd on a string: %v", r.Result)
	}
	h.write(op(shardkvpb.WriteOp_HSET, "{s}h", fields("f", "v")))
	if r := h.write(op(SR, "{s}h", members("f"))); r.Result.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("srem on a hash: %v", r.Result)
	}
	// SMOVE.
	mv := func(src, dst, m string) *shardkvpb.WriteResult {
		return h.write(op(shardkvpb.WriteOp_SMOVE, src, dest(dst), members(m))).Result
	}
	if r := mv("{s}a", "{s}new", "x"); !r.Ok || !slices.Equal(h.set("{s}a"), []string{"y", "z"}) || !slices.Equal(h.set("{s}new"), []string{"x"}) {
		t.Fatalf("smove: %v %v %v", r, h.set("{s}a"), h.set("{s}new"))
	}
	if r := mv("{s}a", "{s}new", "nope"); r.Ok {
		t.Fatalf("smove of no member: %v", r)
	}
	if r := mv("{s}a", "{s}str", "y"); r.Error != shardkvpb.OpErrWrongType || len(h.set("{s}a")) != 2 {
		t.Fatalf("smove to a string: %v", r)
	}
	if r := mv("{s}new", "{s}a", "x"); !r.Ok || h.set("{s}new") != nil {
		t.Fatalf("smove of the last member: %v, source %v", r, h.set("{s}new"))
	}
	// SPOP: the popped members are gone, the rest stay.
	var many []string
	for i := range 2000 {
		many = append(many, fmt.Sprint("m", i))
	}
	for _, size := range []int{10, 2000} {
		key := fmt.Sprint("{s}pop", size)
		h.write(op(SA, key, members(many[:size]...)))
		r := h.write(op(shardkvpb.WriteOp_SPOP, key, delta(3))).Result
		left := h.set(key)
		if r.Num != 3 || len(r.Values) != 3 || len(left) != size-3 {
			t.Fatalf("spop 3 of %d: %v, %d left", size, r, len(left))
		}
		for _, v := range r.Values {
			if slices.Contains(left, string(v)) {
				t.Fatalf("popped %q is still there", v)
			}
		}
	}
	if r := h.write(op(shardkvpb.WriteOp_SPOP, "{s}pop10", delta(100))).Result; r.Num != 7 || h.set("{s}pop10") != nil {
		t.Fatalf("spop of more than the set: %v", r)
	}
}

// list reads key's list whole (nil: absent).
func (h *smHarness) list(key string) []string {
	h.t.Helper()
	r, code, err := h.sm.ReadElems([]byte(key), ElemQuery{Type: TypeList, Range: true, Start: 0, Stop: -1}, nil)
	if err != nil || code != OK {
		h.t.Fatalf("read list %q: %v %v", key, code, err)
	}
	if !r.Entry.Found {
		return nil
	}
	out := []string{}
	for _, e := range r.Elems {
		out = append(out, string(e.Value))
	}
	if int64(len(out)) != r.Len {
		h.t.Fatalf("list %q: %d elements, its record says %d", key, len(out), r.Len)
	}
	return out
}

func (h *smHarness) lrange(key string, start, stop int64) []string {
	h.t.Helper()
	r, _, err := h.sm.ReadElems([]byte(key), ElemQuery{Type: TypeList, Range: true, Start: start, Stop: stop}, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	out := []string{}
	for _, e := range r.Elems {
		out = append(out, string(e.Value))
	}
	return out
}

// TestListOps: pushes and pops at both ends, LSET, LTRIM, LREM, LINSERT,
// LMOVE (also onto itself), ranges with Redis's index rules, and the list
// going with its last element.
func TestListOps(t *testing.T) {
	h := newSMHarness(t)
	K := shardkvpb.WriteOp_Kind(0)
	do := func(kind shardkvpb.WriteOp_Kind, key string, f ...func(*shardkvpb.WriteOp)) *shardkvpb.WriteResult {
		t.Helper()
		return h.write(op(kind, key, f...)).Result
	}
	_ = K
	if r := do(shardkvpb.WriteOp_RPUSH, "{l}a", members("b", "c")); r.Num != 2 {
		t.Fatalf("rpush: %v", r)
	}
	if r := do(shardkvpb.WriteOp_LPUSH, "{l}a", members("x", "a")); r.Num != 4 || !slices.Equal(h.list("{l}a"), []string{"a", "x", "b", "c"}) {
		t.Fatalf("lpush: %v %v", r, h.list("{l}a"))
	}
	if r := do(shardkvpb.WriteOp_LPUSH, "{l}none", members("x"), cond(shardkvpb.WriteOp_IF_PRESENT)); r.Num != 0 || h.list("{l}none") != nil {
		t.Fatalf("lpushx on no list: %v", r)
	}
	for _, c := range []struct {
		start, stop int64
		want        []string
	}{{0, -1, []string{"a", "x", "b", "c"}}, {1, 2, []string{"x", "b"}}, {-2, 100, []string{"b", "c"}}, {-100, 0, []string{"a"}}, {3, 1, []string{}}, {5, 10, []string{}}} {
		if got := h.lrange("{l}a", c.start, c.stop); !slices.Equal(got, c.want) {
			t.Fatalf("lrange %d %d: %v, want %v", c.start, c.stop, got, c.want)
		}
	}
	if r := do(shardkvpb.WriteOp_LSET, "{l}a", delta(-3), val("X")); r.Error != "" || h.lrange("{l}a", 1, 1)[0] != "X" {
		t.Fatalf("lset: %v", r)
	}
	if r := do(shardkvpb.WriteOp_LSET, "{l}a", delta(4), val("X")); r.Error != errOffset {
		t.Fatalf("lset out of range: %v", r)
	}
	if r := do(shardkvpb.WriteOp_LSET, "{l}none", delta(0), val("X")); r.Error != errNoSuchKey {
		t.Fatalf("lset of no list: %v", r)
	}
	if r := do(shardkvpb.WriteOp_RPOP, "{l}a", delta(2)); r.Num != 2 || string(r.Values[0]) != "c" || string(r.Values[1]) != "b" {
		t.Fatalf("rpop 2: %v", r)
	}
	if r := do(shardkvpb.WriteOp_LPOP, "{l}a", delta(1)); string(r.Values[0]) != "a" || !slices.Equal(h.list("{l}a"), []string{"X"}) {
		t.Fatalf("lpop: %v %v", r, h.list("{l}a"))
	}
	if r := do(shardkvpb.WriteOp_LPOP, "{l}a", delta(5)); r.Num != 1 || h.list("{l}a") != nil || h.entry("{l}a").Found {
		t.Fatalf("the last pop: %v, list %v", r, h.list("{l}a"))
	}
	// LREM, LINSERT, LTRIM.
	do(shardkvpb.WriteOp_RPUSH, "{l}b", members("a", "b", "a", "c", "a"))
	if r := do(shardkvpb.WriteOp_LREM, "{l}b", delta(-2), val("a")); r.Num != 2 || !slices.Equal(h.list("{l}b"), []string{"a", "b", "c"}) {
		t.Fatalf("lrem -2: %v %v", r, h.list("{l}b"))
	}
	if r := do(shardkvpb.WriteOp_LINSERT, "{l}b", delta(1), func(o *shardkvpb.WriteOp) { o.Expect, o.Value = []byte("b"), []byte("B") }); r.Num != 4 || !slices.Equal(h.list("{l}b"), []string{"a", "b", "B", "c"}) {
		t.Fatalf("linsert after: %v %v", r, h.list("{l}b"))
	}
	if r := do(shardkvpb.WriteOp_LINSERT, "{l}b", delta(0), func(o *shardkvpb.WriteOp) { o.Expect, o.Value = []byte("nope"), []byte("B") }); r.Num != -1 {
		t.Fatalf("linsert without the pivot: %v", r)
	}
	if r := do(shardkvpb.WriteOp_LTRIM, "{l}b", delta(1), func(o *shardkvpb.WriteOp) { o.Stop = -2 }); r.Error != "" || !slices.Equal(h.list("{l}b"), []string{"b", "B"}) {
		t.Fatalf("ltrim: %v %v", r, h.list("{l}b"))
	}
	// LMOVE to another list and onto itself (a rotation).
	do(shardkvpb.WriteOp_RPUSH, "{l}c", members("1", "2", "3"))
	mv := func(src, dst string, from, to int64) *shardkvpb.WriteResult {
		return do(shardkvpb.WriteOp_LMOVE, src, dest(dst), delta(from), func(o *shardkvpb.WriteOp) { o.Stop = to })
	}
	if r := mv("{l}c", "{l}c", 1, 0); string(r.Values[0]) != "3" || !slices.Equal(h.list("{l}c"), []string{"3", "1", "2"}) {
		t.Fatalf("rotate: %v %v", r, h.list("{l}c"))
	}
	if r := mv("{l}c", "{l}d", 0, 1); string(r.Values[0]) != "3" || !slices.Equal(h.list("{l}d"), []string{"3"}) || !slices.Equal(h.list("{l}c"), []string{"1", "2"}) {
		t.Fatalf("lmove: %v %v %v", r, h.list("{l}c"), h.list("{l}d"))
	}
	do(shardkvpb.WriteOp_RPUSH, "{l}one", members("z"))
	if r := mv("{l}one", "{l}one", 0, 1); string(r.Values[0]) != "z" || !slices.Equal(h.list("{l}one"), []string{"z"}) {
		t.Fatalf("rotate a list of one: %v %v", r, h.list("{l}one"))
	}
	h.write(op(shardkvpb.WriteOp_PUT, "{l}str", val("1")))
	if r := mv("{l}c", "{l}str", 0, 0); r.Error != shardkvpb.OpErrWrongType || len(h.list("{l}c")) != 2 {
		t.Fatalf("lmove onto a string: %v", r)
	}
	if r := do(shardkvpb.WriteOp_RPUSH, "{l}str", members("a")); r.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("rpush on a string: %v", r)
	}
	// A list longer than one entry may delete, trimmed to a few: a new
	// version, the rest collected.
	var many []string
	for i := range maxCopyElems + 1000 {
		many = append(many, fmt.Sprint(i))
	}
	for i := 0; i < len(many); i += 5000 {
		if r := do(shardkvpb.WriteOp_RPUSH, "{l}long", members(many[i:min(i+5000, len(many))]...)); r.Error != "" {
			t.Fatalf("rpush: %v", r)
		}
	}
	if r := do(shardkvpb.WriteOp_LTRIM, "{l}long", delta(10), func(o *shardkvpb.WriteOp) { o.Stop = 12 }); r.Error != "" || !slices.Equal(h.list("{l}long"), []string{"10", "11", "12"}) {
		t.Fatalf("ltrim of a long list: %v %v", r, h.list("{l}long"))
	}
	h.collectAll()
	if got := countPrefix(t, h.sm, elemPrefix(shardOfKey4([]byte("{l}long")), []byte("{l}long"), 0)[:6+len("{l}long")]); got != 3 {
		t.Fatalf("%d elements of the trimmed list after the collection, want 3", got)
	}
}

// TestPopRetried: a retried pop (same session seq) answers the elements
// the first one removed and removes nothing more: the dedup table keeps
// them (without, the retry answered "empty" and porcupine caught it).
func TestPopRetried(t *testing.T) {
	h := newSMHarness(t)
	h.write(op(shardkvpb.WriteOp_RPUSH, "{p}l", members("a", "b", "c")))
	h.write(op(shardkvpb.WriteOp_SADD, "{p}s", members("x", "y")))
	sess := func(o *shardkvpb.WriteOp) { o.Session = &shardkvpb.Session{ClientId: 5, Seq: 1} }
	for _, o := range []*shardkvpb.WriteOp{op(shardkvpb.WriteOp_LPOP, "{p}l", delta(2), sess), op(shardkvpb.WriteOp_SPOP, "{p}s", delta(1), sess)} {
		o.Session.Seq = uint64(o.Kind)
		first, again := h.write(o).Result, h.write(o).Result
		if len(first.Values) == 0 || !slices.EqualFunc(first.Values, again.Values, func(x, y []byte) bool { return string(x) == string(y) }) {
			t.Fatalf("%v retried: %q, then %q", o.Kind, first.Values, again.Values)
		}
	}
	if got := h.list("{p}l"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("list after a retried pop: %v", got)
	}
	if got := h.set("{p}s"); len(got) != 1 {
		t.Fatalf("set after a retried spop: %v", got)
	}
}

func scores(kv ...any) func(*shardkvpb.WriteOp) {
	return func(o *shardkvpb.WriteOp) {
		for i := 0; i < len(kv); i += 2 {
			o.Fields = append(o.Fields, []byte(kv[i].(string)))
			o.FieldValues = append(o.FieldValues, ScoreValue(kv[i+1].(float64)))
		}
	}
}

// zrange reads members in a range as "member:score" strings.
func (h *smHarness) zrange(key string, q ElemQuery) []string {
	h.t.Helper()
	q.Type = TypeZSet
	r, code, err := h.sm.ReadElems([]byte(key), q, nil)
	if err != nil || code != OK {
		h.t.Fatalf("zrange %q: %v %v", key, code, err)
	}
	out := []string{}
	for _, e := range r.Elems {
		f, _ := ValueScore(e.Value)
		out = append(out, fmt.Sprintf("%s:%g", e.Field, f))
	}
	return out
}

func byRank(lo, hi int64, rev bool) ElemQuery {
	return ElemQuery{Z: &ZRange{By: ZByRank, Min: Bound{Rank: lo}, Max: Bound{Rank: hi}, Rev: rev, Count: -1}}
}

// TestZSetOps: ZADD with its flags, ZINCRBY, ZREM, pops, ranges by rank,
// score and lex (with exclusive bounds and infinities), ranks, counts and
// ZREMRANGE; the set goes with its last member.
func TestZSetOps(t *testing.T) {
	h := newSMHarness(t)
	ZA := shardkvpb.WriteOp_ZADD
	flags := func(f int64) func(*shardkvpb.WriteOp) { return delta(f) }
	if r := h.write(op(ZA, "z", scores("a", 1.0, "b", 2.0, "c", 3.0, "d", -1.5))).Result; r.Num != 4 {
		t.Fatalf("zadd: %v", r)
	}
	if got := h.zrange("z", byRank(0, -1, false)); !slices.Equal(got, []string{"d:-1.5", "a:1", "b:2", "c:3"}) {
		t.Fatalf("zrange: %v", got)
	}
	if got := h.zrange("z", byRank(0, 1, true)); !slices.Equal(got, []string{"c:3", "b:2"}) {
		t.Fatalf("zrevrange 0 1: %v", got)
	}
	// NX, XX, GT, LT, CH.
	if r := h.write(op(ZA, "z", scores("a", 5.0, "e", 0.0), flags(ZAddNX))).Result; r.Num != 1 {
		t.Fatalf("zadd nx: %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", 5.0, "f", 0.0), flags(ZAddXX|ZAddCH))).Result; r.Num != 1 {
		t.Fatalf("zadd xx ch: %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", 4.0, "b", 2.5), flags(ZAddGT|ZAddCH))).Result; r.Num != 1 {
		t.Fatalf("zadd gt ch (only b rises): %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", 1.0), flags(ZAddIncr))).Result; !r.Ok || fmt.Sprint(must(ValueScore(r.Value))) != "6" {
		t.Fatalf("zincrby: %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", -100.0), flags(ZAddIncr|ZAddGT))).Result; r.Ok {
		t.Fatalf("zincrby gt lowering: %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", math.Inf(1), "b", math.Inf(-1)))).Result; r.Error != "" {
		t.Fatalf("infinite scores: %v", r)
	}
	if r := h.write(op(ZA, "z", scores("a", math.Inf(-1)), flags(ZAddIncr))).Result; r.Error != errNaN {
		t.Fatalf("inf + -inf: %v", r)
	}
	if got := h.zrange("z", byRank(0, -1, false)); !slices.Equal(got, []string{"b:-Inf", "d:-1.5", "e:0", "c:3", "a:+Inf"}) {
		t.Fatalf("after the updates: %v", got)
	}
	// By score, exclusive and infinite bounds, LIMIT, REV.
	q := func(lo, hi Bound, rev bool, off, n int64) ElemQuery {
		return ElemQuery{Z: &ZRange{By: ZByScore, Min: lo, Max: hi, Rev: rev, Offset: off, Count: n}}
	}
	incl := func(f float64) Bound { return Bound{Kind: BoundIncl, Score: f} }
	excl := func(f float64) Bound { return Bound{Kind: BoundExcl, Score: f} }
	if got := h.zrange("z", q(excl(-1.5), incl(3), false, 0, -1)); !slices.Equal(got, []string{"e:0", "c:3"}) {
		t.Fatalf("(-1.5 3: %v", got)
	}
	if got := h.zrange("z", q(Bound{Kind: BoundNegInf}, Bound{Kind: BoundPosInf}, true, 1, 2)); !slices.Equal(got, []string{"c:3", "e:0"}) {
		t.Fatalf("-inf +inf rev limit 1 2: %v", got)
	}
	r, _, _ := h.sm.ReadElems([]byte("z"), ElemQuery{Type: TypeZSet, Z: &ZRange{By: ZByScore, Min: incl(-2), Max: excl(3), Count: -1}, CountOnly: true}, nil)
	if r.Count != 2 {
		t.Fatalf("zcount [-2 (3: %d", r.Count)
	}
	r, _, _ = h.sm.ReadElems([]byte("z"), ElemQuery{Type: TypeZSet, RankOf: []byte("c"), Rev: true}, nil)
	if r.Rank != 1 {
		t.Fatalf("zrevrank c: %d", r.Rank)
	}
	r, _, _ = h.sm.ReadElems([]byte("z"), ElemQuery{Type: TypeZSet, RankOf: []byte("nope")}, nil)
	if r.Rank != -1 {
		t.Fatalf("zrank of no member: %d", r.Rank)
	}
	// Pops.
	if r := h.write(op(shardkvpb.WriteOp_ZPOPMIN, "z", delta(2))).Result; len(r.Values) != 4 || string(r.Values[0]) != "b" || string(r.Values[2]) != "d" {
		t.Fatalf("zpopmin 2: %q", r.Values)
	}
	if r := h.write(op(shardkvpb.WriteOp_ZPOPMAX, "z", delta(1))).Result; string(r.Values[0]) != "a" {
		t.Fatalf("zpopmax: %q", r.Values)
	}
	// By lex, and ZREMRANGE.
	h.write(op(ZA, "lex", scores("a", 0.0, "b", 0.0, "c", 0.0, "d", 0.0, "e", 0.0)))
	lex := func(kind int, m string) Bound { return Bound{Kind: kind, Lex: []byte(m)} }
	if got := h.zrange("lex", ElemQuery{Z: &ZRange{By: ZByLex, Min: lex(BoundExcl, "a"), Max: lex(BoundIncl, "c"), Count: -1}}); !slices.Equal(got, []string{"b:0", "c:0"}) {
		t.Fatalf("zrangebylex (a [c: %v", got)
	}
	rm := func(by int, lo, hi Bound) *shardkvpb.WriteResult {
		return h.write(op(shardkvpb.WriteOp_ZREMRANGE, "lex", delta(int64(by)), func(o *shardkvpb.WriteOp) {
			o.Fields = [][]byte{lo.Encode(by), hi.Encode(by)}
		})).Result
	}
	if r := rm(ZByLex, lex(BoundNegInf, ""), lex(BoundExcl, "b")); r.Num != 1 {
		t.Fatalf("zremrangebylex - (b: %v", r)
	}
	if r := rm(ZByRank, Bound{Rank: -2}, Bound{Rank: -1}); r.Num != 2 || !slices.Equal(h.zrange("lex", byRank(0, -1, false)), []string{"b:0", "c:0"}) {
		t.Fatalf("zremrangebyrank -2 -1: %v %v", r, h.zrange("lex", byRank(0, -1, false)))
	}
	if r := rm(ZByScore, Bound{Kind: BoundNegInf}, Bound{Kind: BoundPosInf}); r.Num != 2 || h.entry("lex").Found {
		t.Fatalf("zremrangebyscore of all: %v", r)
	}
	h.write(op(shardkvpb.WriteOp_PUT, "s", val("1")))
	if r := h.write(op(ZA, "s", scores("a", 1.0))).Result; r.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("zadd on a string: %v", r)
	}
}

func must[T any](v T, _ bool) T { return v }

// TestWatchKeys: a watcher wakes after a write to its key is applied (not
// another key's), and on a change of shard state.
func TestWatchKeys(t *testing.T) {
	h := newSMHarness(t)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	ch, stop := h.sm.WatchKeys([][]byte{[]byte("{w}l")})
	defer stop()
	h.write(op(shardkvpb.WriteOp_RPUSH, "{w}other", members("x")))
	if closed(ch) {
		t.Fatal("woken by a write to another key")
	}
	h.write(op(shardkvpb.WriteOp_RPUSH, "{w}l", members("x")))
	if !closed(ch) {
		t.Fatal("not woken by a push to its key")
	}
	ch2, stop2 := h.sm.WatchKeys([][]byte{[]byte("{w}l")})
	defer stop2()
	h.apply(&shardkvpb.GroupCommand{NextConfig: &shardkvpb.Config{Num: 2, Shards: []uint64{7, 7, 7, 0},
		Groups: []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}}}})
	if !closed(ch2) {
		t.Fatal("not woken by a config step")
	}
	stop2()
	stop2() // idempotent
	if n := h.sm.watches.n.Load(); n != 1 {
		t.Fatalf("%d watchers registered, want the first one's", n)
	}
}

// TestZStore: ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE with weights and
// aggregates over sorted sets and sets, and ZRANGESTORE; each replaces
// its destination, and an empty result deletes it.
func TestZStore(t *testing.T) {
	h := newSMHarness(t)
	h.write(op(shardkvpb.WriteOp_ZADD, "{z}a", scores("x", 1.0, "y", 2.0, "z", math.Inf(1))))
	h.write(op(shardkvpb.WriteOp_ZADD, "{z}b", scores("y", 10.0, "z", math.Inf(-1))))
	h.write(op(shardkvpb.WriteOp_SADD, "{z}s", members("x", "w")))
	h.write(op(shardkvpb.WriteOp_PUT, "{z}d", val("a string, replaced")))
	store := func(setop int64, agg int32, weights []float64, srcs ...string) *shardkvpb.WriteResult {
		return h.write(op(shardkvpb.WriteOp_ZSTORE, srcs[0], dest("{z}d"), delta(setop), func(o *shardkvpb.WriteOp) {
			for _, k := range srcs[1:] {
				o.MoreKeys = append(o.MoreKeys, []byte(k))
			}
			o.Weights, o.Aggregate = weights, agg
		})).Result
	}
	all := byRank(0, -1, false)
	if r := store(SetUnion, ZAggSum, nil, "{z}a", "{z}b", "{z}s"); r.Num != 4 || !slices.Equal(h.zrange("{z}d", all), []string{"z:0", "w:1", "x:2", "y:12"}) {
		t.Fatalf("zunionstore: %v %v", r, h.zrange("{z}d", all))
	}
	if r := store(SetInter, ZAggMax, []float64{2, 1}, "{z}a", "{z}b"); r.Num != 2 || !slices.Equal(h.zrange("{z}d", all), []string{"y:10", "z:+Inf"}) {
		t.Fatalf("zinterstore weights 2 1 aggregate max: %v %v", r, h.zrange("{z}d", all))
	}
	if r := store(SetDiff, ZAggSum, nil, "{z}a", "{z}s"); r.Num != 2 || !slices.Equal(h.zrange("{z}d", all), []string{"y:2", "z:+Inf"}) {
		t.Fatalf("zdiffstore: %v %v", r, h.zrange("{z}d", all))
	}
	if r := store(SetInter, ZAggSum, nil, "{z}a", "{z}none"); r.Num != 0 || h.entry("{z}d").Found {
		t.Fatalf("an empty result kept the destination: %v", r)
	}
	h.write(op(shardkvpb.WriteOp_PUT, "{z}str", val("1")))
	if r := store(SetUnion, ZAggSum, nil, "{z}a", "{z}str"); r.Error != shardkvpb.OpErrWrongType {
		t.Fatalf("a string source: %v", r)
	}
	rs := func(by int, lo, hi Bound, rev bool, off, n int64) *shardkvpb.WriteResult {
		return h.write(op(shardkvpb.WriteOp_ZRANGESTORE, "{z}a", dest("{z}r"), delta(int64(by)), func(o *shardkvpb.WriteOp) {
			o.Fields = [][]byte{lo.Encode(by), hi.Encode(by)}
			o.Rev, o.Offset, o.Count = rev, off, n
		})).Result
	}
	if r := rs(ZByRank, Bound{Rank: 0}, Bound{Rank: 1}, true, 0, -1); r.Num != 2 || !slices.Equal(h.zrange("{z}r", all), []string{"y:2", "z:+Inf"}) {
		t.Fatalf("zrangestore 0 1 rev: %v %v", r, h.zrange("{z}r", all))
	}
	if r := rs(ZByScore, Bound{Kind: BoundExcl, Score: 1}, Bound{Kind: BoundPosInf}, false, 1, 5); r.Num != 1 || !slices.Equal(h.zrange("{z}r", all), []string{"z:+Inf"}) {
		t.Fatalf("zrangestore (1 +inf limit 1 5: %v %v", r, h.zrange("{z}r", all))
	}
}

// TestRenameKeepsCollections: RENAME and COPY of a sorted set and a list
// keep their size and order (a sorted set has two records per member, a
// list its head position); -0 is stored as 0.
func TestRenameKeepsCollections(t *testing.T) {
	h := newSMHarness(t)
	h.write(op(shardkvpb.WriteOp_ZADD, "{r}z", scores("a", 1.0, "b", 2.0)))
	h.write(op(shardkvpb.WriteOp_LPUSH, "{r}l", members("c", "b", "a"))) // head below 0
	h.write(op(shardkvpb.WriteOp_RENAME, "{r}z", dest("{r}z2")))
	h.write(op(shardkvpb.WriteOp_COPY, "{r}l", dest("{r}l2")))
	r, _, _ := h.sm.ReadElems([]byte("{r}z2"), ElemQuery{Type: TypeZSet, RankOf: []byte("b"), Rev: true}, nil)
	if r.Len != 2 || r.Rank != 0 || !slices.Equal(h.zrange("{r}z2", byRank(-1, -1, false)), []string{"b:2"}) {
		t.Fatalf("renamed sorted set: size %d, zrevrank b %d, last %v", r.Len, r.Rank, h.zrange("{r}z2", byRank(-1, -1, false)))
	}
	if got := h.list("{r}l2"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("copied list: %v", got)
	}
	h.write(op(shardkvpb.WriteOp_ZREM, "{r}z2", members("a", "b")))
	if h.entry("{r}z2").Found {
		t.Fatal("the renamed sorted set outlived its last member")
	}
	// -0 shares the index's 0 but shows as -0, in ranges and pops too.
	h.write(op(shardkvpb.WriteOp_ZADD, "{r}n", scores("a", math.Copysign(0, -1), "b", 0.0)))
	if got := h.zrange("{r}n", byRank(0, -1, false)); !slices.Equal(got, []string{"a:-0", "b:0"}) {
		t.Fatalf("-0 in a range: %v", got)
	}
	if r := h.write(op(shardkvpb.WriteOp_ZPOPMIN, "{r}n", delta(1))).Result; !math.Signbit(must(ValueScore(r.Values[1]))) {
		t.Fatalf("-0 popped as %v", r.Values)
	}
}

// TestMoveFromNothing: SMOVE and LMOVE from a missing source answer
// "nothing moved" before looking at the destination's type, as Redis; LREM
// with the lowest count removes every match.
func TestMoveFromNothing(t *testing.T) {
	h := newSMHarness(t)
	h.write(op(shardkvpb.WriteOp_PUT, "{m}str", val("v")))
	if r := h.write(op(shardkvpb.WriteOp_SMOVE, "{m}none", dest("{m}str"), members("x"))).Result; r.Error != "" || r.Ok {
		t.Fatalf("smove from nothing to a string: %v", r)
	}
	if r := h.write(op(shardkvpb.WriteOp_LMOVE, "{m}none", dest("{m}str"))).Result; r.Error != "" || len(r.Values) != 0 {
		t.Fatalf("lmove from nothing to a string: %v", r)
	}
	h.write(op(shardkvpb.WriteOp_RPUSH, "{m}l", members("a", "b", "a")))
	if r := h.write(op(shardkvpb.WriteOp_LREM, "{m}l", delta(math.MinInt64), val("a"))).Result; r.Num != 2 {
		t.Fatalf("lrem with the lowest count: %v", r)
	}
}

// TestZSetPopBounds: pops start at the sorted set's score bounds
// (collMeta), which pops raise and adds widen; random ZADD, ZINCRBY, ZREM,
// ZREMRANGEBYSCORE, ZPOPMIN, ZPOPMAX and COPY against a model of the set
// must agree on every pop and on the whole set after each step, and the
// bounds must hold every member.
func TestZSetPopBounds(t *testing.T) {
	h := newSMHarness(t)
	rng := rand.New(rand.NewPCG(1, 2))
	model := map[string]float64{}
	key := "{b}z"
	sorted := func() []string {
		ms := slices.Collect(maps.Keys(model))
		slices.SortFunc(ms, func(a, b string) int {
			if c := cmp.Compare(model[a], model[b]); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		return ms
	}
	score := func() float64 {
		switch rng.IntN(20) {
		case 0:
			return math.Inf(-1)
		case 1:
			return math.Inf(1)
		}
		return float64(rng.IntN(200) - 100)
	}
	for step := range 3000 {
		var what string
		switch n := rng.IntN(100); {
		case n < 35:
			m, f := fmt.Sprintf("m%02d", rng.IntN(60)), score()
			what = fmt.Sprintf("zadd %s %v", m, f)
			h.write(op(shardkvpb.WriteOp_ZADD, key, scores(m, f)))
			model[m] = f
		case n < 45:
			m, f := fmt.Sprintf("m%02d", rng.IntN(60)), float64(rng.IntN(60)-30)
			what = fmt.Sprintf("zincrby %s %v", m, f)
			r := h.write(op(shardkvpb.WriteOp_ZADD, key, scores(m, f), delta(ZAddIncr))).Result
			if math.IsNaN(model[m] + f) {
				if r.Error != errNaN {
					t.Fatalf("step %d %s: %v, want NaN refused", step, what, r)
				}
				continue
			}
			model[m] += f
		case n < 52:
			m := fmt.Sprintf("m%02d", rng.IntN(60))
			what = "zrem " + m
			h.write(op(shardkvpb.WriteOp_ZREM, key, members(m)))
			delete(model, m)
		case n < 55:
			lo := float64(rng.IntN(200) - 100)
			hi := lo + float64(rng.IntN(20))
			what = fmt.Sprintf("zremrangebyscore %v %v", lo, hi)
			h.write(op(shardkvpb.WriteOp_ZREMRANGE, key, delta(ZByScore), func(o *shardkvpb.WriteOp) {
				o.Fields = [][]byte{Bound{Kind: BoundIncl, Score: lo}.Encode(ZByScore), Bound{Kind: BoundIncl, Score: hi}.Encode(ZByScore)}
			}))
			for m, f := range model {
				if f >= lo && f <= hi {
					delete(model, m)
				}
			}
		case n < 97:
			fromMin := n < 76
			cnt := 1 + rng.IntN(4)
			kind := shardkvpb.WriteOp_ZPOPMAX
			want := sorted()
			if fromMin {
				kind = shardkvpb.WriteOp_ZPOPMIN
			} else {
				slices.Reverse(want)
			}
			want = want[:min(cnt, len(want))]
			what = fmt.Sprintf("%v %d", kind, cnt)
			r := h.write(op(kind, key, delta(int64(cnt)))).Result
			var got []string
			for i := 0; i+1 < len(r.Values); i += 2 {
				got = append(got, string(r.Values[i]))
			}
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("step %d %s: popped %v, want %v", step, what, got, want)
			}
			for _, m := range want {
				delete(model, m)
			}
		default:
			// A copy keeps the bounds; carry on with it.
			key, what = h.copyOn(key, fmt.Sprintf("{b}z%d", step), len(model) > 0)
		}
		var want []string
		for _, m := range sorted() {
			want = append(want, fmt.Sprintf("%s:%g", m, model[m]))
		}
		got := []string{}
		if h.entry(key).Found {
			got = h.zrange(key, byRank(0, -1, false))
		}
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("step %d %s: set %v, want %v", step, what, got, want)
		}
	}
}

// TestSetPopBounds: SPOP starts at the set's lower bound on its members
// (collMeta), which pops raise and SADD and SMOVE widen; random SADD,
// SREM, SMOVE, SPOP and COPY against a model of the set must agree on
// what every pop may take and on the whole set after each step. Members
// are long (sharing a prefix longer than the bound keeps), short, empty,
// or end in zero bytes.
func TestSetPopBounds(t *testing.T) {
	h := newSMHarness(t)
	rng := rand.New(rand.NewPCG(3, 4))
	model := map[string]bool{}
	other := map[string]bool{}
	key, dst := "{p}s", "{p}other"
	// Pops raise the bound past "x"; a member moved in below it must
	// widen it, or the last pop misses that member.
	h.write(op(shardkvpb.WriteOp_SADD, "{p}x", members("x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9")))
	for range 8 {
		h.write(op(shardkvpb.WriteOp_SPOP, "{p}x", delta(1)))
	}
	h.write(op(shardkvpb.WriteOp_SADD, "{p}y", members("a")))
	h.write(op(shardkvpb.WriteOp_SMOVE, "{p}y", dest("{p}x"), members("a")))
	if r := h.write(op(shardkvpb.WriteOp_SPOP, "{p}x", delta(5))).Result; len(r.Values) != 2 {
		t.Fatalf("spop after smove in below the bound: %q, want 2 members", r.Values)
	}
	large := 0 // pops from a set past smallSet (a random start)
	member := func() string {
		n := rng.IntN(2000)
		switch rng.IntN(5) {
		case 0:
			return fmt.Sprintf("%c", 'a'+n%26)
		case 1:
			return ""
		case 2:
			return fmt.Sprintf("b%d\x00", n%50)
		case 3:
			if n%2 == 0 {
				return fmt.Sprintf("user:shared-prefix:%05d", n)
			}
			return strings.Repeat("L", maxSetLow+6) + fmt.Sprint(n) // past the bound's bytes
		}
		return fmt.Sprintf("m%03d", n)
	}
	check := func(step int, what, k string, want map[string]bool) {
		t.Helper()
		got := []string{}
		if h.entry(k).Found {
			got = h.set(k)
		}
		ws := slices.Sorted(maps.Keys(want))
		if !slices.Equal(got, ws) && !(len(got) == 0 && len(ws) == 0) {
			t.Fatalf("step %d %s: %s holds %q, want %q", step, what, k, got, ws)
		}
	}
	for step := range 5000 {
		var what string
		switch n := rng.IntN(100); {
		case n < 40:
			var ms []string
			for range 10 {
				ms = append(ms, member())
			}
			what = fmt.Sprintf("sadd %q", ms)
			h.write(op(shardkvpb.WriteOp_SADD, key, members(ms...)))
			for _, m := range ms {
				model[m] = true
			}
		case n < 47:
			m := member()
			what = fmt.Sprintf("srem %q", m)
			h.write(op(shardkvpb.WriteOp_SREM, key, members(m)))
			delete(model, m)
		case n < 55:
			// SMOVE both ways: the destination's bound widens too.
			from, to, fm, tm := key, dst, model, other
			if n < 51 {
				from, to, fm, tm = dst, key, other, model
			}
			m := member()
			if rng.IntN(2) == 0 {
				for x := range fm {
					m = x
					break
				}
			}
			what = fmt.Sprintf("smove %s %s %q", from, to, m)
			h.write(op(shardkvpb.WriteOp_SMOVE, from, dest(to), members(m)))
			if fm[m] {
				delete(fm, m)
				tm[m] = true
			}
			check(step, what, dst, other)
		case n < 58:
			ms := []string{member(), member()}
			what = fmt.Sprintf("sadd %s %q", dst, ms)
			h.write(op(shardkvpb.WriteOp_SADD, dst, members(ms...)))
			for _, m := range ms {
				other[m] = true
			}
		case n < 98:
			cnt := 1 + rng.IntN(3)
			if step%1500 == 1499 {
				cnt = 3000 // the whole set at once
			}
			if len(model) > smallSet {
				large++
			}
			what = fmt.Sprintf("spop %d", cnt)
			r := h.write(op(shardkvpb.WriteOp_SPOP, key, delta(int64(cnt)))).Result
			if want := min(cnt, len(model)); len(r.Values) != want {
				t.Fatalf("step %d %s: popped %d of %d members, want %d", step, what, len(r.Values), len(model), want)
			}
			for _, v := range r.Values {
				if !model[string(v)] {
					t.Fatalf("step %d %s: popped %q, not a member", step, what, v)
				}
				delete(model, string(v))
			}
		default:
			key, what = h.copyOn(key, fmt.Sprintf("{p}s%d", step), len(model) > 0)
		}
		// The whole set now and then (each pop is checked as it comes):
		// reading a few thousand members every step made the test slow.
		if step%25 == 0 || step%1500 == 1499 {
			check(step, what, key, model)
		}
	}
	check(-1, "the end", key, model)
	if large < 100 {
		t.Fatalf("only %d pops from a set of more than %d members", large, smallSet)
	}
}

// copyOn copies key to to and returns the key a model test goes on with
// (the copy, if there was anything to copy) and the step's description.
func (h *smHarness) copyOn(key, to string, nonEmpty bool) (string, string) {
	h.write(op(shardkvpb.WriteOp_COPY, key, dest(to)))
	if nonEmpty {
		return to, "copy to " + to
	}
	return key, "copy to " + to
}
