package resp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// List commands (docs/types.md). Writes are ops of the pipeline's write
// batches (LPUSH, RPUSH, LPOP, RPOP, LSET, LTRIM, LREM, LINSERT, LMOVE);
// reads (LRANGE, LINDEX, LLEN, LPOS) are ReadElems range reads made when
// the command runs, as the hash reads (hash.go). LPOS reads the list (or
// its MAXLEN window) in one read and searches it here.
//
// Blocking commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP) try their
// pop at once, a write like any other (so only the leader serves them: a
// follower answers MOVED); when there is nothing to pop, they watch their
// keys (Backend.WatchKeys) and try again after each write to one of them
// is applied, until their timeout. The connection runs nothing else
// meanwhile, as a blocked Redis client.

// Redis's RDB type of a list of plain strings (DUMP; Redis 7.0 loads it
// as a quicklist).
const rdbTypeList = 1

func listCommands() []*command {
	var (
		aListR  = []string{"@read", "@list", "@fast"}
		aListRS = []string{"@read", "@list", "@slow"}
		aListW  = []string{"@write", "@list", "@fast"}
		aListWS = []string{"@write", "@list", "@slow"}
		aBlock  = []string{"@write", "@list", "@slow", "@blocking"}
		pop     = []string{"RW", "access", "delete"}
	)
	one := func(name string, arity int, flags, acl, keyFlags []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: 1, step: 1, acl: acl, keyFlags: keyFlags, run: run}
	}
	move := func(name string, arity int, flags, acl []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: 2, step: 1, acl: acl,
			keyFlags: pop, destFlags: []string{"RW", "insert"}, run: run}
	}
	push := []string{"write", "denyoom", "fast"}
	return []*command{
		one("lpush", -3, push, aListW, []string{"RW", "insert"}, cmdPush),
		one("rpush", -3, push, aListW, []string{"RW", "insert"}, cmdPush),
		one("lpushx", -3, push, aListW, []string{"RW", "insert"}, cmdPush),
		one("rpushx", -3, push, aListW, []string{"RW", "insert"}, cmdPush),
		one("lpop", -2, []string{"write", "fast"}, aListW, pop, cmdPop),
		one("rpop", -2, []string{"write", "fast"}, aListW, pop, cmdPop),
		one("lrange", 4, []string{"readonly"}, aListRS, []string{"RO", "access"}, cmdLRange),
		one("llen", 2, []string{"readonly", "fast"}, aListR, []string{"RO"}, cmdLLen),
		one("lindex", 3, []string{"readonly"}, aListRS, []string{"RO", "access"}, cmdLIndex),
		one("lset", 4, []string{"write", "denyoom"}, aListWS, []string{"RW", "update"}, cmdLSet),
		one("linsert", 5, []string{"write", "denyoom"}, aListWS, []string{"RW", "insert"}, cmdLInsert),
		one("lrem", 4, []string{"write"}, aListWS, []string{"RW", "delete"}, cmdLRem),
		one("ltrim", 4, []string{"write"}, aListWS, []string{"RW", "delete"}, cmdLTrim),
		one("lpos", -3, []string{"readonly"}, aListRS, []string{"RO", "access"}, cmdLPos),
		move("lmove", 5, []string{"write", "denyoom"}, aListWS, cmdLMove),
		move("rpoplpush", 3, []string{"write", "denyoom"}, aListWS, cmdLMove),
		{name: "lmpop", arity: -4, flags: []string{"write", "movablekeys"}, acl: aListWS,
			specs:  []keySpec{{flags: pop, index: 1, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 1) }, run: cmdLMPop},
		{name: "blpop", arity: -3, flags: []string{"write", "noscript", "blocking"}, first: 1, last: -2, step: 1, acl: aBlock, keyFlags: pop, run: cmdBPop},
		{name: "brpop", arity: -3, flags: []string{"write", "noscript", "blocking"}, first: 1, last: -2, step: 1, acl: aBlock, keyFlags: pop, run: cmdBPop},
		move("blmove", 6, []string{"write", "denyoom", "noscript", "blocking"}, aBlock, cmdBLMove),
		move("brpoplpush", 4, []string{"write", "denyoom", "noscript", "blocking"}, aBlock, cmdBLMove),
		{name: "blmpop", arity: -5, flags: []string{"write", "blocking", "movablekeys"}, acl: aBlock,
			specs:  []keySpec{{flags: pop, index: 2, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 2) }, run: cmdLMPop},
	}
}

// nullArray is Redis's null array: *-1 (RESP3: a null).
func (c *conn) nullArray() []byte {
	if c.resp3.Load() {
		return []byte("_\r\n")
	}
	return []byte("*-1\r\n")
}

