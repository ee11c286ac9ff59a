package node_test

// The differential test of the Redis protocol front end: the command scripts
// in testdata/redis/diff/*.txt run, line by line, against Debian's
// redis-server (started by the test, in cluster mode with every slot on
// itself, since shardkv is a Redis Cluster) and against `node local --resp`
// with one data group (every slot on one group; commands go to its leader).
// Each reply from shardkv must equal redis-server's, error texts included,
// except for the differences docs/redis.md documents, each an entry of
// diffAllow with its reason. Commands run in order on one connection per
// script and side; the lines of a script run interleaved (redis-server,
// then shardkv), so the two see the same elapsed times.
//
// Script syntax (one command per line):
//
//   - blank lines and lines starting with '#' are ignored;
//   - `@sleep <duration>` (time.ParseDuration) pauses both sides;
//   - any other line is a command: arguments separated by spaces or tabs;
//     an argument in double quotes is a Go string literal
//     (strconv.Unquote: "a b", "", "\x00\xff", "\"");
//   - an argument `$NOW_S<+|-N>` or `$NOW_MS<+|-N>` becomes the Unix time in
//     seconds or milliseconds plus or minus N, computed when the command is
//     sent to each server (for EXPIREAT, PXAT, ...).
//
// Replies are compared after parsing (type and value: a RESP2 reply parses
// to one value, so equal values mean equal bytes), with these rules:
//
//   - TTL and PTTL: -1 and -2 must match exactly; a positive TTL must be
//     positive on both sides and within 1 s (TTL) or 1000 ms (PTTL) of each
//     other, since the two servers see the command a few milliseconds apart
//     and round differently;
//   - a command in diffAllow is compared by its rule there instead;
//   - a MOVED or TRYAGAIN from shardkv (the command did not run: leadership
//     moved) is followed and the command resent, a bounded number of times.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// diffRule compares a reply pair for a command whose replies legitimately
// differ; it returns "" if they agree under the rule.
type diffRule struct {
	reason  string
	compare func(args []string, redis, shardkv respValue) string
}

