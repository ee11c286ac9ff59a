package resp_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/resp"
)

// testZSets: the sorted-set commands where the differential test (which
// runs commands one at a time on small sets against redis-server) cannot
// reach: pipelines mixing sorted sets and strings, ZSCAN paging over
// thousands of members, ZRANDMEMBER over several pages, the reply bound,
// the size limits and the write budget, DUMP's payload, and score parsing
// and formatting at the edges.
func (e *env) testZSets(t *testing.T) {
	e.run(t, "Pipeline", e.testZSetPipeline)
	e.run(t, "Scores", e.testZSetScores)
	e.run(t, "Scan", e.testZSetScan)
	e.run(t, "RandMember", e.testZSetRandMember)
	e.run(t, "ReplyBound", e.testZSetReplyBound)
	e.run(t, "Limits", e.testZSetLimits)
	e.run(t, "Dump", e.testZSetDump)
	e.run(t, "Stores", e.testZSetStores)
	e.run(t, "CopySize", e.testZSetCopySize)
	e.run(t, "NegativeZero", e.testZSetNegativeZero)
	e.run(t, "Blocking", e.testZSetBlocking)
}

// zaddMany adds n members to key (name(i) scores score(i)) in ZADDs of
// 1000.
func zaddMany(t *testing.T, c *rconn, key string, n int, name func(int) string, score func(int) float64) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		args := []string{"zadd", key}
		for j := i; j < min(i+1000, n); j++ {
			args = append(args, strconv.FormatFloat(score(j), 'g', -1, 64), name(j))
		}
		if r, ok := c.do(args...).(int64); !ok || r != int64(min(i+1000, n)-i) {
			t.Fatalf("ZADD of members %d..: %#v", i, r)
		}
	}
}

// testZSetPipeline: a sorted-set read sees the writes pipelined before it,
// a string read of a sorted set answers WRONGTYPE, and replies stay in
// order.
func (e *env) testZSetPipeline(t *testing.T) {
	s, z := "{zp}s", "{zp}z"
	c := e.conn(e.leaderAddr(e.owner(s)))
	cmds := [][]string{
		{"del", s, z},
		{"set", s, "v"},
		{"zadd", z, "1", "a", "2", "b"},
		{"get", z},
		{"zscore", s, "a"},
		{"zscore", z, "b"},
		{"zincrby", z, "10", "a"},
		{"zrange", z, "0", "-1", "withscores"},
		{"zadd", z, "nx", "incr", "1", "a"},
		{"zrank", z, "a"},
		{"type", z},
		{"mget", s, z},
		{"zpopmin", z},
		{"zcard", z},
		{"zrem", z, "a"},
		{"exists", z},
		{"zadd", z, "5", "again"},
		{"get", z},
		{"set", z, "str"},
		{"zscore", z, "again"},
		{"get", z},
		{"zadd", z, "inf", "x"},
		{"zincrby", z, "-inf", "x"},
		{"zscore", z, "x"},
	}
	wrong := rerr("WRONGTYPE Operation against a key holding the wrong kind of value")
	want := []any{
		nil, status("OK"), int64(2), wrong, wrong, "2", "11",
		[]any{"b", "2", "a", "11"}, nil, int64(1), status("zset"), []any{"v", nil},
		[]any{"b", "2"}, int64(1), int64(1), int64(0), int64(1), wrong, status("OK"), wrong, "str",
		wrong, wrong, wrong,
	}
	var b []byte
	for _, cmd := range cmds {
		b = append(b, encode(cmd...)...)
	}
	c.write(b)
	for i, cmd := range cmds {
		got := c.read()
		if i == 0 {
			continue // DEL: whatever earlier runs left
		}
		expect(t, got, want[i], cmd)
	}
	c.do("del", z)
	c.do("zadd", z, "inf", "x")
	expect(t, c.do("zincrby", z, "-inf", "x"), rerr("ERR resulting score is not a number (NaN)"))
	expect(t, c.do("zadd", z, "incr", "-inf", "x"), rerr("ERR resulting score is not a number (NaN)"))
	expect(t, c.do("zscore", z, "x"), "inf")
}

