package resp_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/shardkv"
)

// The input side: every malformed or hostile frame gets Redis's error at
// once and closes only its own connection; the server goes on serving.

// inputEnv is one data group (gA, 3 replicas) with RESP servers.
type inputEnv struct {
	w *env
	g *shardkv.Group // gA's leader replica
}

func newInputEnv(t *testing.T) *inputEnv {
	e := &env{t: t, conns: map[string]*rconn{}}
	e.w = newWorld(t)
	e.w.StartGroup(gA)
	e.w.Join(gA)
	e.conf = e.w.WaitSettled(60 * time.Second)
	return &inputEnv{w: e, g: e.w.Group(gA, e.leader(gA))}
}

// quick is how soon an answer to a bad frame must come: Redis answers at
// once, so anything near this is a hang.
const quick = 5 * time.Second

// readQuick reads one reply, failing the test if none comes within quick
// (the connection is then closed under the read).
func readQuick(t *testing.T, c *rconn, what string) any {
	t.Helper()
	timer := time.AfterFunc(quick, func() { c.c.Close() })
	defer timer.Stop()
	start := time.Now()
	v, err := c.tryRead()
	if err != nil {
		t.Fatalf("%s: no reply within %v: %v (after %v)", what, quick, err, time.Since(start).Round(time.Millisecond))
	}
	return v
}

// alive checks that the server at addr answers a new client, and that the
// bystander connection still works.
func alive(t *testing.T, addr string, bystander *rconn, what string) {
	t.Helper()
	c := dial(t, addr)
	defer c.c.Close()
	c.write(encode("ping"))
	expect(t, readQuick(t, c, what+": new client PING"), status("PONG"), what+": new client")
	bystander.write(encode("ping"))
	expect(t, readQuick(t, bystander, what+": bystander PING"), status("PONG"), what+": bystander")
}

func TestRESPInput(t *testing.T) {
	e := newInputEnv(t)
	t.Run("Malformed", e.testMalformed)
	t.Run("Panic", e.testPanic)
}

// testMalformed: issue 14 case 2 and its relatives, with Redis 7's texts.
func (e *inputEnv) testMalformed(t *testing.T) {
	_, addr := extraServer(t, resp.Config{}, e.g)
	by := dial(t, addr)
	defer by.c.Close()
	for _, tc := range []struct{ name, in, want string }{
		// Overflowed redcon's length arithmetic: a panic.
		{"BulkOverflow", "*1\r\n$9223372036854775807\r\n", "ERR Protocol error: invalid bulk length"},
		// Made redcon's parser loop.
		{"CountLoop", "*9223372036854775807\r\n", "ERR Protocol error: invalid multibulk length"},
		// Left the connection waiting for gigabytes.
		{"CountHuge", "*3000000000\r\n", "ERR Protocol error: invalid multibulk length"},
		{"BulkHuge", "*1\r\n$2000000000\r\n", "ERR Protocol error: invalid bulk length"},
		{"BulkHuge2", "*2\r\n$3\r\nGET\r\n$2000000000\r\n", "ERR Protocol error: invalid bulk length"},
		{"CountOverCap", "*1048577\r\n", "ERR Protocol error: invalid multibulk length"},
		{"BulkNegative", "*1\r\n$-1\r\n", "ERR Protocol error: invalid bulk length"},
		{"BulkMinInt", "*1\r\n$-9223372036854775808\r\n", "ERR Protocol error: invalid bulk length"},
		{"BulkTooManyDigits", "*1\r\n$99999999999999999999\r\n", "ERR Protocol error: invalid bulk length"},
		{"CountUnderflow", "*-9223372036854775809\r\n", "ERR Protocol error: invalid multibulk length"},
		{"BulkNotNumber", "*1\r\n$1x\r\n", "ERR Protocol error: invalid bulk length"},
		// Header lines that never end (Redis: 64 KiB).
		{"CountLine", "*" + strings.Repeat("1", 70000), "ERR Protocol error: too big mbulk count string"},
		{"BulkLine", "*1\r\n$" + strings.Repeat("1", 70000), "ERR Protocol error: too big bulk count string"},
		// An inline line that never ends.
		{"InlineLine", strings.Repeat("x", 70000), "ERR Protocol error: too big inline request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			defer c.c.Close()
			c.write([]byte(tc.in))
			what := fmt.Sprintf("%.40q", tc.in)
			expect(t, readQuick(t, c, what), rerr(tc.want), what)
			if !c.closed() {
				t.Errorf("%s: connection open after a protocol error", what)
			}
			alive(t, addr, by, what)
		})
	}

	// A bulk of the bare form is an inline command, as in Redis.
	c := dial(t, addr)
	defer c.c.Close()
	c.write([]byte("$2000000000\r\nPING\r\n"))
	expect(t, readQuick(t, c, "inline $"), rerr("ERR unknown command '$2000000000', with args beginning with: "))
	expect(t, readQuick(t, c, "inline $ then PING"), status("PONG"))
	// Empty and null multibulks are skipped, as Redis does.
	c.write([]byte("*0\r\n*-1\r\nPING\r\n"))
	expect(t, readQuick(t, c, "*0 *-1 PING"), status("PONG"))
}

// testPanic: a panic while serving one connection closes that connection
// only. The backend here panics as a bug in a command would.
func (e *inputEnv) testPanic(t *testing.T) {
	h := &hookBackend{Backend: e.g}
	h.setRead(func(_ context.Context, keys [][]byte, _ bool) ([]shardkv.ValueEntry, error) {
		if string(keys[0]) == "boom" {
			var m map[string]int
			m["x"] = 1 // a nil-map write: a runtime panic
		}
		return e.g.ReadKeys(context.Background(), keys, false)
	})
	s, addr := extraServer(t, resp.Config{}, h)
	by := dial(t, addr)
	defer by.c.Close()
	c := dial(t, addr)
	c.write(encode("get", "boom"))
	if v, err := c.tryRead(); err == nil {
		t.Errorf("GET boom answered %#v; want the connection closed", v)
	}
	alive(t, addr, by, "after a panic")
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().ConnectedClients != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("connected clients %d after the panicking one closed, want 1", s.Stats().ConnectedClients)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		t.Fatal(err)
	}
}
