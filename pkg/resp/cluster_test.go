package resp_test

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/routing"
)

// testRedirects: MOVED to the owner group's leader, MOVED from a follower
// to its leader, READONLY follower reads, CROSSSLOT.
func (e *env) testRedirects(t *testing.T) {
	kA, kB := e.keyIn(gA, "redir:"), e.keyIn(gB, "redir:")
	expect(t, e.do("set", kA, "a"), status("OK"))
	expect(t, e.do("set", kB, "b"), status("OK"))
	slotB := routing.SlotOf(kB)

	// A key of another group: MOVED to that group's leader (once this
	// replica has learned who leads it; the controller reports leaders).
	cA := e.conn(e.leaderAddr(gA))
	deadline := time.Now().Add(15 * time.Second)
	for {
		want := rerr(fmt.Sprintf("MOVED %d %s", slotB, e.leaderAddr(gB)))
		got, got2 := cA.do("get", kB), cA.do("set", kB, "x")
		if got == want && got2 == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET/SET of another group's key: %v / %v, want %v", got, got2, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	expect(t, e.do("get", kB), "b", "the refused SET did not run")

	// A follower redirects to its leader, reads included.
	f := dial(t, e.w.RESPAddr(gA, e.follower(gA)))
	defer f.c.Close()
	movedA := rerr(fmt.Sprintf("MOVED %d %s", routing.SlotOf(kA), e.leaderAddr(gA)))
	expect(t, f.do("get", kA), movedA, "follower GET")
	expect(t, f.do("set", kA, "x"), movedA, "follower SET")
	tag := "{" + kA + "}"
	expect(t, f.do("mget", kA, tag+"1"), movedA, "follower MGET")
	// READONLY: the follower serves reads itself (linearizably), not writes.
	expect(t, f.do("readonly"), status("OK"))
	expect(t, f.do("get", kA), "a", "READONLY follower GET")
	expect(t, f.do("mget", kA, tag+"1"), []any{"a", nil}, "READONLY follower MGET")
	expect(t, f.do("exists", kA), int64(1))
	expect(t, f.do("ttl", kA), int64(-1))
	expect(t, f.do("set", kA, "x"), movedA, "READONLY follower SET")
	expect(t, e.do("set", kA, "a2"), status("OK"))
	expect(t, f.do("get", kA), "a2", "READONLY read after a write on the leader")
	// A READONLY follower still redirects keys of other groups.
	if r, ok := f.do("get", kB).(rerr); !ok || !strings.HasPrefix(string(r), fmt.Sprintf("MOVED %d ", slotB)) {
		t.Errorf("READONLY follower GET of another group's key: %v", r)
	}
	expect(t, f.do("readwrite"), status("OK"))
	expect(t, f.do("get", kA), movedA, "after READWRITE")
	expect(t, f.do("asking"), status("OK"))
}

// testCluster checks the CLUSTER replies against the world's layout.
func (e *env) testCluster(t *testing.T) {
	// Make sure every replica knows both leaders (reported through the
	// controller) before comparing layouts.
	ids := map[string]string{} // node id -> RESP address
	for _, gid := range []uint64{gA, gB} {
		for _, id := range e.w.Groups[gid].IDs() {
			ids[resp.NodeID(gid, id)] = e.w.RESPAddr(gid, id)
		}
	}
	addr := e.w.RESPAddr(gB, e.follower(gB))
	c := dial(t, addr)
	defer c.c.Close()
	deadline := time.Now().Add(2 * slow)
	var nodes string
	var leaders map[string]bool
	for {
		leaders = map[string]bool{}
		for _, gid := range []uint64{gA, gB} {
			leaders[resp.NodeID(gid, e.leader(gid))] = true
		}
		nodes = c.do("cluster", "nodes").(string)
		masters := 0
		for _, l := range strings.Split(strings.TrimSuffix(nodes, "\n"), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && strings.Contains(f[2], "master") && leaders[f[0]] {
				masters++
			}
		}
		if masters == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CLUSTER NODES never showed both leaders as masters:\n%s", nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// CLUSTER NODES: Redis's line format.
	lines := strings.Split(strings.TrimSuffix(nodes, "\n"), "\n")
	if len(lines) != 6 || !strings.HasSuffix(nodes, "\n") {
		t.Fatalf("CLUSTER NODES: %q", nodes)
	}
	slots := 0
	masterOf := map[string]string{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 8 {
			t.Fatalf("CLUSTER NODES line %q", l)
		}
		id, a, flags, master, epoch, link := f[0], f[1], f[2], f[3], f[6], f[7]
		host, port, _ := net.SplitHostPort(a[:strings.IndexByte(a, '@')])
		cport := a[strings.IndexByte(a, '@')+1:]
		if ids[id] != host+":"+port {
			t.Errorf("node %s at %s, want %s", id, a, ids[id])
		}
		if p, _ := strconv.Atoi(port); cport != strconv.Itoa(p+10000) {
			t.Errorf("cport in %q", a)
		}
		if (ids[id] == addr) != strings.HasPrefix(flags, "myself,") {
			t.Errorf("myself flag in %q (we asked %s)", l, addr)
		}
		if _, err := strconv.Atoi(epoch); err != nil || link != "connected" {
			t.Errorf("epoch/link in %q", l)
		}
		if strings.HasSuffix(flags, "master") {
			if !leaders[id] || master != "-" {
				t.Errorf("master line %q", l)
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				a, _ := strconv.Atoi(lo)
				b, _ := strconv.Atoi(hi)
				slots += b - a + 1
			}
		} else {
			if !strings.HasSuffix(flags, "slave") || !leaders[master] || len(f) != 8 {
				t.Errorf("replica line %q", l)
			}
			masterOf[id] = master
		}
	}
	if slots != routing.Slots || len(masterOf) != 4 {
		t.Errorf("CLUSTER NODES: %d slots, %d replicas:\n%s", slots, len(masterOf), nodes)
	}

	// CLUSTER SLOTS: [start, end, [host, port, id, metadata]...] per range,
	// the master (the owner's leader) first.
	covered := 0
	for _, r := range c.do("cluster", "slots").([]any) {
		r := r.([]any)
		start, end := int(r[0].(int64)), int(r[1].(int64))
		covered += end - start + 1
		g := e.slotOwner(start)
		if len(r) != 5 || e.slotOwner(end) != g {
			t.Errorf("CLUSTER SLOTS range %v", r)
			continue
		}
		for i, n := range r[2:] {
			n := n.([]any)
			id := n[2].(string)
			if len(n) != 4 || ids[id] != fmt.Sprintf("%s:%d", n[0], n[1]) || (i == 0) != (id == resp.NodeID(g, e.leader(g))) {
				t.Errorf("CLUSTER SLOTS range %d-%d node %d: %v", start, end, i, n)
			}
		}
	}
	if covered != routing.Slots {
		t.Errorf("CLUSTER SLOTS covers %d slots", covered)
	}
	// go-redis parses CLUSTER SHARDS and NODES.
	rc := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: slow})
	defer rc.Close()
	ctx := context.Background()
	shards, err := rc.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != 2 {
		t.Fatalf("CLUSTER SHARDS: %+v", shards)
	}
	covered = 0
	for _, s := range shards {
		for _, r := range s.Slots {
			covered += int(r.End - r.Start + 1)
		}
		roles := []string{}
		for _, n := range s.Nodes {
			roles = append(roles, n.Role)
			if ids[n.ID] != fmt.Sprintf("%s:%d", n.IP, n.Port) || n.Endpoint != n.IP || n.Health != "online" {
				t.Errorf("CLUSTER SHARDS node %+v", n)
			}
		}
		if strings.Join(roles, ",") != "master,replica,replica" || !leaders[s.Nodes[0].ID] {
			t.Errorf("CLUSTER SHARDS roles %v", roles)
		}
	}
	if covered != routing.Slots {
		t.Errorf("CLUSTER SHARDS covers %d slots", covered)
	}
	if _, err := rc.ClusterNodes(ctx).Result(); err != nil {
		t.Fatal(err)
	}

	info := c.do("cluster", "info").(string)
	for _, want := range []string{"cluster_state:ok\r\n", "cluster_slots_assigned:16384\r\n", "cluster_known_nodes:6\r\n", "cluster_size:2\r\n"} {
		if !strings.Contains(info, want) {
			t.Errorf("CLUSTER INFO lacks %q:\n%s", want, info)
		}
	}
	expect(t, c.do("cluster", "myid"), resp.NodeID(gB, e.follower(gB)))
	expect(t, c.do("cluster", "keyslot", "foo"), int64(12182))
	expect(t, c.do("cluster", "keyslot", "{user1000}.following"), int64(routing.SlotOf("user1000")))

	// Keys of a slot, from the local state of any replica of its group.
	tag := "{" + e.keyIn(gA, "cks:") + "}"
	slot := routing.SlotOf(tag)
	for i := range 3 {
		expect(t, e.do("set", tag+strconv.Itoa(i), "v"), status("OK"))
	}
	l := e.conn(e.leaderAddr(gA))
	expect(t, l.do("cluster", "countkeysinslot", strconv.Itoa(slot)), int64(3))
	got := l.do("cluster", "getkeysinslot", strconv.Itoa(slot), "10").([]any)
	var keys []string
	for _, k := range got {
		keys = append(keys, k.(string))
	}
	sort.Strings(keys)
	expect(t, keys, []string{tag + "0", tag + "1", tag + "2"})
	if got := l.do("cluster", "getkeysinslot", strconv.Itoa(slot), "2").([]any); len(got) != 2 {
		t.Errorf("GETKEYSINSLOT count 2: %v", got)
	}
	expect(t, e.conn(e.leaderAddr(gB)).do("cluster", "countkeysinslot", strconv.Itoa(slot)), int64(0), "another group's slot")
}

