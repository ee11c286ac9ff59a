package resp_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/resp"
)

// testHashes: the hash commands where the differential test (which runs
// commands one at a time on small hashes) cannot reach: pipelines mixing
// hashes and strings, HSCAN paging over thousands of fields (both cursor
// forms, and a cursor carried to another replica), HRANDFIELD over several
// pages, the reply bound, the size limits and the write budget.
func (e *env) testHashes(t *testing.T) {
	e.run(t, "Pipeline", e.testHashPipeline)
	e.run(t, "Scan", e.testHashScan)
	e.run(t, "RandField", e.testHashRandField)
	e.run(t, "ReplyBound", e.testHashReplyBound)
	e.run(t, "Limits", e.testHashLimits)
	e.run(t, "MemoryUsage", e.testMemoryUsage)
}

// testMemoryUsage: MEMORY USAGE estimates a string by its bytes and a
// collection by its size times its sampled elements; nil for no key.
func (e *env) testMemoryUsage(t *testing.T) {
	key := "{mu}h"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key, "{mu}s")
	expect(t, c.do("memory", "usage", key), nil)
	c.do("set", "{mu}s", strings.Repeat("v", 1000))
	if n, ok := c.do("memory", "usage", "{mu}s").(int64); !ok || n < 1000 || n > 1100 {
		t.Fatalf("MEMORY USAGE of a 1000-byte string: %v", n)
	}
	for i := range 100 {
		c.do("hset", key, fmt.Sprint("f", i), strings.Repeat("x", 100))
	}
	small, _ := c.do("memory", "usage", key).(int64)
	for i := 100; i < 200; i++ {
		c.do("hset", key, fmt.Sprint("f", i), strings.Repeat("x", 100))
	}
	if big, _ := c.do("memory", "usage", key, "samples", "0").(int64); small < 100*100 || big < 2*small-200 {
		t.Fatalf("MEMORY USAGE of a hash of 100 and 200 fields: %d, %d", small, big)
	}
	expect(t, c.do("memory", "usage", key, "samples"), rerr("ERR syntax error"))
}

