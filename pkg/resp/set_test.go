package resp_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/resp"
)

// testSets: the set commands where the differential test (which runs
// commands one at a time on small sets) cannot reach: pipelines mixing
// sets and strings, SSCAN paging over thousands of members (both cursor
// forms), SRANDMEMBER and SPOP over several pages, the set algebra on
// large sets, the reply bound, the size limits and the write budget, and
// DUMP's payload.
func (e *env) testSets(t *testing.T) {
	e.run(t, "Pipeline", e.testSetPipeline)
	e.run(t, "Scan", e.testSetScan)
	e.run(t, "Random", e.testSetRandom)
	e.run(t, "Algebra", e.testSetAlgebra)
	e.run(t, "Stores", e.testSetStores)
	e.run(t, "Limits", e.testSetLimits)
}

// saddMany adds n members (name(i)) to key in SADDs of 1000.
func saddMany(t *testing.T, c *rconn, key string, n int, name func(int) string) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		args := []string{"sadd", key}
		for j := i; j < min(i+1000, n); j++ {
			args = append(args, name(j))
		}
		if r, ok := c.do(args...).(int64); !ok || r != int64(min(i+1000, n)-i) {
			t.Fatalf("SADD of members %d..: %#v", i, r)
		}
	}
}

// strs is a reply's array of bulk strings, sorted.
func strs(t *testing.T, r any) []string {
	t.Helper()
	a, ok := r.([]any)
	if !ok {
		t.Fatalf("want an array, got %#v", r)
	}
	out := make([]string, len(a))
	for i, v := range a {
		out[i] = v.(string)
	}
	slices.Sort(out)
	return out
}

