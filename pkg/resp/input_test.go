package resp_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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

// alive checks that the server at addr answers a new client (after AUTH
// with password, if given), and that the bystander connection still works.
func alive(t *testing.T, addr string, bystander *rconn, what string, password ...string) {
	t.Helper()
	c := dial(t, addr)
	defer c.c.Close()
	for _, pw := range password {
		c.write(encode("auth", pw))
		expect(t, readQuick(t, c, what+": new client AUTH"), status("OK"), what+": new client AUTH")
	}
	c.write(encode("ping"))
	expect(t, readQuick(t, c, what+": new client PING"), status("PONG"), what+": new client")
	bystander.write(encode("ping"))
	expect(t, readQuick(t, bystander, what+": bystander PING"), status("PONG"), what+": bystander")
}

func TestRESPInput(t *testing.T) {
	e := newInputEnv(t)
	t.Run("Malformed", e.testMalformed)
	t.Run("GoodBeforeBad", e.testGoodBeforeBad)
	t.Run("Unauthenticated", e.testUnauthenticated)
	t.Run("Inline", e.testInline)
	t.Run("Sizes", e.testSizes)
	t.Run("Panic", e.testPanic)
	t.Run("IdleTimeout", e.testIdleTimeout)
	t.Run("InputBudget", e.testInputBudget)
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
	var logs syncBuffer
	h := &hookBackend{Backend: e.g}
	h.setRead(func(_ context.Context, keys [][]byte, _ bool) ([]shardkv.ValueEntry, error) {
		if string(keys[0]) == "boom" {
			panic("a bug in a command")
		}
		return e.g.ReadKeys(context.Background(), keys, false, nil)
	})
	s, addr := extraServer(t, resp.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, h)
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
	// One short line, naming the place, not the request.
	line := logs.String()
	if !strings.Contains(line, "panic serving a client") || !strings.Contains(line, "a bug in a command") ||
		strings.Count(line, "\n") != 1 || len(line) > 1000 || strings.Contains(line, "boom") {
		t.Errorf("panic log: %q", line)
	}
}

// syncBuffer is a bytes.Buffer for a logger written by many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// testGoodBeforeBad: as in Redis, the commands before a malformed one run
// and are answered; then the error, then the connection closes.
func (e *inputEnv) testGoodBeforeBad(t *testing.T) {
	_, addr := extraServer(t, resp.Config{}, e.g)
	c := dial(t, addr)
	defer c.c.Close()
	k := e.w.keyIn(gA, "gbb:")
	c.write([]byte(string(encode("set", k, "v")) + "PING\r\n*1\r\n$-5\r\n" + string(encode("set", k, "after"))))
	expect(t, readQuick(t, c, "SET"), status("OK"))
	expect(t, readQuick(t, c, "PING"), status("PONG"))
	expect(t, readQuick(t, c, "bad"), rerr("ERR Protocol error: invalid bulk length"))
	if !c.closed() {
		t.Error("connection open after a protocol error")
	}
	expect(t, e.w.do("get", k), "v", "the command after the bad one must not run")
}

