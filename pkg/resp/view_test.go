package resp_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// viewBackend serves a fixed topology and refuses every key as unowned:
// the layouts a test world does not produce (hostnames, IPv6, a group with
// no known leader, a slot range of one slot).
type viewBackend struct{ topo shardkv.Topology }

func (v *viewBackend) Users() *shardkvpb.UsersReply { return &shardkvpb.UsersReply{} }

func (v *viewBackend) SetUsers(context.Context, *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error) {
	return nil, errors.New("no users here")
}

func (v *viewBackend) ReadKeys(context.Context, [][]byte, bool, func(int) bool) ([]shardkv.ValueEntry, error) {
	return nil, &shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Msg: "no config yet"}
}

func (v *viewBackend) ReadElems(context.Context, []byte, shardkv.ElemQuery, bool, func(int) bool) (shardkv.ElemsReply, error) {
	return shardkv.ElemsReply{}, &shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Msg: "no config yet"}
}

func (v *viewBackend) ReadElemsOf(context.Context, [][]byte, shardkv.ElemQuery, bool, func(int) bool) ([]shardkv.ElemsReply, error) {
	return nil, &shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Msg: "no config yet"}
}

func (v *viewBackend) WatchKeys([][]byte) (<-chan struct{}, func()) {
	return make(chan struct{}), func() {}
}

func (v *viewBackend) WriteBatch(context.Context, []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
	return nil, &shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Msg: "no config yet"}
}

func (v *viewBackend) Topology() shardkv.Topology { return v.topo }

func (v *viewBackend) KeyCounts() (shardkv.KeyCounts, error) {
	return shardkv.KeyCounts{Total: 3, Expires: 1,
		ByState: map[shardkv.ShardState]int{shardkv.Serving: 2, shardkv.BePulling: 1},
		Shards:  map[shardkv.ShardState]int{shardkv.Serving: 4, shardkv.BePulling: 1}}, nil
}

func (v *viewBackend) CountKeysInSlot(int) (int, error)      { return 0, nil }
func (v *viewBackend) KeysInSlot(int, int) ([][]byte, error) { return nil, nil }
func (v *viewBackend) RandomKey() ([]byte, error)            { return nil, nil }
func (v *viewBackend) Scan([]byte, int, func([]byte) bool) ([][]byte, []byte, error) {
	return nil, nil, nil
}
func (v *viewBackend) RaftStatus() *shardkvpb.MemberStatus {
	return &shardkvpb.MemberStatus{GroupId: 1, Id: 1, Role: "follower", Term: 4, Applied: 42}
}
func (v *viewBackend) MaxValueBytes() int { return 1024 }
func (v *viewBackend) MaxKeyBytes() int   { return 64 }