// diffAllow: the documented differences (docs/redis.md), by command name
// (and subcommand, upper case, for container commands).
var diffAllow = map[string]diffRule{
	"CLUSTER INFO": {
		reason: "the counters (known nodes, epochs, messages) describe different clusters; both must report cluster_state:ok",
		compare: func(_ []string, a, b respValue) string {
			for _, v := range []respValue{a, b} {
				if v.kind != '$' || !strings.Contains(v.str, "cluster_state:ok") {
					return "want a bulk string with cluster_state:ok"
				}
			}
			return ""
		},
	},
	"INCRBYFLOAT": {
		reason:  incrByFloatReason,
		compare: compareIncrByFloat,
	},
	"HINCRBYFLOAT": {
		reason:  "as INCRBYFLOAT: " + incrByFloatReason,
		compare: compareIncrByFloat,
	},
	"HGETALL": {
		reason:  "a hash's fields come in insertion order (small hash) or the hash table's in Redis, in field order in shardkv; the same pairs must come",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 2) },
	},
	"HKEYS": {
		reason:  "as HGETALL: the same fields in another order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"HVALS": {
		reason:  "as HGETALL: the same values in another order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SMEMBERS": {
		reason:  "a set's members come in the intset's numeric order or the hash table's in Redis, in byte order in shardkv; the same members must come",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SINTER": {
		reason:  "as SMEMBERS: the same members in another order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SUNION": {
		reason:  "as SMEMBERS: the same members in another order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SDIFF": {
		reason:  "as SMEMBERS: the same members in another order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SPOP": {
		reason:  "random members in random order; scripts use only the deterministic forms (a count of at least the set's size, a set of one member), whose members must match in any order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SRANDMEMBER": {
		reason:  "as SPOP: random members; only the deterministic forms, compared in any order",
		compare: func(_ []string, a, b respValue) string { return compareUnordered(a, b, 1) },
	},
	"SSCAN": {
		reason: "a page's members come in the intset's or the hash table's order in Redis, in byte order in shardkv; " +
			"the cursor and the page's members must match (scripts use pages that hold the whole set)",
		compare: func(_ []string, a, b respValue) string {
			if a.kind != '*' || b.kind != '*' || len(a.arr) != 2 || len(b.arr) != 2 {
				if a.String() != b.String() {
					return "replies differ"
				}
				return ""
			}
			if a.arr[0].String() != b.arr[0].String() {
				return "cursors differ"
			}
			return compareUnordered(a.arr[1], b.arr[1], 1)
		},
	},
	"HRANDFIELD": {
		reason: "random fields in random order; scripts use only the deterministic forms (a count of at least the hash's size, a hash of one field), whose fields must match in any order",
		compare: func(args []string, a, b respValue) string {
			group := 1
			if len(args) == 4 && strings.EqualFold(args[3], "withvalues") && (len(a.arr) == 0 || a.arr[0].kind != '*') {
				group = 2 // RESP2: field, value, field, value ...
			}
			return compareUnordered(a, b, group)
		},
	},
	"SCAN": {
		reason: "the order of keys in a SCAN page is the hash table's in Redis (random per process), key order in shardkv; " +
			"the cursor and the set of keys must match (scripts use a COUNT that returns everything in one page)",
		compare: func(_ []string, a, b respValue) string {
			if a.kind != '*' || b.kind != '*' || len(a.arr) != 2 || len(b.arr) != 2 {
				if a.String() != b.String() {
					return "replies differ"
				}
				return ""
			}
			sorted := func(v respValue) string {
				keys := make([]string, len(v.arr))
				for i, k := range v.arr {
					keys[i] = k.String()
				}
				slices.Sort(keys)
				return strings.Join(keys, ",")
			}
			if a.arr[0].String() != b.arr[0].String() || sorted(a.arr[1]) != sorted(b.arr[1]) {
				return "cursor or keys differ"
			}
			return ""
		},
	},
	"KEYS": {
		reason: "the order of keys is the hash table's in Redis, key order in shardkv; the set of keys must match",
		compare: func(_ []string, a, b respValue) string {
			sorted := func(v respValue) string {
				keys := make([]string, len(v.arr))
				for i, k := range v.arr {
					keys[i] = k.String()
				}
				slices.Sort(keys)
				return string(v.kind) + strings.Join(keys, ",")
			}
			if sorted(a) != sorted(b) {
				return "keys differ: " + sorted(a) + " / " + sorted(b)
			}
			return ""
		},
	},
	"RANDOMKEY": {
		reason: "a key picked at random from different stores: both must be a key (a bulk string) or both nil",
		compare: func(_ []string, a, b respValue) string {
			if a.kind != b.kind || a.null != b.null {
				return "want the same kind of reply"
			}
			return ""
		},
	},
	"TIME": {
		reason: "two clocks read a few milliseconds apart: both must be [seconds, microseconds] within 2 s of each other",
		compare: func(_ []string, a, b respValue) string {
			at := func(v respValue) (float64, bool) {
				if v.kind != '*' || len(v.arr) != 2 {
					return 0, false
				}
				s, err1 := strconv.ParseInt(v.arr[0].str, 10, 64)
				us, err2 := strconv.ParseInt(v.arr[1].str, 10, 64)
				return float64(s) + float64(us)/1e6, err1 == nil && err2 == nil && us >= 0 && us < 1e6
			}
			if a.String() == b.String() {
				return "" // errors
			}
			ta, okA := at(a)
			tb, okB := at(b)
			if !okA || !okB || math.Abs(ta-tb) > 2 {
				return "want two [seconds, microseconds] replies within 2 s"
			}
			return ""
		},
	},
	"HELLO": {
		reason: "the server version (shardkv reports the Redis version it implements, 7.0.0) and the client id differ; every other field must match",
		compare: func(_ []string, a, b respValue) string {
			strip := func(v respValue) string {
				if (v.kind != '*' && v.kind != '%') || len(v.arr)%2 != 0 {
					return v.String()
				}
				var parts []string
				for i := 0; i < len(v.arr); i += 2 {
					if k := v.arr[i].str; k != "version" && k != "id" {
						parts = append(parts, v.arr[i].String()+"="+v.arr[i+1].String())
					}
				}
				return string(v.kind) + strings.Join(parts, " ")
			}
			if strip(a) != strip(b) {
				return "replies differ beyond version and id"
			}
			return ""
		},
	},
	"INFO": {
		reason: "the fields describe different servers; both must be bulk strings with a # Server section in cluster mode",
		compare: func(_ []string, a, b respValue) string {
			for _, v := range []respValue{a, b} {
				if v.kind != '$' || !strings.HasPrefix(v.str, "# Server\r\n") || !strings.Contains(v.str, "\r\nredis_mode:cluster\r\n") {
					return "want a bulk string starting with # Server, with redis_mode:cluster"
				}
			}
			return ""
		},
	},
	"CLIENT SETINFO": {
		reason: "CLIENT SETINFO is new in Redis 7.2 (Debian's redis-server is 7.0, which answers unknown subcommand); " +
			"shardkv implements it, as go-redis sends it on every new connection",
		compare: func(_ []string, a, b respValue) string {
			if !strings.HasPrefix(a.String(), "-ERR unknown subcommand 'SETINFO'") && a.String() != b.String() {
				return "replies differ"
			}
			if b.String() != "+OK" && a.String() != b.String() {
				return "want +OK from shardkv"
			}
			return ""
		},
	},
	"CLUSTER MYID": {
		reason: "a node id is random in Redis, derived from (gid, replica) in shardkv; both are 40 hex characters",
		compare: func(_ []string, a, b respValue) string {
			for _, v := range []respValue{a, b} {
				if v.kind != '$' || !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(v.str) {
					return "want a 40-hex-character bulk string"
				}
			}
			return ""
		},
	},
}

const incrByFloatReason = "Redis adds in long double and prints the sum with %.17Lf, trailing zeros cut " +
	"(0.1+0.2 -> 0.3, 10.5+5000 -> 5010.60000000000000009); shardkv adds in float64 " +
	"and rounds noise of up to 2 ulps away (0.1+0.2 -> 0.3, but long chains can differ in the last digits). A result must agree to 12 significant digits; " +
	"an increment or a sum beyond float64's range (finite in long double) must be shardkv's NaN-or-Infinity error; " +
	"errors otherwise match exactly"

// compareUnordered compares two arrays (or maps) as multisets of runs of
// group elements; other replies must be equal.
func compareUnordered(a, b respValue, group int) string {
	if a.kind != b.kind || a.null != b.null || (a.kind != '*' && a.kind != '%' && a.kind != '~') {
		if a.String() != b.String() {
			return "replies differ"
		}
		return ""
	}
	sorted := func(v respValue) string {
		var runs []string
		for i := 0; i+group <= len(v.arr); i += group {
			var parts []string
			for _, e := range v.arr[i : i+group] {
				parts = append(parts, e.String())
			}
			runs = append(runs, strings.Join(parts, "="))
		}
		slices.Sort(runs)
		return fmt.Sprintf("%d:%s", len(v.arr), strings.Join(runs, ","))
	}
	if sorted(a) != sorted(b) {
		return "elements differ: " + sorted(a) + " / " + sorted(b)
	}
	return ""
}

// compareIncrByFloat is INCRBYFLOAT's and HINCRBYFLOAT's rule (see
// incrByFloatReason).
func compareIncrByFloat(args []string, a, b respValue) string {
	if a.String() == b.String() {
		return ""
	}
	if a.kind != '$' || a.null {
		return "replies differ"
	}
	fa, errA := strconv.ParseFloat(a.str, 64)
	_, errIncr := strconv.ParseFloat(args[len(args)-1], 64)
	if (errors.Is(errA, strconv.ErrRange) || errors.Is(errIncr, strconv.ErrRange)) &&
		b.String() == "-ERR increment would produce NaN or Infinity" {
		return ""
	}
	if b.kind != '$' || b.null {
		return "replies differ"
	}
	fb, errB := strconv.ParseFloat(b.str, 64)
	if errA != nil || errB != nil || math.Abs(fa-fb) > 1e-12*max(math.Abs(fa), math.Abs(fb)) {
		return "results differ beyond float64 rounding"
	}
	return ""
}

// --- a minimal RESP client ---

// respValue is a parsed reply. kind is the RESP type byte ('+', '-', ':',
// '$', '*', and RESP3's '_', ',', '#', '%', '~', '=' for robustness).
type respValue struct {
	kind byte
	str  string // simple string, error, integer text, bulk content
	null bool
	arr  []respValue
}

func (v respValue) String() string {
	switch v.kind {
	case '$':
		if v.null {
			return "(nil bulk)"
		}
		return strconv.Quote(v.str)
	case '*', '~', '%':
		if v.null {
			return "(nil array)"
		}
		parts := make([]string, len(v.arr))
		for i, e := range v.arr {
			parts[i] = e.String()
		}
		return string(v.kind) + "[" + strings.Join(parts, ", ") + "]"
	case '_':
		return "(null)"
	}
	return string(v.kind) + v.str
}

type respConn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
}

func dialRESP(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &respConn{addr: addr, c: c, r: bufio.NewReader(c)}, nil
}

func (c *respConn) Close() error { return c.c.Close() }

// do sends one command (as a RESP array of bulk strings) and reads its
// reply, within 20 s.
func (c *respConn) do(args ...string) (respValue, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	c.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.c.Write(b.Bytes()); err != nil {
		return respValue{}, err
	}
	return readRESP(c.r)
}

func readRESP(r *bufio.Reader) (respValue, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return respValue{}, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return respValue{}, fmt.Errorf("bad RESP line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+', '-', ':', ',', '#', '(':
		return respValue{kind: kind, str: body}, nil
	case '_':
		return respValue{kind: kind, null: true}, nil
	case '$', '=', '!':
		n, err := strconv.Atoi(body)
		if err != nil {
			return respValue{}, fmt.Errorf("bad bulk length %q", line)
		}
		if n < 0 {
			return respValue{kind: '$', null: true}, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return respValue{}, err
		}
		if string(buf[n:]) != "\r\n" {
			return respValue{}, fmt.Errorf("bulk string of %d bytes not followed by CRLF", n)
		}
		return respValue{kind: '$', str: string(buf[:n])}, nil
	case '*', '~', '%', '>':
		n, err := strconv.Atoi(body)
		if err != nil {
			return respValue{}, fmt.Errorf("bad array length %q", line)
		}
		if n < 0 {
			return respValue{kind: '*', null: true}, nil
		}
		if kind == '%' {
			n *= 2
		}
		v := respValue{kind: kind, arr: make([]respValue, 0, n)}
		for range n {
			e, err := readRESP(r)
			if err != nil {
				return respValue{}, err
			}
			v.arr = append(v.arr, e)
		}
		return v, nil
	}
	return respValue{}, fmt.Errorf("unknown RESP type in %q", line)
}

// --- scripts ---

type scriptLine struct {
	file  string
	num   int
	text  string
	sleep time.Duration // an @sleep line
	args  []string
}

func (l scriptLine) where() string { return fmt.Sprintf("%s:%d: %s", l.file, l.num, l.text) }

// parseScript reads one script file in the syntax documented at the top of
// this file.
func parseScript(path string) ([]scriptLine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []scriptLine
	for i, text := range strings.Split(string(b), "\n") {
		text = strings.TrimSpace(text)
		l := scriptLine{file: filepath.Base(path), num: i + 1, text: text}
		switch {
		case text == "" || strings.HasPrefix(text, "#"):
			continue
		case strings.HasPrefix(text, "@sleep "):
			d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(text, "@sleep ")))
			if err != nil {
				return nil, fmt.Errorf("%s: %v", l.where(), err)
			}
			l.sleep = d
		case strings.HasPrefix(text, "@"):
			return nil, fmt.Errorf("%s: unknown directive", l.where())
		default:
			args, err := splitArgs(text)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", l.where(), err)
			}
			l.args = args
		}
		out = append(out, l)
	}
	return out, nil
}