// --- limits ---

// listKeyError checks a list's key: each element is stored under the key
// and its 8-byte position.
func (c *conn) listKeyError(key []byte) []byte {
	if e := c.sizeError(key); e != nil {
		return e
	}
	if limit := c.s.b.MaxKeyBytes() - fieldOverhead - 8; len(key) > limit {
		return errReply(fmt.Sprintf("ERR key of %d bytes exceeds the limit of %d bytes for a list", len(key), limit))
	}
	return nil
}

// elemError checks a list element against the value limit.
func (c *conn) elemError(elem []byte) []byte {
	if m := c.s.cfg.MaxValueBytes; len(elem) > m {
		return errReply(fmt.Sprintf("ERR element of %d bytes exceeds the limit of %d bytes", len(elem), m))
	}
	return nil
}

// pushSizeError checks an LPUSH or RPUSH against the group's limits and
// the write budget (nil if it fits).
func (c *conn) pushSizeError(op *shardkvpb.WriteOp) []byte {
	if e := c.listKeyError(op.Key); e != nil {
		return e
	}
	o := collOp(len(op.Key))
	for _, v := range op.Fields {
		if e := c.elemError(v); e != nil {
			return e
		}
		o.addElem(len(op.Key), 8, len(v))
	}
	if !o.fits() {
		return budgetError(o, len(op.Fields), "elements")
	}
	return nil
}

// maxListPops is how many elements one pop may remove from the list at
// key (about 12,000 for short keys).
func maxListPops(key []byte) int64 { return maxPops(len(key), 8) }

// listSide parses LEFT or RIGHT: 0 (the head) or 1 (the tail).
func listSide(arg []byte) (int64, bool) {
	switch strings.ToLower(string(arg)) {
	case "left":
		return 0, true
	case "right":
		return 1, true
	}
	return 0, false
}

// parseTimeout parses a blocking command's timeout in seconds as Redis
// 7.0 does (string2ld, then the milliseconds rounded up): 0 is for ever.
// A value Redis's long double holds but whose milliseconds pass a long
// long (1e300, inf) is negative there, as the conversion makes it.
func parseTimeout(arg []byte) (time.Duration, []byte) {
	notFloat := errReply("ERR timeout is not a float or out of range")
	s := string(arg)
	if s == "" || len(s) >= 5*1024 || strings.ContainsAny(s, "_ \t\r\n\v\f") {
		return 0, notFloat
	}
	num := strings.TrimLeft(s, "+-")
	if len(num) > 2 && (num[:2] == "0x" || num[:2] == "0X") && !strings.ContainsAny(num, "pP") {
		s += "p0" // C's hexadecimal floats need no exponent
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !math.IsInf(f, 0), math.IsNaN(f):
		return 0, notFloat
	case f == 0 && !strings.HasPrefix(s, "-") && strings.ContainsAny(strings.FieldsFunc(num, func(r rune) bool { return r == 'e' || r == 'E' || r == 'p' || r == 'P' })[0], "123456789"):
		f = math.SmallestNonzeroFloat64 // below float64's range, not Redis's: 1 ms
	}
	ms := math.Ceil(f * 1000)
	if ms < 0 || ms >= math.MaxInt64 || math.IsInf(ms, 0) {
		return 0, errReply("ERR timeout is negative")
	}
	return time.Duration(min(ms, float64(math.MaxInt64/int64(time.Millisecond)))) * time.Millisecond, nil
}

// --- writes ---

// cmdPush serves LPUSH, RPUSH, LPUSHX and RPUSHX key element [element
// ...]: the list's new length (the X forms: 0 and no list if none).
func cmdPush(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LPUSH, Key: args[1], Fields: args[2:]}
	if name[0] == 'r' {
		op.Kind = shardkvpb.WriteOp_RPUSH
	}
	if strings.HasSuffix(name, "x") {
		op.Cond = shardkvpb.WriteOp_IF_PRESENT
	}
	if e := c.pushSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// popOp is the op that pops up to count elements of key from the head
// (LPOP) or the tail, cut to what one command may remove.
func popOp(key []byte, tail bool, count int64) *shardkvpb.WriteOp {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LPOP, Key: key, Delta: min(count, maxListPops(key))}
	if tail {
		op.Kind = shardkvpb.WriteOp_RPOP
	}
	return op
}

