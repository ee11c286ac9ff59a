package resp_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
)

// TestRESP runs the protocol tests on one shared world (starting one costs
// seconds); subtests use their own keys.
func TestRESP(t *testing.T) {
	e := newEnv(t)
	e.run(t, "Errors", e.testErrors)
	e.run(t, "Strings", e.testStrings)
	e.run(t, "Set", e.testSet)
	e.run(t, "Counters", e.testCounters)
	e.run(t, "Keys", e.testKeys)
	e.run(t, "Expire", e.testExpire)
	e.run(t, "TTL", e.testTTL)
	e.run(t, "Redirects", e.testRedirects)
	e.run(t, "Cluster", e.testCluster)
	e.run(t, "ClusterClient", e.testClusterClient)
	e.run(t, "Scan", e.testScan)
	e.run(t, "Flush", e.testFlush)
	e.run(t, "RESP3", e.testRESP3)
	e.run(t, "Pipeline", e.testPipeline)
	e.run(t, "Streaming", e.testStreaming)
	e.run(t, "ReadsRideFullBatches", e.testReadsRideFullBatches)
	e.run(t, "Deadline", e.testDeadline)
	e.run(t, "FirstRefused", e.testFirstRefused)
	e.run(t, "Connection", e.testConnection)
	e.run(t, "Info", e.testInfo)
	e.run(t, "Auth", e.testAuth)
	e.run(t, "Limits", e.testLimits)
	e.run(t, "LCS", e.testLCS)
	e.run(t, "Transactions", e.testTransactions)
	e.run(t, "RestoreCollections", e.testRestoreCollections)
	e.run(t, "Outcomes", e.testOutcomes)
	e.run(t, "Hashes", e.testHashes)
	e.run(t, "Sets", e.testSets)
	e.run(t, "Lists", e.testLists)
	e.run(t, "BlockingOrder", e.testBlockingOrder)
	e.run(t, "SortedSets", e.testZSets)
	e.run(t, "ACL", e.testACL)
	e.run(t, "Close", e.testClose)
	e.run(t, "LeaderIsolated", e.testLeaderIsolated) // last: it disturbs gA
}

