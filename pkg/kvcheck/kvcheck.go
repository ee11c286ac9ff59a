// Package kvcheck records histories of Get/Put/Append operations on a
// shardkv cluster and checks them for linearizability with porcupine, one
// register per key.
//
// It is the reusable form of the model in pkg/shardkv's linearizability
// test, shared by `kvctl workload` (which records a history inside a
// Kubernetes cluster and serves it over HTTP) and the tests that check what
// it recorded:
//
//	rec := kvcheck.NewRecorder()
//	p := rec.Start(client, kvcheck.Put, key, value)
//	err := c.Put(ctx, key, value)
//	if err != nil { p.Fail(err) } else { p.Ok("") }
//	...
//	h := rec.History()                       // after every call has finished
//	res, err := kvcheck.Check(h.Ops, time.Minute)
//	if !res.Linearizable { res.VisualizePath("/tmp/viz.html") }
//
// # The model
//
// Every key is an independent register holding a string, initially "" (a
// key that does not exist reads as ""; the workload never deletes), or a
// hash or a set (the hset, hdel, hget, hgetall and sadd, srem, smembers
// kinds; a set is the hash of its members, each with the value ""). A get
// must return the register's value; a put sets it; an append appends to it.
// Write values should be unique (the workload's are) so that porcupine can
// tell them apart. An operation whose call returned an error is recorded
// with Unknown set: for a write the outcome is unknown (it may have taken
// effect, at any time from its call on, even after everything else), so it
// is checked with an infinitely late return; a failed get has no effect and
// is left out of the check.
//
// # Times
//
// Op.Call and Op.Return are unix nanoseconds, but taken from the
// recorder's monotonic clock (the wall clock when the recorder was made plus
// the monotonic time elapsed since), so a wall-clock step during the run
// cannot reorder operations. Times of one history are comparable with each
// other; comparing them with another machine's clock (e.g. to place a Note)
// is only as good as the two clocks agree.
//
// # With kvctl workload
//
// `kvctl workload --ctrler=ADDRS` (docs/kvctl.md) runs clients inside the
// cluster and serves, on --listen (default :8090):
//
//   - GET /status: a Status (phase "starting", "running", "stopping",
//     "stopped"; counters; the last error; the recent ok rate);
//   - POST /stop (or GET): stops the clients, waits for the operations in
//     flight (at most its --op-timeout) and answers the History;
//   - GET /history: the same History once stopped (409 before);
//   - GET /healthz.
//
// It keeps serving after the stop until SIGTERM (exit 0). A test polls
// /status (e.g. through the apiserver's pod proxy,
// /api/v1/namespaces/NS/pods/NAME:8090/proxy/status), disturbs the
// cluster, then decodes the body of /stop with encoding/json into a
// History and calls Check(h.Ops, timeout); Result.Linearizable is the
// verdict, and Result.VisualizePath draws the failure. History, Op, Stats,
// Status and Result all have JSON tags.
package kvcheck

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is an operation's kind.
type Kind string

// The operation kinds.
const (
	Get    Kind = "get"
	Put    Kind = "put"
	Append Kind = "append"
	// Hash operations: the key is a hash (a map of fields), initially
	// empty. hset sets Field to Value, hdel removes Field, hget reads
	// Field ("" if absent), hgetall reads the whole hash, its Output
	// encoded with EncodeHash. A key is either a register or a hash.
	HSet    Kind = "hset"
	HDel    Kind = "hdel"
	HGet    Kind = "hget"
	HGetAll Kind = "hgetall"
	// Set operations: a set is a hash whose fields are its members, each
	// with the value "": sadd adds Field, srem removes it, smembers reads
	// the set (Output: EncodeSet).
	SAdd     Kind = "sadd"
	SRem     Kind = "srem"
	SMembers Kind = "smembers"
	// List operations: lpush and rpush push Value, lpop and rpop pop one
	// element (Output: it, "" if the list was empty: values must not be
	// empty), lrange reads the whole list (Output: EncodeList).
	LPush  Kind = "lpush"
	RPush  Kind = "rpush"
	LPop   Kind = "lpop"
	RPop   Kind = "rpop"
	LRange Kind = "lrange"
)