// testZSetScores: scores are read as Redis reads them (strtod) and shown
// as Redis 7.0 shows them ("%.17g").
func (e *env) testZSetScores(t *testing.T) {
	key := "{zs}f"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	for _, tc := range []struct{ in, out string }{
		{"1", "1"}, {"0.1", "0.10000000000000001"}, {"1e3", "1000"}, {"-1.5", "-1.5"},
		{"1e17", "1e+17"}, {"1e16", "10000000000000000"}, {"123456789012345678", "1.2345678901234568e+17"},
		{"0.0001", "0.0001"}, {"0.00001", "1.0000000000000001e-05"}, {"4.9e-324", "4.9406564584124654e-324"},
		{"1.7976931348623157e308", "1.7976931348623157e+308"}, {"inf", "inf"}, {"-Infinity", "-inf"},
		{"+INF", "inf"}, {"0x10", "16"}, {"0x1p-2", "0.25"}, {"0X.8P1", "1"}, {".5", "0.5"}, {"5.", "5"},
		{"+7", "7"}, {"1E2", "100"}, {"-0.0", "-0"},
	} {
		c.do("zadd", key, tc.in, "m")
		expect(t, c.do("zscore", key, "m"), tc.out, "ZADD ", tc.in)
	}
	for _, in := range []string{"", " 1", "1 ", "\t1", "abc", "nan", "-nan", "NaN", "1e400", "-1e400", "1e-400",
		"1_0", "1\x00", "0x", "0x1g", "1e", "1e+", "infinit", "--1", "0x1p", "1.2.3"} {
		expect(t, c.do("zadd", key, in, "m"), rerr("ERR value is not a valid float"), "ZADD ", strconv.Quote(in))
	}
	// Score bounds: strtod up to the first NUL, white space before it,
	// the empty string is 0, out of range is the infinity or 0 strtod
	// gives; NaN is not a float.
	c.do("del", key)
	c.do("zadd", key, "0", "zero", "1", "one", "2", "two")
	for _, tc := range []struct {
		min, max string
		want     any
	}{
		{"", "1", []any{"zero", "one"}}, {"(", "1", []any{"one"}}, {" 1", "2", []any{"one", "two"}},
		{"1\x00x", "2", []any{"one", "two"}}, {"1e-400", "1e400", []any{"zero", "one", "two"}},
		{"0x1", "(0x2", []any{"one"}}, {"1 ", "2", rerr("ERR min or max is not a float")},
		{"nan", "1", rerr("ERR min or max is not a float")}, {"((1", "2", rerr("ERR min or max is not a float")},
	} {
		expect(t, c.do("zrangebyscore", key, tc.min, tc.max), tc.want, "ZRANGEBYSCORE ", strconv.Quote(tc.min), " ", strconv.Quote(tc.max))
	}
	// RESP3: doubles.
	r3 := dial(t, e.leaderAddr(e.owner(key)))
	defer r3.c.Close()
	r3.do("hello", "3")
	expect(t, r3.do("zscore", key, "one"), "1")
	expect(t, r3.do("zincrby", key, "0.1", "one"), "1.1000000000000001")
	expect(t, r3.do("zrange", key, "0", "0", "withscores"), []any{[]any{"zero", "0"}})
	r3.write(encode("zscore", key, "two"))
	if line, _ := r3.r.ReadString('\n'); line != ",2\r\n" {
		t.Errorf("RESP3 ZSCORE: %q, want a double", line)
	}
}

// zscan runs ZSCAN key to its end with args, checking each page against
// max members (0: any), and returns the members and scores seen, in
// order.
func zscan(t *testing.T, c *rconn, key string, max int, args ...string) (members, scores []string, pages int) {
	t.Helper()
	cursor := "0"
	for {
		r, ok := c.do(append([]string{"zscan", key, cursor}, args...)...).([]any)
		if !ok || len(r) != 2 {
			t.Fatalf("ZSCAN %s %s %v: %#v", key, cursor, args, r)
		}
		cursor = r[0].(string)
		if _, err := strconv.ParseUint(cursor, 10, 64); err != nil {
			t.Fatalf("ZSCAN cursor %q is not a number", cursor)
		}
		page := r[1].([]any)
		if max > 0 && len(page) > 2*max {
			t.Errorf("ZSCAN %v page of %d members, want at most %d", args, len(page)/2, max)
		}
		for i := 0; i < len(page); i += 2 {
			members = append(members, page[i].(string))
			scores = append(scores, page[i+1].(string))
		}
		pages++
		if cursor == "0" {
			return members, scores, pages
		}
		if pages > 100000 {
			t.Fatal("ZSCAN does not end")
		}
	}
}

