package resp

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Keyed commands: strings and keys. Each becomes a read or a write item of
// the pipeline; the backend routes it (or refuses it) by its key.

const (
	errSyntax     = "ERR syntax error"
	errNotInteger = "ERR value is not an integer or out of range"
	errNotFloat   = "ERR value is not a valid float"
	errWrongType  = "WRONGTYPE Operation against a key holding the wrong kind of value"
)

// parseInt parses an integer argument as Redis's string2ll does: a
// canonical signed 64-bit decimal (no '+', no spaces, no leading zeros).
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != string(b) {
		return 0, false
	}
	return n, true
}

// Relative expiries (EX, PX, EXPIRE, PEXPIRE) are sent as such (ttl_ms)
// and made absolute by the apply from the entry's log time; TTL and PTTL
// count from the log time of the state read (ValueEntry.NowMs). This front
// end reads no clock for data (docs/time.md). Redis refuses a relative
// expiry whose absolute time would overflow; nowBoundMs stands in for the
// present in that check (about the year 2109), so that it needs no clock.
const nowBoundMs = 1 << 42

// sizeError checks a write's key and values against the group's limits
// (nil if they fit). Nothing is proposed for a command that does not fit.
func (c *conn) sizeError(key []byte, vals ...[]byte) []byte {
	if m := c.s.b.MaxKeyBytes(); len(key) > m {
		return errReply(fmt.Sprintf("ERR key of %d bytes exceeds the limit of %d bytes", len(key), m))
	}
	for _, v := range vals {
		if m := c.s.cfg.MaxValueBytes; len(v) > m {
			return errReply(fmt.Sprintf("ERR value of %d bytes exceeds the limit of %d bytes", len(v), m))
		}
	}
	return nil
}

// readKeys adds a read of keys (of slot) to the pipeline; render uses
// their values only (not their expiry times: see readTTL).
func (c *conn) readKeys(p *pipeline, slot int, keys [][]byte, render func([]shardkv.ValueEntry) []byte) {
	p.read(&item{slot: slot, keys: keys, follower: c.readonly, onRead: render})
}

// readTTL adds a read of keys whose render uses their expiry times.
func (c *conn) readTTL(p *pipeline, slot int, keys [][]byte, render func([]shardkv.ValueEntry) []byte) {
	p.read(&item{slot: slot, keys: keys, follower: c.readonly, ttl: true, onRead: render})
}

// writeOps adds a write of ops (of slot) to the pipeline.
func writeOps(p *pipeline, slot int, ops []*shardkvpb.WriteOp, render func([]*shardkvpb.WriteResult) []byte) {
	p.write(&item{slot: slot, ops: ops, onWrite: render})
}

// wrongType reports whether a string command that read e must answer
// WRONGTYPE: the key holds a value of another type.
func wrongType(e shardkv.ValueEntry) bool { return e.Found && e.Type != shardkv.TypeString }

// refuseString answers a string command on key with the error e, found
// before proposing (an argument out of the server's limits), unless key
// holds another type: Redis checks the key's type first.
func (c *conn) refuseString(p *pipeline, slot int, key, e []byte) {
	c.readKeys(p, slot, [][]byte{key}, func(v []shardkv.ValueEntry) []byte {
		if wrongType(v[0]) {
			return errReply(errWrongType)
		}
		return e
	})
}

func cmdGet(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		switch {
		case !v[0].Found:
			return c.null()
		case wrongType(v[0]):
			return errReply(errWrongType)
		}
		return redcon.AppendBulk(nil, v[0].Value)
	})
}

func cmdStrlen(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		if wrongType(v[0]) {
			return errReply(errWrongType)
		}
		return redcon.AppendInt(nil, int64(len(v[0].Value)))
	})
}

func cmdType(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		if v[0].Found {
			return redcon.AppendString(nil, v[0].Type.String())
		}
		return redcon.AppendString(nil, "none")
	})
}

// cmdMGet: MGET key [key ...]; a key of another type than a string is nil,
// as in Redis.
func cmdMGet(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:], func(v []shardkv.ValueEntry) []byte {
		b := redcon.AppendArray(nil, len(v))
		for _, e := range v {
			if e.Found && e.Type == shardkv.TypeString {
				b = redcon.AppendBulk(b, e.Value)
			} else {
				b = c.appendNull(b)
			}
		}
		return b
	})
}

func cmdExists(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:], func(v []shardkv.ValueEntry) []byte {
		n := 0
		for _, e := range v {
			if e.Found {
				n++
			}
		}
		return redcon.AppendInt(nil, int64(n))
	})
}