// testErrors checks error texts that do not depend on the keys' owners
// against Redis 7.0's (verified with redis-server 7.0.15).
func (e *env) testErrors(t *testing.T) {
	c := e.conn(e.leaderAddr(gA))
	cases := []struct {
		args []string
		want any
	}{
		{[]string{"foo", "a", "b"}, rerr("ERR unknown command 'foo', with args beginning with: 'a' 'b' ")},
		{[]string{"FOO"}, rerr("ERR unknown command 'FOO', with args beginning with: ")},
		{[]string{"get"}, rerr("ERR wrong number of arguments for 'get' command")},
		{[]string{"GET", "a", "b"}, rerr("ERR wrong number of arguments for 'get' command")},
		{[]string{"set", "k"}, rerr("ERR wrong number of arguments for 'set' command")},
		// As Redis Cluster, the keys' slots are checked first.
		{[]string{"mset", "k", "v", "k2"}, rerr("CROSSSLOT Keys in request don't hash to the same slot")},
		{[]string{"mset", "{t}k", "v", "{t}k2"}, rerr("ERR wrong number of arguments for 'mset' command")},
		{[]string{"set", "k", "v", "ex"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "nx", "xx"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "ex", "10", "px", "10"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "keepttl", "ex", "10"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "ex", "10", "keepttl"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "foo"}, rerr("ERR syntax error")},
		{[]string{"set", "k", "v", "ex", "0"}, rerr("ERR invalid expire time in 'set' command")},
		{[]string{"set", "k", "v", "px", "-1"}, rerr("ERR invalid expire time in 'set' command")},
		{[]string{"set", "k", "v", "ex", "9999999999999999"}, rerr("ERR invalid expire time in 'set' command")},
		{[]string{"set", "k", "v", "ex", "abc"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"set", "k", "v", "ex", "+10"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"incrby", "k", "1.5"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"decrby", "k", "-9223372036854775808"}, rerr("ERR decrement would overflow")},
		{[]string{"incrbyfloat", "k", "abc"}, rerr("ERR value is not a valid float")},
		{[]string{"incrbyfloat", "k", " 1"}, rerr("ERR value is not a valid float")},
		{[]string{"incrbyfloat", "k", "nan"}, rerr("ERR value is not a valid float")},
		{[]string{"incrbyfloat", "k", "-1e400"}, rerr("ERR increment would produce NaN or Infinity")},
		{[]string{"expire", "k", "10", "foo"}, rerr("ERR Unsupported option foo")},
		{[]string{"expire", "k", "10", "nx", "xx"}, rerr("ERR NX and XX, GT or LT options at the same time are not compatible")},
		{[]string{"expire", "k", "10", "gt", "lt"}, rerr("ERR GT and LT options at the same time are not compatible")},
		{[]string{"expire", "k", "abc"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"expire", "k", "99999999999999999"}, rerr("ERR invalid expire time in 'expire' command")},
		{[]string{"pexpire", "k", "9223372036854775807"}, rerr("ERR invalid expire time in 'pexpire' command")},
		{[]string{"mget", "a", "b"}, rerr("CROSSSLOT Keys in request don't hash to the same slot")},
		{[]string{"mset", "a", "1", "b", "2"}, rerr("CROSSSLOT Keys in request don't hash to the same slot")},
		{[]string{"del", "a", "b"}, rerr("CROSSSLOT Keys in request don't hash to the same slot")},
		{[]string{"exists", "a", "b"}, rerr("CROSSSLOT Keys in request don't hash to the same slot")},
		{[]string{"select", "1"}, rerr("ERR SELECT is not allowed in cluster mode")},
		{[]string{"select", "x"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"select", "99999999999"}, rerr("ERR value is out of range, value must between -2147483648 and 2147483647")},
		{[]string{"select", "0"}, status("OK")},
		{[]string{"auth", "x"}, rerr("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")},
		{[]string{"auth", "bob", "x"}, rerr("WRONGPASS invalid username-password pair or user is disabled.")},
		{[]string{"auth", "default", "x"}, status("OK")},
		{[]string{"hello", "1"}, rerr("NOPROTO unsupported protocol version")},
		{[]string{"hello", "4"}, rerr("NOPROTO unsupported protocol version")},
		{[]string{"hello", "x"}, rerr("ERR Protocol version is not an integer or out of range")},
		{[]string{"hello", "2", "foo"}, rerr("ERR Syntax error in HELLO option 'foo'")},
		{[]string{"hello", "2", "auth", "default"}, rerr("ERR Syntax error in HELLO option 'auth'")},
		{[]string{"client"}, rerr("ERR wrong number of arguments for 'client' command")},
		{[]string{"client", "foo"}, rerr("ERR unknown subcommand 'foo'. Try CLIENT HELP.")},
		{[]string{"client", "setname", "a b"}, rerr("ERR Client names cannot contain spaces, newlines or special characters.")},
		{[]string{"cluster", "foo"}, rerr("ERR unknown subcommand 'foo'. Try CLUSTER HELP.")},
		{[]string{"cluster", "keyslot"}, rerr("ERR wrong number of arguments for 'cluster|keyslot' command")},
		{[]string{"cluster", "countkeysinslot", "x"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"cluster", "countkeysinslot", "16384"}, rerr("ERR Invalid slot")},
		{[]string{"cluster", "getkeysinslot", "1", "-1"}, rerr("ERR Invalid slot or number of keys")},
		{[]string{"cluster", "getkeysinslot", "x", "1"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"config", "get"}, rerr("ERR wrong number of arguments for 'config|get' command")},
		{[]string{"command", "foo"}, rerr("ERR unknown subcommand 'foo'. Try COMMAND HELP.")},
		{[]string{"command", "getkeys", "foo", "a"}, rerr("ERR Invalid command specified")},
		{[]string{"command", "getkeys", "get", "a", "b"}, rerr("ERR Invalid number of arguments specified for command")},
		{[]string{"command", "getkeys", "echo", "a"}, rerr("ERR The command has no key arguments")},
		{[]string{"scan", "abc"}, rerr("ERR invalid cursor")},
		{[]string{"scan", "12345"}, rerr("ERR invalid cursor")},
		{[]string{"scan", "0", "count", "0"}, rerr("ERR syntax error")},
		{[]string{"scan", "0", "count", "x"}, rerr("ERR value is not an integer or out of range")},
		{[]string{"scan", "0", "match"}, rerr("ERR syntax error")},
		{[]string{"scan", "0", "foo", "bar"}, rerr("ERR syntax error")},
		{[]string{"ping", "a", "b"}, rerr("ERR wrong number of arguments for 'ping' command")},
		{[]string{"echo"}, rerr("ERR wrong number of arguments for 'echo' command")},
	}
	for _, tc := range cases {
		expect(t, c.do(tc.args...), tc.want, tc.args)
	}
	// The unknown-command error quotes at most 128 bytes of arguments, and
	// newlines in arguments never break the protocol.
	long := strings.Repeat("x", 200)
	expect(t, c.do("nope", long, "y"), rerr("ERR unknown command 'nope', with args beginning with: '"+long[:128]+"' "), "long args")
	expect(t, c.do("nope\r\nx"), rerr("ERR unknown command 'nope  x', with args beginning with: "), "newline")
	expect(t, c.do("PING"), status("PONG"), "after errors")
}