// testZSetScan pages over 2,500 members, half of them short enough to be
// their own cursor, half kept in the cursor table; a set of at most 128
// comes whole, in score order.
func (e *env) testZSetScan(t *testing.T) {
	key := "{zc}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	name := func(i int) string {
		if i%2 == 0 {
			return fmt.Sprintf("s%05d", i) // 6 bytes: an inline cursor
		}
		return fmt.Sprintf("long-member-%05d", i)
	}
	score := func(i int) float64 { return float64(i%7) + 0.5 }
	const n = 2500
	zaddMany(t, c, key, n, name, score)
	expect(t, c.do("zcard", key), int64(n))
	check := func(members, scores []string, what string) {
		t.Helper()
		seen := map[string]bool{}
		for i, m := range members {
			if seen[m] {
				t.Errorf("%s: member %s twice", what, m)
			}
			seen[m] = true
			j, _ := strconv.Atoi(strings.TrimPrefix(strings.TrimPrefix(m, "s"), "long-member-"))
			if name(j) != m || scores[i] != strconv.FormatFloat(score(j), 'g', -1, 64) {
				t.Errorf("%s: member %q = %q", what, m, scores[i])
			}
		}
		if len(seen) != n {
			t.Errorf("%s: %d distinct members, want %d", what, len(seen), n)
		}
	}
	members, scores, pages := zscan(t, c, key, 100, "count", "100")
	check(members, scores, "ZSCAN COUNT 100")
	if pages < n/100 || pages > n/100+2 {
		t.Errorf("ZSCAN COUNT 100 of %d members took %d pages", n, pages)
	}
	members, scores, _ = zscan(t, c, key, 10)
	check(members, scores, "ZSCAN (COUNT 10)")
	members, _, _ = zscan(t, c, key, 0, "match", "s01*", "count", "300")
	if len(members) != 500 || members[0] != "s01000" || members[499] != "s01998" {
		t.Errorf("ZSCAN MATCH s01*: %d members, %v..", len(members), members[:min(3, len(members))])
	}

	// At most 128 members: whole, whatever COUNT, in score order.
	small := "{zc}small"
	c.do("del", small)
	zaddMany(t, c, small, 128, func(i int) string { return fmt.Sprintf("x%03d", i) }, func(i int) float64 { return float64(127 - i) })
	members, scores, pages = zscan(t, c, small, 0, "count", "5")
	if len(members) != 128 || pages != 1 || members[0] != "x127" || scores[0] != "0" || members[127] != "x000" {
		t.Errorf("ZSCAN of 128 members: %d members in %d pages, from %v %v", len(members), pages, members[:1], scores[:1])
	}
	c.do("zadd", small, "1000", "x128")
	if members, _, pages := zscan(t, c, small, 5, "count", "5"); len(members) != 129 || pages < 25 {
		t.Errorf("ZSCAN COUNT 5 of 129 members: %d members in %d pages", len(members), pages)
	}

	// An inline cursor goes on on another replica (READONLY); one from
	// the cursor table is known only where it was made.
	r := c.do("zscan", small, "0", "count", "50").([]any)
	cur := r[0].(string)
	gid := e.owner(small)
	e.waitCaughtUp(gid)
	f := dial(t, e.w.RESPAddr(gid, e.follower(gid)))
	defer f.c.Close()
	expect(t, f.do("readonly"), status("OK"))
	r2 := f.do("zscan", small, cur, "count", "50").([]any)
	if page := r2[1].([]any); len(page) != 100 || page[0] != "x050" {
		t.Errorf("ZSCAN on a follower from the leader's cursor: %d elements from %v", len(page), page[:min(1, len(page))])
	}
	r = c.do("zscan", key, "0", "count", "1").([]any) // after long-member-00001
	expect(t, f.do("zscan", key, r[0].(string)), rerr("ERR invalid cursor"))
}