// Op is one recorded operation.
type Op struct {
	Client int    `json:"client"` // the client that issued it (a client issues one operation at a time)
	Kind   Kind   `json:"kind"`
	Key    string `json:"key"`
	Field  string `json:"field,omitempty"`  // hash operations but hgetall
	Value  string `json:"value,omitempty"`  // put and append: the value written
	Output string `json:"output,omitempty"` // get: the value read ("" if the key does not exist)
	// Call and Return are unix nanoseconds (see the package comment).
	// Return is when the call returned, also when it failed; Check treats
	// the return of an Unknown write as infinitely late.
	Call   int64 `json:"call"`
	Return int64 `json:"return"`
	// Unknown: the call returned an error. A write's outcome is then
	// unknown; a failed get is kept for the record and ignored by Check.
	Unknown bool   `json:"unknown,omitempty"`
	Error   string `json:"error,omitempty"` // the call's error, if Unknown
}

// IsWrite reports whether o is a put or an append.
func (o Op) IsWrite() bool { return !o.Kind.read() }

func (k Kind) read() bool {
	return k == Get || k == HGet || k == HGetAll || k == SMembers || k == LRange
}

// returns reports whether a write's Output matters (a pop's element).
func (k Kind) returns() bool { return k == LPop || k == RPop }

func (o Op) String() string {
	var s string
	if o.Kind.read() {
		s = fmt.Sprintf("%s(%s%s) -> %q", o.Kind, o.Key, fieldArg(o.Kind, o.Field), o.Output)
	} else {
		s = fmt.Sprintf("%s(%s, %q)", o.Kind, o.Key, o.Value)
	}
	if o.Unknown {
		s += " -> unknown: " + o.Error
	}
	return s
}

// Stats counts the operations a Recorder has seen.
type Stats struct {
	Ops        int64 `json:"ops"`        // finished operations: ok + unknown + failedGets
	OK         int64 `json:"ok"`         // succeeded
	OKGets     int64 `json:"okGets"`     // of which gets
	OKWrites   int64 `json:"okWrites"`   // of which puts and appends
	Unknown    int64 `json:"unknown"`    // writes whose call failed (outcome unknown)
	FailedGets int64 `json:"failedGets"` // gets whose call failed
	InFlight   int64 `json:"inFlight"`   // started, not finished
	// LastError is the most recent error of a failed call, and when it
	// happened.
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
}

// History is a recorded history: what `kvctl workload` serves on POST /stop
// and GET /history.
type History struct {
	Started time.Time `json:"started"` // when recording started
	Stopped time.Time `json:"stopped"` // when the history was taken
	Stats   Stats     `json:"stats"`
	Ops     []Op      `json:"ops"` // in the order the calls finished
}

// Status is what `kvctl workload` serves on GET /status.
type Status struct {
	// Phase is "starting" (waiting for the cluster, no operation issued
	// yet), "running", "stopping" (waiting for the operations in flight)
	// or "stopped" (the history is ready on GET /history).
	Phase   string `json:"phase"`
	Running bool   `json:"running"` // Phase == "running"
	Stats
	// OKPerSecondRecent is the rate of successful operations over the last
	// 10 seconds or so (0 before the first second).
	OKPerSecondRecent float64  `json:"okPerSecondRecent"`
	UptimeSeconds     float64  `json:"uptimeSeconds"`
	Clients           int      `json:"clients"`
	Keys              []string `json:"keys"`
}

// Recorder records operations; it is safe for concurrent use. Start an
// operation with Start just before the call, and finish it with exactly
// one of Ok or Fail just after.
type Recorder struct {
	start time.Time // has a monotonic reading
	base  int64     // start as unix nanoseconds

	mu         sync.Mutex
	ops        []Op
	lastErr    string
	lastErrAt  time.Time
	ok, okGets atomic.Int64
	okWrites   atomic.Int64
	unknown    atomic.Int64
	failedGets atomic.Int64
	inflight   atomic.Int64
}

// NewRecorder returns an empty recorder whose clock starts now.
func NewRecorder() *Recorder {
	now := time.Now()
	return &Recorder{start: now, base: now.UnixNano()}
}

// Now is the recorder's clock: unix nanoseconds, monotonic.
func (r *Recorder) Now() int64 { return r.base + int64(time.Since(r.start)) }

// Started is when the recorder was made.
func (r *Recorder) Started() time.Time { return r.start }

// Pending is an operation that has started; finish it with Ok or Fail.
type Pending struct {
	r  *Recorder
	op Op
}

// Start records the call of an operation (value: the value a put or append
// writes; "" for a get).
func (r *Recorder) Start(client int, kind Kind, key, value string) Pending {
	r.inflight.Add(1)
	return Pending{r: r, op: Op{Client: client, Kind: kind, Key: key, Value: value, Call: r.Now()}}
}

