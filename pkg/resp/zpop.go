package resp

import (
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Sorted-set pops of the first of several keys (ZMPOP) and the blocking
// pops (BZPOPMIN, BZPOPMAX, BZMPOP), through the machinery the list forms
// use (blocking.go). One command pops at most zpopLimit members (one log
// entry's write budget); a larger COUNT pops that many.

func zsetPopCommands() []*command {
	pop := []string{"RW", "access", "delete"}
	aBlock := []string{"@write", "@sortedset", "@slow", "@blocking"}
	return []*command{
		{name: "zmpop", arity: -4, flags: []string{"write", "movablekeys"}, acl: []string{"@write", "@sortedset", "@slow"},
			specs:  []keySpec{{flags: pop, index: 1, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 1) }, run: cmdZMPop},
		{name: "bzmpop", arity: -5, flags: []string{"write", "blocking", "movablekeys"}, acl: aBlock,
			specs:  []keySpec{{flags: pop, index: 2, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 2) }, run: cmdZMPop},
		{name: "bzpopmin", arity: -3, flags: []string{"write", "noscript", "blocking", "fast"}, first: 1, last: -2, step: 1,
			acl: []string{"@write", "@sortedset", "@fast", "@blocking"}, keyFlags: pop, run: cmdBZPop},
		{name: "bzpopmax", arity: -3, flags: []string{"write", "noscript", "blocking", "fast"}, first: 1, last: -2, step: 1,
			acl: []string{"@write", "@sortedset", "@fast", "@blocking"}, keyFlags: pop, run: cmdBZPop},
	}
}

// zpopOp pops count members of key's sorted set, lowest scores first
// (highest if max), at most zpopLimit of them.
func zpopOp(key []byte, max bool, count int64) *shardkvpb.WriteOp {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZPOPMIN, Key: key, Delta: min(count, zpopLimit(len(key)))}
	if max {
		op.Kind = shardkvpb.WriteOp_ZPOPMAX
	}
	return op
}

// popped is a ZPOPMIN or ZPOPMAX result's members, with their scores.
func popped(r *shardkvpb.WriteResult) []shardkv.Elem {
	vals := r.Values
	elems := make([]shardkv.Elem, 0, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		elems = append(elems, shardkv.Elem{Field: vals[i], Value: vals[i+1], Found: true})
	}
	return elems
}

// cmdZMPop serves ZMPOP numkeys key [key ...] MIN|MAX [COUNT count] and
// BZMPOP timeout numkeys ...: [key, [[member, score], ...]] from the first
// key that holds a sorted set (a null array if none; BZMPOP waits for
// one, see block).
func cmdZMPop(c *conn, p *pipeline, args [][]byte, slot int) {
	a, e := parseMPop(args, "min", "max")
	if e != nil {
		p.reply(e)
		return
	}
	for _, k := range a.keys {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
	}
	pop := func(key []byte) *shardkvpb.WriteOp { return zpopOp(key, a.side == 1, a.count) }
	render := func(key []byte) func([]*shardkvpb.WriteResult) []byte {
		return func(r []*shardkvpb.WriteResult) []byte {
			elems := popped(r[0])
			if len(elems) == 0 {
				return c.nullArray() // nothing popped: popNow goes on
			}
			b := redcon.AppendArray(nil, 2)
			b = redcon.AppendBulk(b, key)
			b = redcon.AppendArray(b, len(elems))
			for _, e := range elems {
				b = redcon.AppendArray(b, 2)
				b = redcon.AppendBulk(b, e.Field)
				b = c.appendDouble(b, elemScore(e))
			}
			return b
		}
	}
	c.popAny(p, slot, a.keys, shardkv.TypeZSet, a.blocking, a.timeout, pop, render)
}

// cmdBZPop serves BZPOPMIN and BZPOPMAX key [key ...] timeout: [key,
// member, score] from the first key that holds a sorted set, waiting for
// one (see block).
func cmdBZPop(c *conn, p *pipeline, args [][]byte, slot int) {
	keys, timeout, e := blockingArgs(args, func(k []byte) []byte { return c.sizeError(k) })
	if e != nil {
		p.reply(e)
		return
	}
	max := strings.EqualFold(string(args[0]), "bzpopmax")
	pop := func(key []byte) *shardkvpb.WriteOp { return zpopOp(key, max, 1) }
	render := func(key []byte) func([]*shardkvpb.WriteResult) []byte {
		return func(r []*shardkvpb.WriteResult) []byte {
			elems := popped(r[0])
			if len(elems) == 0 {
				return c.nullArray() // nothing popped: popNow goes on
			}
			b := redcon.AppendArray(nil, 3)
			b = redcon.AppendBulk(b, key)
			b = redcon.AppendBulk(b, elems[0].Field)
			return c.appendDouble(b, elemScore(elems[0]))
		}
	}
	c.popAny(p, slot, keys, shardkv.TypeZSet, true, timeout, pop, render)
}
