package resp_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// testFlush: FLUSHALL on a group's leader deletes that group's keys, in
// several entries when there are many, and no other group's; a follower
// refuses it as a Redis replica does.
func (e *env) testFlush(t *testing.T) {
	const n = 2500 // three DEL entries of at most 1,000 keys
	var b []byte
	for i := range n {
		b = append(b, encode("set", e.keyIn(gA, fmt.Sprintf("flush%d:", i)), "v")...)
	}
	c := dial(t, e.leaderAddr(gA))
	defer c.c.Close()
	c.write(b)
	for i := range n {
		expect(t, c.read(), status("OK"), "set ", i)
	}
	kB := e.keyIn(gB, "flushB:")
	expect(t, e.do("set", kB, "stays"), status("OK"))

	f := dial(t, e.w.RESPAddr(gA, e.follower(gA)))
	defer f.c.Close()
	if r, ok := f.do("flushall").(rerr); !ok || !strings.HasPrefix(string(r), "READONLY ") {
		t.Fatalf("FLUSHALL on a follower: %v, want READONLY", r)
	}
	if got, ok := c.do("dbsize").(int64); !ok || got < n {
		t.Fatalf("DBSIZE before FLUSHALL: %v, want at least %d (the follower's refusal deleted none)", got, n)
	}
	// RANDOMKEY: a key the group holds, until it holds none.
	for range 5 {
		k, ok := c.do("randomkey").(string)
		if !ok || e.owner(k) != gA {
			t.Fatalf("RANDOMKEY: %v, want a key of group A", k)
		}
		expect(t, c.do("exists", k), int64(1), "RANDOMKEY's key ", k)
	}
	expect(t, c.do("flushall"), status("OK"))
	expect(t, c.do("randomkey"), nil, "RANDOMKEY on an empty group")
	expect(t, c.do("dbsize"), int64(0), "keys of group A after FLUSHALL")
	expect(t, e.do("get", e.keyIn(gA, "flush0:")), nil)
	expect(t, e.do("get", kB), "stays", "group B's key")
	expect(t, c.do("flushall", "now"), rerr("ERR syntax error"))
}

// testRESP3: HELLO 3 switches a connection to RESP3 (nulls, maps,
// verbatim strings) and HELLO 2 back; other connections stay on RESP2.
func (e *env) testRESP3(t *testing.T) {
	c := dial(t, e.leaderAddr(gA))
	defer c.c.Close()
	k := e.keyIn(gA, "resp3:")
	c.write(encode("hello", "3"))
	line, err := c.r.ReadString('\n')
	if err != nil || line != "%7\r\n" {
		t.Fatalf("HELLO 3 reply starts %q (%v), want a map of 7", line, err)
	}
	for range 14 {
		if _, err := c.tryRead(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		cmd  []string
		kind byte
	}{{[]string{"get", k}, '_'}, {[]string{"config", "get", "maxclients"}, '%'}, {[]string{"info", "server"}, '='}} {
		c.write(encode(tc.cmd...))
		_ = c.c.SetReadDeadline(time.Now().Add(2 * slow))
		first, err := c.r.Peek(1)
		if err != nil {
			t.Fatal(err)
		}
		if first[0] != tc.kind {
			t.Errorf("%v in RESP3: reply type %q, want %q", tc.cmd, first[0], tc.kind)
		}
		if _, err := c.tryRead(); err != nil {
			t.Fatalf("%v: %v", tc.cmd, err)
		}
	}
	expect(t, e.do("get", k), nil, "another connection still on RESP2")
	c.write(encode("hello", "2"))
	line, err = c.r.ReadString('\n')
	if err != nil || line != "*14\r\n" {
		t.Fatalf("HELLO 2 reply starts %q (%v)", line, err)
	}
}
