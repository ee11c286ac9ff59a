package grpcdial

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
)

// ErrClosed is returned by a Pool (and the Callers on it) after Close.
var ErrClosed = errors.New("grpcdial: connection pool closed")

// Pool holds one connection per address, dialed on first use. Replicas
// come and go (a pod replaced on Kubernetes may come back at another IP),
// so its owner drops the connections of addresses that are gone: Forget
// and Retain by address, or CloseIdle on a timer.
//
// A connection returned by Get is for the call at hand: Forget, Retain,
// CloseIdle or Close may close it later (an RPC in flight on it then
// fails). Get it again for the next call; it is re-dialed if needed.
type Pool struct {
	opts []grpc.DialOption

	mu     sync.Mutex
	conns  map[string]*pooled
	closed bool
}

type pooled struct {
	cc *grpc.ClientConn
	// used: handed out by Get, or carried an RPC, since the last CloseIdle.
	used atomic.Bool
	// active counts RPCs in flight (a stream until it ends).
	active atomic.Int64
}

// NewPool returns an empty pool that dials with opts (Options() if none).
func NewPool(opts ...grpc.DialOption) *Pool {
	if len(opts) == 0 {
		opts = Options()
	}
	return &Pool{opts: slices.Clip(opts), conns: map[string]*pooled{}}
}

// Get returns the connection to addr ("host:port"), dialing it if the pool
// has none. Dialing is lazy: it fails only on bad options, and the
// connection is made by the first RPC.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	e := p.conns[addr]
	if e == nil {
		e = &pooled{}
		opts := append(p.opts, grpc.WithChainUnaryInterceptor(e.unary), grpc.WithChainStreamInterceptor(e.stream))
		cc, err := grpc.NewClient(Target(addr), opts...)
		if err != nil {
			return nil, fmt.Errorf("grpcdial: dial %s: %w", addr, err)
		}
		e.cc = cc
		p.conns[addr] = e
	}
	e.used.Store(true)
	return e.cc, nil
}

// Forget closes and drops the connections to addrs.
func (p *Pool) Forget(addrs ...string) {
	p.drop(func(addr string, _ *pooled) bool { return slices.Contains(addrs, addr) })
}

// Retain closes and drops every connection except those to addrs.
func (p *Pool) Retain(addrs []string) {
	p.drop(func(addr string, _ *pooled) bool { return !slices.Contains(addrs, addr) })
}

// CloseIdle closes and drops the connections that carry no RPC and were
// neither handed out by Get nor used by an RPC since the previous
// CloseIdle, and returns their addresses (sorted). Called every d, it
// closes connections unused for between d and 2d.
func (p *Pool) CloseIdle() []string {
	return p.drop(func(_ string, e *pooled) bool {
		return !e.used.Swap(false) && e.active.Load() == 0
	})
}

// Addrs lists the addresses the pool holds a connection to, sorted.
func (p *Pool) Addrs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.conns))
}

// Close closes every connection; later Gets fail with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.drop(func(string, *pooled) bool { return true })
	return nil
}

// drop removes the entries gone says so, closes them outside the lock
// (Close waits for the connection's goroutines), and returns their
// addresses, sorted.
func (p *Pool) drop(gone func(string, *pooled) bool) []string {
	var addrs []string
	var ccs []*grpc.ClientConn
	p.mu.Lock()
	for a, e := range p.conns {
		if gone(a, e) {
			addrs = append(addrs, a)
			ccs = append(ccs, e.cc)
			delete(p.conns, a)
		}
	}
	p.mu.Unlock()
	for _, cc := range ccs {
		cc.Close()
	}
	slices.Sort(addrs)
	return addrs
}

// The interceptors keep CloseIdle off connections in use.

func (e *pooled) begin() { e.active.Add(1); e.used.Store(true) }
func (e *pooled) end()   { e.used.Store(true); e.active.Add(-1) }

func (e *pooled) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	e.begin()
	defer e.end()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (e *pooled) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	e.begin()
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		e.end()
		return nil, err
	}
	ts := &trackedStream{ClientStream: s, single: !desc.ServerStreams, end: e.end}
	// A stream ends when RecvMsg fails (io.EOF included) or its context
	// ends, whichever the caller sees first.
	ts.stop = context.AfterFunc(ctx, ts.finish)
	return ts, nil
}

type trackedStream struct {
	grpc.ClientStream
	single bool // one response: the stream ends with it
	end    func()
	stop   func() bool
	once   sync.Once
}

func (s *trackedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || s.single {
		s.stop()
		s.finish()
	}
	return err
}

func (s *trackedStream) finish() { s.once.Do(s.end) }
