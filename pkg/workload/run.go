package workload

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/kvcheck"
)

// RunOptions say how Run runs a workload (kvctl workload's flags).
type RunOptions struct {
	// Listen is the HTTP API's address ("": none).
	Listen string
	// Duration stops the clients this long after they started, that is
	// after the warm-up (0: when ctx ends);
	// without Check, the history is then served until ctx ends.
	Duration time.Duration
	// Check checks the history once the clients stopped.
	Check bool
	// CheckTimeout bounds the check (0: no limit).
	CheckTimeout time.Duration
}

// Run runs a workload of cfg until ctx ends (a signal) or, with Check,
// until it is checked. With Check it returns the check's result, and an
// error unless the history is linearizable with at least one success; the
// result may come with an error. Progress goes to log.
func Run(ctx context.Context, cfg Config, opts RunOptions, log io.Writer) (*kvcheck.Result, error) {
	w, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	if opts.Listen != "" {
		a, err := w.Serve(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("workload: %v", err)
		}
		w.logf("listening on %s (GET /status, POST /stop, GET /history, GET /healthz)", a)
	}
	proto := "protocol grpc, controller " + strings.Join(cfg.Ctrler, ",")
	if len(cfg.Redis) > 0 {
		proto = "protocol redis, seeds " + strings.Join(cfg.Redis, ",")
	}
	w.logf("%d clients, keys wl-%s-0..%d, op timeout %v, rate %s, %s", cfg.Clients, cfg.Prefix, cfg.Keys-1,
		cfg.OpTimeout, rateString(cfg.Rate), proto)

	w.Start()
	// The duration counts from the end of the warm-up, which can take long
	// on a cluster that is still starting or recovering: a run of D is D of
	// client operations, however long the cluster took to answer first.
	running := w.Running()
	var timer <-chan time.Time
	for {
		select {
		case <-running:
			running = nil
			if opts.Duration > 0 {
				t := time.NewTimer(opts.Duration)
				defer t.Stop()
				timer = t.C
			}
		case err := <-w.Failed():
			return nil, err
		case <-ctx.Done():
			if !opts.Check {
				w.logf("signal: exiting")
				return nil, nil
			}
			w.logf("signal: stopping")
			return check(w.Stop(), opts.CheckTimeout)
		case <-timer:
			timer = nil
			w.logf("--duration %v elapsed: stopping", opts.Duration)
			h := w.Stop()
			if opts.Check {
				return check(h, opts.CheckTimeout)
			}
		}
	}
}

// check checks h: the result, and an error unless it is linearizable with
// at least one success.
func check(h kvcheck.History, timeout time.Duration) (*kvcheck.Result, error) {
	res, err := kvcheck.Check(h.Ops, timeout)
	if err != nil {
		return nil, err
	}
	switch {
	case res.CheckResult == kvcheck.ResultIllegal:
		return &res, fmt.Errorf("workload: the history is not linearizable (keys %s)", strings.Join(res.IllegalKeys, ", "))
	case !res.Linearizable:
		return &res, fmt.Errorf("workload: the linearizability check ran out of time after %v (--check-timeout)", timeout)
	case res.OK == 0:
		return &res, fmt.Errorf("workload: no operation succeeded; last error: %s", h.Stats.LastError)
	}
	return &res, nil
}

func rateString(r float64) string {
	if r == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%g ops/s per client", r)
}

// DefaultPrefix is the host name (a pod's name) and a random
// suffix, so that two runs never share keys.
func DefaultPrefix() string {
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