// testZSetRandMember: ZRANDMEMBER's picks are members of the set, distinct
// for a positive count, and reach every page of a large set.
func (e *env) testZSetRandMember(t *testing.T) {
	key := "{zr}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	const n = 3000 // three pages of ReadElems
	name := func(i int) string { return fmt.Sprintf("m%04d", i) }
	zaddMany(t, c, key, n, name, func(i int) float64 { return float64(i) })
	valid := func(m string) bool {
		i, err := strconv.Atoi(strings.TrimPrefix(m, "m"))
		return err == nil && i >= 0 && i < n && name(i) == m
	}
	seen := map[string]bool{}
	late := false
	for range 200 {
		m, ok := c.do("zrandmember", key).(string)
		if !ok || !valid(m) {
			t.Fatalf("ZRANDMEMBER: %#v", m)
		}
		seen[m] = true
		late = late || m >= name(2048)
	}
	if len(seen) < 150 || !late {
		t.Errorf("200 ZRANDMEMBER of %d members: %d distinct, one past the second page: %v", n, len(seen), late)
	}
	r := c.do("zrandmember", key, "50", "withscores").([]any)
	distinct := map[string]bool{}
	for i := 0; i < len(r); i += 2 {
		m := r[i].(string)
		if !valid(m) || r[i+1] != strings.TrimLeft(strings.TrimPrefix(m, "m"), "0") && m != "m0000" || distinct[m] {
			t.Errorf("ZRANDMEMBER 50 WITHSCORES: %q = %q (repeated: %v)", m, r[i+1], distinct[m])
		}
		distinct[m] = true
	}
	if len(distinct) != 50 {
		t.Errorf("ZRANDMEMBER 50: %d distinct members", len(distinct))
	}
	r = c.do("zrandmember", key, "-100").([]any)
	if len(r) != 100 {
		t.Errorf("ZRANDMEMBER -100: %d members", len(r))
	}
	for _, m := range r {
		if !valid(m.(string)) {
			t.Errorf("ZRANDMEMBER -100: %q", m)
		}
	}
	if r := c.do("zrandmember", key, "5000").([]any); len(r) != n || r[0] != name(n-1) || r[n-1] != name(0) {
		t.Errorf("ZRANDMEMBER 5000 of %d members: %d, from %v", n, len(r), r[:1])
	}
}

// testZSetReplyBound: a read of a sorted set is bounded by MaxReplyBytes,
// as MGET is; ZSCAN pages stop at it instead.
func (e *env) testZSetReplyBound(t *testing.T) {
	key := e.keyIn(gA, "zb:")
	_, addr := extraServer(t, resp.Config{MaxReplyBytes: 64 << 10}, e.w.Group(gA, e.leader(gA)))
	c := dial(t, addr)
	defer c.c.Close()
	c.do("del", key)
	pad := strings.Repeat("x", 900)
	zaddMany(t, c, key, 200, func(i int) string { return fmt.Sprintf("%s%03d", pad, i) }, func(i int) float64 { return float64(i) })
	tooLarge := "ERR the reply would be more than 65536 bytes, over the limit of 65536 bytes; read the sorted set in parts with ZSCAN or ZRANGE"
	for _, cmd := range [][]string{
		{"zrange", key, "0", "-1"}, {"zrange", key, "+inf", "-inf", "byscore", "rev"}, {"zrangebylex", key, "-", "+"},
		{"zrandmember", key, "200"}, {"zrandmember", key, "-100"}, {"zunion", "1", key}, {"zdiff", "1", key, "withscores"},
		{"dump", key},
	} {
		expect(t, c.do(cmd...), rerr(tooLarge), cmd)
	}
	if r, ok := c.do("zrange", key, "-inf", "+inf", "byscore", "limit", "10", "5").([]any); !ok || len(r) != 5 || !strings.HasSuffix(r[0].(string), "010") {
		t.Errorf("ZRANGE BYSCORE LIMIT 10 5: %v", r)
	}
	if r, ok := c.do("zrandmember", key, "5").([]any); !ok || len(r) != 5 {
		t.Errorf("ZRANDMEMBER 5: %#v", r)
	}
	// The set operations hold their sources whole: they too.
	expect(t, c.do("zintercard", "1", key), rerr(tooLarge))
	members, _, pages := zscan(t, c, key, 64, "count", "1000")
	if len(members) != 200 || pages < 4 {
		t.Errorf("ZSCAN COUNT 1000 under a 64 KiB reply bound: %d members in %d pages", len(members), pages)
	}
	expect(t, c.do("zcard", key), int64(200))
	expect(t, c.do("zcount", key, "-inf", "+inf"), int64(200))
	expect(t, c.do("object", "encoding", key), "skiplist")
}