// testHashPipeline: a hash read sees the writes pipelined before it, a
// string read after a hash write (made in the write's log entry) answers
// WRONGTYPE, and replies stay in order.
func (e *env) testHashPipeline(t *testing.T) {
	s, h := "{hp}s", "{hp}h"
	c := e.conn(e.leaderAddr(e.owner(s)))
	cmds := [][]string{
		{"del", s, h},
		{"set", s, "v"},
		{"hset", h, "f", "v"},
		{"get", h},
		{"hget", s, "f"},
		{"hget", h, "f"},
		{"hset", h, "g", "w"},
		{"hlen", h},
		{"get", s},
		{"type", h},
		{"mget", s, h},
		{"hincrby", h, "n", "5"},
		{"hincrby", h, "n", "5"},
		{"hget", h, "n"},
		{"append", h, "x"},
		{"hgetall", h},
		{"hdel", h, "f", "g", "n"},
		{"exists", h},
		{"hset", h, "again", "1"},
		{"get", h},
		{"set", h, "str"},
		{"hget", h, "again"},
		{"get", h},
	}
	want := []any{
		nil, status("OK"), int64(1),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		"v", int64(1), int64(2), "v", status("hash"), []any{"v", nil},
		int64(5), int64(10), "10",
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		[]any{"f", "v", "g", "w", "n", "10"},
		int64(3), int64(0), int64(1),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		status("OK"),
		rerr("WRONGTYPE Operation against a key holding the wrong kind of value"),
		"str",
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
}

// hscan runs HSCAN key to its end with args, checking each page against
// max fields (0: any), and returns the fields and values seen, in order.
func hscan(t *testing.T, c *rconn, key string, max int, args ...string) (fields, values []string, pages int) {
	t.Helper()
	cursor := "0"
	for {
		r, ok := c.do(append([]string{"hscan", key, cursor}, args...)...).([]any)
		if !ok || len(r) != 2 {
			t.Fatalf("HSCAN %s %s %v: %#v", key, cursor, args, r)
		}
		cursor = r[0].(string)
		if _, err := strconv.ParseUint(cursor, 10, 64); err != nil {
			t.Fatalf("HSCAN cursor %q is not a number", cursor)
		}
		page := r[1].([]any)
		if max > 0 && len(page) > 2*max {
			t.Errorf("HSCAN %v page of %d fields, want at most %d", args, len(page)/2, max)
		}
		for i := 0; i < len(page); i += 2 {
			fields = append(fields, page[i].(string))
			values = append(values, page[i+1].(string))
		}
		pages++
		if cursor == "0" {
			return fields, values, pages
		}
		if pages > 100000 {
			t.Fatal("HSCAN does not end")
		}
	}
}

// hsetMany sets n fields of key (name(i) = value(i)) in HSETs of 500.
func hsetMany(t *testing.T, c *rconn, key string, n int, name, value func(int) string) {
	t.Helper()
	for i := 0; i < n; i += 500 {
		args := []string{"hset", key}
		for j := i; j < min(i+500, n); j++ {
			args = append(args, name(j), value(j))
		}
		if r, ok := c.do(args...).(int64); !ok || r != int64(min(i+500, n)-i) {
			t.Fatalf("HSET of fields %d..: %#v", i, r)
		}
	}
}

// testHashScan pages over 2,500 fields, half of them short enough to be
// their own cursor, half kept in the cursor table.
func (e *env) testHashScan(t *testing.T) {
	key := "{hs}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	name := func(i int) string {
		if i%2 == 0 {
			return fmt.Sprintf("s%05d", i) // 6 bytes: an inline cursor
		}
		return fmt.Sprintf("long-field-%05d", i)
	}
	value := func(i int) string { return "v" + strconv.Itoa(i) }
	const n = 2500
	hsetMany(t, c, key, n, name, value)
	expect(t, c.do("hlen", key), int64(n))
	check := func(fields, values []string, what string) {
		t.Helper()
		seen := map[string]bool{}
		for i, f := range fields {
			if seen[f] {
				t.Errorf("%s: field %s twice", what, f)
			}
			seen[f] = true
			var j int
			if strings.HasPrefix(f, "s") {
				j, _ = strconv.Atoi(f[1:])
			} else {
				j, _ = strconv.Atoi(strings.TrimPrefix(f, "long-field-"))
			}
			if name(j) != f || values[i] != value(j) {
				t.Errorf("%s: field %q = %q", what, f, values[i])
			}
		}
		if len(seen) != n {
			t.Errorf("%s: %d distinct fields, want %d", what, len(seen), n)
		}
	}
	fields, values, pages := hscan(t, c, key, 100, "count", "100")
	check(fields, values, "HSCAN COUNT 100")
	if pages < n/100 || pages > n/100+2 {
		t.Errorf("HSCAN COUNT 100 of %d fields took %d pages", n, pages)
	}
	fields, values, _ = hscan(t, c, key, 10)
	check(fields, values, "HSCAN (COUNT 10)")
	fields, _, _ = hscan(t, c, key, 0, "match", "s01*", "count", "300")
	if len(fields) != 500 || fields[0] != "s01000" || fields[499] != "s01998" {
		t.Errorf("HSCAN MATCH s01*: %d fields, %v..", len(fields), fields[:min(3, len(fields))])
	}

	// A hash of at most 128 fields comes whole, whatever COUNT.
	small := "{hs}small"
	c.do("del", small)
	hsetMany(t, c, small, 128, func(i int) string { return fmt.Sprintf("x%03d", i) }, value)
	if fields, _, pages := hscan(t, c, small, 0, "count", "5"); len(fields) != 128 || pages != 1 {
		t.Errorf("HSCAN of 128 fields: %d fields in %d pages, want 128 in 1", len(fields), pages)
	}
	c.do("hset", small, "x128", "v")
	if fields, _, pages := hscan(t, c, small, 5, "count", "5"); len(fields) != 129 || pages < 25 {
		t.Errorf("HSCAN COUNT 5 of 129 fields: %d fields in %d pages", len(fields), pages)
	}

	// An inline cursor goes on on another replica (READONLY); one from
	// the cursor table is known only where it was made.
	r := c.do("hscan", small, "0", "count", "50").([]any)
	cur := r[0].(string)
	gid := e.owner(small)
	e.waitCaughtUp(gid)
	f := dial(t, e.w.RESPAddr(gid, e.follower(gid)))
	defer f.c.Close()
	expect(t, f.do("readonly"), status("OK"))
	r2 := f.do("hscan", small, cur, "count", "50").([]any)
	if page := r2[1].([]any); len(page) != 100 || page[0] != "x050" {
		t.Errorf("HSCAN on a follower from the leader's cursor: %d elements from %v", len(page), page[:min(1, len(page))])
	}
	r = c.do("hscan", key, "0", "count", "1").([]any) // after long-field-00001
	expect(t, f.do("hscan", key, r[0].(string)), rerr("ERR invalid cursor"))
	expect(t, c.do("hscan", key, strconv.FormatUint(1<<62|8<<56, 10)), rerr("ERR invalid cursor"))
	expect(t, c.do("hscan", key, strconv.FormatUint(1<<63, 10)), rerr("ERR invalid cursor"))
}

