package kvctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// benchJSON is the --json output of bench.
type benchJSON struct {
	Clients     int           `json:"clients"`
	Keys        int           `json:"keys"`
	ValueSize   int           `json:"value_size"`
	ReadRatio   float64       `json:"read_ratio"`
	DurationSec float64       `json:"duration_s"`
	Ops         uint64        `json:"ops"`
	Errors      uint64        `json:"errors"`
	OpsPerSec   float64       `json:"ops_per_sec"`
	ByOp        []benchOpJSON `json:"by_op"`
	LastError   string        `json:"last_error,omitempty"`
}

// benchOpJSON summarises one kind of operation ("get", "put", or "all").
// Latencies are of successful operations, in milliseconds.
type benchOpJSON struct {
	Op        string  `json:"op"`
	Ops       uint64  `json:"ops"`
	Errors    uint64  `json:"errors"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P90Ms     float64 `json:"p90_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
}

type benchWorker struct {
	get, put       []time.Duration
	getErr, putErr uint64
}

func cmdBench(k *kvctl, args []string) error {
	fs := newFlags("bench")
	clients := fs.Int("clients", 8, "")
	duration := fs.Duration("duration", 10*time.Second, "")
	ops := fs.Uint64("ops", 0, "")
	valueSize := fs.Int("value-size", 64, "")
	keys := fs.Int("keys", 1000, "")
	readRatio := fs.Float64("read-ratio", 0.5, "")
	prefix := fs.String("key-prefix", "kvctl-bench:", "")
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return err
	}
	durationGiven := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "duration" {
			durationGiven = true
		}
	})
	switch {
	case *clients < 1:
		return usagef(nil, "--clients must be >= 1")
	case *duration <= 0:
		return usagef(nil, "--duration must be positive")
	case *valueSize < 0:
		return usagef(nil, "--value-size must be >= 0")
	case *keys < 1:
		return usagef(nil, "--keys must be >= 1")
	case *readRatio < 0 || *readRatio > 1 || math.IsNaN(*readRatio):
		return usagef(nil, "--read-ratio must be between 0 and 1")
	}
	cls, closeAll, err := k.workerClients(*clients)
	if err != nil {
		return err
	}
	defer closeAll()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *ops == 0 || durationGiven {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	value := make([]byte, *valueSize)
	for i := range value {
		value[i] = 'a' + byte(rand.IntN(26))
	}
	val := string(value)

	var done, failed atomic.Uint64
	var tickets atomic.Uint64
	var lastErr atomic.Value
	workers := make([]*benchWorker, *clients)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w := &benchWorker{}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(i)))
			cl := cls[i]
			for ctx.Err() == nil {
				if *ops > 0 && tickets.Add(1) > *ops {
					return
				}
				key := fmt.Sprintf("%s%d", *prefix, rng.IntN(*keys))
				read := rng.Float64() < *readRatio
				octx, cancel := context.WithTimeout(ctx, k.timeout)
				t0 := time.Now()
				var err error
				if read {
					_, _, err = cl.Get(octx, key)
				} else {
					err = cl.Put(octx, key, val)
				}
				lat := time.Since(t0)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return // the run ended mid-operation: not an error
					}
					failed.Add(1)
					lastErr.Store(oneLine(err))
					if read {
						w.getErr++
					} else {
						w.putErr++
					}
					continue
				}
				done.Add(1)
				if read {
					w.get = append(w.get, lat)
				} else {
					w.put = append(w.put, lat)
				}
			}
		}()
	}

	var prev uint64
	prevT := start
	k.progress(&wg, start, func() string {
		now, n := time.Now(), done.Load()
		rate := float64(n-prev) / now.Sub(prevT).Seconds()
		prev, prevT = n, now
		return fmt.Sprintf("%d ops  %.0f ops/s  %d errors", n, rate, failed.Load())
	})
	elapsed := time.Since(start)

	var get, put []time.Duration
	var getErr, putErr uint64
	for _, w := range workers {
		get = append(get, w.get...)
		put = append(put, w.put...)
		getErr += w.getErr
		putErr += w.putErr
	}
	all := append(slices.Clone(get), put...)
	out := benchJSON{Clients: *clients, Keys: *keys, ValueSize: *valueSize, ReadRatio: *readRatio,
		DurationSec: elapsed.Seconds(), Ops: uint64(len(all)), Errors: getErr + putErr,
		OpsPerSec: float64(len(all)) / elapsed.Seconds()}
	if s, ok := lastErr.Load().(string); ok {
		out.LastError = s
	}
	out.ByOp = []benchOpJSON{summarize("get", get, getErr, elapsed), summarize("put", put, putErr, elapsed), summarize("all", all, getErr+putErr, elapsed)}
	if k.json {
		if err := k.printJSON(out); err != nil {
			return err
		}
	} else {
		writeBenchTable(k.stdout, out)
	}
	if out.Ops == 0 && out.Errors > 0 {
		return errors.New("bench: every operation failed; last error: " + out.LastError)
	}
	if out.Errors > 0 && !k.json {
		fmt.Fprintf(k.stderr, "kvctl: bench: %d operations failed; last error: %s\n", out.Errors, out.LastError)
	}
	return nil
}

func summarize(op string, lat []time.Duration, errs uint64, elapsed time.Duration) benchOpJSON {
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1000 }
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		i := int(math.Ceil(p*float64(len(lat)))) - 1
		return lat[max(0, min(i, len(lat)-1))]
	}
	out := benchOpJSON{Op: op, Ops: uint64(len(lat)), Errors: errs, OpsPerSec: math.Round(float64(len(lat))/elapsed.Seconds()*10) / 10}
	if len(lat) > 0 {
		out.P50Ms, out.P90Ms, out.P99Ms, out.MaxMs = ms(pct(0.5)), ms(pct(0.9)), ms(pct(0.99)), ms(lat[len(lat)-1])
	}
	return out
}

func writeBenchTable(w io.Writer, b benchJSON) {
	fmt.Fprintf(w, "%d clients, %.1fs, %d keys, %d-byte values, read ratio %.2f: %d ops, %.0f ops/s, %d errors\n\n",
		b.Clients, b.DurationSec, b.Keys, b.ValueSize, b.ReadRatio, b.Ops, b.OpsPerSec, b.Errors)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "OP\tOPS\tERRORS\tOPS/S\tP50\tP90\tP99\tMAX\t")
	for _, o := range b.ByOp {
		lat := func(v float64) string {
			if o.Ops == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2fms", v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t\n", o.Op, o.Ops, o.Errors, o.OpsPerSec, lat(o.P50Ms), lat(o.P90Ms), lat(o.P99Ms), lat(o.MaxMs))
	}
	tw.Flush()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