func (e *env) testStrings(t *testing.T) {
	k := e.keyIn(gA, "str:")
	expect(t, e.do("get", k), nil, "get absent")
	expect(t, e.do("set", k, "v1"), status("OK"))
	expect(t, e.do("get", k), "v1")
	expect(t, e.do("strlen", k), int64(2))
	expect(t, e.do("append", k, "23"), int64(4))
	expect(t, e.do("get", k), "v123")
	expect(t, e.do("getset", k, "new"), "v123")
	expect(t, e.do("getset", k+"x", "new"), nil, "getset absent")
	expect(t, e.do("setnx", k, "no"), int64(0))
	expect(t, e.do("get", k), "new")
	expect(t, e.do("getdel", k), "new")
	expect(t, e.do("getdel", k), nil)
	expect(t, e.do("setnx", k, "yes"), int64(1))
	expect(t, e.do("strlen", k+"nope"), int64(0))
	expect(t, e.do("append", k+"app", "ab"), int64(2), "append creates")
	expect(t, e.do("type", k), status("string"))
	expect(t, e.do("type", k+"nope"), status("none"))
	// Binary-safe values, and the empty value.
	bin := "a\x00b\r\nc"
	expect(t, e.do("set", k, bin), status("OK"))
	expect(t, e.do("get", k), bin)
	expect(t, e.do("set", k, ""), status("OK"))
	expect(t, e.do("get", k), "")
	expect(t, e.do("exists", k), int64(1), "empty value exists")

	// Multi-key commands on one slot (a hash tag).
	a, b, c := "{mk}a", "{mk}b", "{mk}c"
	expect(t, e.do("mset", a, "1", b, "2"), status("OK"))
	expect(t, e.do("mget", a, b, c), []any{"1", "2", nil})
	expect(t, e.do("exists", a, b, c, a), int64(3), "exists counts repeats")
	expect(t, e.do("del", a, c, a), int64(1), "del counts keys deleted")
	expect(t, e.do("unlink", b), int64(1))
	expect(t, e.do("mget", a, b), []any{nil, nil})
}

