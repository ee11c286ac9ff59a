// Package resp serves the Redis Cluster protocol (RESP2) on top of a data
// group replica, so that stock Redis clients (go-redis, redis-cli,
// redis-benchmark, redis-py) can use shardkv as a Redis Cluster.
//
// Every data-group replica runs one Server. Each group is one Redis Cluster
// "shard": its Raft leader is the master, its other replicas are replicas.
// Keys map to the 16384 Redis slots exactly as Redis Cluster maps them
// (pkg/routing), so the clients' slot maps agree with the groups' shards.
//
// The contract with clients that carry no request ids: a client resends a
// command answered with MOVED, TRYAGAIN or CLUSTERDOWN. Those answers are
// therefore given only when the backend proves that the command did not
// execute (a *shardkvpb.Refusal, rendered in redirect.go). A write whose outcome is unknown (proposed,
// then a timeout or a leader change) is answered with a plain -ERR, which
// clients do not retry on their own, and the connection stays open (an I/O
// error would make them retry too).
//
// The server owns its accept loop and uses redcon only to parse RESP, so
// that it can bound the request size and the number of clients. Each
// connection has a reader, an executor and a writer (queue.go, output.go):
// commands keep being read while others run, consecutive writes of a
// pipeline become one Raft log entry, and replies stream back in order as
// each round of the pipeline completes (pipeline.go).
package resp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Backend is what the server needs from a data-group replica
// (*shardkv.Group implements it). Its answers are neutral facts; see
// pkg/shardkv/frontend.go for which errors mean "not executed".
type Backend interface {
	// ReadKeys reads keys of one slot linearizably.
	ReadKeys(ctx context.Context, keys [][]byte, followerReads bool) ([]shardkv.ValueEntry, error)
	// WriteBatch proposes ops as one log entry.
	WriteBatch(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error)
	// Topology is what the replica knows of the cluster: configs, leaders.
	Topology() shardkv.Topology
	// KeyCounts, CountKeysInSlot, KeysInSlot and Scan read local state.
	KeyCounts() (shardkv.KeyCounts, error)
	CountKeysInSlot(slot int) (int, error)
	KeysInSlot(slot, count int) ([][]byte, error)
	Scan(after []byte, count int, match func(key []byte) bool) (keys [][]byte, next []byte, err error)
	// RaftStatus is the replica's Raft status.
	RaftStatus() *shardkvpb.MemberStatus
	// MaxValueBytes and MaxKeyBytes are the group's size limits.
	MaxValueBytes() int
	MaxKeyBytes() int
}

var _ Backend = (*shardkv.Group)(nil)

// Defaults.
const (
	DefaultMaxClients = 10000
	// DefaultMaxRequestBytes bounds one command as received. Values are
	// bounded far lower (512 KiB by default), and one command becomes at
	// most one Raft entry (1 MiB by default), so 16 MiB leaves room for
	// large MSETs and MGETs and still bounds a connection's memory.
	DefaultMaxRequestBytes = 16 << 20
	// DefaultWriteTimeout bounds a write from proposal to apply. It stays
	// below go-redis's default 3s read timeout, so that the client gets the
	// outcome-unknown error rather than an I/O timeout (which it retries).
	DefaultWriteTimeout = 2 * time.Second
	// DefaultReadTimeout bounds a read (ReadIndex round and local read).
	DefaultReadTimeout = 2 * time.Second
	// DefaultPipelineTimeout bounds a command from being read to its reply,
	// however many commands are ahead of it, below go-redis's 3s read
	// timeout (which is one deadline for a whole pipeline's replies).
	DefaultPipelineTimeout = 2 * time.Second
	// DefaultMaxQueuedBytes bounds a connection's commands read but not yet
	// run; DefaultMaxOutputBytes its replies not yet written. Past either,
	// the connection's further commands are not read until they drain.
	DefaultMaxQueuedBytes = 16 << 20
	DefaultMaxOutputBytes = 16 << 20
)

// flushTimeout bounds writing one batch of replies to a client, so a client
// that stops reading cannot pin a connection forever (its commands stop
// being read once its output is full, so this is the only wait).
const flushTimeout = 30 * time.Second