// cmdPop serves LPOP and RPOP key [count]: an element (nil if no list),
// or with a count an array of up to count elements (a null array if no
// list), in the order popped. One command pops at most about 12,000.
func cmdPop(c *conn, p *pipeline, args [][]byte, slot int) {
	if len(args) > 3 {
		p.reply(wrongArgs(strings.ToLower(string(args[0]))))
		return
	}
	hasCount := len(args) == 3
	count := int64(1)
	if hasCount {
		n, ok := parseInt(args[2])
		if !ok || n < 0 {
			p.reply(errReply("ERR value is out of range, must be positive"))
			return
		}
		count = n
	}
	if e := c.listKeyError(args[1]); e != nil {
		p.reply(e)
		return
	}
	if count == 0 {
		c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeList}, func(r shardkv.ElemsReply) []byte {
			if !r.Entry.Found {
				return c.nullArray()
			}
			return redcon.AppendArray(nil, 0)
		})
		return
	}
	op := popOp(args[1], args[0][0]|0x20 == 'r', count)
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		vals := r[0].Values
		switch {
		case !hasCount && len(vals) == 0:
			return c.null()
		case !hasCount:
			return redcon.AppendBulk(nil, vals[0])
		case len(vals) == 0:
			return c.nullArray()
		}
		return appendBulks(redcon.AppendArray(nil, len(vals)), vals)
	})
}

func appendBulks(b []byte, vals [][]byte) []byte {
	for _, v := range vals {
		b = redcon.AppendBulk(b, v)
	}
	return b
}

// cmdLSet: LSET key index element. Redis looks at the key before the
// index: a bad index is reported after "no such key" and WRONGTYPE.
func cmdLSet(c *conn, p *pipeline, args [][]byte, slot int) {
	i, ok := parseInt(args[2])
	if !ok {
		c.refuseColl(p, slot, args[1], shardkv.TypeList, errReply("ERR no such key"), errReply(errNotInteger))
		return
	}
	if e := c.listKeyError(args[1]); e != nil {
		p.reply(e)
		return
	}
	if e := c.elemError(args[3]); e != nil {
		p.reply(e)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LSET, Key: args[1], Delta: i, Value: args[3]}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func([]*shardkvpb.WriteResult) []byte { return okReply() })
}

// cmdLInsert: LINSERT key BEFORE|AFTER pivot element: the new length, -1
// if there is no pivot, 0 if no list. It rewrites the list: a list of
// more than 12,000 elements answers ERR the command writes too much.
func cmdLInsert(c *conn, p *pipeline, args [][]byte, slot int) {
	var after int64
	switch strings.ToLower(string(args[2])) {
	case "after":
		after = 1
	case "before":
	default:
		p.reply(errReply(errSyntax))
		return
	}
	if e := c.listKeyError(args[1]); e != nil {
		p.reply(e)
		return
	}
	for _, v := range args[3:5] {
		if e := c.elemError(v); e != nil {
			p.reply(e)
			return
		}
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LINSERT, Key: args[1], Delta: after, Expect: args[3], Value: args[4]}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdLRem: LREM key count element, the number removed (the first count
// from the head, from the tail if negative, all if 0). It rewrites the
// list, as LINSERT.
func cmdLRem(c *conn, p *pipeline, args [][]byte, slot int) {
	n, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	if n == math.MinInt64 {
		n = 0 // Redis removes them all (its count does not negate)
	}
	if e := c.listKeyError(args[1]); e != nil {
		p.reply(e)
		return
	}
	if e := c.elemError(args[3]); e != nil {
		p.reply(e)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LREM, Key: args[1], Delta: n, Value: args[3]}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdLTrim: LTRIM key start stop. It deletes the shorter of what it drops
// and what it keeps: at most 12,000 elements (else ERR the command writes
// too much).
func cmdLTrim(c *conn, p *pipeline, args [][]byte, slot int) {
	start, ok1 := parseInt(args[2])
	stop, ok2 := parseInt(args[3])
	if !ok1 || !ok2 {
		p.reply(errReply(errNotInteger))
		return
	}
	if e := c.listKeyError(args[1]); e != nil {
		p.reply(e)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LTRIM, Key: args[1], Delta: start, Stop: stop}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func([]*shardkvpb.WriteResult) []byte { return okReply() })
}

// lmoveOp is the op moving an element from src (from: 0 head, 1 tail) to
// dst (to: the same).
func lmoveOp(src, dst []byte, from, to int64) *shardkvpb.WriteOp {
	return &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_LMOVE, Key: src, Dest: dst, Delta: from, Stop: to}
}

// parseMove parses LMOVE's and BLMOVE's ends (RPOPLPUSH: RIGHT LEFT);
// on an error it replies and reports false.
func parseMove(p *pipeline, args [][]byte) (from, to int64, ok bool) {
	if name := strings.ToLower(string(args[0])); name == "rpoplpush" || name == "brpoplpush" {
		return 1, 0, true
	}
	from, ok1 := listSide(args[3])
	to, ok2 := listSide(args[4])
	if !ok1 || !ok2 {
		p.reply(errReply(errSyntax))
		return 0, 0, false
	}
	return from, to, true
}

// moveKeysError checks LMOVE's two keys.
func (c *conn) moveKeysError(args [][]byte) []byte {
	for _, k := range args[1:3] {
		if e := c.listKeyError(k); e != nil {
			return e
		}
	}
	return nil
}

// cmdLMove serves LMOVE source destination LEFT|RIGHT LEFT|RIGHT and
// RPOPLPUSH source destination: the element moved (nil if no source).
func cmdLMove(c *conn, p *pipeline, args [][]byte, slot int) {
	from, to, ok := parseMove(p, args)
	if !ok {
		return
	}
	if e := c.moveKeysError(args); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{lmoveOp(args[1], args[2], from, to)}, c.movedReply)
}

