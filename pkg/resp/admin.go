package resp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Connection and server commands. Keyless commands are answered by any
// replica from its own state.

// redisVersion is the Redis version the server is compatible with.
const redisVersion = "7.0.0"

func cmdPing(_ *conn, p *pipeline, args [][]byte, _ int) {
	switch len(args) {
	case 1:
		p.reply(redcon.AppendString(nil, "PONG"))
	case 2:
		p.reply(redcon.AppendBulk(nil, args[1]))
	default:
		p.reply(wrongArgs("ping"))
	}
}

func cmdEcho(_ *conn, p *pipeline, args [][]byte, _ int) {
	p.reply(redcon.AppendBulk(nil, args[1]))
}

func cmdQuit(c *conn, p *pipeline, _ [][]byte, _ int) {
	c.quit = true
	p.reply(okReply())
}

func cmdReadOnly(c *conn, p *pipeline, _ [][]byte, _ int) {
	c.setReadOnly(true)
	p.reply(okReply())
}

func cmdReadWrite(c *conn, p *pipeline, _ [][]byte, _ int) {
	c.setReadOnly(false)
	p.reply(okReply())
}

// setReadOnly changes the READONLY flag. Only the connection's goroutine
// writes it, under mu since CLIENT LIST reads it from other connections;
// that goroutine reads it without the lock.
func (c *conn) setReadOnly(ro bool) {
	c.mu.Lock()
	c.readonly = ro
	c.mu.Unlock()
}

// cmdAsking: there are no migrating slots to ask about; a moving shard is
// answered TRYAGAIN until it is served.
func cmdAsking(_ *conn, p *pipeline, _ [][]byte, _ int) { p.reply(okReply()) }

// cmdSelect: one database, as Redis Cluster.
func cmdSelect(_ *conn, p *pipeline, args [][]byte, _ int) {
	n, ok := parseInt(args[1])
	switch {
	case !ok:
		p.reply(errReply(errNotInteger))
	case n < math.MinInt32 || n > math.MaxInt32:
		p.reply(errReply("ERR value is out of range, value must between -2147483648 and 2147483647"))
	case n != 0:
		p.reply(errReply("ERR SELECT is not allowed in cluster mode"))
	default:
		p.reply(okReply())
	}
}

const (
	errWrongPass = "WRONGPASS invalid username-password pair or user is disabled."
	errNoPass    = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?"
)

func cmdAuth(c *conn, p *pipeline, args [][]byte, _ int) {
	var e []byte
	switch len(args) {
	case 2:
		e = c.authenticate(nil, args[1], false)
	case 3:
		e = c.authenticate(args[1], args[2], true)
	default:
		e = errReply(errSyntax)
	}
	if e != nil {
		p.reply(e)
		return
	}
	p.reply(okReply())
}

// cmdHello: HELLO [protover [AUTH user pass] [SETNAME name]]. Only RESP2 is
// spoken: HELLO 3 is refused with NOPROTO (clients then stay on RESP2).
func cmdHello(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) >= 2 {
		v, ok := parseInt(args[1])
		if !ok {
			p.reply(errReply("ERR Protocol version is not an integer or out of range"))
			return
		}
		if v != 2 && v != 3 {
			p.reply(errReply("NOPROTO unsupported protocol version"))
			return
		}
	}
	var user, pass, name []byte
	hasAuth, hasName := false, false
	for j := 2; j < len(args); j++ {
		more := len(args) - 1 - j
		switch opt := strings.ToLower(string(args[j])); {
		case opt == "auth" && more >= 2:
			user, pass, hasAuth = args[j+1], args[j+2], true
			j += 2
		case opt == "setname" && more >= 1:
			name, hasName = args[j+1], true
			j++
		default:
			p.reply(errReply(fmt.Sprintf("ERR Syntax error in HELLO option '%s'", args[j])))
			return
		}
	}
	if hasAuth {
		if e := c.authenticate(user, pass, true); e != nil {
			p.reply(e)
			return
		}
	}
	if !c.authed.Load() {
		p.reply(errReply("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"))
		return
	}
	if hasName {
		if !validName(name) {
			p.reply(errReply(errClientName))
			return
		}
		c.setName(string(name))
	}
	role := "replica"
	if c.s.view(c.tls).Self.Leader {
		role = "master"
	}
	proto := 2
	if len(args) >= 2 {
		proto = int(args[1][0] - '0') // 2 or 3, checked above
		c.resp3.Store(proto == 3)
	} else if c.resp3.Load() {
		proto = 3
	}
	b := c.appendMap(nil, 7)
	b = redcon.AppendBulkString(b, "server")
	b = redcon.AppendBulkString(b, "redis")
	b = redcon.AppendBulkString(b, "version")
	b = redcon.AppendBulkString(b, redisVersion)
	b = redcon.AppendBulkString(b, "proto")
	b = redcon.AppendInt(b, int64(proto))
	b = redcon.AppendBulkString(b, "id")
	b = redcon.AppendInt(b, c.id)
	b = redcon.AppendBulkString(b, "mode")
	b = redcon.AppendBulkString(b, "cluster")
	b = redcon.AppendBulkString(b, "role")
	b = redcon.AppendBulkString(b, role)
	b = redcon.AppendBulkString(b, "modules")
	b = redcon.AppendArray(b, 0)
	p.reply(b)
}

