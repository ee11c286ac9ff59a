package resp_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
)

// testLists: the list commands where the differential test cannot reach:
// pipelines mixing lists and strings, the size limits, the write budget
// and the 12,000-element bounds, the reply bound, DUMP's payload, and the
// blocking commands with real go-redis clients (woken by another client's
// push, timing out, on a follower, several waiters, a client that leaves).
func (e *env) testLists(t *testing.T) {
	e.run(t, "Pipeline", e.testListPipeline)
	e.run(t, "Limits", e.testListLimits)
	e.run(t, "ReplyBound", e.testListReplyBound)
	e.run(t, "Blocking", e.testListBlocking)
	e.run(t, "BlockingRaw", e.testListBlockingRaw)
}

// rpushMany appends n elements (elem(i)) to key in RPUSHes of 1000.
func rpushMany(t *testing.T, c *rconn, key string, n int, elem func(int) string) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		args := []string{"rpush", key}
		for j := i; j < min(i+1000, n); j++ {
			args = append(args, elem(j))
		}
		if _, ok := c.do(args...).(int64); !ok {
			t.Fatalf("RPUSH of elements %d..", i)
		}
	}
}

// testListPipeline: list reads see the writes pipelined before them,
// string commands on a list answer WRONGTYPE, and replies stay in order.
func (e *env) testListPipeline(t *testing.T) {
	s, l, d := "{lp}s", "{lp}l", "{lp}d"
	c := e.conn(e.leaderAddr(e.owner(s)))
	cmds := [][]string{
		{"del", s, l, d},
		{"set", s, "v"},
		{"rpush", l, "a", "b", "c"},
		{"get", l},
		{"lpush", s, "x"},
		{"lpush", l, "z"},
		{"lrange", l, "0", "-1"},
		{"lset", l, "1", "A"},
		{"lindex", l, "1"},
		{"linsert", l, "before", "c", "B"},
		{"lrem", l, "0", "z"},
		{"lpos", l, "c"},
		{"lmove", l, d, "right", "left"},
		{"rpoplpush", l, d},
		{"lrange", d, "0", "-1"},
		{"ltrim", l, "0", "0"},
		{"llen", l},
		{"lpop", l, "5"},
		{"exists", l},
		{"type", d},
		{"blpop", d, "0"},
		{"brpop", d, "0"},
		{"exists", d},
		{"get", s},
	}
	want := []any{
		nil, status("OK"), int64(3),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		int64(4), []any{"z", "a", "b", "c"}, status("OK"), "A", int64(5), int64(1), int64(3),
		"c", "B", []any{"B", "c"}, status("OK"), int64(1), []any{"A"}, int64(0), status("list"),
		[]any{d, "B"}, []any{d, "c"}, int64(0), "v",
	}
	var buf []byte
	for _, cmd := range cmds {
		buf = append(buf, encode(cmd...)...)
	}
	c.write(buf)
	for i, cmd := range cmds {
		got := c.read()
		if i == 0 {
			continue
		}
		expect(t, got, want[i], cmd)
	}
}

// testListLimits: elements count against the value limit and the write
// budget, checked before anything is proposed; a pop removes at most what
// one command may; LREM, LINSERT and LTRIM rewrite at most 12,000
// elements; DUMP's payload.
func (e *env) testListLimits(t *testing.T) {
	key := "{ll}l"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	args := []string{"rpush", key}
	for i := range 13000 {
		args = append(args, strconv.Itoa(i))
	}
	r, ok := c.do(args...).(rerr)
	if !ok || !strings.Contains(string(r), "send fewer elements per command") {
		t.Errorf("RPUSH of 13,000 elements: %#v", r)
	}
	expect(t, c.do("exists", key), int64(0))
	rpushMany(t, c, key, 24100, strconv.Itoa)
	expect(t, c.do("llen", key), int64(24100))
	tooLong := rerr("ERR the list is too long for this command: LREM and LINSERT rewrite lists of at most 12000 elements, LTRIM deletes at most 12000 (one log entry's write budget)")
	expect(t, c.do("lrem", key, "0", "5"), tooLong)
	expect(t, c.do("linsert", key, "before", "5", "x"), tooLong)
	expect(t, c.do("ltrim", key, "12050", "-1"), tooLong) // drops 12,050 and keeps 12,050
	expect(t, c.do("llen", key), int64(24100))
	expect(t, c.do("ltrim", key, "0", "12499"), status("OK")) // drops 11,600
	expect(t, c.do("lindex", key, "-1"), "12499")
	// A pop removes at most what the write budget allows: 11,997 elements
	// of a short key.
	n := len(c.do("lpop", key, "20000").([]any))
	if n != 11997 {
		t.Errorf("LPOP 20000 of 12,500 elements: %d", n)
	}
	expect(t, c.do("llen", key), int64(12500-n))
	expect(t, c.do("lrem", key, "0", "12499"), int64(1))
	expect(t, c.do("linsert", key, "after", "12498", "end"), int64(12500-n))
	expect(t, c.do("rpop", key), "end")

	// Element and key sizes.
	big := strings.Repeat("x", shardkv.DefaultMaxValueBytes+1)
	tooBig := rerr(fmt.Sprintf("ERR element of %d bytes exceeds the limit of %d bytes", len(big), shardkv.DefaultMaxValueBytes))
	expect(t, c.do("rpush", key, big), tooBig)
	expect(t, c.do("lset", key, "0", big), tooBig)
	longKey := "{ll}" + strings.Repeat("k", 64989-10-8-4+1)
	expect(t, c.do("rpush", longKey, "x"), rerr(fmt.Sprintf("ERR key of %d bytes exceeds the limit of %d bytes for a list", len(longKey), 64989-10-8)))

	// DUMP of a list: Redis's RDB_TYPE_LIST (1), its elements in order.
	c.do("del", key)
	c.do("rpush", key, "b", "cc")
	c.do("lpush", key, "a")
	d, _ := c.do("dump", key).(string)
	if want := "\x01\x03\x01a\x01b\x02cc\x0a\x00"; !strings.HasPrefix(d, want) || len(d) != len(want)+8 {
		t.Errorf("DUMP of a list: %q", d)
	}
}

