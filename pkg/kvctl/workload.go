package kvctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/kvcheck"
)

// The workload's phases (kvcheck.Status.Phase).
const (
	phaseStarting = "starting"
	phaseRunning  = "running"
	phaseStopping = "stopping"
	phaseStopped  = "stopped"
)

// workloadProgressEvery is how often the workload logs a progress line.
const workloadProgressEvery = 10 * time.Second

// workloadRecentWindow is the window of kvcheck.Status.OKPerSecondRecent.
const workloadRecentWindow = 10 * time.Second

// EnvRedisPassword is the environment variable read for the Redis
// password of kvctl workload --redis (--redis-password overrides it).
const EnvRedisPassword = "SHARDKV_REDIS_PASSWORD"

type workloadConfig struct {
	ctrler    []string // the Go client's controller addresses
	redis     []string // if set, Redis Cluster seeds: the clients speak RESP
	redisPass string   // the password of the Redis front ends (AUTH)
	clients   int
	keys      int
	prefix    string
	opTimeout time.Duration // one call, the client's retries included
	rate      float64       // ops/s per client, 0: unlimited
}

// workload runs cfg.clients clients, each its own kv (a client.Client with
// its own session, or a go-redis ClusterClient with its own connections),
// doing random gets, puts and appends of unique values on cfg.keys keys,
// and records every call in a kvcheck.Recorder.
type workload struct {
	cfg           workloadConfig
	keys          []string
	cls           []kv
	rec           *kvcheck.Recorder
	logMu         sync.Mutex
	log           io.Writer
	progressEvery time.Duration

	runCtx    context.Context // cancelled by stop: no new operation starts
	cancelRun context.CancelFunc
	opCtx     context.Context // cancelled by close: operations in flight end
	cancelOps context.CancelFunc
	started   time.Time

	startOnce   sync.Once
	stopOnce    sync.Once
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

func newWorkload(cfg workloadConfig, log io.Writer) (*workload, error) {
	w := &workload{cfg: cfg, log: log, progressEvery: workloadProgressEvery, phase: phaseStarting,
		clientsDone: make(chan struct{}), stopped: make(chan struct{}), failed: make(chan error, 1)}
	for i := range cfg.keys {
		w.keys = append(w.keys, fmt.Sprintf("wl-%s-%d", cfg.prefix, i))
	}
	for range cfg.clients {
		var c kv
		if len(cfg.redis) > 0 {
			c = newRedisKV(cfg.redis, cfg.redisPass, cfg.opTimeout)
		} else {
			gc, err := client.New(cfg.ctrler)
			if err != nil {
				w.closeClients()
				return nil, err
			}
			gc.AttemptTimeout = min(gc.AttemptTimeout, cfg.opTimeout)
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

func (w *workload) logf(format string, a ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(w.log, "%s workload: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// start runs the workload in the background: a warm-up (every key is read
// once, which waits for the cluster and checks the keys are new), then the
// clients until stop.
func (w *workload) start() {
	w.startOnce.Do(func() {
		go w.ticker()
		go w.run()
	})
}

func (w *workload) run() {
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
	w.phase = phaseRunning
	w.warmErr = ""
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
func (w *workload) warmUp() error {
	c := w.cls[0]
	for _, key := range w.keys {
		for {
			if w.runCtx.Err() != nil {
				return w.runCtx.Err()
			}
			ctx, cancel := context.WithTimeout(w.runCtx, w.cfg.opTimeout)
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
				return fmt.Errorf("workload: get %q: %s (--redis-password, $%s)", key, oneLine(err), EnvRedisPassword)
			}
			msg := fmt.Sprintf("waiting for the cluster: get %q: %s", key, oneLine(err))
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
func (w *workload) client(i int) {
	cl := w.cls[i]
	rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(i)))
	var interval time.Duration
	if w.cfg.rate > 0 {
		interval = time.Duration(float64(time.Second) / w.cfg.rate)
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
		ctx, cancel := context.WithTimeout(w.opCtx, w.cfg.opTimeout)
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
			p.Fail(errors.New(oneLine(err)))
		} else {
			p.Ok(out)
		}
	}
}

// ticker samples the ok count every second and logs progress.
func (w *workload) ticker() {
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
			for len(w.samples) > 2 && now.Sub(w.samples[1].at) >= workloadRecentWindow {
				w.samples = w.samples[1:]
			}
			w.mu.Unlock()
			if now.Sub(lastLog) >= w.progressEvery-w.progressEvery/10 { // ticks jitter
				lastLog = now
				s := w.status()
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

func (w *workload) status() kvcheck.Status {
	st := w.rec.Stats()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := kvcheck.Status{Phase: w.phase, Running: w.phase == phaseRunning, Stats: st,
		UptimeSeconds: now.Sub(w.started).Seconds(), Clients: len(w.cls), Keys: w.keys}
	if w.phase == phaseStopped {
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

// stop stops the clients, waits for the operations in flight (each ends
// within the op timeout) and returns the history. Concurrent and later
// calls return the same history.
func (w *workload) stop() kvcheck.History {
	w.stopOnce.Do(func() {
		w.mu.Lock()
		w.cancelRun() // under mu: run does not set phaseRunning after this
		w.phase = phaseStopping
		w.mu.Unlock()
		w.start() // a workload never started stops at once
		<-w.clientsDone
		h := w.rec.History()
		b, err := json.Marshal(h)
		if err != nil { // cannot happen: the history is strings and numbers
			b = []byte(fmt.Sprintf(`{"error":%q}`, err.Error()))
		}
		w.mu.Lock()
		w.phase, w.history, w.historyJSON = phaseStopped, h, b
		w.mu.Unlock()
		close(w.stopped)
		w.logf("stopped: %d ops, %d ok, %d unknown, %d failed gets; the history is on GET /history",
			h.Stats.Ops, h.Stats.OK, h.Stats.Unknown, h.Stats.FailedGets)
	})
	<-w.stopped
	return w.history
}

// close ends everything (operations in flight fail) and closes the clients
// and the HTTP server.
func (w *workload) close() {
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

func (w *workload) closeClients() {
	for _, c := range w.cls {
		c.Close()
	}
}

// serve starts the HTTP server on addr and returns the address it listens
// on.
func (w *workload) serve(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: w.handler(), ReadHeaderTimeout: 10 * time.Second}
	w.mu.Lock()
	w.srv = srv
	w.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.logf("http: %v", err)
		}
	}()
	return ln.Addr(), nil
}

func (w *workload) handler() http.Handler {
	mux := http.NewServeMux()
	writeJSON := func(rw http.ResponseWriter, b []byte) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Write(b)
	}
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /status", func(rw http.ResponseWriter, r *http.Request) {
		b, _ := json.Marshal(w.status())
		writeJSON(rw, append(b, '\n'))
	})
	stop := func(rw http.ResponseWriter, r *http.Request) {
		w.stop()
		w.mu.Lock()
		b := w.historyJSON
		w.mu.Unlock()
		writeJSON(rw, b)
	}
	mux.HandleFunc("POST /stop", stop)
	mux.HandleFunc("GET /stop", stop)
	mux.HandleFunc("GET /history", func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		b, phase := w.historyJSON, w.phase
		w.mu.Unlock()
		if b == nil {
			http.Error(rw, fmt.Sprintf("the workload is %s: the history is ready once it has stopped (POST /stop)", phase), http.StatusConflict)
			return
		}
		writeJSON(rw, b)
	})
	return mux
}

// kv is one workload client's connection to the cluster. An error from a
// write means its outcome is unknown; from a get, that it had no effect.
type kv interface {
	// Get returns key's value, "" if it does not exist.
	Get(ctx context.Context, key string) (string, error)
	Put(ctx context.Context, key, value string) error
	Append(ctx context.Context, key, value string) error
	Close()
}

// goKV is a kv over the Go client: its own exactly-once session.
type goKV struct{ c *client.Client }

func (g goKV) Get(ctx context.Context, key string) (string, error) {
	v, _, err := g.c.Get(ctx, key)
	return v, err
}

func (g goKV) Put(ctx context.Context, key, value string) error {
	return g.c.Put(ctx, key, value)
}

func (g goKV) Append(ctx context.Context, key, value string) error {
	return g.c.Append(ctx, key, value)
}

func (g goKV) Close() { g.c.Close() }

// redisKV is a kv over the Redis Cluster protocol of the data-group
// replicas: GET, SET and APPEND through a go-redis ClusterClient, which
// follows MOVED and ASK and retries TRYAGAIN and CLUSTERDOWN itself.
type redisKV struct{ c *redis.ClusterClient }

// newRedisKV returns a ClusterClient with its own small pool, with the
// settings of docs/redis.md ("Clients") that ride through migrations and
// elections: up to 16 redirects and retries, 8-512 ms apart; a read timeout
// (6 s) above the front ends' write timeout (2 s by default), so a slow
// write is answered "outcome unknown" rather than timed out. Calls end at
// their context's deadline (the op timeout).
func newRedisKV(seeds []string, password string, opTimeout time.Duration) redisKV {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		// A copy: go-redis appends the nodes it learns to Addrs in place,
		// which would race between clients sharing seeds' array.
		Addrs:                 slices.Clone(seeds),
		Password:              password,
		ClientName:            "kvctl-workload",
		MaxRedirects:          16,
		MinRetryBackoff:       8 * time.Millisecond,
		MaxRetryBackoff:       512 * time.Millisecond,
		DialTimeout:           min(5*time.Second, opTimeout),
		ReadTimeout:           6 * time.Second,
		WriteTimeout:          6 * time.Second,
		ContextTimeoutEnabled: true,
		PoolSize:              2,
	})
	c.OnNewNode(func(n *redis.Client) { n.AddHook(noResendHook{}) })
	return redisKV{c}
}

func (r redisKV) Get(ctx context.Context, key string) (string, error) {
	v, err := r.c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

func (r redisKV) Put(ctx context.Context, key, value string) error {
	return r.c.Set(ctx, key, value, 0).Err()
}

func (r redisKV) Append(ctx context.Context, key, value string) error {
	return r.c.Append(ctx, key, value).Err()
}

func (r redisKV) Close() { r.c.Close() }

// noResendHook keeps a ClusterClient from resending a write that may have
// been applied. ClusterClient resends a command whose connection failed
// (EOF, reset, read timeout) to the same or another node; Redis commands
// carry no request id, so a resent APPEND that had been applied is applied
// twice, and a resent SET can overwrite a later write: a history the
// checker rejects although the cluster did nothing wrong. On a node client,
// the hook turns such an error of a write into one ClusterClient does not
// retry, so the write is recorded with an unknown outcome. Replies from the
// server (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: the command did not run; the
// outcome-unknown error) and dial errors (nothing was sent) pass through,
// as do all errors of a GET, which is safe to resend.
type noResendHook struct{}

func (noResendHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (noResendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (noResendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || cmd.Name() == "get" || !mayHaveRun(err) {
			return err
		}
		// Not wrapped: go-redis would still find the retryable error.
		err = fmt.Errorf("%s (may have been applied: not resent)", err.Error())
		cmd.SetErr(err)
		return err
	}
}

// mayHaveRun reports whether a command that failed with err may have
// reached the server.
func mayHaveRun(err error) bool {
	var rerr redis.Error
	var operr *net.OpError
	switch {
	case errors.As(err, &rerr): // the server's reply
		return false
	case errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout):
		return false
	case errors.As(err, &operr) && operr.Op == "dial":
		return false
	}
	return true
}

// isAuthError reports whether err is a Redis front end refusing the
// password (or asking for one): retrying does not help.
func isAuthError(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	s := rerr.Error()
	return strings.HasPrefix(s, "WRONGPASS") || strings.HasPrefix(s, "NOAUTH") || strings.HasPrefix(s, "ERR AUTH")
}

// defaultWorkloadPrefix is the host name (a pod's name) and a random
// suffix, so that two runs never share keys.
func defaultWorkloadPrefix() string {
	host, _ := os.Hostname()
	var b strings.Builder
	for _, r := range strings.ToLower(host) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		}
	}
	h := strings.Trim(b.String(), "-")
	if len(h) > 24 {
		h = h[len(h)-24:]
	}
	if h == "" {
		h = "kvctl"
	}
	return fmt.Sprintf("%s-%04x", h, rand.IntN(1<<16))
}

func cmdWorkload(k *kvctl, args []string) error {
	fs := newFlags("workload")
	clients := fs.Int("clients", 8, "")
	keys := fs.Int("keys", 16, "")
	prefix := fs.String("prefix", "", "")
	opTimeout := fs.Duration("op-timeout", 10*time.Second, "")
	listen := fs.String("listen", ":8090", "")
	duration := fs.Duration("duration", 0, "")
	rate := fs.Float64("rate", 50, "")
	check := fs.Bool("check", false, "")
	checkTimeout := fs.Duration("check-timeout", 5*time.Minute, "")
	viz := fs.String("viz", "", "")
	redisSeeds := fs.String("redis", "", "")
	redisPass := fs.String("redis-password", "", "")
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return err
	}
	switch {
	case *clients < 1:
		return usagef(nil, "--clients must be >= 1")
	case *keys < 1:
		return usagef(nil, "--keys must be >= 1")
	case *opTimeout <= 0:
		return usagef(nil, "--op-timeout must be positive")
	case *duration < 0:
		return usagef(nil, "--duration must be >= 0 (0: until stopped)")
	case *rate < 0 || math.IsNaN(*rate):
		return usagef(nil, "--rate must be >= 0 (0: unlimited)")
	case *check && *duration == 0:
		return usagef(nil, "--check needs --duration")
	case *checkTimeout < 0:
		return usagef(nil, "--check-timeout must be >= 0 (0: no limit)")
	}
	if *prefix == "" {
		*prefix = defaultWorkloadPrefix()
	}
	cfg := workloadConfig{clients: *clients, keys: *keys, prefix: *prefix, opTimeout: *opTimeout, rate: *rate}
	var proto string
	if *redisSeeds != "" {
		for _, a := range strings.Split(*redisSeeds, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.redis = append(cfg.redis, a)
			}
		}
		if len(cfg.redis) == 0 {
			return usagef(nil, "--redis needs host:port addresses")
		}
		cfg.redisPass = os.Getenv(EnvRedisPassword)
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "redis-password" {
				cfg.redisPass = *redisPass
			}
		})
		proto = "protocol redis, seeds " + strings.Join(cfg.redis, ",")
	} else {
		addrs, err := k.resolveCtrler()
		if err != nil {
			return err
		}
		cfg.ctrler = addrs
		proto = "protocol grpc, controller " + strings.Join(addrs, ",")
	}
	w, err := newWorkload(cfg, k.stderr)
	if err != nil {
		return err
	}
	defer w.close()
	if *listen != "" {
		a, err := w.serve(*listen)
		if err != nil {
			return fmt.Errorf("workload: %v", err)
		}
		w.logf("listening on %s (GET /status, POST /stop, GET /history, GET /healthz)", a)
	}
	w.logf("%d clients, keys wl-%s-0..%d, op timeout %v, rate %s, %s", *clients, *prefix, *keys-1,
		*opTimeout, rateString(*rate), proto)

	sig, stopSig := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSig()
	w.start()
	var timer <-chan time.Time
	if *duration > 0 {
		t := time.NewTimer(*duration)
		defer t.Stop()
		timer = t.C
	}
	for {
		select {
		case err := <-w.failed:
			return err
		case <-sig.Done():
			if !*check {
				w.logf("signal: exiting")
				return nil
			}
			w.logf("signal: stopping")
			return checkWorkload(k, w.stop(), *checkTimeout, *viz)
		case <-timer:
			timer = nil
			w.logf("--duration %v elapsed: stopping", *duration)
			h := w.stop()
			if *check {
				return checkWorkload(k, h, *checkTimeout, *viz)
			}
		}
	}
}

func rateString(r float64) string {
	if r == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%g ops/s per client", r)
}

// checkWorkload checks h, prints the summary and fails unless it is
// linearizable.
func checkWorkload(k *kvctl, h kvcheck.History, timeout time.Duration, viz string) error {
	res, err := kvcheck.Check(h.Ops, timeout)
	if err != nil {
		return err
	}
	if k.json {
		if err := k.printJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(k.stdout, "%s\n", res)
	}
	if !res.Linearizable && viz != "" {
		if err := res.VisualizePath(viz); err != nil {
			fmt.Fprintf(k.stderr, "kvctl: workload: visualization: %v\n", err)
		} else {
			fmt.Fprintf(k.stderr, "kvctl: workload: visualization written to %s\n", viz)
		}
	}
	switch {
	case res.CheckResult == kvcheck.ResultIllegal:
		return fmt.Errorf("workload: the history is not linearizable (keys %s)", strings.Join(res.IllegalKeys, ", "))
	case !res.Linearizable:
		return fmt.Errorf("workload: the linearizability check ran out of time after %v (--check-timeout)", timeout)
	case res.OK == 0:
		return fmt.Errorf("workload: no operation succeeded; last error: %s", h.Stats.LastError)
	}
	return nil
}