func splitArgs(s string) ([]string, error) {
	var args []string
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return args, nil
		}
		if s[0] != '"' {
			end := strings.IndexAny(s, " \t")
			if end < 0 {
				end = len(s)
			}
			args = append(args, s[:end])
			s = s[end:]
			continue
		}
		// A quoted argument: find its closing quote (not escaped).
		end := -1
		for i := 1; i < len(s); i++ {
			if s[i] == '\\' {
				i++
				continue
			}
			if s[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("unterminated quote in %q", s)
		}
		a, err := strconv.Unquote(s[:end+1])
		if err != nil {
			return nil, fmt.Errorf("bad quoted argument %s: %v", s[:end+1], err)
		}
		if end+1 < len(s) && s[end+1] != ' ' && s[end+1] != '\t' {
			return nil, fmt.Errorf("no space after quoted argument %s", s[:end+1])
		}
		args = append(args, a)
		s = s[end+1:]
	}
}

var nowArg = regexp.MustCompile(`^\$NOW_(S|MS)([+-][0-9]+)?$`)

// expandArgs replaces $NOW_S / $NOW_MS arguments with the current time.
func expandArgs(args []string) []string {
	out := make([]string, len(args))
	now := time.Now()
	for i, a := range args {
		m := nowArg.FindStringSubmatch(a)
		if m == nil {
			out[i] = a
			continue
		}
		t := now.Unix()
		if m[1] == "MS" {
			t = now.UnixMilli()
		}
		if m[2] != "" {
			d, _ := strconv.ParseInt(m[2], 10, 64)
			t += d
		}
		out[i] = strconv.FormatInt(t, 10)
	}
	return out
}

