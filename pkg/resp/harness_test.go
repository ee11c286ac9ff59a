package resp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/raftgroup/rgtest"
	"github.com/shardkv/shardkv/pkg/resp"
	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The tests run real data groups (Raft over gRPC, badger) from
// kvtest.World, each replica with a resp.Server on its advertised RESP
// address, and talk to them with go-redis and with raw RESP where the exact
// bytes matter.

// Groups of the shared world.
const (
	gA = uint64(100)
	gB = uint64(101)
)

// slow bounds waits that a busy machine may stretch (server timeouts,
// client read timeouts).
const slow = 15 * time.Second

// env is a world with RESP servers, shared by subtests.
type env struct {
	t    *testing.T // the running subtest (they run one at a time)
	w    *kvtest.World
	conf *shardkvpb.Config // the config; the tests never change it

	mu    sync.Mutex
	conns map[string]*rconn // cached raw connections by address
}

// newEnv starts a controller and groups gA and gB (3 replicas each, 16
// shards), both joined, and waits until they serve.
func newEnv(t *testing.T) *env {
	e := &env{t: t, conns: map[string]*rconn{}}
	e.w = newWorld(t)
	e.w.StartGroup(gA)
	e.w.StartGroup(gB)
	e.w.Join(gA, gB)
	e.conf = e.w.WaitSettled(60 * time.Second)
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, c := range e.conns {
			c.c.Close()
		}
	})
	return e
}

// newWorld starts a controller with RESP servers for every data-group
// replica it will start (16 shards).
func newWorld(t *testing.T) *kvtest.World {
	return kvtest.New(t, kvtest.Options{Shards: 16,
		// A two-second election timeout: the tests run on busy CI machines,
		// where the default 200ms makes spurious elections.
		RaftConfig: func(c *raftgroup.Config) { c.ElectionTicks = 100 },
		RESP: func(addr string, g *shardkv.Group) func() {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Errorf("listen %s: %v", addr, err)
				return func() {}
			}
			// Long timeouts, for the same reason: a slow write would answer
			// "outcome unknown". The outcome tests use their own servers.
			s := resp.New(resp.Config{WriteTimeout: slow, ReadTimeout: slow, PipelineTimeout: slow, Logger: rgtest.Logger()}, g)
			go s.Serve(ln)
			return func() { s.Close() }
		}})
}

// run runs a subtest with e.t set to it.
func (e *env) run(t *testing.T, name string, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		parent := e.t
		e.t = t
		defer func() { e.t = parent }()
		f(t)
	})
}

// owner is the group that owns key.
func (e *env) owner(key string) uint64 { return routing.GroupOf([]byte(key), e.conf.Shards) }

// slotOwner is the group that owns slot.
func (e *env) slotOwner(slot int) uint64 {
	return e.conf.Shards[routing.Shard(slot, len(e.conf.Shards))]
}

// keyIn returns a key owned by gid: prefix followed by a number.
func (e *env) keyIn(gid uint64, prefix string) string {
	e.t.Helper()
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if e.owner(k) == gid {
			return k
		}
	}
}

// leader returns gid's leader replica id, waiting for one.
func (e *env) leader(gid uint64) uint64 { return e.w.Groups[gid].WaitLeader(10 * time.Second) }

func (e *env) leaderAddr(gid uint64) string { return e.w.RESPAddr(gid, e.leader(gid)) }

// follower returns a replica of gid that is not its leader.
func (e *env) follower(gid uint64) uint64 {
	l := e.leader(gid)
	for _, id := range e.w.Groups[gid].IDs() {
		if id != l {
			return id
		}
	}
	e.t.Fatal("no follower")
	return 0
}

// conn returns a cached raw connection to addr.
func (e *env) conn(addr string) *rconn {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.conns[addr]; c != nil {
		c.t = e.t // report failures in the running subtest
		return c
	}
	c := dial(e.t, addr)
	e.conns[addr] = c
	return c
}