// testUnauthenticated: before AUTH (a password set), Redis's tighter caps:
// 10 arguments, 16 KiB bulks. AUTH lifts them for the next command, even
// in the same pipeline.
func (e *inputEnv) testUnauthenticated(t *testing.T) {
	// A bulk limit of 1 MiB, so that a bulk over it is over both limits.
	_, addr := extraServer(t, resp.Config{Password: "pw", MaxBulkBytes: 1 << 20}, e.g)
	by := dial(t, addr)
	defer by.c.Close()
	expect(t, by.do("auth", "pw"), status("OK"))
	for _, tc := range []struct{ in, want string }{
		{"*11\r\n", "ERR Protocol error: unauthenticated multibulk length"},
		{"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16385\r\n", "ERR Protocol error: unauthenticated bulk length"},
		{"*1\r\n$1048577\r\n", "ERR Protocol error: invalid bulk length"},
	} {
		c := dial(t, addr)
		c.write([]byte(tc.in))
		what := fmt.Sprintf("%.40q", tc.in)
		expect(t, readQuick(t, c, what), rerr(tc.want), what)
		if !c.closed() {
			t.Errorf("%s: connection open after a protocol error", what)
		}
		c.c.Close()
		alive(t, addr, by, what, "pw")
	}
	// At the caps: answered (NOAUTH), the connection stays.
	c := dial(t, addr)
	defer c.c.Close()
	ten := make([]string, 10)
	for i := range ten {
		ten[i] = "x"
	}
	ten[0] = "exists"
	c.write(encode(ten...))
	expect(t, readQuick(t, c, "10 args"), rerr("NOAUTH Authentication required."))
	c.write(encode("echo", strings.Repeat("x", 16384)))
	expect(t, readQuick(t, c, "16 KiB bulk"), rerr("NOAUTH Authentication required."))
	// AUTH, then at once a larger command, in one write.
	k := e.w.keyIn(gA, "unauth:")
	big := strings.Repeat("v", 100<<10)
	c.write(append(encode("auth", "pw"), encode("set", k, big)...))
	expect(t, readQuick(t, c, "AUTH"), status("OK"))
	expect(t, readQuick(t, c, "SET after AUTH"), status("OK"))
	expectBig(t, c.do("get", k), big, "GET after AUTH")
}

// expectBig is expect for replies too long to print.
func expectBig[T ~string](t *testing.T, got any, want T, what string) {
	t.Helper()
	if g, ok := got.(T); !ok || g != want {
		s := fmt.Sprintf("%#v", got)
		t.Errorf("%s: got %.80s... (%d bytes), want %.80q... (%d bytes)", what, s, len(s), string(want), len(want))
	}
}

// testInline: inline (telnet) commands, with Redis's quoting and its
// 64 KiB line cap.
func (e *inputEnv) testInline(t *testing.T) {
	_, addr := extraServer(t, resp.Config{}, e.g)
	c := dial(t, addr)
	defer c.c.Close()
	c.write([]byte("ECHO \"a\\x41\\n\\\"b\"\r\n\r\n  \r\nECHO 'it\\'s'\nECHO " + strings.Repeat("x", maxInline-len("ECHO \r")) + "\r\n"))
	expect(t, readQuick(t, c, "double quotes"), "aA\n\"b")
	expect(t, readQuick(t, c, "single quotes"), "it's")
	expectBig(t, readQuick(t, c, "a 64 KiB line"), strings.Repeat("x", maxInline-len("ECHO \r")), "a 64 KiB line")
	for _, in := range []string{"ECHO \"a\"b\r\n", "ECHO 'a\r\n", "ECHO " + strings.Repeat("x", maxInline) + "\r\n"} {
		c := dial(t, addr)
		c.write([]byte(in))
		want := "ERR Protocol error: unbalanced quotes in request"
		if len(in) > maxInline {
			want = "ERR Protocol error: too big inline request"
		}
		expectBig(t, readQuick(t, c, fmt.Sprintf("%.20q", in)), rerr(want), fmt.Sprintf("%.20q", in))
		if !c.closed() {
			t.Errorf("%.20q: connection open after a protocol error", in)
		}
		c.c.Close()
	}
}

// maxInline is Redis's inline line cap, its '\r' included.
const maxInline = 64 << 10

// testSizes: the size limits are checked at the headers, before the data
// comes.
func (e *inputEnv) testSizes(t *testing.T) {
	_, addr := extraServer(t, resp.Config{MaxRequestBytes: 4096, MaxBulkBytes: 2000, MaxArgs: 100}, e.g)
	by := dial(t, addr)
	defer by.c.Close()
	for _, tc := range []struct{ in, want string }{
		{"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2001\r\n", "ERR Protocol error: invalid bulk length"},
		{"*101\r\n", "ERR Protocol error: invalid multibulk length"},
		// Each bulk fits, the command does not.
		{"*4\r\n$3\r\nSET\r\n" + strings.Repeat("$2000\r\n"+strings.Repeat("k", 2000)+"\r\n", 2) + "$2000\r\n", "ERR Protocol error: request too large (limit 4096 bytes)"},
	} {
		c := dial(t, addr)
		c.write([]byte(tc.in))
		what := fmt.Sprintf("%.40q", tc.in)
		expect(t, readQuick(t, c, what), rerr(tc.want), what)
		if !c.closed() {
			t.Errorf("%s: connection open after a protocol error", what)
		}
		c.c.Close()
		alive(t, addr, by, what)
	}
	// At the limits: served.
	k := e.w.keyIn(gA, "size:")
	expect(t, by.do("set", k, "1"), status("OK"))
	args := []string{"exists"}
	for len(args) < 100 {
		args = append(args, k)
	}
	expect(t, by.do(args...), int64(99))
	expect(t, by.do("echo", strings.Repeat("e", 2000)), strings.Repeat("e", 2000))
}

