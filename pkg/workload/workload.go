// Package workload is the linearizability workload of `kvctl workload`:
// clients (Go clients with exactly-once sessions, or go-redis Redis
// Cluster clients) doing random gets, puts and appends of unique values on
// a few keys, every call recorded in a kvcheck history that an HTTP API
// serves (GET /status, POST /stop, GET /history) and that Run can check.
// The e2e suite runs it in-cluster; docs/kvctl.md ("workload") and
// docs/e2e.md describe it.
//
// Files: workload.go (the clients and their history), http.go (the HTTP
// API), run.go (a whole run, as kvctl runs it), kv.go and redis.go (the
// two kinds of client).
package workload

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/kvcheck"
	"google.golang.org/grpc"
)

// The workload's phases (kvcheck.Status.Phase).
const (
	PhaseStarting = "starting"
	PhaseRunning  = "running"
	PhaseStopping = "stopping"
	PhaseStopped  = "stopped"
)

// progressEvery is how often the workload logs a progress line.
const progressEvery = 10 * time.Second

// recentWindow is the window of kvcheck.Status.OKPerSecondRecent.
const recentWindow = 10 * time.Second

// Config is one workload: its clients and keys.
type Config struct {
	Ctrler []string // the Go client's controller addresses
	// Dial are the Go client's dial options (grpcdial.OptionsWith for
	// mutual TLS); nil: plaintext.
	Dial          []grpc.DialOption
	Redis         []string // if set, Redis Cluster seeds: the clients speak RESP
	RedisPassword string   // the password of the Redis front ends (AUTH)
	// RedisUser is the ACL user to AUTH as ("": the default user);
	// RedisTLS the TLS configuration of the Redis connections (nil: plain).
	RedisUser string
	RedisTLS  *tls.Config
	Clients   int
	Keys      int
	Prefix    string        // keys are wl-<Prefix>-<i>
	OpTimeout time.Duration // one call, the client's retries included
	Rate      float64       // ops/s per client, 0: unlimited
}

// Workload runs cfg.Clients clients, each its own kv (a client.Client with
// its own session, or a go-redis ClusterClient with its own connections),
// doing random gets, puts and appends of unique values on cfg.Keys keys,
// and records every call in a kvcheck.Recorder.
type Workload struct {
	cfg           Config
	keys          []string
	cls           []kv
	rec           *kvcheck.Recorder
	logMu         sync.Mutex
	log           io.Writer
	progressEvery time.Duration

	runCtx    context.Context // cancelled by Stop: no new operation starts
	cancelRun context.CancelFunc
	opCtx     context.Context // cancelled by Close: operations in flight end
	cancelOps context.CancelFunc
	started   time.Time

	startOnce   sync.Once
	stopOnce    sync.Once
	running     chan struct{} // closed when the warm-up is done and the clients start
	clientsDone chan struct{} // closed when every client has returned
	stopped     chan struct{} // closed when the history is ready
	failed      chan error    // the workload cannot run (buffered, one error)

	mu          sync.Mutex
	phase       string
	warmErr     string // why the warm-up has not finished yet
	samples     []okSample
	history     kvcheck.History
	historyJSON []byte
	srv         *http.Server
}

type okSample struct {
	at time.Time
	ok int64
}

// New returns a workload of cfg, not started, that logs to log.
func New(cfg Config, log io.Writer) (*Workload, error) {
	w := &Workload{cfg: cfg, log: log, progressEvery: progressEvery, phase: PhaseStarting,
		running: make(chan struct{}), clientsDone: make(chan struct{}), stopped: make(chan struct{}), failed: make(chan error, 1)}
	for i := range cfg.Keys {
		w.keys = append(w.keys, fmt.Sprintf("wl-%s-%d", cfg.Prefix, i))
	}
	for range cfg.Clients {
		var c kv
		if len(cfg.Redis) > 0 {
			c = newRedisKV(cfg.Redis, RedisAuth{User: cfg.RedisUser, Password: cfg.RedisPassword, TLS: cfg.RedisTLS}, cfg.OpTimeout)
		} else {
			gc, err := client.New(cfg.Ctrler, cfg.Dial...)
			if err != nil {
				w.closeClients()
				return nil, err
			}
			gc.AttemptTimeout = min(gc.AttemptTimeout, cfg.OpTimeout)
			c = goKV{gc}
		}
		w.cls = append(w.cls, c)
	}
	w.runCtx, w.cancelRun = context.WithCancel(context.Background())
	w.opCtx, w.cancelOps = context.WithCancel(context.Background())
	w.rec = kvcheck.NewRecorder()
	w.started = time.Now()
	return w, nil
}