// do runs a keyed command (args[1] is the key) as a cluster client would:
// on the key owner's leader, following MOVED and waiting out TRYAGAIN.
func (e *env) do(args ...string) any {
	e.t.Helper()
	addr := e.leaderAddr(e.owner(args[1]))
	deadline := time.Now().Add(2 * slow)
	for {
		r := e.conn(addr).do(args...)
		err, isErr := r.(rerr)
		if !isErr || time.Now().After(deadline) {
			return r
		}
		switch f := strings.Fields(string(err)); f[0] {
		case "MOVED":
			addr = f[2]
		case "TRYAGAIN", "CLUSTERDOWN":
			time.Sleep(50 * time.Millisecond)
		default:
			return r
		}
	}
}

// cluster returns a go-redis cluster client seeded with one node.
func (e *env) cluster(opt *redis.ClusterOptions) *redis.ClusterClient {
	if opt == nil {
		opt = &redis.ClusterOptions{}
	}
	if len(opt.Addrs) == 0 {
		opt.Addrs = []string{e.leaderAddr(gA)}
	}
	opt.ReadTimeout, opt.MaxRedirects = slow+time.Second, 16
	c := redis.NewClusterClient(opt)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// extraServer starts another resp.Server with cfg (timeouts default to
// slow) on backend b (a replica's group, possibly wrapped) and returns its
// address.
func extraServer(t *testing.T, cfg resp.Config, b resp.Backend) (*resp.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = rgtest.Logger()
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = slow
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = slow
	}
	if cfg.PipelineTimeout == 0 {
		cfg.PipelineTimeout = slow
	}
	s := resp.New(cfg, b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return s, ln.Addr().String()
}

// Replies of the raw client: a status (+), an error (-), an int64 (:), a
// string (bulk, $), nil (null bulk or array) or []any (array).
type (
	status string
	rerr   string
)

// rconn is a raw RESP connection.
type rconn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

func dial(t testing.TB, addr string) *rconn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return &rconn{t: t, c: c, r: bufio.NewReader(c)}
}

func encode(args ...string) []byte {
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	return b
}

// write sends raw bytes.
func (c *rconn) write(b []byte) {
	c.t.Helper()
	_ = c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rconn) do(args ...string) any {
	c.t.Helper()
	c.write(encode(args...))
	return c.read()
}

// read reads one reply.
func (c *rconn) read() any {
	c.t.Helper()
	v, err := c.tryRead()
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	return v
}

func (c *rconn) tryRead() (any, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(2 * slow))
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return nil, fmt.Errorf("bad line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return status(body), nil
	case '-':
		return rerr(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*', '%', '~', '>':
		// An array; RESP3's map (n pairs), set and push read as one.
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		if line[0] == '%' {
			n *= 2
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = c.tryRead(); err != nil {
				return nil, err
			}
		}
		if line[0] == '%' {
			return resp3Map(out), nil
		}
		return out, nil
	case '=': // RESP3 verbatim string: "txt:" and the text
		n, err := strconv.Atoi(body)
		if err != nil || n < 4 {
			return nil, fmt.Errorf("bad verbatim length %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		return string(buf[4:n]), nil
	case '_':
		return nil, nil
	case ',', '(':
		return body, nil
	case '#':
		return body == "t", nil
	}
	return nil, fmt.Errorf("bad reply type %q", line)
}

// resp3Map is a RESP3 map reply: its keys and values in turn.
type resp3Map []any

// closed reports whether the server closed the connection (after any
// pending replies).
func (c *rconn) closed() bool {
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.r.ReadByte()
	return err != nil
}

// expect checks a reply against want, comparing their printed forms.
func expect(t *testing.T, got, want any, what ...any) {
	t.Helper()
	if g, w := fmt.Sprintf("%#v", got), fmt.Sprintf("%#v", want); g != w {
		t.Errorf("%s: got %s, want %s", fmt.Sprint(what...), g, w)
	}
}