// cmdTTL serves TTL, PTTL, EXPIRETIME and PEXPIRETIME: -2 if the key does
// not exist, -1 if it has no expiry, else the remaining time (TTL, PTTL) or
// the absolute expiry as a Unix time (EXPIRETIME, PEXPIRETIME); seconds are
// rounded to the nearest, as Redis does.
func cmdTTL(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	ms, absolute := name == "pttl" || name == "pexpiretime", strings.HasSuffix(name, "expiretime")
	c.readTTL(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		switch {
		case !v[0].Found:
			return redcon.AppendInt(nil, -2)
		case v[0].ExpireAtMs == 0:
			return redcon.AppendInt(nil, -1)
		}
		t := max(v[0].ExpireAtMs-v[0].NowMs, 0)
		if absolute {
			t = v[0].ExpireAtMs
		}
		if !ms {
			t = (t + 500) / 1000
		}
		return redcon.AppendInt(nil, t)
	})
}

// SET key value [NX | XX] [GET] [EX s | PX ms | EXAT unix-s | PXAT unix-ms | KEEPTTL]
func cmdSet(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: args[2]}
	var nx, xx bool
	var expKind string // "ex", "px", "exat", "pxat" or "keepttl"
	var expArg []byte
	// Redis's parseExtendedStringArgumentsOrReply: NX/XX exclude each other,
	// the expiry options exclude each other and KEEPTTL, a repeated option
	// is accepted (the last value wins).
	for j := 3; j < len(args); j++ {
		opt := strings.ToLower(string(args[j]))
		hasNext := j+1 < len(args)
		switch {
		case opt == "nx" && !xx:
			nx = true
		case opt == "xx" && !nx:
			xx = true
		case opt == "get":
			op.ReturnPrev = true
		case opt == "keepttl" && (expKind == "" || expKind == "keepttl"):
			expKind = opt
		case (opt == "ex" || opt == "px" || opt == "exat" || opt == "pxat") && (expKind == "" || expKind == opt) && hasNext:
			expKind, expArg = opt, args[j+1]
			j++
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	switch expKind {
	case "keepttl":
		op.KeepTtl = true
	case "ex", "px", "exat", "pxat":
		ms, e := setExpiry(expKind, expArg, "set")
		if e != nil {
			p.reply(e)
			return
		}
		if expKind == "ex" || expKind == "px" {
			op.TtlMs = &ms
		} else {
			op.ExpireAtMs = ms
		}
	}
	if nx {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	} else if xx {
		op.Cond = shardkvpb.WriteOp_IF_PRESENT
	}
	if e := c.sizeError(op.Key, op.Value); e != nil {
		p.reply(e)
		return
	}
	get := op.ReturnPrev
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		switch {
		case get && r[0].PrevFound:
			// With GET the reply is the old value, set or not (as Redis).
			return redcon.AppendBulk(nil, r[0].Prev)
		case get, !r[0].Ok:
			return c.null()
		}
		return okReply()
	})
}

// setExpiry converts an EX/PX/EXAT/PXAT argument to milliseconds, with
// Redis's checks (getExpireMillisecondsOrReply): relative ones (EX, PX)
// stay relative (see nowBoundMs), the others are an absolute Unix time.
func setExpiry(kind string, arg []byte, cmd string) (int64, []byte) {
	n, ok := parseInt(arg)
	if !ok {
		return 0, errReply(errNotInteger)
	}
	seconds := kind == "ex" || kind == "exat"
	invalid := errReply(fmt.Sprintf("ERR invalid expire time in '%s' command", cmd))
	if n <= 0 || (seconds && n > math.MaxInt64/1000) {
		return 0, invalid
	}
	if seconds {
		n *= 1000
	}
	if (kind == "ex" || kind == "px") && n > math.MaxInt64-nowBoundMs {
		return 0, invalid
	}
	return n, nil
}

func cmdSetNX(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: args[2], Cond: shardkvpb.WriteOp_IF_ABSENT}
	if e := c.sizeError(op.Key, op.Value); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		return boolInt(r[0].Ok)
	})
}

func cmdGetSet(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: args[2], ReturnPrev: true}
	if e := c.sizeError(op.Key, op.Value); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, c.prevReply)
}

func cmdGetDel(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: args[1], ReturnPrev: true}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, c.prevReply)
}

// prevReply renders the value a write found (null if none).
func (c *conn) prevReply(r []*shardkvpb.WriteResult) []byte {
	if !r[0].PrevFound {
		return c.null()
	}
	return redcon.AppendBulk(nil, r[0].Prev)
}

func boolInt(b bool) []byte {
	if b {
		return redcon.AppendInt(nil, 1)
	}
	return redcon.AppendInt(nil, 0)
}

func numReply(r []*shardkvpb.WriteResult) []byte { return redcon.AppendInt(nil, r[0].Num) }

func cmdAppend(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_APPEND, Key: args[1], Value: args[2]}
	if e := c.sizeError(op.Key, op.Value); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdIncr serves INCR, DECR, INCRBY and DECRBY.