// StartField records the call of a hash operation on one field (hset,
// hdel, hget).
func (r *Recorder) StartField(client int, kind Kind, key, field, value string) Pending {
	p := r.Start(client, kind, key, value)
	p.op.Field = field
	return p
}

// Ok records that the operation succeeded; output is the value a get read
// (ignored for writes).
func (p Pending) Ok(output string) {
	p.op.Return = p.r.Now()
	if p.op.Kind.read() || p.op.Kind.returns() {
		p.op.Output = output
	}
	if p.op.Kind.read() {
		p.r.okGets.Add(1)
	} else {
		p.r.okWrites.Add(1)
	}
	p.r.ok.Add(1)
	p.r.add(p.op)
}

// Fail records that the operation's call returned err: a write's outcome is
// unknown, a get had no effect.
func (p Pending) Fail(err error) {
	p.op.Return = p.r.Now()
	p.op.Unknown = true
	if err == nil {
		err = errors.New("failed")
	}
	p.op.Error = err.Error()
	if p.op.Kind.read() {
		p.r.failedGets.Add(1)
	} else {
		p.r.unknown.Add(1)
	}
	p.r.mu.Lock()
	p.r.lastErr, p.r.lastErrAt = p.op.Error, time.Now()
	p.r.mu.Unlock()
	p.r.add(p.op)
}

func (r *Recorder) add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
	r.inflight.Add(-1)
}

// Stats returns the counts so far.
func (r *Recorder) Stats() Stats {
	s := Stats{OK: r.ok.Load(), OKGets: r.okGets.Load(), OKWrites: r.okWrites.Load(),
		Unknown: r.unknown.Load(), FailedGets: r.failedGets.Load(), InFlight: r.inflight.Load()}
	s.Ops = s.OK + s.Unknown + s.FailedGets
	r.mu.Lock()
	s.LastError, s.LastErrorAt = r.lastErr, r.lastErrAt
	r.mu.Unlock()
	return s
}

// History returns a copy of the finished operations, stamped as stopped
// now. Take it once every call has finished: an operation still in flight
// is not in it.
func (r *Recorder) History() History {
	r.mu.Lock()
	ops := slices.Clone(r.ops)
	r.mu.Unlock()
	if ops == nil {
		ops = []Op{}
	}
	return History{Started: r.start, Stopped: time.Now(), Stats: r.Stats(), Ops: ops}
}

// --- checking ---

// Check results.
const (
	ResultOK      = "ok"      // linearizable
	ResultIllegal = "illegal" // not linearizable
	ResultUnknown = "unknown" // the checker ran out of time
)

// Result is the outcome of Check.
type Result struct {
	// Linearizable is true only if the checker proved it (CheckResult
	// "ok"); a check that ran out of time is "unknown" and not
	// linearizable.
	Linearizable bool          `json:"linearizable"`
	CheckResult  string        `json:"checkResult"`
	Ops          int           `json:"ops"`                   // operations checked (failed gets left out)
	Keys         int           `json:"keys"`                  // distinct keys (partitions)
	OK           int           `json:"ok"`                    // successful operations
	OKGets       int           `json:"okGets"`                //
	OKWrites     int           `json:"okWrites"`              //
	Unknown      int           `json:"unknown"`               // writes with an unknown outcome
	FailedGets   int           `json:"failedGets"`            // left out
	IllegalKeys  []string      `json:"illegalKeys,omitempty"` // keys whose history is not linearizable
	Elapsed      time.Duration `json:"elapsedNanos"`

	model porcupine.Model
	info  porcupine.LinearizationInfo
	keys  []string
}

// String is a one-line summary.
func (r Result) String() string {
	s := fmt.Sprintf("%s: %d operations on %d keys (%d ok: %d gets, %d writes; %d writes with unknown outcome; %d failed gets left out), checked in %v",
		r.CheckResult, r.Ops, r.Keys, r.OK, r.OKGets, r.OKWrites, r.Unknown, r.FailedGets, r.Elapsed.Round(time.Millisecond))
	if len(r.IllegalKeys) > 0 {
		s += "; not linearizable: " + strings.Join(r.IllegalKeys, ", ")
	}
	return s
}

// Note marks an event (a pod deleted, a shard moved) on the visualization.
// Start and End are unix nanoseconds, like Op times.
type Note struct {
	Tag         string // the row it is drawn on, e.g. "cluster"
	Start, End  int64
	Description string
}