func (w *Workload) logf(format string, a ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.log, "%s workload: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// Running is closed when the warm-up is done and the clients start.
func (w *Workload) Running() <-chan struct{} { return w.running }

// Failed delivers the error that keeps the workload from running (the
// warm-up found a key with a value, or the password was refused).
func (w *Workload) Failed() <-chan error { return w.failed }

// Start runs the workload in the background: a warm-up (every key is read
// once, which waits for the cluster and checks the keys are new), then the
// clients until stop.
func (w *Workload) Start() {
	w.startOnce.Do(func() {
		go w.ticker()
		go w.run()
	})
}

func (w *Workload) run() {
	defer close(w.clientsDone)
	if err := w.warmUp(); err != nil {
		if w.runCtx.Err() == nil {
			w.failed <- err
		}
		return
	}
	w.mu.Lock()
	if w.runCtx.Err() != nil {
		w.mu.Unlock()
		return
	}
	w.phase = PhaseRunning
	w.warmErr = ""
	close(w.running)
	w.mu.Unlock()
	w.logf("running: %d clients on %d keys %s..%s", len(w.cls), len(w.keys), w.keys[0], w.keys[len(w.keys)-1])
	var wg sync.WaitGroup
	for i := range w.cls {
		wg.Go(func() { w.client(i) })
	}
	wg.Wait()
}

// warmUp reads every key until it succeeds: the history's model starts
// with every key empty, so a key that already has a value is an error.
func (w *Workload) warmUp() error {
	c := w.cls[0]
	for _, key := range w.keys {
		for {
			if w.runCtx.Err() != nil {
				return w.runCtx.Err()
			}
			ctx, cancel := context.WithTimeout(w.runCtx, w.cfg.OpTimeout)
			v, err := c.Get(ctx, key)
			cancel()
			if err == nil {
				if v != "" {
					return fmt.Errorf("workload: key %q already has a value (%d bytes): the history must start from empty keys; pick another --prefix", key, len(v))
				}
				break
			}
			if w.runCtx.Err() != nil {
				return w.runCtx.Err()
			}
			if isAuthError(err) {
				return fmt.Errorf("workload: get %q: %s (--redis-user, --redis-password, $%s)", key, client.ErrorLine(err), EnvRedisPassword)
			}
			msg := fmt.Sprintf("waiting for the cluster: get %q: %s", key, client.ErrorLine(err))
			w.mu.Lock()
			w.warmErr = msg
			w.mu.Unlock()
			w.logf("%s", msg)
			select {
			case <-w.runCtx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// client is client i's loop.
func (w *Workload) client(i int) {
	cl := w.cls[i]
	rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(i)))
	var interval time.Duration
	if w.cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) / w.cfg.Rate)
	}
	next := time.Now()
	for seq := 0; ; seq++ {
		if interval > 0 {
			if d := time.Until(next); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-w.runCtx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			// Calls start at least interval apart; a client that fell
			// behind does not catch up in a burst.
			if now := time.Now(); now.After(next) {
				next = now
			}
			next = next.Add(interval)
		}
		if w.runCtx.Err() != nil {
			return
		}
		key := w.keys[rng.IntN(len(w.keys))]
		kind, value := kvcheck.Get, ""
		switch p := rng.IntN(10); {
		case p < 4:
		case p < 7:
			// Every value is unique, and a key's value is a sequence of
			// ';'-terminated tokens, so porcupine can tell writes apart.
			kind, value = kvcheck.Put, fmt.Sprintf("p%d.%d;", i, seq)
		default:
			kind, value = kvcheck.Append, fmt.Sprintf("a%d.%d;", i, seq)
		}
		// Not bounded by stop: an operation in flight finishes (within
		// the op timeout), so every recorded outcome is the client's.
		ctx, cancel := context.WithTimeout(w.opCtx, w.cfg.OpTimeout)
		p := w.rec.Start(i, kind, key, value)
		var out string
		var err error
		switch kind {
		case kvcheck.Get:
			out, err = cl.Get(ctx, key)
		case kvcheck.Put:
			err = cl.Put(ctx, key, value)
		default:
			err = cl.Append(ctx, key, value)
		}
		cancel()
		if err != nil {
			p.Fail(errors.New(client.ErrorLine(err)))
		} else {
			p.Ok(out)
		}
	}
}