const errClientName = "ERR Client names cannot contain spaces, newlines or special characters."

// validName: printable ASCII without spaces (Redis's validateClientAttr).
func validName(b []byte) bool {
	for _, c := range b {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

func (c *conn) setName(n string) {
	c.mu.Lock()
	c.name = n
	c.mu.Unlock()
}

// noteCommand records the last command (CLIENT LIST's cmd and idle).
func (c *conn) noteCommand(name string) {
	c.mu.Lock()
	c.lastCmd, c.lastAt = name, time.Now()
	c.mu.Unlock()
}

func cmdClientID(c *conn, p *pipeline, _ [][]byte, _ int) { p.reply(redcon.AppendInt(nil, c.id)) }

func cmdClientSetName(c *conn, p *pipeline, args [][]byte, _ int) {
	if !validName(args[2]) {
		p.reply(errReply(errClientName))
		return
	}
	c.setName(string(args[2]))
	p.reply(okReply())
}

func cmdClientGetName(c *conn, p *pipeline, _ [][]byte, _ int) {
	c.mu.Lock()
	n := c.name
	c.mu.Unlock()
	if n == "" {
		p.reply(c.null())
		return
	}
	p.reply(redcon.AppendBulkString(nil, n))
}

// cmdClientSetInfo: CLIENT SETINFO LIB-NAME|LIB-VER value (Redis 7.2).
func cmdClientSetInfo(c *conn, p *pipeline, args [][]byte, _ int) {
	attr := strings.ToLower(string(args[2]))
	if attr != "lib-name" && attr != "lib-ver" {
		p.reply(errReply(fmt.Sprintf("ERR Unrecognized option '%s'", args[2])))
		return
	}
	if !validName(args[3]) {
		p.reply(errReply(fmt.Sprintf("ERR %s cannot contain spaces, newlines or special characters.", attr)))
		return
	}
	c.mu.Lock()
	if attr == "lib-name" {
		c.libName = string(args[3])
	} else {
		c.libVer = string(args[3])
	}
	c.mu.Unlock()
	p.reply(okReply())
}

// info is the connection's CLIENT INFO / CLIENT LIST line (a subset of
// Redis's fields; flags "r" for READONLY, else "N").
func (c *conn) info() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	flags := "N"
	if c.readonly {
		flags = "r"
	}
	now := time.Now()
	return fmt.Sprintf("id=%d addr=%s laddr=%s fd=-1 name=%s age=%d idle=%d flags=%s db=0 sub=0 psub=0 ssub=0 multi=-1 cmd=%s user=default lib-name=%s lib-ver=%s redir=-1 resp=2\n",
		c.id, c.nc.RemoteAddr(), c.nc.LocalAddr(), c.name, int(now.Sub(c.created).Seconds()), int(now.Sub(c.lastAt).Seconds()),
		flags, c.lastCmd, c.libName, c.libVer)
}

func cmdClientInfo(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.reply(c.appendVerbatim(nil, c.info()))
}

func cmdClientList(c *conn, p *pipeline, args [][]byte, _ int) {
	if len(args) > 2 {
		p.reply(errReply(errSyntax))
		return
	}
	conns := c.s.clients()
	slices.SortFunc(conns, func(a, b *conn) int { return int(a.id - b.id) })
	var b strings.Builder
	for _, o := range conns {
		b.WriteString(o.info())
	}
	p.reply(c.appendVerbatim(nil, b.String()))
}

// configParams are the parameters CONFIG GET reports (read-only; tools such
// as redis-benchmark ask for some of them). The password is never shown.
func (s *Server) configParams() [][2]string {
	return append(s.tun.params(), [][2]string{
		{"appendonly", "no"},
		{"client-query-buffer-limit", strconv.Itoa(s.cfg.MaxRequestBytes)},
		{"cluster-enabled", "yes"},
		{"databases", "1"},
		{"maxclients", strconv.Itoa(s.cfg.MaxClients)},
		{"maxmemory", "0"},
		{"proto-max-bulk-len", strconv.Itoa(s.cfg.MaxBulkBytes)},
		{"save", ""},
		{"timeout", strconv.Itoa(int(s.cfg.IdleTimeout / time.Second))},
	}...)
}

func cmdConfigGet(c *conn, p *pipeline, args [][]byte, _ int) {
	var out []string
	for _, kv := range c.s.configParams() {
		for _, pat := range args[2:] {
			if acl.Glob(pat, []byte(kv[0]), true) {
				out = append(out, kv[0], kv[1])
				break
			}
		}
	}
	b := c.appendMap(nil, len(out)/2)
	for _, s := range out {
		b = redcon.AppendBulkString(b, s)
	}
	p.reply(b)
}

func cmdDBSize(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.barrier()
	kc, err := c.s.b.KeyCounts()
	if err != nil {
		p.reply(errReply("ERR " + err.Error()))
		return
	}
	p.reply(redcon.AppendInt(nil, int64(kc.Total)))
}

// Cursor table bounds: SCAN cursors are numbers, so the backend's positions
// (keys) are kept here; the oldest are dropped first.
const (
	maxCursors     = 10000
	maxCursorBytes = 8 << 20
)

// cursorTable maps SCAN cursor ids to backend positions. Ids are random so
// that a cursor sent to another replica (or to a restarted one) is most
// likely unknown there ("ERR invalid cursor") rather than another scan's.
type cursorTable struct {
	mu    sync.Mutex
	pos   map[uint64][]byte
	order []uint64 // insertion order, for eviction
	bytes int
}

func newCursorTable() *cursorTable { return &cursorTable{pos: map[uint64][]byte{}} }

func (t *cursorTable) put(pos []byte) uint64 { return t.putBelow(pos, 63) }

// putBelow is put with an id below 2^bits.
func (t *cursorTable) putBelow(pos []byte, bits uint) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var id uint64
	for id == 0 || t.pos[id] != nil {
		id = rand.Uint64() >> (64 - bits) // 63 bits: positive as a signed 64-bit number too
	}
	t.pos[id] = pos
	t.order = append(t.order, id)
	t.bytes += len(pos)
	for len(t.pos) > maxCursors || t.bytes > maxCursorBytes {
		old := t.order[0]
		t.order = t.order[1:]
		t.bytes -= len(t.pos[old])
		delete(t.pos, old)
	}
	return id
}