func (e *env) testSet(t *testing.T) {
	k := e.keyIn(gB, "set:")
	expect(t, e.do("set", k, "a", "xx"), nil, "xx absent")
	expect(t, e.do("get", k), nil)
	expect(t, e.do("set", k, "a", "nx"), status("OK"))
	expect(t, e.do("set", k, "b", "nx"), nil, "nx present")
	expect(t, e.do("set", k, "b", "xx", "get"), "a", "xx get")
	expect(t, e.do("set", k, "c", "nx", "get"), "b", "nx get: old value, not set")
	expect(t, e.do("get", k), "b")
	expect(t, e.do("set", k+"n", "c", "get"), nil, "get absent")
	expect(t, e.do("set", k, "c", "NX", "nx"), nil, "repeated option")

	// Expiry options.
	now := time.Now()
	expect(t, e.do("set", k, "e", "ex", "100"), status("OK"))
	e.ttlNear(t, "ttl", k, now.Add(100*time.Second), time.Now().Add(100*time.Second))
	now = time.Now()
	expect(t, e.do("set", k, "e", "px", "100000"), status("OK"))
	e.ttlNear(t, "pttl", k, now.Add(100*time.Second), time.Now().Add(100*time.Second))
	now = time.Now()
	at := now.Add(time.Hour).Unix()
	expect(t, e.do("set", k, "e", "exat", strconv.FormatInt(at, 10)), status("OK"))
	e.ttlNear(t, "ttl", k, time.Unix(at, 0), time.Unix(at, 0))
	expect(t, e.do("set", k, "f", "keepttl"), status("OK"))
	e.ttlNear(t, "ttl", k, time.Unix(at, 0), time.Unix(at, 0))
	expect(t, e.do("get", k), "f")
	expect(t, e.do("set", k, "g"), status("OK"))
	expect(t, e.do("ttl", k), int64(-1), "plain SET clears the TTL")
	expect(t, e.do("set", k, "h", "ex", "100"), status("OK"))
	expect(t, e.do("getset", k, "i"), "h")
	expect(t, e.do("ttl", k), int64(-1), "GETSET clears the TTL")
	pxat := time.Now().Add(-time.Second).UnixMilli()
	expect(t, e.do("set", k, "past", "pxat", strconv.FormatInt(pxat, 10)), status("OK"), "PXAT in the past")
	expect(t, e.do("get", k), nil, "set with a past PXAT is expired at once")

	// Size limits: nothing is proposed for an oversized key or value.
	big := strings.Repeat("v", shardkv.DefaultMaxValueBytes+1)
	expect(t, e.do("set", k, big), rerr(fmt.Sprintf("ERR value of %d bytes exceeds the limit of %d bytes", len(big), shardkv.DefaultMaxValueBytes)))
	expect(t, e.do("append", k, big), rerr(fmt.Sprintf("ERR value of %d bytes exceeds the limit of %d bytes", len(big), shardkv.DefaultMaxValueBytes)))
	bigKey := strings.Repeat("k", shardkv.MaxKeyBytesLimit+1)
	c := e.conn(e.leaderAddr(gA))
	expect(t, c.do("set", bigKey, "v"), rerr(fmt.Sprintf("ERR key of %d bytes exceeds the limit of %d bytes", len(bigKey), shardkv.MaxKeyBytesLimit)))
	expect(t, e.do("get", k), nil)
}

func (e *env) testCounters(t *testing.T) {
	k := e.keyIn(gA, "ctr:")
	expect(t, e.do("incr", k), int64(1))
	expect(t, e.do("incrby", k, "41"), int64(42))
	expect(t, e.do("decr", k), int64(41))
	expect(t, e.do("decrby", k, "-9"), int64(50))
	expect(t, e.do("incrby", k, "-100"), int64(-50))
	expect(t, e.do("get", k), "-50")
	expect(t, e.do("set", k, "9223372036854775807"), status("OK"))
	expect(t, e.do("incr", k), rerr("ERR increment or decrement would overflow"))
	expect(t, e.do("get", k), "9223372036854775807", "overflow changes nothing")
	expect(t, e.do("set", k, "abc"), status("OK"))
	expect(t, e.do("incr", k), rerr("ERR value is not an integer or out of range"))
	expect(t, e.do("set", k, " 1"), status("OK"))
	expect(t, e.do("incr", k), rerr("ERR value is not an integer or out of range"))
	// INCR keeps the TTL.
	now := time.Now()
	expect(t, e.do("set", k, "1", "ex", "100"), status("OK"))
	expect(t, e.do("incr", k), int64(2))
	e.ttlNear(t, "ttl", k, now.Add(100*time.Second), time.Now().Add(100*time.Second))

	f := e.keyIn(gB, "flt:")
	expect(t, e.do("incrbyfloat", f, "1.5"), "1.5")
	expect(t, e.do("incrbyfloat", f, "2"), "3.5")
	expect(t, e.do("incrbyfloat", f, "-3.5"), "0")
	expect(t, e.do("set", f, "10.50"), status("OK"))
	expect(t, e.do("incrbyfloat", f, "0.1"), "10.6")
	expect(t, e.do("incrbyfloat", f, "5.0e3"), "5010.6")
	nan := rerr("ERR increment would produce NaN or Infinity")
	expect(t, e.do("incrbyfloat", f, "inf"), nan)
	expect(t, e.do("incrbyfloat", f, "1e308"), "1"+strings.Repeat("0", 308))
	expect(t, e.do("incrbyfloat", f, "1e308"), nan, "sum beyond float64")
	expect(t, e.do("set", f, "x"), status("OK"))
	expect(t, e.do("incrbyfloat", f, "1"), rerr("ERR value is not a valid float"))
	expect(t, e.do("incrbyfloat", f, "inf"), rerr("ERR value is not a valid float"), "current value checked first")
}

