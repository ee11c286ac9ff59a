package resp_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// testConnection: PING, ECHO, HELLO, CLIENT, COMMAND, CONFIG.
func (e *env) testConnection(t *testing.T) {
	c := dial(t, e.leaderAddr(gA))
	defer c.c.Close()
	expect(t, c.do("ping"), status("PONG"))
	expect(t, c.do("ping", "hi"), "hi")
	expect(t, c.do("echo", "a b"), "a b")
	id := c.do("client", "id").(int64)
	expect(t, c.do("hello"), []any{"server", "redis", "version", "7.0.0", "proto", int64(2), "id", id, "mode", "cluster", "role", "master", "modules", []any{}})
	expect(t, c.do("hello", "2", "setname", "n1"), []any{"server", "redis", "version", "7.0.0", "proto", int64(2), "id", id, "mode", "cluster", "role", "master", "modules", []any{}})
	expect(t, c.do("client", "getname"), "n1")
	expect(t, c.do("client", "setname", "n2"), status("OK"))
	expect(t, c.do("client", "getname"), "n2")
	expect(t, c.do("client", "setname", ""), status("OK"))
	expect(t, c.do("client", "getname"), nil)
	expect(t, c.do("client", "setinfo", "LIB-NAME", "mylib"), status("OK"))
	expect(t, c.do("client", "setinfo", "lib-ver", "1.0"), status("OK"))
	expect(t, c.do("client", "setinfo", "foo", "1"), rerr("ERR Unrecognized option 'foo'"))
	expect(t, c.do("client", "setinfo", "lib-name", "a b"), rerr("ERR lib-name cannot contain spaces, newlines or special characters."))
	info := c.do("client", "info").(string)
	for _, want := range []string{fmt.Sprintf("id=%d ", id), " lib-name=mylib ", " lib-ver=1.0 ", " cmd=client|info ", " flags=N "} {
		if !strings.Contains(info, want) || !strings.HasSuffix(info, "\n") {
			t.Errorf("CLIENT INFO %q lacks %q", info, want)
		}
	}
	if l := c.do("client", "list").(string); !strings.Contains(l, fmt.Sprintf("id=%d ", id)) {
		t.Errorf("CLIENT LIST %q lacks this client", l)
	}
	f := dial(t, e.w.RESPAddr(gA, e.follower(gA)))
	defer f.c.Close()
	if h := f.do("hello").([]any); h[11] != "replica" {
		t.Errorf("HELLO on a follower: %v", h)
	}
	expect(t, f.do("readonly"), status("OK"))
	if info := f.do("client", "info").(string); !strings.Contains(info, " flags=r ") {
		t.Errorf("CLIENT INFO after READONLY: %q", info)
	}

	// COMMAND: Redis 7's 10-field entries.
	n := c.do("command", "count").(int64)
	if all := c.do("command").([]any); int64(len(all)) != n || n < 40 {
		t.Errorf("COMMAND: %d entries, COUNT %d", len(all), n)
	}
	expect(t, c.do("command", "info", "get", "nosuch"), []any{
		[]any{"get", int64(2), []any{status("readonly"), status("fast")}, int64(1), int64(1), int64(1),
			[]any{status("@read"), status("@string"), status("@fast")}, []any{},
			[]any{[]any{"flags", []any{status("RO"), status("access")}, "begin_search", []any{"type", "index", "spec", []any{"index", int64(1)}},
				"find_keys", []any{"type", "range", "spec", []any{"lastkey", int64(0), "keystep", int64(1), "limit", int64(0)}}}},
			[]any{}},
		nil,
	})
	ms := c.do("command", "info", "MSET").([]any)[0].([]any)
	expect(t, ms[:6], []any{"mset", int64(-3), []any{status("write"), status("denyoom")}, int64(1), int64(-1), int64(2)})
	cl := c.do("command", "info", "client").([]any)[0].([]any)
	if subs := cl[9].([]any); len(subs) < 5 || subs[0].([]any)[0] != "client|id" {
		t.Errorf("COMMAND INFO client subcommands: %v", cl[9])
	}
	if l := c.do("command", "list").([]any); len(l) < int(n) {
		t.Errorf("COMMAND LIST: %v", l)
	}
	expect(t, c.do("command", "docs"), []any{})
	expect(t, c.do("command", "getkeys", "mset", "a", "1", "b", "2"), []any{"a", "b"})
	expect(t, c.do("command", "getkeys", "MGET", "a", "b"), []any{"a", "b"})
	if h := c.do("client", "help").([]any); len(h) < 3 {
		t.Errorf("CLIENT HELP: %v", h)
	}
	expect(t, c.do("config", "get", "save"), []any{"save", ""})
	expect(t, c.do("config", "get", "APPENDONLY", "maxclients"), []any{"appendonly", "no", "maxclients", "10000"})
	if all := c.do("config", "get", "*").([]any); len(all) < 8 || strings.Contains(fmt.Sprint(all), "pass") {
		t.Errorf("CONFIG GET *: %v", all)
	}
}