// testIdleTimeout: with IdleTimeout a silent client is closed; a busy one
// is not.
func (e *inputEnv) testIdleTimeout(t *testing.T) {
	_, addr := extraServer(t, resp.Config{IdleTimeout: 500 * time.Millisecond}, e.g)
	idle, busy := dial(t, addr), dial(t, addr)
	defer idle.c.Close()
	defer busy.c.Close()
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		expect(t, busy.do("ping"), status("PONG"))
		time.Sleep(100 * time.Millisecond)
	}
	if !idle.closed() {
		t.Error("idle client still open after 4 timeouts")
	}
	expect(t, busy.do("ping"), status("PONG"))
}

// testInputBudget: past the server-wide input budget a connection is
// refused with an error and closed; the others go on, and the budget comes
// back when it closes.
func (e *inputEnv) testInputBudget(t *testing.T) {
	const budget = 256 << 10
	s, addr := extraServer(t, resp.Config{InputBudgetBytes: budget, MaxRequestBytes: 1 << 20, MaxBulkBytes: 1 << 20}, e.g)
	by := dial(t, addr)
	defer by.c.Close()
	expect(t, by.do("ping"), status("PONG"))
	base := s.Stats().InputBytes
	if base <= 0 || base > 8<<10 {
		t.Fatalf("one idle client holds %d input bytes", base)
	}
	// A 300 KiB value arriving: its buffer outgrows the budget.
	k := e.w.keyIn(gA, "budget:")
	c := dial(t, addr)
	defer c.c.Close()
	frame := encode("set", k, strings.Repeat("b", 300<<10))
	c.write(frame[:200<<10])
	expect(t, readQuick(t, c, "over budget"), rerr(fmt.Sprintf("ERR client input buffers of this server are full (%d bytes); try again later", budget)))
	if !c.closed() {
		t.Error("connection open after the budget refusal")
	}
	alive(t, addr, by, "after a budget refusal")
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().InputBytes != base {
		if time.Now().After(deadline) {
			t.Fatalf("input bytes %d after the refused client left, want %d", s.Stats().InputBytes, base)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.InputRefusals != 1 {
		t.Errorf("input refusals %d, want 1", st.InputRefusals)
	}
	// Within the budget a large value is served, and its memory returned.
	v := strings.Repeat("w", 100<<10)
	expect(t, by.do("set", k, v), status("OK"))
	expectBig(t, by.do("get", k), v, "GET")
	if got := s.Stats().InputBytes; got != base {
		t.Errorf("input bytes %d after a large command, want %d", got, base)
	}
	// Many clients: each idle one holds a small buffer; past the budget
	// the next is refused at once.
	var cs []*rconn
	defer func() {
		for _, c := range cs {
			c.c.Close()
		}
	}()
	for i := 0; ; i++ {
		if i > budget/1024 {
			t.Fatal("no client refused")
		}
		c := dial(t, addr)
		cs = append(cs, c)
		c.write(encode("ping"))
		if r := readQuick(t, c, "many clients"); r != status("PONG") {
			expect(t, r, rerr(fmt.Sprintf("ERR client input buffers of this server are full (%d bytes); try again later", budget)))
			break
		}
	}
	if got := s.Stats().InputBytes; got > budget {
		t.Errorf("input bytes %d past the budget %d", got, budget)
	}
}