// compareReplies applies the comparison rules; "" means they agree.
func compareReplies(args []string, redis, shardkv respValue) string {
	name := strings.ToUpper(args[0])
	key := name
	if len(args) > 1 {
		key = name + " " + strings.ToUpper(args[1])
	}
	for _, k := range []string{key, name} {
		if rule, ok := diffAllow[k]; ok {
			if why := rule.compare(args, redis, shardkv); why != "" {
				return fmt.Sprintf("%s (not covered by the documented difference for %s in diffAllow)", why, k)
			}
			return ""
		}
	}
	if (name == "TTL" || name == "PTTL") && redis.kind == ':' && shardkv.kind == ':' {
		a, _ := strconv.ParseInt(redis.str, 10, 64)
		b, _ := strconv.ParseInt(shardkv.str, 10, 64)
		tol := int64(1)
		if name == "PTTL" {
			tol = 1000
		}
		if a < 0 || b < 0 {
			if a != b {
				return "TTL sentinels differ"
			}
			return ""
		}
		if a == 0 && b == 0 || a > 0 && b > 0 && max(a-b, b-a) <= tol {
			return ""
		}
		return fmt.Sprintf("TTLs differ by more than %d", tol)
	}
	if redis.String() != shardkv.String() {
		return "replies differ"
	}
	return ""
}

