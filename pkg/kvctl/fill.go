package kvctl

// fill and verify: a data set that can be checked. fill writes keys
// <prefix>0 .. <prefix>N-1, each with a value derived from its own name
// (fillValue); verify reads every one back and counts the missing and the
// wrong. Together they prove that what was acknowledged survives whatever
// happened between them (migrations, drains, lost disks, restarts).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
)

// fillJSON is the --json output of fill and verify.
type fillJSON struct {
	Keys      int     `json:"keys"`
	ValueSize int     `json:"value_size"`
	Passes    int     `json:"passes,omitempty"`
	Ops       uint64  `json:"ops"`
	Errors    uint64  `json:"errors"`
	Missing   uint64  `json:"missing,omitempty"`
	Wrong     uint64  `json:"wrong,omitempty"`
	Seconds   float64 `json:"duration_s"`
	OpsPerSec float64 `json:"ops_per_sec"`
	// FirstBad is the first missing or wrong key verify met.
	FirstBad  string `json:"first_bad,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// fillValue is key's value in a fill of values of size bytes: the key
// repeated, so a value read under another key is seen as wrong.
func fillValue(key string, size int) string {
	if size == 0 {
		return ""
	}
	return strings.Repeat(key+"|", size/(len(key)+1)+1)[:size]
}

// dataSetFlags are the flags fill and verify share: what the data set is.
type dataSetFlags struct {
	clients, keys, valueSize int
	prefix                   string
	passes                   int // fill only
}

func (k *kvctl) parseDataSet(name string, args []string) (*dataSetFlags, error) {
	fs := newFlags(name)
	d := &dataSetFlags{passes: 1}
	fs.IntVar(&d.clients, "clients", 16, "")
	fs.IntVar(&d.keys, "keys", 0, "")
	fs.IntVar(&d.valueSize, "value-size", 1024, "")
	fs.StringVar(&d.prefix, "key-prefix", "kvctl-fill:", "")
	if name == "fill" {
		fs.IntVar(&d.passes, "passes", 1, "")
	}
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return nil, err
	}
	switch {
	case d.keys < 1:
		return nil, usagef(nil, "--keys must be >= 1")
	case d.clients < 1:
		return nil, usagef(nil, "--clients must be >= 1")
	case d.valueSize < 0:
		return nil, usagef(nil, "--value-size must be >= 0")
	case d.passes < 1:
		return nil, usagef(nil, "--passes must be >= 1")
	}
	return d, nil
}

func cmdFill(k *kvctl, args []string) error {
	d, err := k.parseDataSet("fill", args)
	if err != nil {
		return err
	}
	out := fillJSON{Keys: d.keys, ValueSize: d.valueSize, Passes: d.passes}
	err = k.forEachKey(d.clients, d.keys*d.passes, &out, func(ctx context.Context, cl *client.Client, i int) (string, error) {
		key := fmt.Sprintf("%s%d", d.prefix, i%d.keys)
		return key, cl.Put(ctx, key, fillValue(key, d.valueSize))
	})
	if err != nil {
		return err
	}
	if err := k.printFill(out); err != nil {
		return err
	}
	if out.Errors > 0 {
		return fmt.Errorf("fill: %d writes failed (their keys may or may not hold the value); last error: %s", out.Errors, out.LastError)
	}
	return nil
}

func cmdVerify(k *kvctl, args []string) error {
	d, err := k.parseDataSet("verify", args)
	if err != nil {
		return err
	}
	out := fillJSON{Keys: d.keys, ValueSize: d.valueSize}
	var missing, wrong atomic.Uint64
	var mu sync.Mutex
	noteBad := func(key string, n *atomic.Uint64) {
		n.Add(1)
		mu.Lock()
		if out.FirstBad == "" {
			out.FirstBad = key
		}
		mu.Unlock()
	}
	err = k.forEachKey(d.clients, d.keys, &out, func(ctx context.Context, cl *client.Client, i int) (string, error) {
		key := fmt.Sprintf("%s%d", d.prefix, i)
		v, ok, err := cl.Get(ctx, key)
		switch {
		case err != nil:
		case !ok:
			noteBad(key, &missing)
		case v != fillValue(key, d.valueSize):
			noteBad(key, &wrong)
		}
		return key, err
	})
	if err != nil {
		return err
	}
	out.Missing, out.Wrong = missing.Load(), wrong.Load()
	if err := k.printFill(out); err != nil {
		return err
	}
	if out.Missing+out.Wrong+out.Errors > 0 {
		return fmt.Errorf("verify: of %d keys, %d missing, %d with a wrong value, %d unread (first bad %q; last error: %s)",
			out.Keys, out.Missing, out.Wrong, out.Errors, out.FirstBad, out.LastError)
	}
	return nil
}

func (k *kvctl) printFill(out fillJSON) error {
	if k.json {
		return k.printJSON(out)
	}
	fmt.Fprintf(k.stdout, "%d keys of %d bytes: %d operations in %.1fs (%.0f/s), %d errors",
		out.Keys, out.ValueSize, out.Ops, out.Seconds, out.OpsPerSec, out.Errors)
	if out.Passes == 0 {
		fmt.Fprintf(k.stdout, ", %d missing, %d wrong", out.Missing, out.Wrong)
	}
	fmt.Fprintln(k.stdout)
	return nil
}

// forEachKey runs op for i in [0, n) over clients workers (each its own
// client), with a progress line a second on stderr, and fills out's
// counts and last error (op names the key it worked on). An interrupt
// stops it early with an error.
func (k *kvctl) forEachKey(clients, n int, out *fillJSON, op func(ctx context.Context, cl *client.Client, i int) (key string, err error)) error {
	cls, closeAll, err := k.workerClients(clients)
	if err != nil {
		return err
	}
	defer closeAll()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var next, done, failed atomic.Uint64
	var lastErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for _, cl := range cls {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= uint64(n) {
					return
				}
				octx, cancel := context.WithTimeout(ctx, k.timeout)
				key, err := op(octx, cl, int(i))
				cancel()
				if err != nil {
					failed.Add(1)
					lastErr.Store(key + ": " + oneLine(err))
				} else {
					done.Add(1)
				}
			}
		})
	}
	k.progress(&wg, start, func() string {
		return fmt.Sprintf("%d of %d done, %d errors", done.Load(), n, failed.Load())
	})
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	out.Seconds = time.Since(start).Seconds()
	out.Ops, out.Errors = done.Load(), failed.Load()
	if s, ok := lastErr.Load().(string); ok {
		out.LastError = s
	}
	out.OpsPerSec = float64(out.Ops) / out.Seconds
	return nil
}

// workerClients opens n clients (each its own session and connections)
// and learns the config before any clock starts.
func (k *kvctl) workerClients(n int) ([]*client.Client, func(), error) {
	if _, err := k.resolveCtrler(); err != nil {
		return nil, nil, err
	}
	var cls []*client.Client
	closeAll := func() {
		for _, c := range cls {
			c.Close()
		}
	}
	for range n {
		c, err := client.New(k.ctrlerAddrs, k.dial...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		c.AttemptTimeout = min(c.AttemptTimeout, k.timeout)
		cls = append(cls, c)
	}
	ctx, cancel := k.ctx()
	_, err := cls[0].Config(ctx)
	cancel()
	if err != nil {
		closeAll()
		return nil, nil, k.ctrlErr(err)
	}
	return cls, closeAll, nil
}

// progress prints line() each second on stderr (in place on a terminal)
// until wg is done.
func (k *kvctl) progress(wg *sync.WaitGroup, start time.Time, line func() string) {
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tty := isTerminal(k.stderr)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-finished:
			if tty {
				fmt.Fprintf(k.stderr, "\r%-60s\r", "")
			}
			return
		case now := <-tick.C:
			l := fmt.Sprintf("%5.0fs  %s", now.Sub(start).Seconds(), line())
			if tty {
				fmt.Fprintf(k.stderr, "\r%-60s", l)
			} else {
				fmt.Fprintln(k.stderr, l)
			}
		}
	}
}
