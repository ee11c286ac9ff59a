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
// The server owns its accept loop and its request reader (reader.go), so
// that it can bound every length a client announces before buffering it,
// the memory all connections hold and the number of clients. Each
// connection has a reader, an executor and a writer (queue.go, output.go):
// commands keep being read while others run, consecutive writes of a
// pipeline become one Raft log entry, and replies stream back in order as
// each round of the pipeline completes (pipeline.go). redcon only encodes
// replies.
package resp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// Backend is what the server needs from a data-group replica
// (*shardkv.Group implements it). Its answers are neutral facts; see
// pkg/shardkv/frontend.go for which errors mean "not executed".
type Backend interface {
	// ReadKeys reads keys of one slot linearizably.
	// reserve bounds what it holds (see shardkv.Group.ReadKeys).
	ReadKeys(ctx context.Context, keys [][]byte, followerReads bool, reserve func(bytes int) bool) ([]shardkv.ValueEntry, error)
	// ReadElems reads elements of the collection at key linearizably
	// (refusals as ReadKeys; reserve: each element's size, ErrReadLimit
	// when it refuses). A key of another type than q.Type is reported in
	// the reply's Entry with no element read.
	ReadElems(ctx context.Context, key []byte, q shardkv.ElemQuery, followerReads bool, reserve func(bytes int) bool) (shardkv.ElemsReply, error)
	// ReadElemsOf reads the collections at keys (of one slot) as
	// ReadElems does, all at one point of the log (SINTER and the like).
	ReadElemsOf(ctx context.Context, keys [][]byte, q shardkv.ElemQuery, followerReads bool, reserve func(bytes int) bool) ([]shardkv.ElemsReply, error)
	// WatchKeys returns a channel closed once a write naming one of keys
	// is applied by this replica, or its shard state changes (blocking
	// commands wait on it); stop releases it.
	WatchKeys(keys [][]byte) (changed <-chan struct{}, stop func())
	// WriteBatch proposes ops as one log entry.
	WriteBatch(ctx context.Context, ops []*shardkvpb.WriteOp) ([]shardkv.WriteOutcome, error)
	// Topology is what the replica knows of the cluster: configs, leaders.
	Topology() shardkv.Topology
	// KeyCounts, CountKeysInSlot, KeysInSlot and Scan read local state.
	KeyCounts() (shardkv.KeyCounts, error)
	CountKeysInSlot(slot int) (int, error)
	KeysInSlot(slot, count int) ([][]byte, error)
	Scan(after []byte, count int, match func(key []byte) bool) (keys [][]byte, next []byte, err error)
	// RandomKey is a live key picked at random (nil: none), local state.
	RandomKey() ([]byte, error)
	// RaftStatus is the replica's Raft status.
	RaftStatus() *shardkvpb.MemberStatus
	// MaxValueBytes and MaxKeyBytes are the group's size limits.
	MaxValueBytes() int
	MaxKeyBytes() int
	// Users are the cluster's users as this replica last heard them (nil:
	// not yet); SetUsers changes them (the specs are acl's text).
	Users() *shardkvpb.UsersReply
	SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error)
}

var _ Backend = (*shardkv.Group)(nil)