// ticker samples the ok count every second and logs progress.
func (w *Workload) ticker() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		select {
		case <-w.opCtx.Done():
			return
		case <-w.stopped:
			return
		case now := <-tick.C:
			st := w.rec.Stats()
			w.mu.Lock()
			w.samples = append(w.samples, okSample{now, st.OK})
			for len(w.samples) > 2 && now.Sub(w.samples[1].at) >= recentWindow {
				w.samples = w.samples[1:]
			}
			w.mu.Unlock()
			if now.Sub(lastLog) >= w.progressEvery-w.progressEvery/10 { // ticks jitter
				lastLog = now
				s := w.Status()
				line := fmt.Sprintf("%s %.0fs: %d ops, %d ok (%.1f/s recently), %d unknown, %d failed gets, %d in flight",
					s.Phase, s.UptimeSeconds, s.Ops, s.OK, s.OKPerSecondRecent, s.Unknown, s.FailedGets, s.InFlight)
				if s.LastError != "" {
					line += fmt.Sprintf("; last error %.0fs ago: %s", now.Sub(s.LastErrorAt).Seconds(), s.LastError)
				}
				w.logf("%s", line)
			}
		}
	}
}

// Status is what GET /status answers.
func (w *Workload) Status() kvcheck.Status {
	st := w.rec.Stats()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := kvcheck.Status{Phase: w.phase, Running: w.phase == PhaseRunning, Stats: st,
		UptimeSeconds: now.Sub(w.started).Seconds(), Clients: len(w.cls), Keys: w.keys}
	if w.phase == PhaseStopped {
		s.Stats = w.history.Stats
	}
	if s.LastError == "" && w.warmErr != "" {
		s.LastError, s.LastErrorAt = w.warmErr, now
	}
	if len(w.samples) > 0 {
		if dt := now.Sub(w.samples[0].at).Seconds(); dt > 0.5 {
			s.OKPerSecondRecent = float64(st.OK-w.samples[0].ok) / dt
		}
	}
	return s
}

// Stop stops the clients, waits for the operations in flight (each ends
// within the op timeout) and returns the history. Concurrent and later
// calls return the same history.
func (w *Workload) Stop() kvcheck.History {
	w.stopOnce.Do(func() {
		w.mu.Lock()
		w.cancelRun() // under mu: run does not set PhaseRunning after this
		w.phase = PhaseStopping
		w.mu.Unlock()
		w.Start() // a workload never started stops at once
		<-w.clientsDone
		h := w.rec.History()
		b, err := json.Marshal(h)
		if err != nil { // cannot happen: the history is strings and numbers
			b = []byte(fmt.Sprintf(`{"error":%q}`, err.Error()))
		}
		w.mu.Lock()
		w.phase, w.history, w.historyJSON = PhaseStopped, h, b
		w.mu.Unlock()
		close(w.stopped)
		w.logf("stopped: %d ops, %d ok, %d unknown, %d failed gets; the history is on GET /history",
			h.Stats.Ops, h.Stats.OK, h.Stats.Unknown, h.Stats.FailedGets)
	})
	<-w.stopped
	return w.history
}

// Close ends everything (operations in flight fail) and closes the clients
// and the HTTP server.
func (w *Workload) Close() {
	w.cancelRun()
	w.cancelOps()
	w.mu.Lock()
	srv := w.srv
	w.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	w.closeClients()
}

func (w *Workload) closeClients() {
	for _, c := range w.cls {
		c.Close()
	}
}