// movedReply renders an LMOVE's result: the element moved, nil if none.
func (c *conn) movedReply(r []*shardkvpb.WriteResult) []byte {
	if len(r[0].Values) == 0 {
		return c.null()
	}
	return redcon.AppendBulk(nil, r[0].Values[0])
}

// --- reads ---

// cmdLRange: LRANGE key start stop, with Redis's index rules.
func cmdLRange(c *conn, p *pipeline, args [][]byte, slot int) {
	start, ok1 := parseInt(args[2])
	stop, ok2 := parseInt(args[3])
	if !ok1 || !ok2 {
		p.reply(errReply(errNotInteger))
		return
	}
	q := shardkv.ElemQuery{Type: shardkv.TypeList, Range: true, Start: start, Stop: stop}
	c.readColl(p, slot, args[1], q, func(r shardkv.ElemsReply) []byte {
		b := redcon.AppendArray(nil, len(r.Elems))
		for _, e := range r.Elems {
			b = redcon.AppendBulk(b, e.Value)
		}
		return b
	})
}

// cmdLLen: LLEN key.
func cmdLLen(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeList}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, r.Len)
	})
}

// cmdLIndex: LINDEX key index (nil if out of range). Redis looks at the
// key before the index.
func cmdLIndex(c *conn, p *pipeline, args [][]byte, slot int) {
	i, ok := parseInt(args[2])
	if !ok {
		c.refuseColl(p, slot, args[1], shardkv.TypeList, c.null(), errReply(errNotInteger))
		return
	}
	q := shardkv.ElemQuery{Type: shardkv.TypeList, Range: true, Start: i, Stop: i}
	c.readColl(p, slot, args[1], q, func(r shardkv.ElemsReply) []byte {
		if len(r.Elems) == 0 {
			return c.null()
		}
		return redcon.AppendBulk(nil, r.Elems[0].Value)
	})
}

// cmdLPos: LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len],
// with Redis's checks in its order. The list (its first or last MAXLEN
// elements) is read in one read, bounded as LRANGE's, and searched here.
func cmdLPos(c *conn, p *pipeline, args [][]byte, slot int) {
	rank, count, maxlen := int64(1), int64(-1), int64(0)
	for j := 3; j < len(args); j++ {
		opt, more := strings.ToLower(string(args[j])), j+1 < len(args)
		switch {
		case opt == "rank" && more:
			j++
			n, ok := parseInt(args[j])
			switch {
			case !ok:
				p.reply(errReply(errNotInteger))
				return
			case n == 0:
				p.reply(errReply("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"))
				return
			}
			rank = n
		case opt == "count" && more:
			j++
			n, ok := parseInt(args[j])
			if !ok || n < 0 {
				p.reply(errReply("ERR COUNT can't be negative"))
				return
			}
			count = n
		case opt == "maxlen" && more:
			j++
			n, ok := parseInt(args[j])
			if !ok || n < 0 {
				p.reply(errReply("ERR MAXLEN can't be negative"))
				return
			}
			maxlen = n
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	tail := rank < 0
	if tail {
		// Redis negates the rank; the lowest one stays negative there, so
		// it matches from the first (seen from the tail).
		rank = max(-rank, 1)
	}
	q := shardkv.ElemQuery{Type: shardkv.TypeList, Range: true, Start: 0, Stop: -1}
	if maxlen > 0 {
		q.Stop = maxlen - 1
		if tail {
			q.Start, q.Stop = -maxlen, -1
		}
	}
	elem := args[2]
	c.readColl(p, slot, args[1], q, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			if count != -1 {
				return redcon.AppendArray(nil, 0)
			}
			return c.null()
		}
		var found []int64
		var matches int64
		for idx := range r.Elems {
			e := r.Elems[idx]
			at := int64(idx)
			if tail {
				e = r.Elems[len(r.Elems)-1-idx]
				at = r.Len - 1 - int64(idx)
			}
			if !bytes.Equal(e.Value, elem) {
				continue
			}
			if matches++; matches < rank {
				continue
			}
			found = append(found, at)
			if count == -1 || (count > 0 && int64(len(found)) >= count) {
				break
			}
		}
		if count != -1 {
			b := redcon.AppendArray(nil, len(found))
			for _, at := range found {
				b = redcon.AppendInt(b, at)
			}
			return b
		}
		if len(found) == 0 {
			return c.null()
		}
		return redcon.AppendInt(nil, found[0])
	})
}