// Defaults.
const (
	DefaultMaxClients = 10000
	// DefaultMaxRequestBytes bounds one command as received, and so what
	// one connection buffers (our client-query-buffer-limit). Values are
	// bounded far lower (512 KiB by default), and one command becomes at
	// most one Raft entry (1 MiB by default), so 16 MiB leaves room for
	// large MSETs and MGETs and still bounds a connection's memory. It is
	// raised to hold one bulk of MaxBulkBytes when that is larger.
	DefaultMaxRequestBytes = 16 << 20
	// maxRequestLimit is the largest MaxRequestBytes.
	maxRequestLimit = 1 << 30
	// DefaultInputBudgetBytes bounds the input all connections hold at
	// once (at least 4 requests of MaxRequestBytes).
	DefaultInputBudgetBytes = 256 << 20
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
	// DefaultMaxReplyBytes is Config.MaxReplyBytes's default.
	DefaultMaxReplyBytes = 64 << 20
	// DefaultOutputBudgetBytes bounds what all connections hold of their
	// output at once (at least 4 * MaxReplyBytes).
	DefaultOutputBudgetBytes = 1 << 30
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
	// TLSAdvertise is its RESP-over-TLS address (ServeTLS), what clients
	// on TLS connections are shown; default: its resp_tls_addr in the
	// config.
	TLSAdvertise string
	// Password, if set, is required (AUTH / HELLO AUTH) before any command
	// but AUTH, HELLO and QUIT. The only user is "default".
	Password string
	// MaxClients bounds open client connections (default 10000); more are
	// answered "-ERR max number of clients reached" and closed.
	MaxClients int
	// MaxRequestBytes bounds one command as received (default 16 MiB),
	// and so what one connection buffers; a command announcing more gets a
	// protocol error at once and the connection is closed.
	MaxRequestBytes int
	// MaxBulkBytes bounds one argument (Redis's proto-max-bulk-len);
	// default: twice MaxValueBytes, at least 1 MiB, so that a value a bit
	// too large gets the value-size error rather than a disconnect. A
	// longer bulk gets "invalid bulk length" at its header.
	MaxBulkBytes int
	// MaxArgs bounds a command's argument count (default 1024*1024, Redis
	// 6's cap); more get "invalid multibulk length" at the header.
	MaxArgs int
	// InputBudgetBytes bounds the input all connections hold at once:
	// buffers and commands received but not run (default 256 MiB, at
	// least 4 * MaxRequestBytes). A connection that needs more is answered
	// an error and closed.
	InputBudgetBytes int64
	// IdleTimeout closes a client that sends nothing for this long
	// (Redis's timeout; default 0: never).
	IdleTimeout time.Duration
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
	// MaxReplyBytes bounds one read's reply (default 64 MiB): a reply is
	// built whole before it is queued, so MaxOutputBytes cannot bound it.
	// It also bounds the values one read round holds per slot, and the
	// values a write batch returns (its reads made in the log, GETSET).
	MaxReplyBytes int
	// OutputBudgetBytes bounds what all connections hold of their output
	// at once: values read for replies, values a write batch returns, and
	// replies not yet written (default 1 GiB, at least 4 * MaxReplyBytes).
	// A read that would need more is refused with an error (nothing else
	// changes); replies already made wait for room rather than being lost.
	OutputBudgetBytes int64
	// Version is reported by INFO as shardkv_version (default: the
	// module version from the build info).
	Version string
	Logger  *slog.Logger
	// OnCommands, if set, is called as each batch of commands arrives from
	// a client: the process tracks client activity with it (a drained
	// group's pods stay until clients have moved away).
	OnCommands func()
}

// Stats are the server's counters (INFO clients and stats).
type Stats struct {
	ConnectedClients    int64
	TotalConnections    int64 // accepted, rejected ones included
	RejectedConnections int64 // refused for MaxClients
	AuthFailures        int64 // failed AUTHs (INFO acl_access_denied_auth)
	TotalCommands       int64
	NetInputBytes       int64
	NetOutputBytes      int64
	// Writes answered with the outcome-unknown error, and commands answered
	// with a redirect or retry (MOVED/TRYAGAIN/CLUSTERDOWN).
	OutcomeUnknown int64
	Refused        int64
	ProtocolErrors int64
	// InputBytes is the input all connections hold now (InputBudgetBytes
	// bounds it); InputRefusals counts connections closed for the budget.
	InputBytes    int64
	InputRefusals int64
	// OutputBytes is what all connections hold of their output now
	// (OutputBudgetBytes bounds it, but for the one reply each connection
	// may always add), OutputPeakBytes the most so far; OutputRefusals
	// counts reads refused for the budget.
	OutputBytes     int64
	OutputPeakBytes int64
	OutputRefusals  int64
}