// Config configures a Server.
type Config struct {
	// Addr is the listen address of ListenAndServe.
	Addr string
	// Advertise is this replica's RESP address as clients reach it (INFO
	// tcp_port, CLUSTER views); default: its resp_addr in the config.
	Advertise string
	// Password, if set, is required (AUTH / HELLO AUTH) before any command
	// but AUTH, HELLO and QUIT. The only user is "default".
	Password string
	// MaxClients bounds open client connections (default 10000); more are
	// answered "-ERR max number of clients reached" and closed.
	MaxClients int
	// MaxRequestBytes bounds one command as received (default 16 MiB);
	// beyond it the client gets a protocol error and is disconnected.
	MaxRequestBytes int
	// MaxValueBytes bounds a value (default and maximum: the backend's).
	MaxValueBytes int
	// WriteTimeout bounds a write (default 2s); a write not applied by then
	// is answered with the outcome-unknown error.
	WriteTimeout time.Duration
	// ReadTimeout bounds a read (default 2s).
	ReadTimeout time.Duration
	// PipelineTimeout bounds a command from being read to its reply
	// (default 2s). A command still waiting for its turn when less than a
	// quarter of it is left is refused with TRYAGAIN and not executed; a
	// write proposed but not applied by then gets the outcome-unknown
	// error.
	PipelineTimeout time.Duration
	// MaxQueuedBytes and MaxOutputBytes bound a connection's commands read
	// but not yet run and its replies not yet written (16 MiB each by
	// default); past them the server stops reading the connection until
	// they drain.
	MaxQueuedBytes int
	MaxOutputBytes int
	// Version is reported by INFO as shardkv_version (default: the
	// module version from the build info).
	Version string
	Logger  *slog.Logger
}

// Stats are the server's counters (INFO clients and stats).
type Stats struct {
	ConnectedClients    int64
	TotalConnections    int64 // accepted, rejected ones included
	RejectedConnections int64 // refused for MaxClients
	TotalCommands       int64
	NetInputBytes       int64
	NetOutputBytes      int64
	// Writes answered with the outcome-unknown error, and commands answered
	// with a redirect or retry (MOVED/TRYAGAIN/CLUSTERDOWN).
	OutcomeUnknown int64
	Refused        int64
	ProtocolErrors int64
}

// Server is a Redis protocol front end for one replica.
type Server struct {
	cfg     Config
	b       Backend
	log     *slog.Logger
	started time.Time
	cursors *cursorTable
	cmds    map[string]*command

	// ctx is cancelled by Close, which cancels in-flight backend calls.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[*conn]struct{}
	nextID int64
	wg     sync.WaitGroup

	stats struct {
		connected, total, rejected, commands, in, out, unknown, refused, protoErrs atomic.Int64
	}
}

// New returns a server for backend b. Serve or ListenAndServe starts it.
func New(cfg Config, b Backend) *Server {
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = DefaultMaxClients
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if m := b.MaxValueBytes(); cfg.MaxValueBytes <= 0 || cfg.MaxValueBytes > m {
		cfg.MaxValueBytes = m
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.PipelineTimeout <= 0 {
		cfg.PipelineTimeout = DefaultPipelineTimeout
	}
	if cfg.MaxQueuedBytes <= 0 {
		cfg.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			cfg.Version = bi.Main.Version
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, b: b, log: cfg.Logger, started: time.Now(), cursors: newCursorTable(), cmds: commandTable(),
		ctx: ctx, cancel: cancel, lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// ListenAndServe listens on Config.Addr and serves until Close.
func (s *Server) ListenAndServe() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve accepts clients on ln until Close (then it returns nil) or until
// ln is closed by someone else. It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: wait and go on, as
			// net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.accept(nc)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// accept registers nc and starts its goroutine, or refuses it when the
// server is full (as Redis does: an error, then close).
func (s *Server) accept(nc net.Conn) {
	s.stats.total.Add(1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxClients {
		s.mu.Unlock()
		s.stats.rejected.Add(1)
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(nc, "-ERR max number of clients reached\r\n")
		nc.Close()
		return
	}
	s.nextID++
	c := newConn(s, nc, s.nextID)
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	s.stats.connected.Add(1)
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.stats.connected.Add(-1)
	}()
}

// Close stops accepting, cancels in-flight backend calls, closes every
// client connection and waits for their goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		ConnectedClients:    s.stats.connected.Load(),
		TotalConnections:    s.stats.total.Load(),
		RejectedConnections: s.stats.rejected.Load(),
		TotalCommands:       s.stats.commands.Load(),
		NetInputBytes:       s.stats.in.Load(),
		NetOutputBytes:      s.stats.out.Load(),
		OutcomeUnknown:      s.stats.unknown.Load(),
		Refused:             s.stats.refused.Load(),
		ProtocolErrors:      s.stats.protoErrs.Load(),
	}
}

// clients snapshots the open connections (CLIENT LIST).
func (s *Server) clients() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}

// errRequestTooLarge is returned by the counting reader once an incomplete
// command has buffered more than the limit.
var errRequestTooLarge = errors.New("request too large")