// testZSetLimits: members count against the key limit and the write
// budget, checked before anything is proposed; ZPOPMIN and ZPOPMAX pop
// at most what one log entry may write.
func (e *env) testZSetLimits(t *testing.T) {
	key := "{zl}z"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	limit := 64989 - 10 - 9
	long := strings.Repeat("m", limit-len(key)+1)
	expect(t, c.do("zadd", key, "1", long), rerr(fmt.Sprintf("ERR key and member of %d bytes together exceed the limit of %d bytes", len(key)+len(long), limit)))
	expect(t, c.do("zadd", key, "1", long[1:]), int64(1))
	expect(t, c.do("zscore", key, long[1:]), "1")
	expect(t, c.do("zrank", key, long[1:]), int64(0))
	expect(t, c.do("object", "encoding", key), "skiplist")
	expect(t, c.do("zrem", key, long[1:]), int64(1))
	expect(t, c.do("exists", key), int64(0))

	// The write budget: six records a member.
	args := []string{"zadd", key}
	for i := range 4100 {
		args = append(args, strconv.Itoa(i), "m"+strconv.Itoa(i))
	}
	r, ok := c.do(args...).(rerr)
	if !ok || !strings.Contains(string(r), "send fewer members per command") {
		t.Errorf("ZADD of 4,100 members: %#v", r)
	}
	expect(t, c.do("exists", key), int64(0))
	expect(t, c.do(args[:2+2*3990]...), int64(3990))

	// ZPOPMIN: at most what one entry may write, exactly that much works.
	r, ok = c.do("zpopmin", key, "100000").(rerr)
	m := regexp.MustCompile(`^ERR ZPOPMIN pops at most (\d+) members per command`).FindStringSubmatch(string(r))
	if !ok || m == nil {
		t.Fatalf("ZPOPMIN 100000: %#v", r)
	}
	most, _ := strconv.Atoi(m[1])
	if most < 3000 {
		t.Fatalf("ZPOPMIN pops at most %d: want 3000 or more", most)
	}
	c.do("del", key)
	zaddMany(t, c, key, most+10, func(i int) string { return fmt.Sprintf("p%05d", i) }, func(i int) float64 { return float64(i) })
	if got, ok := c.do("zpopmin", key, m[1]).([]any); !ok || len(got) != 2*most || got[0] != "p00000" {
		t.Errorf("ZPOPMIN %d: %d elements, %v", most, len(got), got[:min(2, len(got))])
	}
	expect(t, c.do("zcard", key), int64(10))
	expect(t, c.do("zpopmax", key, "1"), []any{fmt.Sprintf("p%05d", most+9), strconv.Itoa(most + 9)})
	expect(t, c.do("zpopmin", "{zl}missing", "100000"), []any{})
	c.do("set", "{zl}s", "x")
	expect(t, c.do("zpopmin", "{zl}s", "100000"), rerr("WRONGTYPE Operation against a key holding the wrong kind of value"))

	// ZREMRANGEBYRANK removes thousands in one entry.
	c.do("del", key)
	zaddMany(t, c, key, 5000, func(i int) string { return fmt.Sprintf("r%05d", i) }, func(i int) float64 { return float64(i) })
	expect(t, c.do("zremrangebyrank", key, "0", "4499"), int64(4500))
	expect(t, c.do("zrange", key, "0", "0"), []any{"r04500"})
	expect(t, c.do("zremrangebyscore", key, "-inf", "+inf"), int64(500))
	expect(t, c.do("exists", key), int64(0))
}

// testZSetDump: DUMP of a sorted set is Redis's RDB_TYPE_ZSET_2: its
// members with binary (little-endian) scores, RDB version 10.
func (e *env) testZSetDump(t *testing.T) {
	key := "{zd}z"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	c.do("zadd", key, "1.5", "a", "-2", "bb")
	d, _ := c.do("dump", key).(string)
	want := "\x05\x02\x01a\x00\x00\x00\x00\x00\x00\xf8\x3f\x02bb\x00\x00\x00\x00\x00\x00\x00\xc0\x0a\x00"
	if !strings.HasPrefix(d, want) || len(d) != len(want)+8 {
		t.Errorf("DUMP of a sorted set: %q", d)
	}
	expect(t, c.do("object", "encoding", key), "listpack")
	expect(t, c.do("type", key), status("zset"))
}

// testZSetCopySize: RENAME and COPY of a sorted set keep its size (a copy
// counted both records of each member before 7dff586: ZCARD, negative
// ranks and ZREVRANK were wrong, and the copy outlived its last member).
func (e *env) testZSetCopySize(t *testing.T) {
	key, dst := "{zy}a", "{zy}b"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key, dst)
	c.do("zadd", key, "1", "a", "2", "b")
	c.do("rename", key, dst)
	if n := c.do("zcard", dst); n != int64(2) {
		t.Fatalf("ZCARD of a renamed 2-member sorted set is %v, want 2", n)
	}
	expect(t, c.do("zrange", dst, "-1", "-1"), []any{"b"})
	expect(t, c.do("zrevrank", dst, "b"), int64(0))
	c.do("copy", dst, key)
	expect(t, c.do("zcard", key), int64(2))
	expect(t, c.do("zrem", key, "a", "b"), int64(2))
	expect(t, c.do("exists", key), int64(0))
}