// testInfo: INFO sections and DBSIZE, from any replica's own state.
func (e *env) testInfo(t *testing.T) {
	k := e.keyIn(gB, "info:")
	expect(t, e.do("set", k, "v", "ex", "100"), status("OK"))
	l := e.conn(e.leaderAddr(gB))
	info := l.do("info").(string)
	for _, want := range []string{
		"# Server\r\nredis_version:7.0.0\r\n", "redis_mode:cluster\r\n", "shardkv_version:",
		"# Clients\r\nconnected_clients:", "maxclients:10000\r\n",
		"# Stats\r\n", "total_commands_processed:",
		"# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,",
		"# Cluster\r\ncluster_enabled:1\r\n",
		"# Keyspace\r\ndb0:keys=", ",avg_ttl=0\r\n",
		"# Raft\r\n", "raft_role:leader\r\n", fmt.Sprintf("raft_group_id:%d\r\n", gB), "keys_serving:", "shards_serving:8\r\n",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO lacks %q:\n%s", want, info)
		}
	}
	fid := e.follower(gB)
	f := e.conn(e.w.RESPAddr(gB, fid))
	host, port, _ := strings.Cut(e.leaderAddr(gB), ":")
	repl := f.do("info", "replication").(string)
	if !regexp.MustCompile("^# Replication\r\nrole:slave\r\nmaster_host:" + host + "\r\nmaster_port:" + port + "\r\nmaster_link_status:up\r\nconnected_slaves:0\r\nmaster_repl_offset:[1-9][0-9]*\r\n$").MatchString(repl) {
		t.Errorf("INFO replication on a follower: %q", repl)
	}
	sections := f.do("info", "keyspace", "CLUSTER").(string)
	if !strings.HasPrefix(sections, "# Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\ndb0:keys=") || strings.Contains(sections, "# Server") {
		t.Errorf("INFO keyspace cluster: %q", sections)
	}
	expect(t, f.do("info", "nosuch"), "")
	// Memory, CPU and command statistics, as Redis's INFO has them:
	// commandstats only when asked for (or "all"/"everything").
	for _, want := range []string{"# Memory\r\nused_memory:", "used_memory_rss:", "maxmemory_policy:noeviction\r\n", "# CPU\r\nused_cpu_sys:", "used_cpu_user:"} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO lacks %q", want)
		}
	}
	if strings.Contains(info, "# Commandstats") || strings.Contains(l.do("info", "default").(string), "# Commandstats") {
		t.Error("INFO and INFO default show commandstats; Redis shows them only when asked")
	}
	s := dial(t, e.leaderAddr(gB))
	defer s.c.Close()
	ks := e.keyIn(gB, "cmdstat:")
	for range 3 {
		expect(t, s.do("set", ks, "v"), status("OK"))
	}
	expect(t, s.do("incr", ks), rerr("ERR value is not an integer or out of range"))
	expect(t, s.do("get", ks, "extra"), rerr("ERR wrong number of arguments for 'get' command"))
	stats := s.do("info", "commandstats").(string)
	for _, re := range []string{
		`(?m)^cmdstat_set:calls=([3-9]|\d\d+),usec=\d+,usec_per_call=\d+\.\d\d,rejected_calls=\d+,failed_calls=\d+\r$`,
		`(?m)^cmdstat_incr:calls=\d+,usec=\d+,usec_per_call=[\d.]+,rejected_calls=\d+,failed_calls=[1-9]\d*\r$`,
		`(?m)^cmdstat_get:calls=\d+,usec=\d+,usec_per_call=[\d.]+,rejected_calls=[1-9]\d*,failed_calls=\d+\r$`,
		`(?m)^cmdstat_info:calls=[1-9]`,
	} {
		if !regexp.MustCompile(re).MatchString(stats) {
			t.Errorf("INFO commandstats does not match %s:\n%s", re, stats)
		}
	}
	for _, sec := range []string{"all", "everything"} {
		if !strings.Contains(s.do("info", sec).(string), "# Commandstats\r\ncmdstat_") {
			t.Errorf("INFO %s lacks commandstats", sec)
		}
	}
	// DBSIZE: every key the replica holds; followers catch up.
	want := l.do("dbsize").(int64)
	if want < 1 {
		t.Fatalf("dbsize %d", want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.do("dbsize").(int64) != want {
		if time.Now().After(deadline) {
			t.Fatalf("follower dbsize %v, leader %d", f.do("dbsize"), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ks := l.do("info", "keyspace").(string); !strings.Contains(ks, fmt.Sprintf("db0:keys=%d,", want)) {
		t.Errorf("INFO keyspace %q, DBSIZE %d", ks, want)
	}
}

// testAuth runs a server with a password on a replica's group.
func (e *env) testAuth(t *testing.T) {
	_, addr := extraServer(t, resp.Config{Password: "secret"}, e.w.Group(gA, e.leader(gA)))
	c := dial(t, addr)
	defer c.c.Close()
	k := e.keyIn(gA, "auth:")
	noauth := rerr("NOAUTH Authentication required.")
	expect(t, c.do("get", k), noauth)
	expect(t, c.do("ping"), noauth)
	expect(t, c.do("cluster", "slots"), noauth)
	expect(t, c.do("client", "id"), noauth)
	// As Redis: unknown commands and wrong arity are reported first.
	expect(t, c.do("nosuch"), rerr("ERR unknown command 'nosuch', with args beginning with: "))
	expect(t, c.do("get"), rerr("ERR wrong number of arguments for 'get' command"))
	wrong := rerr("WRONGPASS invalid username-password pair or user is disabled.")
	expect(t, c.do("auth", "bad"), wrong)
	expect(t, c.do("auth", "default", "bad"), wrong)
	expect(t, c.do("auth", "other", "secret"), wrong)
	expect(t, c.do("auth", "a", "b", "c"), rerr("ERR syntax error"))
	expect(t, c.do("hello"), rerr("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"))
	expect(t, c.do("hello", "2", "auth", "default", "bad"), wrong)
	expect(t, c.do("get", k), noauth)
	if h, ok := c.do("hello", "2", "auth", "default", "secret").([]any); !ok || len(h) != 14 {
		t.Fatalf("HELLO AUTH: %v", h)
	}
	expect(t, c.do("get", k), nil)
	c2 := dial(t, addr)
	defer c2.c.Close()
	expect(t, c2.do("auth", "secret"), status("OK"))
	expect(t, c2.do("set", k, "v"), status("OK"))
	c3 := dial(t, addr)
	expect(t, c3.do("quit"), status("OK"), "QUIT needs no password")
	if !c3.closed() {
		t.Error("open after QUIT")
	}
	// go-redis: HELLO 3 with AUTH (RESP3, go-redis's default).
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: "secret", ReadTimeout: slow})
	defer rdb.Close()
	if v, err := rdb.Get(context.Background(), k).Result(); err != nil || v != "v" {
		t.Fatalf("go-redis with a password: %q, %v", v, err)
	}
	bad := redis.NewClient(&redis.Options{Addr: addr, Password: "nope", MaxRetries: -1, ReadTimeout: slow})
	defer bad.Close()
	if err := bad.Ping(context.Background()).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("go-redis with a wrong password: %v", err)
	}
}

// testLimits: max clients, request size, malformed RESP, inline commands.
func (e *env) testLimits(t *testing.T) {
	g := e.w.Group(gA, e.leader(gA))
	k := e.keyIn(gA, "lim:")

	// Client activity: the hook runs as commands arrive, not before.
	var batches atomic.Int64
	_, actAddr := extraServer(t, resp.Config{OnCommands: func() { batches.Add(1) }}, g)
	act := dial(t, actAddr)
	if n := batches.Load(); n != 0 {
		t.Errorf("OnCommands ran %d times before any command", n)
	}
	expect(t, act.do("ping"), status("PONG"))
	if n := batches.Load(); n < 1 {
		t.Errorf("OnCommands ran %d times after a command", n)
	}
	act.c.Close()

	// Max clients: the next client gets Redis's error and is closed.
	s, addr := extraServer(t, resp.Config{MaxClients: 2}, g)
	a, b := dial(t, addr), dial(t, addr)
	expect(t, a.do("ping"), status("PONG"))
	expect(t, b.do("ping"), status("PONG"))
	c := dial(t, addr)
	expect(t, c.read(), rerr("ERR max number of clients reached"))
	if !c.closed() {
		t.Error("refused client not closed")
	}
	if st := s.Stats(); st.RejectedConnections != 1 || st.ConnectedClients != 2 {
		t.Errorf("stats %+v", st)
	}
	a.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().ConnectedClients != 1 {
		if time.Now().After(deadline) {
			t.Fatal("closed client still counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := dial(t, addr)
	expect(t, d.do("ping"), status("PONG"), "after a client left")
	b.c.Close()
	d.c.Close()

	// Request size: a command above the limit is refused, nothing of it
	// runs, and the connection closes. Pipelines are bounded per command.
	_, addr = extraServer(t, resp.Config{MaxRequestBytes: 1024}, g)
	c = dial(t, addr)
	expect(t, c.do("set", k, strings.Repeat("x", 900)), status("OK"))
	var pipe []byte
	for range 50 {
		pipe = append(pipe, encode("set", k, strings.Repeat("y", 100))...)
	}
	c.write(pipe)
	for range 50 {
		expect(t, c.read(), status("OK"))
	}
	c.write(encode("set", k, strings.Repeat("z", 2000)))
	expect(t, c.read(), rerr("ERR Protocol error: request too large (limit 1024 bytes)"))
	if !c.closed() {
		t.Error("connection open after a request too large")
	}
	expect(t, e.do("get", k), strings.Repeat("y", 100))
	// A large bulk length announced: refused at its header (the data sent
	// with it is not waited for).
	c = dial(t, addr)
	c.write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n" + strings.Repeat("z", 1500)))
	expect(t, c.read(), rerr("ERR Protocol error: request too large (limit 1024 bytes)"))
	if !c.closed() {
		t.Error("connection open after a request too large")
	}

	// Malformed RESP: a protocol error, then close.
	for _, tc := range []struct{ in, want string }{
		{"*2\r\n$3\r\nGET\r\n$x\r\n", "ERR Protocol error: invalid bulk length"},
		{"*x\r\n", "ERR Protocol error: invalid multibulk length"},
		{"*1\r\n+PING\r\n", "ERR Protocol error: expected '$', got '+'"},
		{"*1\r\n$4\r\nPINGxx\r\n", "ERR Protocol error: invalid bulk length"},
		{"SET \"a b\r\n", "ERR Protocol error: unbalanced quotes in request"},
	} {
		c := dial(t, addr)
		c.write([]byte(tc.in))
		expect(t, c.read(), rerr(tc.want), fmt.Sprintf("%q", tc.in))
		if !c.closed() {
			t.Errorf("%q: connection open after a protocol error", tc.in)
		}
	}
	// Inline commands (telnet) work.
	c = dial(t, addr)
	c.write([]byte("PING\r\nSET " + k + " \"a b\"\r\nGET " + k + "\n"))
	expect(t, c.read(), status("PONG"))
	expect(t, c.read(), status("OK"))
	expect(t, c.read(), "a b")
	c.c.Close()
}

// hookBackend wraps a group; tests replace its reads and writes.
type hookBackend struct {
	resp.Backend
	mu     sync.Mutex
	write  func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error)
	read   func(ctx context.Context, keys [][]byte, follower bool) ([]shardkv.ValueEntry, error)
	writes atomic.Int64 // WriteBatch calls
	reads  atomic.Int64 // ReadKeys calls
}

// Topology adds groups 7 (replicas 1 and 3) and 8 (replica 1) with RESP
// addresses to the group's newest config, for refusals that name them.
func (h *hookBackend) Topology() shardkv.Topology {
	t := h.Backend.Topology()
	conf := proto.Clone(t.Newest).(*shardkvpb.Config)
	conf.Groups = append(conf.Groups,
		&shardkvpb.Group{Gid: 7, Servers: []*shardkvpb.Server{{Id: 1, Addr: "x:1", RespAddr: "10.1.2.1:7000"}, {Id: 3, Addr: "x:3", RespAddr: "10.1.2.3:7000"}}},
		&shardkvpb.Group{Gid: 8, Servers: []*shardkvpb.Server{{Id: 1, Addr: "y:1", RespAddr: "node-3.example:6379"}}})
	t.Newest = conf
	return t
}

func (h *hookBackend) setWrite(f func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.write = f
}

func (h *hookBackend) setRead(f func(ctx context.Context, keys [][]byte, follower bool) ([]shardkv.ValueEntry, error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.read = f
}

func (h *hookBackend) WriteBatch(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
	h.writes.Add(1)
	h.mu.Lock()
	f := h.write
	h.mu.Unlock()
	if f != nil {
		return f(ctx, ops)
	}
	return h.Backend.WriteBatch(ctx, ops)
}

func (h *hookBackend) ReadKeys(ctx context.Context, keys [][]byte, follower bool, reserve func(int) bool) ([]shardkv.ValueEntry, error) {
	h.reads.Add(1)
	h.mu.Lock()
	f := h.read
	h.mu.Unlock()
	if f == nil {
		return h.Backend.ReadKeys(ctx, keys, follower, reserve)
	}
	vals, err := f(ctx, keys, follower)
	for i, v := range vals {
		if err == nil && reserve != nil && !reserve(len(v.Value)) {
			return vals[:i], shardkv.ErrReadLimit
		}
	}
	return vals, err
}

// testOutcomes: the reply to each backend answer. A refusal (not executed)
// is a redirect or retry error; an unknown outcome is an -ERR that clients
// do not retry, on a connection that stays open.
func (e *env) testOutcomes(t *testing.T) {
	h := &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	_, addr := extraServer(t, resp.Config{ReadTimeout: 200 * time.Millisecond}, h)
	c := dial(t, addr)
	defer c.c.Close()
	k := e.keyIn(gA, "oc:")
	slot := routing.SlotOf(k)

	// Batching: one pipeline of writes is one WriteBatch (one log entry),
	// one of reads of a slot one ReadKeys. (The backend is simulated here,
	// so that the counts do not depend on leadership.)
	h.setWrite(func(_ context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		out := make([]shardkv.WriteOutcome, len(ops))
		for i := range out {
			out[i].Result = &shardkvpb.WriteResult{Ok: true}
		}
		return out, nil
	})
	h.setRead(func(_ context.Context, keys [][]byte, _ bool) ([]shardkv.ValueEntry, error) {
		out := make([]shardkv.ValueEntry, len(keys))
		for i := range out {
			out[i] = shardkv.ValueEntry{Found: true, Value: []byte("15")}
		}
		return out, nil
	})
	var pipe []byte
	for i := range 16 {
		pipe = append(pipe, encode("set", k, strconv.Itoa(i))...)
	}
	c.write(pipe)
	for range 16 {
		expect(t, c.read(), status("OK"))
	}
	if n := h.writes.Swap(0); n > 2 {
		t.Errorf("16 pipelined SETs took %d WriteBatch calls", n)
	}
	pipe = nil
	for range 16 {
		pipe = append(pipe, encode("get", k)...)
	}
	c.write(pipe)
	for range 16 {
		expect(t, c.read(), "15")
	}
	if n := h.reads.Swap(0); n > 2 {
		t.Errorf("16 pipelined GETs took %d ReadKeys calls", n)
	}
	h.setRead(nil)

	unknown := rerr("ERR outcome unknown: the write was proposed but its result is unknown (leader change or timeout); read the key before retrying")
	h.setWrite(func(context.Context, []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		return nil, fmt.Errorf("%w: injected", shardkvpb.ErrOutcomeUnknown)
	})
	expect(t, c.do("set", k, "x"), unknown)
	expect(t, c.do("incr", k), unknown)
	expect(t, c.do("ping"), status("PONG"), "the connection stays open")
	// go-redis does not retry it (it would, for MOVED/TRYAGAIN/... or an
	// I/O error).
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 5, MinRetryBackoff: time.Millisecond})
	defer rdb.Close()
	ctx := context.Background()
	rdb.Ping(ctx)
	h.writes.Store(0)
	if err := rdb.Set(ctx, k, "x", 0).Err(); err == nil || err.Error() != string(unknown) {
		t.Errorf("go-redis SET: %v", err)
	}
	if n := h.writes.Load(); n != 1 {
		t.Errorf("go-redis sent the write %d times", n)
	}

	// Refusals, whole-batch and per op.
	// The refusals name groups 7 and 8, which the hook's topology adds.
	for _, tc := range []struct {
		ref  *shardkvpb.Refusal
		want string
	}{
		{&shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Owner: 7, Leader: 3}, fmt.Sprintf("MOVED %d 10.1.2.3:7000", slot)},
		{&shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Owner: 8}, fmt.Sprintf("MOVED %d node-3.example:6379", slot)},
		{&shardkvpb.Refusal{Reason: shardkvpb.ReasonNotReady, Msg: "shard 3 is arriving"}, "TRYAGAIN shard 3 is arriving"},
		{&shardkvpb.Refusal{Reason: shardkvpb.ReasonWrongGroup, Msg: "not served"}, "CLUSTERDOWN Hash slot not served"},
	} {
		h.setWrite(func(context.Context, []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) { return nil, tc.ref })
		expect(t, c.do("set", k, "x"), rerr(tc.want))
		h.setWrite(func(_ context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
			out := make([]shardkv.WriteOutcome, len(ops))
			for i := range out {
				out[i].Err = tc.ref
			}
			return out, nil
		})
		expect(t, c.do("del", k), rerr(tc.want))
		h.setRead(func(context.Context, [][]byte, bool) ([]shardkv.ValueEntry, error) { return nil, tc.ref })
		expect(t, c.do("get", k), rerr(tc.want))
		h.setRead(nil)
	}
	// A batch where the backend refuses some ops: each command its answer.
	other := "{" + k + "}other"
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		out := make([]shardkv.WriteOutcome, len(ops))
		for i, op := range ops {
			if string(op.Key) == other {
				out[i].Err = &shardkvpb.Refusal{Reason: shardkvpb.ReasonNotReady, Msg: "busy"}
			} else {
				out[i].Result = &shardkvpb.WriteResult{Ok: true}
			}
		}
		return out, nil
	})
	c.write(append(append(encode("set", k, "1"), encode("set", other, "1")...), encode("set", k, "2")...))
	expect(t, c.read(), status("OK"))
	expect(t, c.read(), rerr("TRYAGAIN busy"))
	expect(t, c.read(), status("OK"))
	// Invalid input (nothing executed) fails only the command at fault.
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		out := make([]shardkv.WriteOutcome, len(ops))
		for i, op := range ops {
			if string(op.Key) == other {
				return nil, errors.New("bad op")
			}
			out[i].Result = &shardkvpb.WriteResult{Ok: true, Num: 7}
		}
		return out, nil
	})
	c.write(append(append(encode("set", k, "a"), encode("set", other, "1")...), encode("append", k, "b")...))
	expect(t, c.read(), status("OK"))
	expect(t, c.read(), rerr("ERR bad op"))
	expect(t, c.read(), int64(7))
	// A Redis error decided at apply is passed on verbatim.
	h.setWrite(func(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		return []shardkv.WriteOutcome{{Result: &shardkvpb.WriteResult{Error: "ERR value is not an integer or out of range"}}}, nil
	})
	expect(t, c.do("incr", k), rerr("ERR value is not an integer or out of range"))
	// A read that times out (no quorum): TRYAGAIN, as a read is side-effect
	// free; other read errors are plain errors.
	h.setRead(func(ctx context.Context, _ [][]byte, _ bool) ([]shardkv.ValueEntry, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if r, ok := c.do("get", k).(rerr); !ok || !strings.HasPrefix(string(r), "TRYAGAIN ") {
		t.Errorf("timed-out read: %v", r)
	}
	h.setRead(func(context.Context, [][]byte, bool) ([]shardkv.ValueEntry, error) {
		return nil, errors.New("disk on fire")
	})
	expect(t, c.do("get", k), rerr("ERR read failed: disk on fire"))
}

// testLeaderIsolated cuts a group's leader off while clients write to it,
// with a short write timeout: writes it had proposed end with the
// outcome-unknown error, never with a redirect; every write answered with
// MOVED/TRYAGAIN/CLUSTERDOWN did not happen.
func (e *env) testLeaderIsolated(t *testing.T) {
	grp := e.w.Groups[gA]
	old := e.leader(gA)
	_, addr := extraServer(t, resp.Config{WriteTimeout: 300 * time.Millisecond}, e.w.Group(gA, old))
	c := dial(t, addr)
	defer c.c.Close()
	var keys []string
	for i := 0; len(keys) < 30; i++ {
		if k := fmt.Sprintf("iso:%d", i); e.owner(k) == gA {
			keys = append(keys, k)
		}
	}
	expect(t, c.do("ping"), status("PONG"))
	grp.Net.Isolate(grp.IDs(), old)
	healed := false
	defer func() {
		if !healed {
			grp.Net.Heal()
		}
	}()
	replies := map[string]any{}
	// A pipelined batch right away (proposed to the cut-off leader), then
	// one write at a time as it steps down.
	var pipe []byte
	for _, k := range keys[:10] {
		pipe = append(pipe, encode("set", k, "v")...)
	}
	c.write(pipe)
	for _, k := range keys[:10] {
		replies[k] = c.read()
	}
	for _, k := range keys[10:] {
		replies[k] = c.do("set", k, "v")
	}
	grp.Net.Heal()
	healed = true

	unknown := rerr("ERR outcome unknown: the write was proposed but its result is unknown (leader change or timeout); read the key before retrying")
	var nUnknown, nRefused, nOK int
	for _, k := range keys {
		r := replies[k]
		after := e.do("get", k) // on the group's leader, after the heal
		switch {
		case r == status("OK"):
			nOK++
			expect(t, after, "v", "acknowledged write ", k)
		case r == unknown:
			nUnknown++
		case isRefusal(r):
			nRefused++
			expect(t, after, nil, "write ", k, " answered ", r, " was executed")
		default:
			t.Errorf("write %s: unexpected reply %v", k, r)
		}
	}
	t.Logf("%d outcome unknown, %d refused, %d acknowledged", nUnknown, nRefused, nOK)
	if nUnknown == 0 || nRefused == 0 {
		t.Errorf("the scenario did not produce both kinds: %d unknown, %d refused", nUnknown, nRefused)
	}
}

func isRefusal(r any) bool {
	s, ok := r.(rerr)
	if !ok {
		return false
	}
	w, _, _ := strings.Cut(string(s), " ")
	return w == "MOVED" || w == "TRYAGAIN" || w == "CLUSTERDOWN"
}

// testClose: Close cancels in-flight backend calls and closes clients.
func (e *env) testClose(t *testing.T) {
	h := &hookBackend{Backend: e.w.Group(gA, e.leader(gA))}
	started := make(chan struct{})
	var sawCancel atomic.Bool
	h.setWrite(func(ctx context.Context, _ []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error) {
		close(started)
		<-ctx.Done()
		sawCancel.Store(errors.Is(ctx.Err(), context.Canceled))
		return nil, fmt.Errorf("%w: %v", shardkvpb.ErrOutcomeUnknown, ctx.Err())
	})
	s, addr := extraServer(t, resp.Config{WriteTimeout: time.Minute}, h)
	c := dial(t, addr)
	c.write(encode("set", e.keyIn(gA, "close:"), "v"))
	<-started
	done := make(chan struct{})
	go func() {
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a write of a minute")
	}
	if !sawCancel.Load() {
		t.Error("the in-flight write's context was not cancelled")
	}
	if !c.closed() {
		t.Error("client still connected after Close")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("still accepting after Close")
	}
}