// Server is a Redis protocol front end for one replica.
type Server struct {
	cfg       Config
	b         Backend
	log       *slog.Logger
	started   time.Time
	cursors   *cursorTable
	tun       *tunables // CONFIG SET's parameters (config.go)
	cmds      map[string]*command
	budget    *memBudget // input
	outBudget *memBudget // output
	// tx is the transaction lock: EXEC holds it exclusively, every
	// other connection shared while it runs commands (multi.go).
	tx sync.RWMutex
	// blocked: the clients waiting in blocking commands (blocking.go).
	blocked blockQueue
	// tlsRefusals logs failed TLS handshakes (ServeTLS), once per kind.
	tlsRefusals *mtls.Refusals
	// The users (users.go): the table parsed from the backend's copy, and
	// the delays of failed AUTHs by host.
	usersMu      sync.Mutex // serialises rebuilding userTab
	userTab      atomic.Pointer[userTable]
	authThrottle authThrottle
	// writeCost: what write batches cost per op of late (batchfit.go).
	writeCost writeCost

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
		connected, total, rejected, commands, in, out, unknown, refused, protoErrs, inputRefusals, outputRefusals atomic.Int64
		// authFailures: failed AUTHs (INFO acl_access_denied_auth).
		authFailures atomic.Int64

		// blocked: clients waiting in a blocking command (INFO blocked_clients).
		blocked atomic.Int64
	}
}

// New returns a server for backend b. Serve or ListenAndServe starts it.
func New(cfg Config, b Backend) *Server {
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = DefaultMaxClients
	}
	if m := b.MaxValueBytes(); cfg.MaxValueBytes <= 0 || cfg.MaxValueBytes > m {
		cfg.MaxValueBytes = m
	}
	if cfg.MaxBulkBytes <= 0 {
		cfg.MaxBulkBytes = max(2*cfg.MaxValueBytes, 1<<20)
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = max(DefaultMaxRequestBytes, cfg.MaxBulkBytes+maxLineBytes)
	}
	// The reader keeps offsets within a command in 32 bits.
	cfg.MaxRequestBytes = min(cfg.MaxRequestBytes, maxRequestLimit)
	if cfg.MaxArgs <= 0 {
		cfg.MaxArgs = DefaultMaxArgs
	}
	if cfg.InputBudgetBytes <= 0 {
		cfg.InputBudgetBytes = max(DefaultInputBudgetBytes, 4*int64(cfg.MaxRequestBytes))
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
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = DefaultMaxReplyBytes
	}
	if cfg.OutputBudgetBytes <= 0 {
		cfg.OutputBudgetBytes = max(DefaultOutputBudgetBytes, 4*int64(cfg.MaxReplyBytes))
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
	return &Server{cfg: cfg, b: b, log: cfg.Logger, started: time.Now(), cursors: newCursorTable(), tun: newTunables(), cmds: commandTable(),
		budget: &memBudget{limit: cfg.InputBudgetBytes}, outBudget: &memBudget{limit: cfg.OutputBudgetBytes}, ctx: ctx, cancel: cancel, lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{},
		tlsRefusals: mtls.NewRefusals(cfg.Logger, time.Minute)}
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
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, nil) }

// ServeTLS serves RESP over TLS on ln (Redis's tls-port) with cfg, which
// decides whether clients must present certificates. Clients on it are
// shown the replicas' TLS addresses in redirects and CLUSTER replies. A
// failed handshake (plain text, an unknown client CA) closes the
// connection and is logged once per peer and reason.
func (s *Server) ServeTLS(ln net.Listener, cfg *tls.Config) error { return s.serve(ln, cfg) }

// handshakeTimeout bounds a TLS handshake: a client that connects and says
// nothing must not hold a goroutine and a socket for ever.
const handshakeTimeout = 10 * time.Second