// countingReader sits between the connection and redcon's reader. redcon
// reads from it only when its buffer holds no complete command, so at that
// moment everything read but not yet returned as commands (`pending`) is
// one incomplete command: that is what the request size limit bounds. Reads
// are also cut to the remaining allowance, so the buffer never grows past
// the limit by more than one read.
type countingReader struct {
	r        io.Reader
	limit    int64
	total    int64 // bytes read from the connection
	consumed int64 // bytes returned as complete commands
	stats    *atomic.Int64
}

func (cr *countingReader) Read(p []byte) (int, error) {
	pending := cr.total - cr.consumed
	if pending > cr.limit {
		return 0, errRequestTooLarge
	}
	if allow := cr.limit - pending + 1; int64(len(p)) > allow {
		p = p[:allow]
	}
	n, err := cr.r.Read(p)
	cr.total += int64(n)
	cr.stats.Add(int64(n))
	return n, err
}

// done accounts for commands returned by the reader. A RESP command's Raw
// is exactly its bytes on the wire; an inline (telnet) command's Raw is its
// RESP re-encoding, which is longer, so consumed is clamped to what was
// read: the limit may then be exceeded by the re-encoding overhead of the
// inline commands buffered with an incomplete one, never undercut.
func (cr *countingReader) done(cmds []redcon.Command) {
	for _, c := range cmds {
		cr.consumed += int64(len(c.Raw))
	}
	cr.consumed = min(cr.consumed, cr.total)
}

// countingWriter counts reply bytes.
type countingWriter struct {
	w     io.Writer
	stats *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.stats.Add(int64(n))
	return n, err
}

// conn is one client connection. Its goroutine owns the protocol state and
// is the only writer of every field; the fields under mu are also read by
// CLIENT LIST from other connections, so they are written under mu (and
// read without it by the owner).
type conn struct {
	s   *Server
	nc  net.Conn
	cr  *countingReader
	rd  *redcon.Reader
	q   *cmdQueue // reader -> executor
	out *outbox   // executor -> writer
	w   io.Writer // the connection, counting reply bytes

	id      int64
	created time.Time
	authed  bool
	quit    bool // QUIT: close after the replies are flushed
	burst   burst
	sizes   map[string]int // value sizes last seen (pipeline.written)

	mu       sync.Mutex
	readonly bool // READONLY: reads may be served by this replica as a follower
	name     string
	libName  string
	libVer   string
	lastCmd  string
	lastAt   time.Time
}

func newConn(s *Server, nc net.Conn, id int64) *conn {
	cr := &countingReader{r: nc, limit: int64(s.cfg.MaxRequestBytes), stats: &s.stats.in}
	now := time.Now()
	return &conn{s: s, nc: nc, cr: cr, rd: redcon.NewReader(cr),
		q: newCmdQueue(s.cfg.MaxQueuedBytes), out: newOutbox(s.cfg.MaxOutputBytes), w: countingWriter{nc, &s.stats.out},
		id: id, created: now, lastAt: now, authed: s.cfg.Password == "", sizes: map[string]int{}}
}

// serve reads commands and queues them for the executor (which runs them
// and puts their replies in the outbox, which the writer writes), until the
// client leaves, QUIT, a protocol error or Close. The commands read before
// the client left still run and get their replies.
func (c *conn) serve() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		c.execute()
	}()
	go func() {
		defer wg.Done()
		c.writeLoop()
	}()
	defer wg.Wait()
	for {
		cmds, err := c.rd.ReadCommands()
		if err != nil {
			c.q.finish(c.readFailed(err))
			return
		}
		c.cr.done(cmds)
		args := make([][][]byte, len(cmds))
		for i, cmd := range cmds {
			args[i] = cmd.Args // redcon copies each command off its buffer
		}
		if !c.q.push(args, c.out, c.s.cfg.PipelineTimeout) {
			return
		}
	}
}

// readFailed is the reply to a malformed or oversized request (nil for
// EOF and the like), written after the replies to the commands before it,
// before the connection closes. Nothing of the failing read runs: redcon
// drops the whole buffer on a parse error.
func (c *conn) readFailed(err error) []byte {
	var msg string
	switch {
	case errors.Is(err, errRequestTooLarge):
		msg = fmt.Sprintf("ERR Protocol error: request too large (limit %d bytes)", c.s.cfg.MaxRequestBytes)
	case strings.HasPrefix(err.Error(), "Protocol error: "):
		// redcon's parse errors (its error type is unexported).
		msg = "ERR " + err.Error()
	default:
		return nil // EOF, reset, or Close
	}
	c.s.stats.protoErrs.Add(1)
	c.s.log.Debug("protocol error", "client", c.nc.RemoteAddr().String(), "err", msg)
	return errReply(msg)
}