func (e *env) testKeys(t *testing.T) {
	k := e.keyIn(gB, "key:")
	expect(t, e.do("exists", k), int64(0))
	expect(t, e.do("del", k), int64(0))
	expect(t, e.do("set", k, "v"), status("OK"))
	expect(t, e.do("exists", k), int64(1))
	expect(t, e.do("ttl", k), int64(-1))
	expect(t, e.do("pttl", k), int64(-1))
	expect(t, e.do("ttl", k+"nope"), int64(-2))
	expect(t, e.do("pttl", k+"nope"), int64(-2))
	expect(t, e.do("persist", k), int64(0), "persist without expiry")
	expect(t, e.do("del", k), int64(1))
	expect(t, e.do("exists", k), int64(0))
	expect(t, e.do("persist", k), int64(0), "persist absent")
}

func (e *env) testExpire(t *testing.T) {
	k := e.keyIn(gA, "exp:")
	expect(t, e.do("expire", k, "100"), int64(0), "expire absent")
	expect(t, e.do("set", k, "v"), status("OK"))
	expect(t, e.do("expire", k, "100", "xx"), int64(0), "XX without expiry")
	expect(t, e.do("expire", k, "100", "gt"), int64(0), "GT without expiry (infinite)")
	expect(t, e.do("expire", k, "100", "nx"), int64(1), "NX without expiry")
	expect(t, e.do("expire", k, "200", "nx"), int64(0), "NX with expiry")
	expect(t, e.do("expire", k, "50", "gt"), int64(0), "GT smaller")
	expect(t, e.do("expire", k, "200", "gt"), int64(1), "GT larger")
	expect(t, e.do("expire", k, "300", "lt"), int64(0), "LT larger")
	expect(t, e.do("expire", k, "150", "lt"), int64(1), "LT smaller")
	now := time.Now()
	expect(t, e.do("expire", k, "160", "xx", "gt"), int64(1), "XX GT")
	e.ttlNear(t, "ttl", k, now.Add(160*time.Second), time.Now().Add(160*time.Second))
	now = time.Now()
	expect(t, e.do("pexpire", k, "500000"), int64(1))
	e.ttlNear(t, "pttl", k, now.Add(500*time.Second), time.Now().Add(500*time.Second))
	now = time.Now()
	at := now.Add(time.Hour)
	expect(t, e.do("expireat", k, strconv.FormatInt(at.Unix(), 10)), int64(1))
	e.ttlNear(t, "ttl", k, time.Unix(at.Unix(), 0), time.Unix(at.Unix(), 0))
	expect(t, e.do("pexpireat", k, strconv.FormatInt(at.UnixMilli()+5000, 10)), int64(1))
	e.ttlNear(t, "pttl", k, time.UnixMilli(at.UnixMilli()+5000), time.UnixMilli(at.UnixMilli()+5000))
	expect(t, e.do("persist", k), int64(1))
	expect(t, e.do("ttl", k), int64(-1))
	expect(t, e.do("expire", k, "100", "lt"), int64(1), "LT without expiry (infinite)")
	// A time in the past deletes the key (and counts as set).
	expect(t, e.do("expire", k, "-1"), int64(1))
	expect(t, e.do("exists", k), int64(0))
	expect(t, e.do("set", k, "v"), status("OK"))
	expect(t, e.do("pexpireat", k, "1"), int64(1))
	expect(t, e.do("get", k), nil)
	// XX LT: only a key with an expiry, and only to an earlier one.
	expect(t, e.do("set", k, "v"), status("OK"))
	expect(t, e.do("expire", k, "100", "xx", "lt"), int64(0), "XX LT without expiry")
	expect(t, e.do("ttl", k), int64(-1))
	expect(t, e.do("expire", k, "100"), int64(1))
	expect(t, e.do("expire", k, "200", "lt", "xx"), int64(0), "XX LT later")
	now = time.Now()
	expect(t, e.do("pexpire", k, "50000", "xx", "lt"), int64(1), "XX LT earlier")
	e.ttlNear(t, "pttl", k, now.Add(50*time.Second), time.Now().Add(50*time.Second))
}