// dumpList is a list's DUMP payload: RDB_TYPE_LIST (plain strings, which
// Redis 7.0 loads as a quicklist).
func dumpList(elems []shardkv.Elem) []byte {
	b := appendRDBLen([]byte{rdbTypeList}, uint64(len(elems)))
	for _, e := range elems {
		b = append(appendRDBLen(b, uint64(len(e.Value))), e.Value...)
	}
	b = binary.LittleEndian.AppendUint16(b, rdbVersion)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b))
}

// cmdBPop serves BLPOP and BRPOP key [key ...] timeout: [key, element]
// from the first key that holds a list, waiting for one (see block).
func cmdBPop(c *conn, p *pipeline, args [][]byte, slot int) {
	keys, timeout, e := blockingArgs(args, c.listKeyError)
	if e != nil {
		p.reply(e)
		return
	}
	tail := args[0][1]|0x20 == 'r'
	pop := func(key []byte) *shardkvpb.WriteOp { return popOp(key, tail, 1) }
	render := func(key []byte) func([]*shardkvpb.WriteResult) []byte {
		return func(r []*shardkvpb.WriteResult) []byte {
			if len(r[0].Values) == 0 {
				return c.nullArray() // nothing popped: popNow goes on
			}
			b := redcon.AppendArray(nil, 2)
			b = redcon.AppendBulk(b, key)
			return redcon.AppendBulk(b, r[0].Values[0])
		}
	}
	c.popAny(p, slot, keys, shardkv.TypeList, true, timeout, pop, render)
}

// cmdBLMove serves BLMOVE source destination LEFT|RIGHT LEFT|RIGHT
// timeout and BRPOPLPUSH source destination timeout: LMOVE, waiting for a
// source (see block).
func cmdBLMove(c *conn, p *pipeline, args [][]byte, slot int) {
	from, to, ok := parseMove(p, args)
	if !ok {
		return
	}
	timeout, e := parseTimeout(args[len(args)-1])
	if e != nil {
		p.reply(e)
		return
	}
	if e := c.moveKeysError(args); e != nil {
		p.reply(e)
		return
	}
	op := lmoveOp(args[1], args[2], from, to)
	c.block(p, slot, args[1:2], shardkv.TypeList, timeout, c.null(), func(it *item, deadline time.Time, _ bool) bool {
		return c.popNow(it, deadline, op, c.movedReply)
	})
}

// cmdLMPop serves LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]
// and BLMPOP timeout numkeys ...: [key, [elements]] from the first key
// that holds a list (null array if none; BLMPOP waits for one, see
// block).
func cmdLMPop(c *conn, p *pipeline, args [][]byte, slot int) {
	a, e := parseMPop(args, "left", "right")
	if e != nil {
		p.reply(e)
		return
	}
	keys, side, count := a.keys, a.side, a.count
	for _, k := range keys {
		if e := c.listKeyError(k); e != nil {
			p.reply(e)
			return
		}
	}
	pop := func(key []byte) *shardkvpb.WriteOp { return popOp(key, side == 1, count) }
	render := func(key []byte) func([]*shardkvpb.WriteResult) []byte {
		return func(r []*shardkvpb.WriteResult) []byte {
			if len(r[0].Values) == 0 {
				return c.nullArray() // nothing popped: popNow goes on
			}
			b := redcon.AppendArray(nil, 2)
			b = redcon.AppendBulk(b, key)
			return appendBulks(redcon.AppendArray(b, len(r[0].Values)), r[0].Values)
		}
	}
	c.popAny(p, slot, keys, shardkv.TypeList, a.blocking, a.timeout, pop, render)
}