// testListReplyBound: LRANGE, LPOS and DUMP of a list are bounded by
// MaxReplyBytes.
func (e *env) testListReplyBound(t *testing.T) {
	key := e.keyIn(gA, "lb:")
	_, addr := extraServer(t, resp.Config{MaxReplyBytes: 64 << 10}, e.w.Group(gA, e.leader(gA)))
	c := dial(t, addr)
	defer c.c.Close()
	c.do("del", key)
	val := strings.Repeat("x", 1000)
	rpushMany(t, c, key, 200, func(int) string { return val })
	tooLarge := rerr("ERR the reply would be more than 65536 bytes, over the limit of 65536 bytes; read the list in parts with LRANGE")
	for _, cmd := range [][]string{{"lrange", key, "0", "-1"}, {"lpos", key, "nosuch"}, {"dump", key}} {
		expect(t, c.do(cmd...), tooLarge, cmd)
	}
	if r, ok := c.do("lrange", key, "0", "9").([]any); !ok || len(r) != 10 {
		t.Errorf("LRANGE 0 9: %#v", r)
	}
	expect(t, c.do("lpos", key, "nosuch", "maxlen", "10"), nil)
	expect(t, c.do("llen", key), int64(200))
}

// testListBlocking: the blocking commands with go-redis cluster clients.
func (e *env) testListBlocking(t *testing.T) {
	ctx := context.Background()
	rdb := e.cluster(nil)
	other := e.cluster(nil)
	key, src, dst := "{lbk}a", "{lbk}src", "{lbk}dst"
	if err := rdb.Del(ctx, key, src, dst, "{lbk}b").Err(); err != nil {
		t.Fatal(err)
	}

	// BLPOP woken by another client's RPUSH.
	type popped struct {
		v   []string
		err error
		at  time.Time
	}
	done := make(chan popped, 1)
	go func() {
		v, err := rdb.BLPop(ctx, 0, key).Result()
		done <- popped{v, err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case p := <-done:
		t.Fatalf("BLPOP of an empty list returned at once: %v %v", p.v, p.err)
	default:
	}
	pushed := time.Now()
	if err := other.RPush(ctx, key, "hello", "world").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-done:
		if p.err != nil || fmt.Sprint(p.v) != fmt.Sprint([]string{key, "hello"}) {
			t.Errorf("BLPOP woken by RPUSH: %v %v", p.v, p.err)
		}
		t.Logf("BLPOP answered %v after the push", p.at.Sub(pushed))
	case <-time.After(slow):
		t.Fatal("BLPOP not woken by an RPUSH")
	}
	if v, err := rdb.LRange(ctx, key, 0, -1).Result(); err != nil || fmt.Sprint(v) != "[world]" {
		t.Errorf("after BLPOP: %v %v", v, err)
	}

	// BLPOP times out: nil after about the timeout.
	rdb.Del(ctx, key)
	start := time.Now()
	if v, err := rdb.BLPop(ctx, time.Second, key).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("BLPOP 1 of nothing: %v %v", v, err)
	}
	if d := time.Since(start); d < 950*time.Millisecond || d > 6*time.Second {
		t.Errorf("BLPOP 1 returned after %v", d)
	}

	// Several keys: the one pushed to answers.
	go func() {
		v, err := rdb.BRPop(ctx, 0, key, "{lbk}b").Result()
		done <- popped{v, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	other.RPush(ctx, "{lbk}b", "x", "y")
	if p := <-done; p.err != nil || fmt.Sprint(p.v) != fmt.Sprint([]string{"{lbk}b", "y"}) {
		t.Errorf("BRPOP of two keys: %v %v", p.v, p.err)
	}

	// BLMOVE woken by an LPUSH; BRPOPLPUSH.
	moved := make(chan popped, 1)
	go func() {
		v, err := rdb.BLMove(ctx, src, dst, "LEFT", "RIGHT", 0).Result()
		moved <- popped{[]string{v}, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	other.RPush(ctx, dst, "first")
	other.LPush(ctx, src, "m")
	if p := <-moved; p.err != nil || p.v[0] != "m" {
		t.Errorf("BLMOVE: %v %v", p.v, p.err)
	}
	if v, _ := rdb.LRange(ctx, dst, 0, -1).Result(); fmt.Sprint(v) != "[first m]" {
		t.Errorf("after BLMOVE: %v", v)
	}
	//lint:ignore SA1019 BRPOPLPUSH is served and tested as such
	if v, err := rdb.BRPopLPush(ctx, dst, src, time.Second).Result(); err != nil || v != "m" {
		t.Errorf("BRPOPLPUSH of a list: %v %v", v, err)
	}
	if v, err := rdb.BLMove(ctx, "{lbk}none", dst, "LEFT", "LEFT", time.Second).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("BLMOVE 1 of nothing: %v %v", v, err)
	}

	// Three waiters, two pushes: two answered, one still waiting.
	rdb.Del(ctx, key)
	var wg sync.WaitGroup
	results := make(chan popped, 3)
	clients := make([]*redis.ClusterClient, 3)
	for i := range clients {
		clients[i] = e.cluster(nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := clients[i].BLPop(ctx, 3*time.Second, key).Result()
			results <- popped{v, err, time.Now()}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	other.RPush(ctx, key, "1")
	other.RPush(ctx, key, "2")
	got := map[string]int{}
	for range 3 {
		p := <-results
		switch {
		case errors.Is(p.err, redis.Nil):
			got["timeout"]++
		case p.err != nil:
			t.Errorf("BLPOP of three waiters: %v", p.err)
		default:
			got[p.v[1]]++
		}
	}
	wg.Wait()
	if fmt.Sprint(got) != "map[1:1 2:1 timeout:1]" {
		t.Errorf("three waiters, two pushes: %v", got)
	}
	expect(t, other.Exists(ctx, key).Val(), int64(0))
}

// testListBlockingRaw: a blocking command on a follower is redirected; a
// client that leaves while blocked stops waiting (it pops nothing later);
// the replies pipelined before a blocking command come before it blocks,
// those after it once it answers; a key that becomes a string does not
// end the wait, as in Redis.
func (e *env) testListBlockingRaw(t *testing.T) {
	key := "{lbr}a"
	gid := e.owner(key)
	c := e.conn(e.leaderAddr(gid))
	c.do("del", key)

	f := dial(t, e.w.RESPAddr(gid, e.follower(gid)))
	defer f.c.Close()
	expect(t, f.do("readonly"), status("OK"))
	for _, cmd := range [][]string{{"blpop", key, "0"}, {"blmove", key, "{lbr}b", "left", "left", "0"}, {"blpop", key, "{lbr}b", "0"}} {
		if r, ok := f.do(cmd...).(rerr); !ok || !strings.HasPrefix(string(r), "MOVED ") {
			t.Errorf("%v on a follower: %#v", cmd, r)
		}
	}

	// A client that leaves while blocked.
	gone := dial(t, e.leaderAddr(gid))
	gone.write(encode("blpop", key, "0"))
	time.Sleep(300 * time.Millisecond)
	gone.c.Close()
	time.Sleep(300 * time.Millisecond)
	expect(t, c.do("rpush", key, "kept"), int64(1))
	time.Sleep(300 * time.Millisecond)
	expect(t, c.do("lrange", key, "0", "-1"), []any{"kept"})
	c.do("del", key)

	// A pipeline: PING, BLPOP (blocks), PING. The first PONG comes while
	// BLPOP waits; the rest once another client pushes.
	p := dial(t, e.leaderAddr(gid))
	defer p.c.Close()
	p.write(append(append(encode("ping"), encode("blpop", key, "0")...), encode("ping")...))
	expect(t, p.read(), status("PONG"))
	time.Sleep(200 * time.Millisecond)
	if info := c.do("info", "clients").(string); !strings.Contains(info, "blocked_clients:1\r\n") {
		t.Errorf("INFO clients while one client waits: %q", info)
	}
	c.do("rpush", key, "v")
	expect(t, p.read(), []any{key, "v"})
	expect(t, p.read(), status("PONG"))

	// A key that becomes a string does not end the wait (Redis serves
	// blocked clients from lists only); a push after it is deleted does.
	p.write(encode("blpop", key, "5"))
	time.Sleep(200 * time.Millisecond)
	c.do("set", key, "str")
	time.Sleep(300 * time.Millisecond)
	c.do("del", key)
	c.do("lpush", key, "w")
	expect(t, p.read(), []any{key, "w"})

	// RESP3: a timeout is a null.
	expect(t, p.do("hello", "3").(resp3Map)[0], "server")
	expect(t, p.do("blpop", key, "0.1"), nil)
	expect(t, p.do("blmove", key, "{lbr}b", "left", "left", "0.1"), nil)
}