func (t *cursorTable) get(id uint64) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pos[id]
	return p, ok
}

// cmdScan: SCAN cursor [MATCH pattern] [COUNT count] [TYPE type], over the
// keys of the shards this replica serves.
func cmdScan(c *conn, p *pipeline, args [][]byte, _ int) {
	id, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil {
		p.reply(errReply("ERR invalid cursor"))
		return
	}
	var after []byte
	if id != 0 {
		pos, ok := c.s.cursors.get(id)
		if !ok {
			p.reply(errReply("ERR invalid cursor"))
			return
		}
		after = pos
	}
	count := int64(10)
	var pattern []byte
	var typeName string
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			p.reply(errReply(errSyntax))
			return
		}
		switch opt := string(args[i]); {
		case strings.EqualFold(opt, "count"):
			n, ok := parseInt(args[i+1])
			if !ok {
				p.reply(errReply(errNotInteger))
				return
			}
			if n < 1 {
				p.reply(errReply(errSyntax))
				return
			}
			count = n
		case strings.EqualFold(opt, "match"):
			pattern = args[i+1]
			if string(pattern) == "*" {
				pattern = nil
			}
		case strings.EqualFold(opt, "type"):
			typeName = strings.ToLower(string(args[i+1]))
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	var match func([]byte) bool
	switch {
	case !knownType(typeName):
		// Redis compares the name with each key's type: no key has this
		// one.
		match = func([]byte) bool { return false }
	case pattern != nil:
		match = func(k []byte) bool { return acl.Glob(pattern, k, false) }
	}
	p.barrier()
	keys, next, err := c.s.b.Scan(after, int(min(count, 1<<20)), match)
	if err != nil {
		p.reply(errReply("ERR " + err.Error()))
		return
	}
	if typeName != "" && len(keys) > 0 {
		var e []byte
		if keys, e = c.s.keysOfType(keys, typeName, p.deadline); e != nil {
			p.reply(e)
			return
		}
	}
	cursor := "0"
	if next != nil {
		cursor = strconv.FormatUint(c.s.cursors.put(next), 10)
	}
	b := redcon.AppendArray(nil, 2)
	b = redcon.AppendBulkString(b, cursor)
	b = redcon.AppendArray(b, len(keys))
	for _, k := range keys {
		b = redcon.AppendBulk(b, k)
	}
	p.reply(b)
}