// --- servers ---

// needTool returns path if it exists. Otherwise the test is skipped, or,
// in CI (CI=true, where .ci/run installs the package), fails.
func needTool(t *testing.T, path, debPackage string) string {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (Debian package %s; .ci/run installs it)", path, debPackage)
	}
	t.Skipf("%s is not installed (apt-get install %s)", path, debPackage)
	return ""
}

// startRedisServer runs redis-server in cluster mode on a free port, in a
// temp dir, with every slot assigned to itself, and waits for
// cluster_state:ok. It returns the address.
func startRedisServer(t *testing.T) string {
	t.Helper()
	bin := needTool(t, "/usr/bin/redis-server", "redis-server")
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		base := freeBase(t, 1, 0, 10000) // the port and its cluster bus port
		addr := fmt.Sprintf("127.0.0.1:%d", base)
		cmd := exec.Command(bin, "--port", strconv.Itoa(base), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", attempt)),
			"--dir", dir, "--daemonize", "no", "--loglevel", "warning")
		out := newLineBuf()
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan struct{})
		go func() { cmd.Wait(); close(waited) }()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGKILL)
			<-waited
			if t.Failed() {
				t.Logf("--- redis-server output:\n%s", tail(out.String(), 3000))
			}
		})
		if err := redisClusterUp(addr, waited); err == nil {
			return addr
		} else if attempt == 3 || !strings.Contains(out.String(), "in use") {
			t.Fatalf("redis-server on %s: %v\n%s", addr, err, out.String())
		}
	}
}

func redisClusterUp(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	var c *respConn
	var err error
	for {
		select {
		case <-exited:
			return errors.New("redis-server exited")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not up within 20s: %v", err)
		}
		if c == nil {
			if c, err = dialRESP(addr); err != nil {
				c = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
			defer c.Close()
			var v respValue
			if v, err = c.do("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err == nil && v.kind == '-' {
				return fmt.Errorf("CLUSTER ADDSLOTSRANGE: %s", v)
			}
		}
		v, e := c.do("CLUSTER", "INFO")
		if e == nil && strings.Contains(v.str, "cluster_state:ok") {
			return nil
		}
		err = fmt.Errorf("CLUSTER INFO: %v %v", v, e)
		time.Sleep(50 * time.Millisecond)
	}
}

// respAddrs reads the RESP address of every data-group replica from node
// local's endpoint table, by gid.
func (c *localCluster) respAddrs() map[uint64][]string {
	out := map[uint64][]string{}
	sc := bufio.NewScanner(strings.NewReader(c.out.String()))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && strings.HasPrefix(f[0], "group-") && f[1] == "group" && f[4] != "-" {
			gid, err := strconv.ParseUint(f[2], 10, 64)
			if err == nil {
				out[gid] = append(out[gid], f[4])
			}
		}
	}
	return out
}