// testSetPipeline: set reads see the writes pipelined before them, string
// commands on a set answer WRONGTYPE, and replies stay in order.
func (e *env) testSetPipeline(t *testing.T) {
	s, a, b := "{sp}s", "{sp}a", "{sp}b"
	c := e.conn(e.leaderAddr(e.owner(s)))
	cmds := [][]string{
		{"del", s, a, b},
		{"set", s, "v"},
		{"sadd", a, "x", "y", "z"},
		{"get", a},
		{"sismember", s, "x"},
		{"scard", a},
		{"sadd", b, "y", "z", "w"},
		{"sinter", a, b},
		{"sunionstore", s, b},
		{"type", s},
		{"smembers", s},
		{"srem", a, "x", "y", "z"},
		{"exists", a},
		{"smove", b, a, "w"},
		{"smembers", a},
		{"spop", a},
		{"exists", a},
		{"mget", s, b},
		{"set", b, "str"},
		{"scard", b},
		{"get", b},
	}
	want := []any{
		nil, status("OK"), int64(3),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		int64(3), int64(3), []any{"y", "z"}, int64(3), status("set"), []any{"w", "y", "z"},
		int64(3), int64(0), int64(1), []any{"w"}, "w", int64(0),
		[]any{nil, nil}, status("OK"),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		"str",
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

// sscan runs SSCAN key to its end with args, checking each page against
// max members (0: any), and returns the members seen and the pages.
func sscan(t *testing.T, c *rconn, key string, max int, args ...string) (members []string, pages int) {
	t.Helper()
	cursor := "0"
	for {
		r, ok := c.do(append([]string{"sscan", key, cursor}, args...)...).([]any)
		if !ok || len(r) != 2 {
			t.Fatalf("SSCAN %s %s %v: %#v", key, cursor, args, r)
		}
		cursor = r[0].(string)
		if _, err := strconv.ParseUint(cursor, 10, 64); err != nil {
			t.Fatalf("SSCAN cursor %q is not a number", cursor)
		}
		page := r[1].([]any)
		if max > 0 && len(page) > max {
			t.Errorf("SSCAN %v page of %d members, want at most %d", args, len(page), max)
		}
		for _, m := range page {
			members = append(members, m.(string))
		}
		pages++
		if cursor == "0" {
			return members, pages
		}
		if pages > 100000 {
			t.Fatal("SSCAN does not end")
		}
	}
}

// testSetScan pages over 2,500 members, half of them short enough to be
// their own cursor; an intset (at most 512 integers) comes whole.
func (e *env) testSetScan(t *testing.T) {
	key := "{ss}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	name := func(i int) string {
		if i%2 == 0 {
			return fmt.Sprintf("s%05d", i)
		}
		return fmt.Sprintf("long-member-%05d", i)
	}
	const n = 2500
	saddMany(t, c, key, n, name)
	check := func(members []string, what string) {
		t.Helper()
		seen := map[string]bool{}
		for _, m := range members {
			if seen[m] {
				t.Errorf("%s: member %s twice", what, m)
			}
			seen[m] = true
		}
		for i := range n {
			if !seen[name(i)] {
				t.Errorf("%s: member %s missing", what, name(i))
				break
			}
		}
		if len(seen) != n {
			t.Errorf("%s: %d distinct members, want %d", what, len(seen), n)
		}
	}
	members, pages := sscan(t, c, key, 100, "count", "100")
	check(members, "SSCAN COUNT 100")
	if pages < n/100 || pages > n/100+2 {
		t.Errorf("SSCAN COUNT 100 of %d members took %d pages", n, pages)
	}
	members, _ = sscan(t, c, key, 10)
	check(members, "SSCAN (COUNT 10)")
	members, _ = sscan(t, c, key, 0, "match", "s01*", "count", "300")
	if len(members) != 500 {
		t.Errorf("SSCAN MATCH s01*: %d members", len(members))
	}

	// 512 integers are an intset: one page, whatever COUNT; one more, or
	// a member that is not an integer, and they are paged.
	ints := "{ss}ints"
	c.do("del", ints)
	saddMany(t, c, ints, 512, strconv.Itoa)
	if members, pages := sscan(t, c, ints, 0, "count", "5"); len(members) != 512 || pages != 1 {
		t.Errorf("SSCAN of 512 integers: %d members in %d pages, want 512 in 1", len(members), pages)
	}
	expect(t, c.do("object", "encoding", ints), "intset")
	c.do("sadd", ints, "512")
	expect(t, c.do("object", "encoding", ints), "hashtable")
	if members, pages := sscan(t, c, ints, 5, "count", "5"); len(members) != 513 || pages < 100 {
		t.Errorf("SSCAN COUNT 5 of 513 integers: %d members in %d pages", len(members), pages)
	}
	c.do("srem", ints, "512", "511")
	c.do("sadd", ints, "x")
	expect(t, c.do("object", "encoding", ints), "hashtable")
	c.do("srem", ints, "x")
	expect(t, c.do("object", "encoding", ints), "intset")

	// An inline cursor goes on on another replica (READONLY); one from
	// the cursor table is known only where it was made.
	r := c.do("sscan", key, "0", "count", "1").([]any) // after long-member-00001
	cur := r[0].(string)
	gid := e.owner(key)
	e.waitCaughtUp(gid)
	f := dial(t, e.w.RESPAddr(gid, e.follower(gid)))
	defer f.c.Close()
	expect(t, f.do("readonly"), status("OK"))
	expect(t, f.do("sscan", key, cur), rerr("ERR invalid cursor"))
	r = c.do("sscan", key, "0", "count", "1251").([]any) // the long members, then s00000
	if page := f.do("sscan", key, r[0].(string), "count", "1").([]any)[1].([]any); len(page) != 1 || page[0] != "s00002" {
		t.Errorf("SSCAN on a follower from the leader's inline cursor: %v", page)
	}
}

// testSetRandom: SRANDMEMBER's picks are members, distinct for a positive
// count, and reach every page of a large set; SPOP removes what it
// returns.
func (e *env) testSetRandom(t *testing.T) {
	key := "{sr}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	const n = 3000
	name := func(i int) string { return fmt.Sprintf("m%04d", i) }
	saddMany(t, c, key, n, name)
	valid := func(m string) bool {
		i, err := strconv.Atoi(strings.TrimPrefix(m, "m"))
		return err == nil && i >= 0 && i < n && name(i) == m
	}
	seen, late := map[string]bool{}, false
	for range 200 {
		m, ok := c.do("srandmember", key).(string)
		if !ok || !valid(m) {
			t.Fatalf("SRANDMEMBER: %#v", m)
		}
		seen[m] = true
		late = late || m >= name(2048)
	}
	if len(seen) < 150 || !late {
		t.Errorf("200 SRANDMEMBER of %d members: %d distinct, one past the second page: %v", n, len(seen), late)
	}
	r := strs(t, c.do("srandmember", key, "50"))
	if len(slices.Compact(slices.Clone(r))) != 50 {
		t.Errorf("SRANDMEMBER 50: %d distinct of %d", len(slices.Compact(slices.Clone(r))), len(r))
	}
	if r := strs(t, c.do("srandmember", key, "-100")); len(r) != 100 || !valid(r[0]) {
		t.Errorf("SRANDMEMBER -100: %d members", len(r))
	}
	if r := strs(t, c.do("srandmember", key, "5000")); len(r) != n {
		t.Errorf("SRANDMEMBER 5000 of %d members: %d", n, len(r))
	}
	popped := strs(t, c.do("spop", key, "100"))
	if len(slices.Compact(slices.Clone(popped))) != 100 {
		t.Errorf("SPOP 100: %d distinct", len(slices.Compact(slices.Clone(popped))))
	}
	for _, m := range popped {
		if !valid(m) {
			t.Fatalf("SPOP 100: %q", m)
		}
	}
	expect(t, c.do("scard", key), int64(n-100))
	expect(t, c.do("smismember", key, popped[0], popped[99]), []any{int64(0), int64(0)})
	if m, ok := c.do("spop", key).(string); !ok || !valid(m) {
		t.Errorf("SPOP: %#v", m)
	}
	if r := strs(t, c.do("spop", key, "100000")); len(r) != n-101 {
		t.Errorf("SPOP 100000 of %d members: %d", n-101, len(r))
	}
	expect(t, c.do("exists", key), int64(0))
}

// testSetAlgebra: SINTER and the like on sets of thousands of members,
// their STORE forms, and the reply bound.
func (e *env) testSetAlgebra(t *testing.T) {
	a, b, d := "{sa}a", "{sa}b", "{sa}d"
	c := e.conn(e.leaderAddr(e.owner(a)))
	c.do("del", a, b, d)
	saddMany(t, c, a, 3000, func(i int) string { return strconv.Itoa(2 * i) }) // 0..5998 even
	saddMany(t, c, b, 3000, func(i int) string { return strconv.Itoa(3 * i) }) // 0..8997 by 3
	inter := strs(t, c.do("sinter", a, b))
	if len(inter) != 1000 {
		t.Errorf("SINTER: %d members, want 1000", len(inter))
	}
	expect(t, c.do("sintercard", "2", a, b), int64(1000))
	expect(t, c.do("sintercard", "2", a, b, "limit", "10"), int64(10))
	if u := strs(t, c.do("sunion", a, b)); len(u) != 5000 {
		t.Errorf("SUNION: %d members, want 5000", len(u))
	}
	if d := strs(t, c.do("sdiff", a, b)); len(d) != 2000 || d[0] != "10" {
		t.Errorf("SDIFF: %d members from %v", len(d), d[:min(len(d), 1)])
	}
	expect(t, c.do("sunionstore", d, a), int64(3000))
	expect(t, c.do("scard", d), int64(3000))

	// Reads are bounded by MaxReplyBytes: SINTER reads its sets whole.
	_, addr := extraServer(t, resp.Config{MaxReplyBytes: 16 << 10}, e.w.Group(e.owner(a), e.leader(e.owner(a))))
	x := dial(t, addr)
	defer x.c.Close()
	tooLarge := rerr("ERR the reply would be more than 16384 bytes, over the limit of 16384 bytes; read the set in parts with SSCAN")
	for _, cmd := range [][]string{{"smembers", a}, {"sinter", a, b}, {"sunion", a, b}, {"sintercard", "2", a, b}, {"srandmember", a, "3000"}, {"dump", a}} {
		expect(t, x.do(cmd...), tooLarge, cmd)
	}
	if m, _ := sscan(t, x, a, 0, "count", "3000"); len(m) != 3000 {
		t.Errorf("SSCAN COUNT 3000 under a 16 KiB reply bound: %d members", len(m))
	}
}

// testSetStores: SINTERSTORE, SUNIONSTORE and SDIFFSTORE of several
// sources (the engine refused two sources or more before 7dff586).
func (e *env) testSetStores(t *testing.T) {
	a, b, d := "{sst}a", "{sst}b", "{sst}d"
	c := e.conn(e.leaderAddr(e.owner(a)))
	c.do("del", a, b, d)
	saddMany(t, c, a, 3000, func(i int) string { return strconv.Itoa(2 * i) })
	saddMany(t, c, b, 3000, func(i int) string { return strconv.Itoa(3 * i) })
	if r, ok := c.do("sinterstore", d, a, b).(rerr); ok && strings.Contains(string(r), "more keys but") {
		t.Fatalf("a store of two sources is refused: %s", r)
	}
	expect(t, c.do("scard", d), int64(1000))
	expect(t, c.do("sunionstore", d, a, b), int64(5000))
	expect(t, c.do("sdiffstore", d, a, b), int64(2000))
	expect(t, c.do("sismember", d, "2"), int64(1))
	expect(t, c.do("sismember", d, "6"), int64(0))
	expect(t, c.do("sinterstore", d, a, "{sst}missing"), int64(0))
	expect(t, c.do("exists", d), int64(0))
	c.do("set", "{sst}s", "v")
	expect(t, c.do("sunionstore", d, a, "{sst}s"), rerr("WRONGTYPE Operation against a key holding the wrong kind of value"))
}

// testSetLimits: members count against the key limit and the write
// budget, checked before anything is proposed; SPOP removes at most what
// one command may; DUMP's payload.
func (e *env) testSetLimits(t *testing.T) {
	key := "{sl}s"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key, "{sl}d")
	long := strings.Repeat("m", 64989-10-len(key)+1)
	expect(t, c.do("sadd", key, long), rerr(fmt.Sprintf("ERR key and member of %d bytes together exceed the limit of %d bytes", len(key)+len(long), 64989-10)))
	expect(t, c.do("sadd", key, long[1:]), int64(1))
	expect(t, c.do("smove", key, "{sl}dd", long[1:]), rerr(fmt.Sprintf("ERR key and member of %d bytes together exceed the limit of %d bytes", len(key)+len(long), 64989-10)))
	expect(t, c.do("srem", key, long[1:]), int64(1))
	args := []string{"sadd", key}
	for i := range 13000 {
		args = append(args, "m"+strconv.Itoa(i))
	}
	r, ok := c.do(args...).(rerr)
	if !ok || !strings.Contains(string(r), "send fewer members per command") {
		t.Errorf("SADD of 13,000 members: %#v", r)
	}
	expect(t, c.do("exists", key), int64(0))
	saddMany(t, c, key, 12500, func(i int) string { return "m" + strconv.Itoa(i) })
	// SPOP takes at most what the write budget allows (about 10,000
	// members of short keys).
	reply := c.do("spop", key, "20000")
	popped, ok := reply.([]any)
	if !ok {
		t.Fatalf("SPOP 20000 of 12,500 members: %#v", reply)
	}
	n := len(popped)
	if n < 9000 || n >= 12500 {
		t.Errorf("SPOP 20000 of 12,500 members: %d", n)
	}
	expect(t, c.do("scard", key), int64(12500-n))
	c.do("sadd", key, strings.Repeat("x", 10))
	// A result of more than 12,000 members is refused.
	saddMany(t, c, key, 12500, func(i int) string { return "n" + strconv.Itoa(i) })
	if r, ok := c.do("sunionstore", "{sl}d", key).(rerr); !ok || !strings.Contains(string(r), "12000") {
		t.Errorf("SUNIONSTORE of %d members: %#v", 12500, r)
	}
	expect(t, c.do("exists", "{sl}d"), int64(0))

	// DUMP of a set: Redis's RDB_TYPE_SET (2), its members, version 10.
	c.do("del", key)
	c.do("sadd", key, "a", "bb")
	d, _ := c.do("dump", key).(string)
	if want := "\x02\x02\x01a\x02bb\x0a\x00"; !strings.HasPrefix(d, want) || len(d) != len(want)+8 {
		t.Errorf("DUMP of a set: %q", d)
	}
}