// knownType reports whether name ("" for none) may be a key's type name.
func knownType(name string) bool {
	switch name {
	case "", "string", "hash", "list", "set", "zset":
		return true
	}
	return false
}

// maxTypeReadBytes bounds the values one read of keysOfType holds: the
// types are in the keys' records, read with their values.
const maxTypeReadBytes = 4 << 20

// keysOfType returns the keys (of shards this replica serves: a SCAN
// page) whose value is of type name, reading them as follower reads
// (ReadKeys: after a ReadIndex round) by chunks of at most
// maxTypeReadBytes of values; or the error reply. A key that is gone, or
// has left this replica's shards meanwhile, is left out.
func (s *Server) keysOfType(keys [][]byte, name string, deadline time.Time) ([][]byte, []byte) {
	var out [][]byte
	for len(keys) > 0 {
		used, noMemory := 0, false
		reserve := func(n int) bool {
			n += 16
			if used > 0 && used+n > maxTypeReadBytes {
				return false
			}
			if !s.outBudget.take(int64(n)) {
				noMemory = true
				return false
			}
			used += n
			return true
		}
		ctx, cancel := s.roundContext(s.cfg.ReadTimeout, &item{deadline: deadline})
		vals, err := s.b.ReadKeys(ctx, keys, true, reserve)
		timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
		cancel()
		s.outBudget.give(int64(used))
		var ref *shardkvpb.Refusal
		switch {
		case errors.As(err, &ref) && len(keys) > 1:
			// Some key left: read each alone.
			for _, k := range keys {
				one, e := s.keysOfType([][]byte{k}, name, deadline)
				if e != nil {
					return nil, e
				}
				out = append(out, one...)
			}
			return out, nil
		case errors.As(err, &ref):
			return out, nil
		case errors.Is(err, shardkv.ErrReadLimit) && noMemory && len(vals) == 0:
			s.stats.outputRefusals.Add(1)
			return nil, errReply(s.outputFull())
		case err != nil && !errors.Is(err, shardkv.ErrReadLimit):
			return nil, s.readFailure(err, timedOut, -1, false)
		case len(vals) == 0 || len(vals) > len(keys):
			return nil, errReply(fmt.Sprintf("ERR read failed: backend returned %d values for %d keys", len(vals), len(keys)))
		}
		for i, v := range vals {
			if v.Found && v.Type.String() == name {
				out = append(out, keys[i])
			}
		}
		keys = keys[len(vals):]
	}
	return out, nil
}