// testZSetNegativeZero: a score of -0 shows as -0 everywhere, as in Redis.
// The score index holds one 0 (scoreBytes): range reads and pops take a
// zero score from the member's record.
func (e *env) testZSetNegativeZero(t *testing.T) {
	key := "{zn}z"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	c.do("zadd", key, "-0", "a")
	expect(t, c.do("zscore", key, "a"), "-0")
	if r := c.do("zrange", key, "0", "-1", "withscores"); fmt.Sprint(r) != "[a -0]" {
		t.Fatalf("ZRANGE WITHSCORES of a member scored -0 shows %v", r)
	}
	expect(t, c.do("zpopmin", key), []any{"a", "-0"})
}

// testZSetStores: ZUNIONSTORE, ZINTERSTORE and ZDIFFSTORE of several
// sources, their results as redis-server 7.0.15 gives them (the
// differential script has the one-source forms; the group refused two
// sources or more before 7dff586).
func (e *env) testZSetStores(t *testing.T) {
	c := e.conn(e.leaderAddr(e.owner("{zu}u1")))
	c.do("del", "{zu}u1", "{zu}u2", "{zu}s1", "{zu}i1", "{zu}i2", "{zu}dst", "{zu}str")
	c.do("zadd", "{zu}u1", "1", "a", "2", "b", "3", "c")
	c.do("zadd", "{zu}u2", "10", "b", "20", "c", "30", "d")
	c.do("sadd", "{zu}s1", "a", "d", "x")
	c.do("zadd", "{zu}i1", "inf", "a", "1", "b")
	c.do("zadd", "{zu}i2", "-inf", "a", "2", "b")
	c.do("set", "{zu}str", "x")
	if r, ok := c.do("zunionstore", "{zu}dst", "2", "{zu}u1", "{zu}u2").(rerr); ok && strings.Contains(string(r), "more keys but 0 more values") {
		t.Fatalf("a store of two sources is refused: %s", r)
	}
	all := func() any { return c.do("zrange", "{zu}dst", "0", "-1", "withscores") }
	expect(t, all(), []any{"a", "1", "b", "12", "c", "23", "d", "30"}, "ZUNIONSTORE")
	for _, tc := range []struct {
		cmd  []string
		n    int64
		want []any
	}{
		{[]string{"zunionstore", "{zu}dst", "2", "{zu}u1", "{zu}u2", "weights", "2", "3", "aggregate", "max"}, 4, []any{"a", "2", "b", "30", "c", "60", "d", "90"}},
		{[]string{"zunionstore", "{zu}dst", "3", "{zu}u1", "{zu}u2", "{zu}s1", "weights", "1", "1", "0.5"}, 5, []any{"x", "0.5", "a", "1.5", "b", "12", "c", "23", "d", "30.5"}},
		{[]string{"zinterstore", "{zu}dst", "2", "{zu}u1", "{zu}u2", "aggregate", "min"}, 2, []any{"b", "2", "c", "3"}},
		{[]string{"zinterstore", "{zu}dst", "2", "{zu}u1", "{zu}s1"}, 1, []any{"a", "2"}},
		{[]string{"zdiffstore", "{zu}dst", "2", "{zu}u1", "{zu}u2"}, 1, []any{"a", "1"}},
		{[]string{"zunionstore", "{zu}dst", "2", "{zu}i1", "{zu}i2"}, 2, []any{"a", "0", "b", "3"}},
		{[]string{"zinterstore", "{zu}dst", "2", "{zu}u1", "{zu}missing"}, 0, []any{}},
	} {
		expect(t, c.do(tc.cmd...), tc.n, tc.cmd)
		expect(t, all(), tc.want, tc.cmd)
	}
	expect(t, c.do("exists", "{zu}dst"), int64(0))
	expect(t, c.do("zunionstore", "{zu}dst", "2", "{zu}u1", "{zu}str"), rerr("WRONGTYPE Operation against a key holding the wrong kind of value"))
	c.do("copy", "{zu}u1", "{zu}u1c")
	expect(t, c.do("zunionstore", "{zu}u1c", "2", "{zu}u1c", "{zu}u2", "weights", "1", "10"), int64(4))
	expect(t, c.do("zrange", "{zu}u1c", "0", "-1", "withscores"), []any{"a", "1", "b", "102", "c", "203", "d", "300"})
}