// testClusterClient uses go-redis's cluster client end to end: it finds
// the slots, routes by key, pipelines across groups, scans each master.
func (e *env) testClusterClient(t *testing.T) {
	rdb := e.cluster(nil)
	ctx := context.Background()
	owners := map[uint64]int{}
	const n = 12
	for i := range n {
		k := fmt.Sprintf("cc:%d", i)
		owners[e.owner(k)]++
		if err := rdb.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if len(owners) != 2 {
		t.Fatalf("keys all in one group: %v", owners)
	}
	for i := range n {
		if v, err := rdb.Get(ctx, fmt.Sprintf("cc:%d", i)).Int(); err != nil || v != i {
			t.Fatalf("cc:%d = %d, %v", i, v, err)
		}
	}
	// A pipeline spanning both groups.
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range n {
			p.Incr(ctx, fmt.Sprintf("cc:%d", i))
		}
		for i := range n {
			p.Get(ctx, fmt.Sprintf("cc:%d", i))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if v := cmds[i].(*redis.IntCmd).Val(); v != int64(i+1) {
			t.Fatalf("pipelined INCR cc:%d = %d", i, v)
		}
		if v := cmds[n+i].(*redis.StringCmd).Val(); v != strconv.Itoa(i+1) {
			t.Fatalf("pipelined GET cc:%d = %q", i, v)
		}
	}
	if err := rdb.MSet(ctx, "{cc}a", "1", "{cc}b", "2").Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := rdb.MGet(ctx, "{cc}a", "{cc}b", "{cc}c").Result(); err != nil || fmt.Sprint(v) != "[1 2 <nil>]" {
		t.Fatalf("MGET: %v, %v", v, err)
	}
	if n, err := rdb.Del(ctx, "{cc}a", "{cc}b").Result(); err != nil || n != 2 {
		t.Fatalf("DEL: %d, %v", n, err)
	}
	if err := rdb.Get(ctx, "{cc}a").Err(); err != redis.Nil {
		t.Fatalf("GET deleted: %v", err)
	}
	// SCAN each master: every key once, from its owner.
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	seen := map[string]int{}
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "cc:*", 7).Iterator()
		for iter.Next(ctx) {
			<-mu
			seen[iter.Val()]++
			mu <- struct{}{}
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("SCAN found %d keys, want %d", len(seen), n)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("SCAN returned %s %d times", k, n)
		}
	}
	// READONLY clients read from replicas.
	ro := e.cluster(&redis.ClusterOptions{ReadOnly: true, RouteRandomly: true})
	for i := range n {
		if v, err := ro.Get(ctx, fmt.Sprintf("cc:%d", i)).Int(); err != nil || v != i+1 {
			t.Fatalf("READONLY GET cc:%d = %d, %v", i, v, err)
		}
	}
	// COMMAND parses (go-redis reads it for key positions and read-only
	// flags).
	info, err := rdb.Command(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if g := info["get"]; g == nil || !g.ReadOnly || g.FirstKeyPos != 1 || g.Arity != 2 {
		t.Errorf("COMMAND get: %+v", g)
	}
	if m := info["mset"]; m == nil || m.ReadOnly || m.FirstKeyPos != 1 || m.LastKeyPos != -1 || m.StepCount != 2 {
		t.Errorf("COMMAND mset: %+v", m)
	}
}

