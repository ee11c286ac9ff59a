package shardkv

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// sessionRecords is shard s's sessions, key to record.
func sessionRecords(t *testing.T, sm *StateMachine, s int) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		return sessionsWritten(txn, s, 0, func(k, v []byte) error {
			out[string(k)] = string(v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPreCopyShipsSessionsAhead: the pre-copy rounds carry the shard's
// sessions, so the last round (behind the write barrier) carries only the
// sessions written since the round before, not the whole dedup table: with
// 300 clients and one of them writing after the last pre-copy round, the
// last round holds that one session and its key (and at most the session
// written at exactly the round before's log time, which may be sent twice). The copy ends with every
// session equal to the source's, and a retry of the late write at the new
// owner is answered from its session, not run again. (Before, every last
// round sent all 300.)
func TestPreCopyShipsSessionsAhead(t *testing.T) {
	groups := []*shardkvpb.Group{{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1"}}}, {Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}}}
	const s = 1
	conf1 := &shardkvpb.Config{Num: 1, Shards: []uint64{7, 7, 8, 7}, Groups: groups}
	conf2 := &shardkvpb.Config{Num: 2, Shards: []uint64{7, 7, 8, 7}, Groups: groups,
		Moves: []*shardkvpb.PlannedMove{{Shard: s, FromGid: 7, ToGid: 8, SinceConfig: 2}}}
	conf3 := &shardkvpb.Config{Num: 3, Shards: []uint64{7, 8, 8, 7}, Groups: groups}
	key := func(i int) []byte {
		for j := 0; ; j++ {
			k := fmt.Appendf(nil, "k%d-%d", i, j)
			if shardOfKey4(k) == s {
				return k
			}
		}
	}

	src := &smHarness{t: t, sm: openSM(t, 7), now: time.Unix(1_800_000_000, 0)}
	dst := &smHarness{t: t, sm: openSM(t, 8), now: src.now}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf1})
	for i := range 300 {
		src.now = src.now.Add(time.Millisecond)
		if r := src.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: key(i), Value: []byte("v"),
			Session: &shardkvpb.Session{ClientId: uint64(10 + i), Seq: 1}}); !r.Result.GetOk() {
			t.Fatalf("put: %v", r)
		}
	}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf2})
	if m := dst.sm.Shard(s); m.State != PreCopying {
		t.Fatalf("target shard %d: %v, want PreCopying", s, m)
	}
	// The snapshot, then one round of changes while the source serves.
	err := src.sm.StreamShard(s, nil, false, func(c *shardkvpb.ShardChunk) error {
		at := dst.sm.Shard(s)
		if r := dst.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: s, ConfigNum: 2, Precopy: true, AfterKey: at.Resume, Resume: at.Resumed,
			Kvs: c.Kvs, Last: c.Last, TotalKeys: c.TotalKeys, SourceIndex: c.SourceIndex, LogTimeNs: c.LogTimeNs}}); r != nil {
			return fmt.Errorf("snapshot chunk: %v", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	round := func(num uint64, precopy, frozen bool) (sessions, records int) {
		t.Helper()
		at := dst.sm.Shard(s)
		err := src.sm.StreamChanges(s, at.Cursor, at.SessionsAt, frozen, 0, func(c *shardkvpb.ShardChunk) error {
			for _, kv := range c.Kvs {
				if kv.Key[3] == tagSession {
					sessions++
				} else {
					records++
				}
			}
			cur := dst.sm.Shard(s)
			if r := dst.apply(&shardkvpb.GroupCommand{Insert: &shardkvpb.InsertChunk{Shard: s, ConfigNum: num, Precopy: precopy, Delta: true,
				Cursor: cur.Cursor, NextCursor: c.NextCursor, Kvs: c.Kvs, Last: c.Last, CaughtUp: c.CaughtUp,
				SourceIndex: c.SourceIndex, LogTimeNs: c.LogTimeNs, SessionsAt: c.SessionsAt}}); r != nil {
				return fmt.Errorf("round chunk: %v", r)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return sessions, records
	}
	if n, _ := round(2, true, false); n != 300 {
		t.Fatalf("the first round of changes sent %d sessions, want all 300", n)
	}
	// A round with nothing new brings at most the sessions written at
	// exactly the last round's log time, which the target holds already:
	// the puller finds it idle (no entry).
	at := dst.sm.Shard(s)
	var again []*shardkvpb.KeyValue
	if err := src.sm.StreamChanges(s, at.Cursor, at.SessionsAt, false, 0, func(c *shardkvpb.ShardChunk) error {
		again = append(again, c.Kvs...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(again) > 1 || !dst.sm.holdsSessions(again) {
		t.Fatalf("a round with nothing new sent %d records, not all held by the target", len(again))
	}
	// One client writes again; then the cut-over freezes the shard.
	src.now = src.now.Add(time.Second)
	late := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: key(0), Value: []byte("+late"), Session: &shardkvpb.Session{ClientId: 10, Seq: 2, Ack: 1}}
	if r := src.write(late); !r.Result.GetOk() {
		t.Fatalf("late write: %v", r)
	}
	src.apply(&shardkvpb.GroupCommand{NextConfig: conf3})
	dst.apply(&shardkvpb.GroupCommand{NextConfig: conf3})
	// The late write's session and key, and at most the one session
	// written at exactly the previous round's log time.
	if n, recs := round(3, false, true); n < 1 || n > 2 || recs != 1 {
		t.Fatalf("the last round sent %d sessions and %d records, want the 1 session (or 2) and 1 key written since the round before", n, recs)
	}
	if m := dst.sm.Shard(s); m.State != Acking {
		t.Fatalf("target shard %d after the last round: %v, want Acking", s, m)
	}
	a, b := sessionRecords(t, src.sm, s), sessionRecords(t, dst.sm, s)
	if len(a) != 300 || len(b) != 300 {
		t.Fatalf("sessions: source %d, target %d; want 300 each", len(a), len(b))
	}
	for k, v := range a {
		if !bytes.Equal([]byte(b[k]), []byte(v)) {
			t.Fatalf("session %x differs on the target", k)
		}
	}
	// A retry of the late write at the new owner is answered, not run again.
	dst.now = src.now.Add(time.Millisecond)
	if r := dst.write(late); !r.Result.GetOk() {
		t.Fatalf("retry at the target: %v", r)
	}
	if got := dst.get(string(key(0))); got != "v+late" {
		t.Fatalf("key after the retry: %q, want the late append once", got)
	}
}

// shardOfKey4 is key's shard among 4.
func shardOfKey4(k []byte) int {
	sm := &StateMachine{config: &shardkvpb.Config{Shards: make([]uint64, 4)}}
	return shardOfKey(sm, k)
}