// VisualizePath writes porcupine's HTML visualization of the check (the
// linearizations found, and for an illegal key where they stop) to path,
// with notes drawn on their own rows.
func (r Result) VisualizePath(path string, notes ...Note) error {
	if r.model.Step == nil {
		return errors.New("kvcheck: no check to visualize")
	}
	info := r.info
	if len(notes) > 0 {
		var ann []porcupine.Annotation
		for _, n := range notes {
			ann = append(ann, porcupine.Annotation{Tag: n.Tag, Start: n.Start, End: n.End, Description: n.Description})
		}
		info.AddAnnotations(ann)
	}
	return porcupine.VisualizePath(r.model, info, path)
}

type input struct {
	kind              Kind
	key, field, value string
}

type output struct {
	value   string
	unknown bool
}

// fieldArg is ", field" for an operation on one field of a hash.
func fieldArg(k Kind, field string) string {
	if k == HGet || k == HSet || k == HDel || k == SAdd || k == SRem {
		return fmt.Sprintf(", %q", field)
	}
	return ""
}

// EncodeHash is the canonical form of a hash, as an hgetall's Output and
// the model's state: its fields in order, each "field=value" with both
// quoted, joined by spaces ("" for an empty hash).
func EncodeHash(h map[string]string) string {
	var b strings.Builder
	for _, f := range slices.Sorted(maps.Keys(h)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%q=%q", f, h[f])
	}
	return b.String()
}

// EncodeList is the canonical form of a list (lrange's Output and the
// model's state): its elements quoted, joined by spaces.
func EncodeList(elems []string) string {
	q := make([]string, len(elems))
	for i, e := range elems {
		q[i] = strconv.Quote(e)
	}
	return strings.Join(q, " ")
}

func decodeList(s string) []string {
	var out []string
	for s != "" {
		v, rest, ok := cutQuoted(s)
		if !ok {
			break
		}
		out = append(out, v)
		s = strings.TrimPrefix(rest, " ")
	}
	return out
}

// listStep is a push or a pop on the list state st. A pop with an unknown
// outcome may have popped anything: only its effect counts.
func listStep(k Kind, st, v string, o output) (bool, any) {
	l := decodeList(st)
	switch k {
	case LPush:
		l = append([]string{v}, l...)
	case RPush:
		l = append(l, v)
	default:
		got := ""
		if len(l) > 0 {
			if k == LPop {
				got, l = l[0], l[1:]
			} else {
				got, l = l[len(l)-1], l[:len(l)-1]
			}
		}
		if !o.unknown && o.value != got {
			return false, st
		}
	}
	return true, EncodeList(l)
}

// EncodeSet is the canonical form of a set (smembers' Output): the hash
// of its members, each with the value "".
func EncodeSet(members []string) string {
	h := make(map[string]string, len(members))
	for _, m := range members {
		h[m] = ""
	}
	return EncodeHash(h)
}

func decodeHash(s string) map[string]string {
	h := map[string]string{}
	for s != "" {
		f, rest, _ := cutQuoted(s)
		v, rest2, _ := cutQuoted(strings.TrimPrefix(rest, "="))
		h[f] = v
		s = strings.TrimPrefix(rest2, " ")
	}
	return h
}

// cutQuoted splits a Go-quoted string off the front of s.
func cutQuoted(s string) (string, string, bool) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", false
	}
	v, _ := strconv.Unquote(q)
	return v, s[len(q):], true
}