func cmdIncr(c *conn, p *pipeline, args [][]byte, slot int) {
	delta := int64(1)
	name := strings.ToLower(string(args[0]))
	if len(args) == 3 {
		n, ok := parseInt(args[2])
		if !ok {
			p.reply(errReply(errNotInteger))
			return
		}
		delta = n
	}
	if name == "decr" || name == "decrby" {
		if delta == math.MinInt64 {
			p.reply(errReply("ERR decrement would overflow"))
			return
		}
		delta = -delta
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_INCR, Key: args[1], Delta: delta}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdIncrByFloat checks the increment and leaves the addition to the
// backend, which has the current value. "inf" is a valid increment (the
// backend refuses the infinite sum, after checking the current value, as
// Redis); a finite increment beyond float64's range, which Redis adds in
// long double, could only give a sum beyond it.
func cmdIncrByFloat(c *conn, p *pipeline, args [][]byte, slot int) {
	f, err := strconv.ParseFloat(string(args[2]), 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0):
		c.refuseString(p, slot, args[1], errReply("ERR increment would produce NaN or Infinity"))
		return
	case err != nil || math.IsNaN(f):
		c.refuseString(p, slot, args[1], errReply(errNotFloat))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_INCR_FLOAT, Key: args[1], Value: args[2]}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		return redcon.AppendBulk(nil, r[0].Value)
	})
}

// cmdMSet is one write of every pair (one log entry; the keys share a slot).
func cmdMSet(c *conn, p *pipeline, args [][]byte, slot int) {
	if len(args)%2 == 0 {
		p.reply(wrongArgs("mset"))
		return
	}
	var ops []*shardkvpb.WriteOp
	for i := 1; i < len(args); i += 2 {
		if e := c.sizeError(args[i], args[i+1]); e != nil {
			p.reply(e)
			return
		}
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[i], Value: args[i+1]})
	}
	writeOps(p, slot, ops, func([]*shardkvpb.WriteResult) []byte { return okReply() })
}

// cmdMSetNX: MSETNX key value [key value ...], one op: every key set, or
// none if any exists (the keys share a slot, hence a shard).
func cmdMSetNX(c *conn, p *pipeline, args [][]byte, slot int) {
	if len(args)%2 == 0 {
		p.reply(wrongArgs("msetnx"))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_MSET_NX, Key: args[1], Value: args[2]}
	for i := 1; i < len(args); i += 2 {
		if e := c.sizeError(args[i], args[i+1]); e != nil {
			p.reply(e)
			return
		}
		if i > 1 {
			op.MoreKeys = append(op.MoreKeys, args[i])
			op.MoreValues = append(op.MoreValues, args[i+1])
		}
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte { return boolInt(r[0].Ok) })
}

// cmdDel serves DEL and UNLINK: the number of keys that existed (a key
// named twice counts once, as the second delete finds nothing).
func cmdDel(c *conn, p *pipeline, args [][]byte, slot int) {
	var ops []*shardkvpb.WriteOp
	for _, k := range args[1:] {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: k})
	}
	writeOps(p, slot, ops, func(r []*shardkvpb.WriteResult) []byte {
		n := 0
		for _, x := range r {
			if x.Ok {
				n++
			}
		}
		return redcon.AppendInt(nil, int64(n))
	})
}

func cmdPersist(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PERSIST, Key: args[1]}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte { return boolInt(r[0].Ok) })
}

// cmdExpire serves EXPIRE, PEXPIRE, EXPIREAT and PEXPIREAT key time
// [NX | XX | GT | LT], with Redis 7's checks in Redis's order (options,
// then the time). A time at or before now deletes the key (reply 1).
func cmdExpire(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	var nx, xx, gt, lt bool
	for _, a := range args[3:] {
		switch strings.ToLower(string(a)) {
		case "nx":
			nx = true
		case "xx":
			xx = true
		case "gt":
			gt = true
		case "lt":
			lt = true
		default:
			p.reply(errReply(fmt.Sprintf("ERR Unsupported option %s", a)))
			return
		}
	}
	switch {
	case nx && (xx || gt || lt):
		p.reply(errReply("ERR NX and XX, GT or LT options at the same time are not compatible"))
		return
	case gt && lt:
		p.reply(errReply("ERR GT and LT options at the same time are not compatible"))
		return
	}
	when, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	invalid := errReply(fmt.Sprintf("ERR invalid expire time in '%s' command", name))
	if name == "expire" || name == "expireat" {
		if when > math.MaxInt64/1000 || when < math.MinInt64/1000 {
			p.reply(invalid)
			return
		}
		when *= 1000
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Key: args[1], ExpireAtMs: when}
	if name == "expire" || name == "pexpire" {
		// Relative: made absolute at apply (see nowBoundMs).
		if when > math.MaxInt64-nowBoundMs {
			p.reply(invalid)
			return
		}
		op.ExpireAtMs, op.TtlMs = 0, &when
	}
	switch {
	case nx:
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	case gt:
		// XX GT is GT: GT already fails for a key without expiry.
		op.Cond = shardkvpb.WriteOp_IF_GREATER
	case lt && xx:
		// Unlike LT alone, which counts no expiry as infinite.
		op.Cond = shardkvpb.WriteOp_IF_PRESENT_LESS
	case lt:
		op.Cond = shardkvpb.WriteOp_IF_LESS
	case xx:
		op.Cond = shardkvpb.WriteOp_IF_PRESENT
	}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte { return boolInt(r[0].Ok) })
}