func (s *Server) serve(ln net.Listener, tlsCfg *tls.Config) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	stampArrivals(ln)
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
		if tlsCfg != nil {
			go s.handshake(nc, tlsCfg)
			continue
		}
		s.accept(nc, false)
	}
}

// handshake completes a TLS handshake, then serves the connection.
func (s *Server) handshake(nc net.Conn, cfg *tls.Config) {
	tc := tls.Server(nc, cfg)
	ctx, cancel := context.WithTimeout(s.ctx, handshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		host, _, _ := net.SplitHostPort(nc.RemoteAddr().String())
		s.tlsRefusals.Refuse(host+" "+mtls.RefusalKind(err), "Redis TLS handshake refused", "peer", host, "err", err)
		nc.Close()
		return
	}
	s.accept(tc, true)
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// accept registers nc and starts its goroutine, or refuses it when the
// server is full (as Redis does: an error, then close).
func (s *Server) accept(nc net.Conn, isTLS bool) {
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
	c.tls = isTLS
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
		AuthFailures:        s.stats.authFailures.Load(),
		TotalCommands:       s.stats.commands.Load(),
		NetInputBytes:       s.stats.in.Load(),
		NetOutputBytes:      s.stats.out.Load(),
		OutcomeUnknown:      s.stats.unknown.Load(),
		Refused:             s.stats.refused.Load(),
		ProtocolErrors:      s.stats.protoErrs.Load(),
		InputBytes:          s.budget.inUse(),
		InputRefusals:       s.stats.inputRefusals.Load(),
		OutputBytes:         s.outBudget.inUse(),
		OutputPeakBytes:     s.outBudget.maxUsed(),
		OutputRefusals:      s.stats.outputRefusals.Load(),
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

// connInput is a connection as the request reader reads it: each read
// counts its bytes and, with an idle timeout, has a deadline. It notes
// when the last bytes it read arrived: the kernel's stamp where there is
// one (stampArrivals), else the time of the read.
type connInput struct {
	nc      net.Conn
	rc      syscall.RawConn // nil: no arrival stamps
	idle    time.Duration
	stats   *atomic.Int64
	arrived time.Time
}

func (ci *connInput) Read(p []byte) (int, error) {
	if ci.idle > 0 {
		_ = ci.nc.SetReadDeadline(time.Now().Add(ci.idle))
	}
	var (
		n   int
		at  time.Time
		err error
	)
	if ci.rc != nil {
		n, at, err = readStamped(ci.rc, p)
	} else {
		n, err = ci.nc.Read(p)
	}
	if n > 0 {
		if at.IsZero() {
			at = time.Now()
		}
		ci.arrived = at
	}
	ci.stats.Add(int64(n))
	return n, err
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
	tls bool // a TLS connection: redirects and topology name TLS ports
	in  *connInput
	rd  *reqReader
	q   *cmdQueue // reader -> executor
	out *outbox   // executor -> writer
	w   io.Writer // the connection, counting reply bytes

	id      int64
	created time.Time
	authed  atomic.Bool // set by the executor (AUTH), read by the reader (limits)
	resp3   atomic.Bool // HELLO 3: replies in RESP3 (resp3.go)
	quit    bool        // QUIT: close after the replies are flushed
	userMu  sync.Mutex
	user    string // the user it is ("": not authenticated); users.go
	burst   burst
	sizes   map[string]int // value sizes last seen (pipeline.written)
	// Transactions (multi.go): the open MULTI, the WATCHes, whether EXEC
	// is running the transaction's commands, and whether this connection
	// holds the server's transaction lock shared (see txShared).
	tx      *transaction
	watches []watch
	execing bool
	shared  bool

	mu       sync.Mutex
	readonly bool // READONLY: reads may be served by this replica as a follower
	name     string
	libName  string
	libVer   string
	lastCmd  string
	lastAt   time.Time
}

func newConn(s *Server, nc net.Conn, id int64) *conn {
	now := time.Now()
	c := &conn{s: s, nc: nc,
		q: newCmdQueue(s.cfg.MaxQueuedBytes), out: newOutbox(s.cfg.MaxOutputBytes, s.outBudget), w: countingWriter{nc, &s.stats.out},
		id: id, created: now, lastAt: now, sizes: map[string]int{}}
	c.startUser()
	c.in = &connInput{nc: nc, rc: stampArrivals(nc), idle: s.cfg.IdleTimeout, stats: &s.stats.in}
	c.rd = newReqReader(c.in, c.limits(), s.budget)
	return c
}

// limits are the reader's limits for the connection's next command: far
// tighter before AUTH, as in Redis.
func (c *conn) limits() readLimits {
	cfg := &c.s.cfg
	return readLimits{maxArgs: cfg.MaxArgs, maxBulk: cfg.MaxBulkBytes, maxRequest: cfg.MaxRequestBytes, unauth: !c.authed.Load()}
}

// serve reads commands and queues them for the executor (which runs them
// and puts their replies in the outbox, which the writer writes), until the
// client leaves, QUIT, a protocol error, a panic or Close. The commands
// read before the client left still run and get their replies.
func (c *conn) serve() {
	defer c.rd.release()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer c.recoverPanic()
		c.execute()
	}()
	go func() {
		defer wg.Done()
		defer c.recoverPanic()
		c.writeLoop()
	}()
	defer wg.Wait()
	defer c.recoverPanic()
	for {
		c.rd.setLimits(c.limits())
		cmds, err := c.rd.readCommands()
		if err != nil {
			c.q.finish(c.readFailed(err))
			return
		}
		if c.s.cfg.OnCommands != nil {
			c.s.cfg.OnCommands()
		}
		args := make([][][]byte, len(cmds))
		for i, cmd := range cmds {
			args[i] = cmd.Args // each command owns its bytes (reader.go)
		}
		if !c.q.push(args, c.out, c.s.cfg.PipelineTimeout, c.in.arrived) {
			return
		}
		if !c.authed.Load() {
			// Before AUTH the reader takes one command at a time and waits
			// for it to run: an AUTH raises the limits for the next read.
			c.q.waitDrained()
		}
	}
}

// recoverPanic ends a panic in the connection's handling: the connection
// closes, the process goes on. The log line is short and names where it
// happened, not the request (which may be large or private).
func (c *conn) recoverPanic() {
	r := recover()
	if r == nil {
		return
	}
	msg := fmt.Sprint(r)
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	var pcs [32]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	var at []string
	for len(at) < 6 {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			at = append(at, fmt.Sprintf("%s:%d", f.Function[strings.LastIndexByte(f.Function, '/')+1:], f.Line))
		}
		if !more {
			break
		}
	}
	c.s.log.Error("panic serving a client; closed its connection", "client", c.nc.RemoteAddr().String(), "panic", msg, "at", strings.Join(at, " < "))
	// Every part of the connection stops: the reader sees the closed
	// socket, the executor the stopped queue, the writer the closed outbox.
	c.nc.Close()
	c.q.stop()
	c.out.close()
}

// readFailed is the reply to a malformed or oversized request (nil for
// EOF and the like), written after the replies to the commands before it,
// before the connection closes, as Redis does. Nothing after it runs.
func (c *conn) readFailed(err error) []byte {
	var msg string
	var pe protoError
	switch {
	case errors.As(err, &pe):
		msg = "ERR " + string(pe)
		c.s.stats.protoErrs.Add(1)
	case errors.Is(err, errInputBudget):
		msg = fmt.Sprintf("ERR client input buffers of this server are full (%d bytes); try again later", c.s.cfg.InputBudgetBytes)
		c.s.stats.inputRefusals.Add(1)
	default:
		return nil // EOF, reset, idle timeout, or Close
	}
	c.s.log.Debug("refused input", "client", c.nc.RemoteAddr().String(), "err", msg)
	return errReply(msg)
}