// model is the register model, partitioned by key in keys' order.
func model(keys []string) porcupine.Model {
	return porcupine.Model{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			for _, op := range h {
				k := op.Input.(input).key
				by[k] = append(by[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(by))
			for _, k := range keys {
				if len(by[k]) > 0 {
					out = append(out, by[k])
				}
			}
			return out
		},
		Init: func() any { return "" },
		Step: func(state, in, out any) (bool, any) {
			st, i, o := state.(string), in.(input), out.(output)
			switch i.kind {
			case Get:
				return !o.unknown && o.value == st, st
			case Put:
				return true, i.value
			case Append:
				return true, st + i.value
			case HGetAll, SMembers, LRange:
				return !o.unknown && o.value == st, st
			case LPush, RPush, LPop, RPop:
				return listStep(i.kind, st, i.value, o)
			}
			h := decodeHash(st)
			switch i.kind {
			case HGet:
				return !o.unknown && o.value == h[i.field], st
			case HSet:
				h[i.field] = i.value
			case SAdd:
				h[i.field] = ""
			case HDel, SRem:
				delete(h, i.field)
			}
			return true, EncodeHash(h)
		},
		Equal: func(a, b any) bool { return a.(string) == b.(string) },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			h.Write([]byte(s.(string)))
			return h.Sum64()
		},
		DescribeOperation: func(in, out any) string {
			i, o := in.(input), out.(output)
			if i.kind.read() {
				return fmt.Sprintf("%s(%s%s) -> %q", i.kind, i.key, fieldArg(i.kind, i.field), o.value)
			}
			if i.kind == HSet || i.kind == HDel || i.kind == SAdd || i.kind == SRem {
				i.key += ", " + i.field
			}
			res := "ok"
			if o.unknown {
				res = "unknown"
			}
			return fmt.Sprintf("%s(%s, %q) -> %s", i.kind, i.key, i.value, res)
		},
		DescribeState: func(s any) string { return fmt.Sprintf("%q", s.(string)) },
		DescribeOperationMetadata: func(m any) string {
			if m == nil {
				return ""
			}
			return m.(string)
		},
	}
}

// Check checks ops for linearizability, one register per key (see the
// package comment), giving porcupine at most timeout (0: no limit). It
// returns an error only for a malformed history (an unknown kind, a
// successful operation that returned before its call); a history that is
// not linearizable, or whose check ran out of time, is a Result with
// Linearizable false.
func Check(ops []Op, timeout time.Duration) (Result, error) {
	var res Result
	var pops []porcupine.Operation
	keySet := map[string]bool{}
	for i, o := range ops {
		switch o.Kind {
		case Get, Put, Append, HSet, HDel, HGet, HGetAll, SAdd, SRem, SMembers, LPush, RPush, LPop, RPop, LRange:
		default:
			return res, fmt.Errorf("kvcheck: op %d: unknown kind %q", i, o.Kind)
		}
		if !o.Unknown && o.Return < o.Call {
			return res, fmt.Errorf("kvcheck: op %d (%s): returned at %d, before its call at %d", i, o, o.Return, o.Call)
		}
		out := output{value: o.Output, unknown: o.Unknown}
		ret := o.Return
		meta := fmt.Sprintf("client %d", o.Client)
		switch {
		case o.Unknown && o.Kind.read():
			res.FailedGets++ // no effect: left out
			continue
		case o.Unknown:
			// It may take effect at any time from its call on, even
			// after everything else: its return is infinitely late.
			res.Unknown++
			ret = math.MaxInt64
			meta += "; outcome unknown: " + o.Error
		case o.Kind.read():
			res.OK++
			res.OKGets++
		default:
			res.OK++
			res.OKWrites++
		}
		keySet[o.Key] = true
		pops = append(pops, porcupine.Operation{ClientId: o.Client, Input: input{kind: o.Kind, key: o.Key, field: o.Field, value: o.Value},
			Call: o.Call, Output: out, Return: ret, Metadata: meta})
	}
	res.keys = make([]string, 0, len(keySet))
	for k := range keySet {
		res.keys = append(res.keys, k)
	}
	slices.Sort(res.keys)
	res.Ops, res.Keys = len(pops), len(res.keys)
	res.model = model(res.keys)

	start := time.Now()
	cr, info := porcupine.CheckOperationsVerbose(res.model, pops, timeout)
	res.Elapsed = time.Since(start)
	res.info = info
	switch cr {
	case porcupine.Ok:
		res.Linearizable, res.CheckResult = true, ResultOK
	case porcupine.Illegal:
		res.CheckResult = ResultIllegal
		res.IllegalKeys = illegalKeys(res.keys, pops, info)
	default:
		res.CheckResult = ResultUnknown
	}
	return res, nil
}

// illegalKeys: the partitions (one per key, in keys' order) for which the
// checker found no complete linearization.
func illegalKeys(keys []string, pops []porcupine.Operation, info porcupine.LinearizationInfo) []string {
	size := map[string]int{}
	for _, o := range pops {
		size[o.Input.(input).key]++
	}
	partials := info.PartialLinearizations()
	var out []string
	for i, k := range keys {
		if i >= len(partials) {
			break
		}
		complete := false
		for _, l := range partials[i] {
			if len(l) == size[k] {
				complete = true
				break
			}
		}
		if !complete {
			out = append(out, k)
		}
	}
	return out
}