// testHashRandField: HRANDFIELD's picks are fields of the hash, distinct
// for a positive count, and reach every page of a large hash.
func (e *env) testHashRandField(t *testing.T) {
	key := "{hr}big"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	const n = 3000 // three pages of ReadElems
	name := func(i int) string { return fmt.Sprintf("f%04d", i) }
	hsetMany(t, c, key, n, name, func(i int) string { return "v" + name(i) })
	valid := func(f string) bool {
		i, err := strconv.Atoi(strings.TrimPrefix(f, "f"))
		return err == nil && i >= 0 && i < n && name(i) == f
	}
	seen := map[string]bool{}
	late := false
	for range 200 {
		f, ok := c.do("hrandfield", key).(string)
		if !ok || !valid(f) {
			t.Fatalf("HRANDFIELD: %#v", f)
		}
		seen[f] = true
		late = late || f >= name(2048)
	}
	if len(seen) < 150 || !late {
		t.Errorf("200 HRANDFIELD of %d fields: %d distinct, one past the second page: %v", n, len(seen), late)
	}
	r := c.do("hrandfield", key, "50", "withvalues").([]any)
	distinct := map[string]bool{}
	for i := 0; i < len(r); i += 2 {
		f := r[i].(string)
		if !valid(f) || r[i+1] != "v"+f || distinct[f] {
			t.Errorf("HRANDFIELD 50 WITHVALUES: %q = %q (repeated: %v)", f, r[i+1], distinct[f])
		}
		distinct[f] = true
	}
	if len(distinct) != 50 {
		t.Errorf("HRANDFIELD 50: %d distinct fields", len(distinct))
	}
	r = c.do("hrandfield", key, "-100").([]any)
	if len(r) != 100 {
		t.Errorf("HRANDFIELD -100: %d fields", len(r))
	}
	for _, f := range r {
		if !valid(f.(string)) {
			t.Errorf("HRANDFIELD -100: %q", f)
		}
	}
	if r := c.do("hrandfield", key, "5000").([]any); len(r) != n {
		t.Errorf("HRANDFIELD 5000 of %d fields: %d", n, len(r))
	}
	small := "{hr}small"
	c.do("del", small)
	c.do("hset", small, "a", "1", "b", "2", "c", "3")
	seen = map[string]bool{}
	for range 100 {
		seen[c.do("hrandfield", small).(string)] = true
	}
	if len(seen) != 3 {
		t.Errorf("100 HRANDFIELD of 3 fields saw %v", seen)
	}
}

// testHashReplyBound: a read of a hash is bounded by MaxReplyBytes, as
// MGET is; HSCAN pages stop at it instead.
func (e *env) testHashReplyBound(t *testing.T) {
	key := e.keyIn(gA, "hb:")
	_, addr := extraServer(t, resp.Config{MaxReplyBytes: 64 << 10}, e.w.Group(gA, e.leader(gA)))
	c := dial(t, addr)
	defer c.c.Close()
	c.do("del", key)
	val := strings.Repeat("x", 1000)
	hsetMany(t, c, key, 200, func(i int) string { return fmt.Sprintf("f%03d", i) }, func(int) string { return val })
	tooLarge := "ERR the reply would be more than 65536 bytes, over the limit of 65536 bytes; read the hash in parts with HSCAN"
	for _, cmd := range [][]string{{"hgetall", key}, {"hvals", key}, {"hrandfield", key, "200"}, {"hrandfield", key, "-100"}, {"dump", key}} {
		expect(t, c.do(cmd...), rerr(tooLarge), cmd)
	}
	if r, ok := c.do("hrandfield", key, "5").([]any); !ok || len(r) != 5 {
		t.Errorf("HRANDFIELD 5: %#v", r)
	}
	fields, _, pages := hscan(t, c, key, 64, "count", "1000")
	if len(fields) != 200 || pages < 4 {
		t.Errorf("HSCAN COUNT 1000 under a 64 KiB reply bound: %d fields in %d pages", len(fields), pages)
	}
	expect(t, c.do("hlen", key), int64(200))
	expect(t, c.do("object", "encoding", key), "hashtable")
}

// testHashLimits: fields count against the key limit and the write
// budget, checked before anything is proposed.
func (e *env) testHashLimits(t *testing.T) {
	key := "{hl}h"
	c := e.conn(e.leaderAddr(e.owner(key)))
	c.do("del", key)
	long := strings.Repeat("f", 64989-10-len(key)+1)
	expect(t, c.do("hset", key, long, "v"), rerr(fmt.Sprintf("ERR key and field of %d bytes together exceed the limit of %d bytes", len(key)+len(long), 64989-10)))
	expect(t, c.do("hset", key, long[1:], "v"), int64(1))
	expect(t, c.do("hstrlen", key, long[1:]), int64(1))
	expect(t, c.do("hdel", key, long[1:]), int64(1))
	args := []string{"hset", key}
	for i := range 13000 {
		args = append(args, "f"+strconv.Itoa(i), "v")
	}
	r, ok := c.do(args...).(rerr)
	if !ok || !strings.Contains(string(r), "send fewer fields per command") {
		t.Errorf("HSET of 13,000 fields: %#v", r)
	}
	expect(t, c.do("exists", key), int64(0))
	hsetMany(t, c, key, 128, func(i int) string { return fmt.Sprintf("%03d", i) }, func(int) string { return "v" })
	expect(t, c.do("object", "encoding", key), "listpack")
	c.do("hset", key, "one-more", "v")
	expect(t, c.do("object", "encoding", key), "hashtable")
	// DUMP of a hash: Redis's RDB_TYPE_HASH (4), its fields, version 10.
	c.do("del", key)
	c.do("hset", key, "a", "1", "bb", "hello")
	d, _ := c.do("dump", key).(string)
	if want := "\x04\x02\x01a\x011\x02bb\x05hello\x0a\x00"; !strings.HasPrefix(d, want) || len(d) != len(want)+8 {
		t.Errorf("DUMP of a hash: %q", d)
	}
}
