package shardkv

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Entries that reached the log without submit's checks (proposed by an
// older version, or committed before the checks existed) must become
// results at apply, the same on every replica, never an Apply error: an
// error stops every replica at that entry, and again at every restart.

func (h *smHarness) opError(op *shardkvpb.WriteOp) string {
	h.t.Helper()
	r := h.write(op)
	if r.Code != OK || r.Result == nil {
		h.t.Fatalf("op not executed: %+v", r)
	}
	return r.Result.Error
}

func TestApplyRefusesUnstorableKeys(t *testing.T) {
	h := newSMHarness(t)
	for _, tc := range []struct {
		key int
		exp int64
	}{{65000, 0}, {64997, 0}, {64995, h.now.UnixMilli() + 60_000}} {
		op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: bytes.Repeat([]byte{'k'}, tc.key), Value: []byte("v"), ExpireAtMs: tc.exp}
		if got := h.opError(op); got != shardkvpb.OpErrKeyTooLarge {
			t.Errorf("SET of a %d-byte key (expiry %d): %q, want %s", tc.key, tc.exp, got, shardkvpb.OpErrKeyTooLarge)
		}
	}
	if got := h.opError(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: bytes.Repeat([]byte{'k'}, MaxKeyBytesLimit), Value: []byte("v"), ExpireAtMs: h.now.UnixMilli() + 60_000}); got != "" {
		t.Errorf("SET EX of a %d-byte key: %q", MaxKeyBytesLimit, got)
	}
}

func TestApplyRefusesCommandPastOneTransaction(t *testing.T) {
	h := newSMHarness(t)
	key := func(i int) []byte { return fmt.Appendf(nil, "{a}%d", i) }
	for from := 0; from < 13200; from += 2000 {
		cmd := &shardkvpb.GroupCommand{}
		for i := from; i < min(from+2000, 13200); i++ {
			cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: key(i), Value: []byte("v")})
		}
		h.apply(cmd)
	}
	del := &shardkvpb.GroupCommand{}
	for i := range 13200 {
		del.Writes = append(del.Writes, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: key(i)})
	}
	res := h.apply(del).([]OpResult)
	for i, r := range res {
		if r.Result.GetError() != shardkvpb.OpErrCommandTooLarge {
			t.Fatalf("op %d: %+v, want %s", i, r.Result, shardkvpb.OpErrCommandTooLarge)
		}
	}
	if got := h.get("{a}0"); got != "v" {
		t.Fatalf("a key of the refused DEL reads %q", got)
	}
	var applied uint64
	h.sm.store.DB().View(func(txn *badger.Txn) error {
		applied, _ = raftgroup.LoadApplied(txn, keyApplied)
		return nil
	})
	if applied != h.index {
		t.Fatalf("applied index %d, want %d", applied, h.index)
	}
}

func TestApplyChecksAppendResult(t *testing.T) {
	h := newSMHarness(t)
	piece := bytes.Repeat([]byte{'a'}, 200)
	cmd := func() *shardkvpb.GroupCommand {
		return &shardkvpb.GroupCommand{MaxValueBytes: 500, Writes: []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("log"), Value: piece}}}
	}
	var last OpResult
	for range 3 {
		last = h.apply(cmd()).([]OpResult)[0]
	}
	if last.Result.GetError() != shardkvpb.OpErrValueTooLarge || len(h.get("log")) != 400 {
		t.Fatalf("third append: %+v, value %d bytes", last.Result, len(h.get("log")))
	}
}

func TestApplyBadRecordIsAResult(t *testing.T) {
	h := newSMHarness(t)
	s := shardOf(h, "bad")
	if err := h.sm.store.DB().Update(func(txn *badger.Txn) error {
		if err := txn.Set(dataKey(s, []byte("bad")), []byte("short")); err != nil {
			return err
		}
		return txn.Set(sessionKey(s, 5), []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	if got := h.opError(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: []byte("bad"), Value: []byte("x")}); got != shardkvpb.OpErrBadRecord {
		t.Fatalf("append to a bad record: %q", got)
	}
	if got := h.opError(appendOp("bad", "x", 5, 1, 0)); got != shardkvpb.OpErrBadRecord {
		t.Fatalf("write of a bad session: %q", got)
	}
}

// A session keeping ReturnPrev results is bounded: it drops its oldest
// results (a retry of one gets ResultForgotten, never a second apply).
func TestSessionRecordBounded(t *testing.T) {
	h := newSMHarness(t)
	big := bytes.Repeat([]byte{'p'}, 20<<10)
	for seq := uint64(1); seq <= 10; seq++ {
		h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: big, ReturnPrev: true,
			Session: &shardkvpb.Session{ClientId: 3, Seq: seq}})
	}
	var n int
	h.sm.store.DB().View(func(txn *badger.Txn) error {
		v, _ := raftgroup.GetValue(txn, sessionKey(shardOf(h, "k"), 3))
		n = len(v)
		return nil
	})
	if n > MaxSessionBytes {
		t.Fatalf("session record of %d bytes, limit %d", n, MaxSessionBytes)
	}
	r := h.write(&shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("k"), Value: big, ReturnPrev: true,
		Session: &shardkvpb.Session{ClientId: 3, Seq: 1}})
	if r.Code != ResultForgotten {
		t.Fatalf("retry of a dropped result: %+v, want ResultForgotten", r)
	}
}

// A write command whose ops return previous values (reads made in a write
// batch, GETSET) returns at most EntryMaxResultBytes of them: every replica
// holds them until the entry is applied. Before the limit, one entry of
// 200 reads of an 8 MiB key made every replica hold 1.6 GiB.
func TestApplyBoundsReturnedValues(t *testing.T) {
	h := newSMHarness(t)
	big := bytes.Repeat([]byte{'v'}, 8<<20)
	h.apply(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_PUT, Key: []byte("{a}big"), Value: big}}})
	read := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Cond: shardkvpb.WriteOp_IF_GREATER, Key: []byte("{a}big"), ReturnPrev: true}
	cmd := &shardkvpb.GroupCommand{}
	for range 12 {
		cmd.Writes = append(cmd.Writes, read)
	}
	// A GETSET past the limit must not run: its new value is not stored.
	cmd.Writes = append(cmd.Writes, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: []byte("{a}big"), Value: []byte("new"), ReturnPrev: true})
	res := h.apply(cmd).([]OpResult)
	fit := EntryMaxResultBytes / len(big)
	for i, r := range res {
		switch {
		case i < fit && (r.Result.GetError() != "" || len(r.Result.GetPrev()) != len(big)):
			t.Errorf("op %d (within the limit): error %q, %d bytes returned", i, r.Result.GetError(), len(r.Result.GetPrev()))
		case i >= fit && (r.Result.GetError() != shardkvpb.OpErrResultTooLarge || r.Result.GetPrev() != nil):
			t.Errorf("op %d (past the limit): error %q, %d bytes returned; want %s", i, r.Result.GetError(), len(r.Result.GetPrev()), shardkvpb.OpErrResultTooLarge)
		}
	}
	if got := h.get("{a}big"); len(got) != len(big) {
		t.Fatalf("the refused GETSET changed the value: %d bytes", len(got))
	}
	// The limit is per command: the next one reads again.
	res = h.apply(&shardkvpb.GroupCommand{Writes: []*shardkvpb.WriteOp{read}}).([]OpResult)
	if len(res[0].Result.GetPrev()) != len(big) {
		t.Fatalf("next command: %+v", res[0].Result.GetError())
	}
}
