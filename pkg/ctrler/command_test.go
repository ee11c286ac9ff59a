package ctrler

import (
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// Entries as earlier controllers logged them (json.Marshal of their Command),
// and the protobuf command each must decode to.
var jsonEntries = []struct {
	json string
	want *shardkvpb.ControllerCommand
}{
	{`{"op":"init","shards":8,"placement":"balanced"}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Init{Init: &shardkvpb.ControllerInit{Shards: 8, Placement: "balanced"}}}},
	{`{"op":"join","client":7,"seq":1,"groups":[{"gid":1,"servers":[{"id":1,"addr":"a:1","resp_addr":"a:2"}]},{"gid":2,"servers":[{"id":1,"addr":"b:1"}],"weight":3}]}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Join{Join: &shardkvpb.JoinRequest{ClientId: 7, Seq: 1, Groups: []*shardkvpb.Group{
			{Gid: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a:1", RespAddr: "a:2"}}},
			{Gid: 2, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b:1"}}, Weight: 3},
		}}}}},
	{`{"op":"move","client":7,"seq":2,"shard":3,"gid":2}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: 7, Seq: 2, Shard: 3, Gid: 2}}}},
	{`{"op":"move","client":7,"seq":2,"shard":3,"gid":2}`, // a retry
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Move{Move: &shardkvpb.MoveRequest{ClientId: 7, Seq: 2, Shard: 3, Gid: 2}}}},
	{`{"op":"unpin","client":7,"seq":3,"shard":5}`, // refused: not pinned
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Unpin{Unpin: &shardkvpb.UnpinRequest{ClientId: 7, Seq: 3, Shard: 5}}}},
	{`{"op":"unpin","client":7,"seq":4,"shard":3}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Unpin{Unpin: &shardkvpb.UnpinRequest{ClientId: 7, Seq: 4, Shard: 3}}}},
	{`{"op":"leave","client":9,"seq":1,"gids":[1]}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Leave{Leave: &shardkvpb.LeaveRequest{ClientId: 9, Seq: 1, Gids: []uint64{1}}}}},
	{`{"op":"compact","below":2}`,
		&shardkvpb.ControllerCommand{Op: &shardkvpb.ControllerCommand_Compact{Compact: &shardkvpb.ControllerCompact{Below: 2}}}},
}

func TestJSONEntriesDecode(t *testing.T) {
	for _, e := range jsonEntries {
		got, err := decodeCommand([]byte(e.json))
		if err != nil {
			t.Fatalf("%s: %v", e.json, err)
		}
		if !proto.Equal(got, e.want) {
			t.Errorf("%s: decoded to %v, want %v", e.json, got, e.want)
		}
	}
	for _, bad := range []string{`{"op":"frobnicate"}`, `{"op":"move","shard":-1}`, `{"op":"init","shards":4294967552}`, `{"op":`} {
		if _, err := decodeCommand([]byte(bad)); err == nil {
			t.Errorf("%s: decoded without error", bad)
		}
	}
}

func openSM(t *testing.T) *StateMachine {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions("").WithInMemory(true).WithLogger(nil))
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

// A log of JSON entries and the same log in protobuf leave the same state:
// a replica that catches up through old entries agrees with the others.
func TestJSONAndProtobufLogsAgree(t *testing.T) {
	old, cur := openSM(t), openSM(t)
	t0 := time.Unix(1_700_000_000, 0)
	var oldEnts, curEnts []raftgroup.Entry
	for i, e := range jsonEntries {
		b, err := encodeCommand(e.want)
		if err != nil {
			t.Fatal(err)
		}
		at := t0.Add(time.Duration(i) * time.Second)
		oldEnts = append(oldEnts, raftgroup.Entry{Index: uint64(i + 1), Time: at, Cmd: []byte(e.json)})
		curEnts = append(curEnts, raftgroup.Entry{Index: uint64(i + 1), Time: at, Cmd: b})
	}
	for i := range oldEnts { // one entry per Apply, as replay may deliver them
		if err := raftgroup.ApplyAlone(old, old.store.DB(), oldEnts[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := raftgroup.ApplyAlone(cur, cur.store.DB(), curEnts); err != nil {
		t.Fatal(err)
	}
	for i := range oldEnts {
		a, b := oldEnts[i].Result.(Result), curEnts[i].Result.(Result)
		if !proto.Equal(a.Config, b.Config) || errString(a.Err) != errString(b.Err) {
			t.Errorf("entry %d (%s): JSON gave %v / %v, protobuf %v / %v", i, jsonEntries[i].json, a.Config, a.Err, b.Config, b.Err)
		}
	}
	if got := errString(oldEnts[4].Result.(Result).Err); got != "unpin: shard 5 is not pinned" {
		t.Errorf("unpin of an unpinned shard: %q", got)
	}
	if got, want := dump(t, old), dump(t, cur); !equalMaps(got, want) {
		t.Errorf("states differ:\nJSON     %v\nprotobuf %v", got, want)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func dump(t *testing.T, sm *StateMachine) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := sm.store.DB().View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key())] = string(v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// FuzzControllerCommandDecode: any entry decodes or fails cleanly, a decoded
// command survives a protobuf round trip, and computing the config it makes
// never panics.
func FuzzControllerCommandDecode(f *testing.F) {
	for _, e := range jsonEntries {
		f.Add([]byte(e.json))
		b, _ := encodeCommand(e.want)
		f.Add(b)
	}
	latest := &shardkvpb.Config{Num: 3, Shards: []uint64{1, 1, 2, 2}, Placement: "balanced",
		Groups: []*shardkvpb.Group{
			{Gid: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: "a"}}, Weight: 1},
			{Gid: 2, Servers: []*shardkvpb.Server{{Id: 1, Addr: "b"}}, Weight: 1},
		},
		Pins: []*shardkvpb.Pin{{Shard: 2, Gid: 2}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		cmd, err := decodeCommand(b)
		if err != nil {
			return
		}
		enc, err := encodeCommand(cmd)
		if err != nil {
			t.Fatalf("decoded command does not encode: %v", err)
		}
		again, err := decodeCommand(enc)
		if err != nil || !proto.Equal(cmd, again) {
			t.Fatalf("round trip: %v, %v -> %v", err, cmd, again)
		}
		if request(cmd) != nil {
			_, _ = nextConfig(latest, len(latest.Shards), "balanced", cmd)
		}
	})
}