func TestClusterViewLayouts(t *testing.T) {
	// Group 1: replicas 1 (this one, a hostname) and 2, no known leader;
	// group 2: replicas 1 (the leader) and 2, on IPv6. One slot per shard:
	// group 2 owns slot 101 only, group 1 the two ranges around it.
	type nd struct{ ID, Addr string }
	a := nd{resp.NodeID(1, 1), "node-a.svc:6379"}
	b := nd{resp.NodeID(1, 2), "10.0.0.2:6379"}
	c := nd{resp.NodeID(2, 1), "[::1]:7000"}
	d := nd{resp.NodeID(2, 2), "[::1]:7001"}
	conf := &shardkvpb.Config{Num: 7, Shards: make([]uint64, 16384), Groups: []*shardkvpb.Group{
		{Gid: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: "g1", RespAddr: a.Addr}, {Id: 2, Addr: "g2", RespAddr: b.Addr}}},
		{Gid: 2, Servers: []*shardkvpb.Server{{Id: 1, Addr: "g3", RespAddr: c.Addr}, {Id: 2, Addr: "g4", RespAddr: d.Addr}}},
	}}
	for s := range conf.Shards {
		conf.Shards[s] = 1
		if s == 101 {
			conf.Shards[s] = 2
		}
	}
	vb := &viewBackend{topo: shardkv.Topology{GID: 1, ReplicaID: 1, Applied: conf, Newest: conf, Leaders: map[uint64]uint64{2: 1}}}
	_, addr := extraServer(t, resp.Config{MaxValueBytes: 4096}, vb)
	conn := dial(t, addr)
	defer conn.c.Close()

	// A group with no known leader shows its first node as the master, so
	// that every slot has one; a hostname is in the address field and after
	// the comma; IPv6 addresses are written without brackets.
	nodes := regexp.MustCompile(` 0 \d+ 7 connected`).ReplaceAllString(conn.do("cluster", "nodes").(string), " 0 T 7 connected")
	expect(t, nodes, a.ID+" node-a.svc:6379@16379,node-a.svc myself,master - 0 T 7 connected 0-100 102-16383\n"+
		b.ID+" 10.0.0.2:6379@16379 slave "+a.ID+" 0 T 7 connected\n"+
		c.ID+" ::1:7000@17000 master - 0 T 7 connected 101\n"+
		d.ID+" ::1:7001@17001 slave "+c.ID+" 0 T 7 connected\n")
	expect(t, conn.do("cluster", "slots"), []any{
		[]any{int64(0), int64(100), []any{"node-a.svc", int64(6379), a.ID, []any{"hostname", "node-a.svc"}}, []any{"10.0.0.2", int64(6379), b.ID, []any{}}},
		[]any{int64(101), int64(101), []any{"::1", int64(7000), c.ID, []any{}}, []any{"::1", int64(7001), d.ID, []any{}}},
		[]any{int64(102), int64(16383), []any{"node-a.svc", int64(6379), a.ID, []any{"hostname", "node-a.svc"}}, []any{"10.0.0.2", int64(6379), b.ID, []any{}}},
	})
	shards := conn.do("cluster", "shards").([]any)
	expect(t, shards[0], []any{"slots", []any{int64(0), int64(100), int64(102), int64(16383)}, "nodes", []any{
		[]any{"id", a.ID, "port", int64(6379), "ip", "node-a.svc", "endpoint", "node-a.svc", "hostname", "node-a.svc", "role", "master", "replication-offset", int64(42), "health", "online"},
		[]any{"id", b.ID, "port", int64(6379), "ip", "10.0.0.2", "endpoint", "10.0.0.2", "role", "replica", "replication-offset", int64(0), "health", "online"},
	}})
	expect(t, shards[1].([]any)[1], []any{int64(101), int64(101)})
	info := conn.do("cluster", "info").(string)
	for _, want := range []string{"cluster_state:ok\r\n", "cluster_slots_assigned:16384\r\n", "cluster_known_nodes:4\r\n", "cluster_size:2\r\n", "cluster_current_epoch:7\r\n"} {
		if !strings.Contains(info, want) {
			t.Errorf("CLUSTER INFO lacks %q: %q", want, info)
		}
	}
	expect(t, conn.do("cluster", "myid"), a.ID)
	if h := conn.do("hello").([]any); h[11] != "replica" {
		t.Errorf("HELLO role: %v", h[11])
	}
	expect(t, conn.do("info", "replication"), "# Replication\r\nrole:slave\r\nmaster_host:\r\nmaster_port:0\r\nmaster_link_status:down\r\nconnected_slaves:0\r\nmaster_repl_offset:42\r\n")

	// Key counts: DBSIZE and INFO count every key held, by shard state.
	expect(t, conn.do("dbsize"), int64(3))
	expect(t, conn.do("info", "keyspace"), "# Keyspace\r\ndb0:keys=3,expires=1,avg_ttl=0\r\n")
	raft := conn.do("info", "raft").(string)
	for _, want := range []string{"raft_role:follower\r\n", "raft_term:4\r\n", "raft_applied_index:42\r\n", "config_num:7\r\n",
		"keys_serving:2\r\n", "keys_bepulling:1\r\n", "keys_pulling:0\r\n", "shards_serving:4\r\n", "shards_bepulling:1\r\n"} {
		if !strings.Contains(raft, want) {
			t.Errorf("INFO raft lacks %q: %q", want, raft)
		}
	}

	// Refusals before any config; limits from the backend.
	expect(t, conn.do("get", "k"), rerr("CLUSTERDOWN Hash slot not served"))
	expect(t, conn.do("set", "k", "v"), rerr("CLUSTERDOWN Hash slot not served"))
	expect(t, conn.do("set", "k", strings.Repeat("v", 1025)), rerr("ERR value of 1025 bytes exceeds the limit of 1024 bytes"))
	expect(t, conn.do("mset", "{k}a", "v", "{k}"+strings.Repeat("k", 65), "v"), rerr("ERR key of 68 bytes exceeds the limit of 64 bytes"))
	expect(t, conn.do("scan", "0"), []any{"0", []any{}})
}

// TestRefusedOneAtATime: a client that waits for each reply starts a new
// burst with each command, so a refusal is never carried over to the next
// command as "the first command of this pipeline was refused". The
// executor's and writer's bookkeeping once trailed the reply on the wire,
// and a quick client's next command was taken for the same pipeline.
func TestRefusedOneAtATime(t *testing.T) {
	vb := &viewBackend{topo: shardkv.Topology{GID: 1, ReplicaID: 1}}
	_, addr := extraServer(t, resp.Config{MaxValueBytes: 4096}, vb)
	conn := dial(t, addr)
	defer conn.c.Close()
	for i := range 3000 {
		if got := conn.do("set", "k", "v"); got != rerr("CLUSTERDOWN Hash slot not served") {
			t.Fatalf("command %d: got %v", i, got)
		}
	}
}