// waitCaughtUp waits until every replica of gid has applied what its
// leader had applied when called.
func (e *env) waitCaughtUp(gid uint64) {
	e.t.Helper()
	g := e.w.Groups[gid]
	want := g.Replica(e.leader(gid)).AppliedIndex()
	deadline := time.Now().Add(slow)
	for _, id := range g.IDs() {
		for r := g.Replica(id); r != nil && r.AppliedIndex() < want; {
			if time.Now().After(deadline) {
				e.t.Fatalf("group %d replica %d applied %d, leader %d", gid, id, r.AppliedIndex(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// testScan: SCAN pages through the keys a replica serves, with MATCH,
// COUNT and TYPE; cursors are numbers.
func (e *env) testScan(t *testing.T) {
	want := map[uint64][]string{}
	rdb := e.cluster(nil)
	ctx := context.Background()
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 30 {
			k := fmt.Sprintf("sc:%02d", i)
			p.Set(ctx, k, "v", 0)
			want[e.owner(k)] = append(want[e.owner(k)], k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	scan := func(c *rconn, args ...string) []string {
		var keys []string
		cursor := "0"
		for i := 0; ; i++ {
			r := c.do(append([]string{"scan", cursor}, args...)...).([]any)
			cursor = r[0].(string)
			for _, k := range r[1].([]any) {
				keys = append(keys, k.(string))
			}
			if cursor == "0" {
				break
			}
			if i > 10000 {
				t.Fatal("SCAN does not end")
			}
		}
		sort.Strings(keys)
		return keys
	}
	for _, gid := range []uint64{gA, gB} {
		// A follower answers from its own state too (once it has applied
		// the writes: a quorum may have acknowledged them without it).
		e.waitCaughtUp(gid)
		for _, addr := range []string{e.leaderAddr(gid), e.w.RESPAddr(gid, e.follower(gid))} {
			c := e.conn(addr)
			expect(t, scan(c, "match", "sc:*", "count", "4"), want[gid], "SCAN of group ", gid, " at ", addr)
			expect(t, scan(c, "MATCH", "sc:*"), want[gid])
			expect(t, scan(c, "match", "sc:*", "type", "STRING"), want[gid])
			expect(t, scan(c, "match", "sc:*", "type", "hash"), []string(nil))
			var ones []string
			for _, k := range want[gid] {
				if strings.HasPrefix(k, "sc:1") {
					ones = append(ones, k)
				}
			}
			expect(t, scan(c, "match", "sc:1?", "count", "3"), ones)
		}
	}
	// A cursor is a number, valid on the replica that issued it.
	c := e.conn(e.leaderAddr(gA))
	r := c.do("scan", "0", "match", "sc:*", "count", "1").([]any)
	if _, err := strconv.ParseUint(r[0].(string), 10, 64); err != nil || r[0] == "0" {
		t.Fatalf("cursor %v", r[0])
	}
	expect(t, e.conn(e.leaderAddr(gB)).do("scan", r[0].(string)), rerr("ERR invalid cursor"))
	again := c.do("scan", r[0].(string), "match", "sc:*", "count", "1").([]any)
	if again[0] == r[0] {
		t.Errorf("cursor did not advance: %v", again)
	}
}

// testPipeline: commands of one pipeline run in order, writes batched.
func (e *env) testPipeline(t *testing.T) {
	addr := e.leaderAddr(gA)
	k := e.keyIn(gA, "pipe:")
	c := dial(t, addr)
	defer c.c.Close()
	// 100 INCRs in one write: one or a few log entries, applied in order.
	var b []byte
	for range 100 {
		b = append(b, encode("incr", k)...)
	}
	c.write(b)
	for i := 1; i <= 100; i++ {
		expect(t, c.read(), int64(i), "INCR ", i)
	}
	// Reads see the writes before them, not those after; errors and
	// keyless commands keep their place.
	k2 := e.keyIn(gA, "pipe2:")
	kB := e.keyIn(gB, "pipe:")
	b = nil
	for _, cmd := range [][]string{
		{"set", k2, "v"}, {"get", k2}, {"ping"}, {"nosuch"}, {"append", k2, "w"}, {"get", k2},
		{"set", kB, "x"}, {"incr", k2}, {"set", k2, "1"}, {"incr", k2}, {"get", k2}, {"del", k2}, {"get", k2},
		{"echo", "e"}, {"exists", k2},
	} {
		b = append(b, encode(cmd...)...)
	}
	c.write(b)
	slotB := routing.SlotOf(kB)
	for i, want := range []any{
		status("OK"), "v", status("PONG"), rerr("ERR unknown command 'nosuch', with args beginning with: "), int64(2), "vw",
		"MOVED", rerr("ERR value is not an integer or out of range"), status("OK"), int64(2), "2", int64(1), nil,
		"e", int64(0),
	} {
		got := c.read()
		if want == "MOVED" {
			if r, ok := got.(rerr); !ok || !strings.HasPrefix(string(r), fmt.Sprintf("MOVED %d ", slotB)) {
				t.Errorf("reply %d: %v, want MOVED", i, got)
			}
			continue
		}
		expect(t, got, want, "reply ", i)
	}
	expect(t, e.do("get", kB), nil, "the refused write did not run")

	// Two-key writes and SETRANGE in one batch: each read sees the writes
	// before it (the reads are made inside the entry, at their place).
	ht := "{" + k2 + "}"
	b = nil
	for _, cmd := range [][]string{
		{"set", ht + "a", "hello"}, {"setrange", ht + "a", "1", "EY"}, {"rename", ht + "a", ht + "b"}, {"get", ht + "a"},
		{"get", ht + "b"}, {"copy", ht + "b", ht + "c"}, {"append", ht + "c", "!"}, {"renamenx", ht + "c", ht + "b"},
		{"get", ht + "b"}, {"get", ht + "c"}, {"rename", ht + "a", ht + "b"}, {"getrange", ht + "c", "-3", "-1"},
	} {
		b = append(b, encode(cmd...)...)
	}
	c.write(b)
	for i, want := range []any{
		status("OK"), int64(5), status("OK"), nil, "hEYlo", int64(1), int64(6), int64(0), "hEYlo", "hEYlo!",
		rerr("ERR no such key"), "lo!",
	} {
		expect(t, c.read(), want, "two-key batch reply ", i)
	}

	// Keys of several slots of the group in one pipeline.
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprintf("ps:%d", i); e.owner(k) == gA {
			keys = append(keys, k)
		}
	}
	b = nil
	for i, k := range keys {
		b = append(b, encode("set", k, strconv.Itoa(i))...)
	}
	for _, k := range keys {
		b = append(b, encode("get", k)...)
	}
	c.write(b)
	for range keys {
		expect(t, c.read(), status("OK"))
	}
	for i := range keys {
		expect(t, c.read(), strconv.Itoa(i), "GET ", keys[i])
	}

	// QUIT: OK, then nothing more runs and the connection closes.
	c.write(append(append(encode("set", k2, "before"), encode("quit")...), encode("set", k2, "after")...))
	expect(t, c.read(), status("OK"))
	expect(t, c.read(), status("OK"))
	if !c.closed() {
		t.Error("connection open after QUIT")
	}
	expect(t, e.do("get", k2), "before")

	// A big pipeline through go-redis.
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: slow})
	defer rdb.Close()
	ctx := context.Background()
	tag := "{" + k + "}"
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range 2000 {
			p.Set(ctx, tag+strconv.Itoa(i), i, 0)
		}
		p.Get(ctx, tag+"1999")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := cmds[2000].(*redis.StringCmd).Val(); v != "1999" {
		t.Fatalf("GET after 2000 pipelined SETs: %q", v)
	}
}