// clusterNodeLine is one line of CLUSTER NODES.
type clusterNodeLine struct {
	id, addr string // addr without the @cport part
	flags    []string
	master   string // the master's id for a replica, else "-"
	slots    []string
}

func (n clusterNodeLine) has(flag string) bool {
	for _, f := range n.flags {
		if f == flag {
			return true
		}
	}
	return false
}

func parseClusterNodes(s string) ([]clusterNodeLine, error) {
	var out []clusterNodeLine
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line with %d fields: %q", len(f), line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		addr, _, _ = strings.Cut(addr, ",") // a hostname may follow
		out = append(out, clusterNodeLine{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3], slots: f[8:]})
	}
	return out, nil
}

// respLeader finds the RESP address whose CLUSTER NODES says
// myself,master, starting from any of addrs.
func respLeader(t *testing.T, addrs []string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		for _, a := range addrs {
			c, err := dialRESP(a)
			if err != nil {
				last = err.Error()
				continue
			}
			v, err := c.do("CLUSTER", "NODES")
			c.Close()
			if err != nil || v.kind != '$' {
				last = fmt.Sprintf("%s CLUSTER NODES: %v %v", a, v, err)
				continue
			}
			nodes, err := parseClusterNodes(v.str)
			if err != nil {
				last = err.Error()
				continue
			}
			for _, n := range nodes {
				if n.has("myself") && n.has("master") {
					return a
				}
			}
			last = fmt.Sprintf("%s is not myself,master:\n%s", a, v.str)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no RESP leader among %v: %s", addrs, last)
	return ""
}

// TestRedisDifferential runs every script in testdata/redis/diff against
// redis-server and shardkv and compares the replies (see the top of this
// file for the syntax and the rules).
func TestRedisDifferential(t *testing.T) {
	needProcesses(t)
	scripts, err := filepath.Glob(filepath.Join("testdata", "redis", "diff", "*.txt"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	redisAddr := startRedisServer(t)
	c := startLocal(t, 4, "--resp", "--groups=1", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	addrs := c.respAddrs()[1]
	if len(addrs) != 3 {
		t.Fatalf("RESP addresses of group 1: %v\n%s", addrs, c.out.String())
	}
	leader := respLeader(t, addrs, 20*time.Second)
	t.Logf("redis-server at %s; shardkv group 1 leader at %s", redisAddr, leader)

	var mismatches, total int
	for _, path := range scripts {
		lines, err := parseScript(path)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := dialRESP(redisAddr)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := dialRESP(leader)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if l.sleep > 0 {
				time.Sleep(l.sleep)
				continue
			}
			total++
			rv, err := rc.do(expandArgs(l.args)...)
			if err != nil {
				t.Fatalf("%s: redis-server: %v", l.where(), err)
			}
			sv, err := doFollow(t, &sc, l.args)
			if err != nil {
				t.Fatalf("%s: shardkv: %v", l.where(), err)
			}
			if why := compareReplies(l.args, rv, sv); why != "" {
				mismatches++
				t.Errorf("%s\n    redis-server: %s\n    shardkv:      %s\n    %s", l.where(), rv, sv, why)
			}
		}
		rc.Close()
		sc.Close()
	}
	t.Logf("%d commands in %d scripts, %d mismatches", total, len(scripts), mismatches)
}

// doFollow sends a command to shardkv; a MOVED (leadership moved) or
// TRYAGAIN reply means the command did not run, so it is resent to the
// named node or after a pause, a bounded number of times.
func doFollow(t *testing.T, c **respConn, args []string) (respValue, error) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		v, err := (*c).do(expandArgs(args)...)
		if err != nil || v.kind != '-' || attempt == 20 {
			return v, err
		}
		switch {
		case strings.HasPrefix(v.str, "MOVED "):
			f := strings.Fields(v.str)
			t.Logf("%q: %s; following it", args, v.str)
			nc, err := dialRESP(f[len(f)-1])
			if err != nil {
				return v, err
			}
			(*c).Close()
			*c = nc
		case strings.HasPrefix(v.str, "TRYAGAIN "):
			time.Sleep(100 * time.Millisecond)
		default:
			return v, nil
		}
	}
}