// ttlNear checks the TTL (cmd "ttl") or PTTL of key, whose expiry was set
// to a time from lo to hi (a relative expiry: from before the command to
// after its reply), allowing for the time the TTL command takes, for
// rounding, and for the log clock the TTL counts from: it may lag the true
// time by about raftgroup.ClockLag and a commit (docs/time.md).
func (e *env) ttlNear(t *testing.T, cmd, key string, lo, hi time.Time) {
	t.Helper()
	before := time.Now()
	got := e.do(cmd, key)
	after := time.Now()
	unit := time.Second
	if cmd == "pttl" {
		unit = time.Millisecond
	}
	const lag = time.Second
	min, max := int64(lo.Add(-50*time.Millisecond).Sub(after)/unit)-1, int64(hi.Add(lag).Sub(before)/unit)+1
	if n, ok := got.(int64); !ok || n < min || n > max {
		t.Errorf("%s %s: %v, want %d..%d", cmd, key, got, min, max)
	}
}

// testTTL: an expired key is invisible at once; the leader's active expiry
// then deletes it, so DBSIZE drops.
func (e *env) testTTL(t *testing.T) {
	addr := e.leaderAddr(gB)
	c := e.conn(addr)
	// Let earlier subtests' expired keys go first.
	before := c.do("dbsize").(int64)
	for {
		time.Sleep(300 * time.Millisecond)
		n := c.do("dbsize").(int64)
		if n == before {
			break
		}
		before = n
	}
	const n = 10
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("ttl:%d", i)
		if e.owner(k) == gB {
			keys = append(keys, k)
		}
	}
	// Expiries are set when the SETs reach the leader: before each reply.
	start := time.Now()
	for _, k := range keys {
		expect(t, e.do("set", k, "v", "px", "1500"), status("OK"))
	}
	if time.Since(start) < time.Second {
		// (Only when the machine is not so slow that they could be gone.)
		expect(t, e.do("get", keys[0]), "v")
		if got := c.do("dbsize").(int64); got != before+n {
			t.Fatalf("dbsize %d, want %d", got, before+n)
		}
	}
	time.Sleep(1600 * time.Millisecond) // after the last SET's reply
	// Reads judge expiry by the log clock, which passes an expiry within
	// the expiry loop's period and a commit (docs/time.md).
	for late := time.Now().Add(time.Second); e.do("get", keys[n-1]) != nil && time.Now().Before(late); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, k := range keys {
		expect(t, e.do("get", k), nil, "expired ", k)
		expect(t, e.do("ttl", k), int64(-2), "expired ", k)
		expect(t, e.do("exists", k), int64(0), "expired ", k)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.do("dbsize").(int64) != before {
		if time.Now().After(deadline) {
			t.Fatalf("dbsize %v, want %d after active expiry", c.do("dbsize"), before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
