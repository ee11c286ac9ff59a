package resp

import (
	"bytes"
	"math"
	"slices"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// SORT key [BY nosort] [LIMIT offset count] [ASC|DESC] [ALPHA] [STORE
// destination] and SORT_RO, as Redis Cluster serves them: BY with a
// pattern and GET are refused (they name other keys), so a sort orders
// the elements of a list, a set or a sorted set themselves, numerically
// (strtod, ties by bytes) or, with ALPHA, by their bytes. STORE writes the
// result as a list (or deletes the destination when it is empty) in one
// log entry, after the read, with the node's transaction lock held as
// EXEC holds it (multi.go).

func sortCommands() []*command {
	acl := func(rw string) []string { return []string{rw, "@set", "@sortedset", "@list", "@slow", "@dangerous"} }
	key := keySpec{flags: []string{"RO", "access"}, index: 1, step: 1}
	byGet := keySpec{unknown: true, flags: []string{"RO", "access"},
		notes: "For the optional BY/GET keyword. It is marked 'unknown' because the key names derive from the content of the key we sort"}
	store := keySpec{unknown: true, flags: []string{"OW", "update"},
		notes: "For the optional STORE keyword. It is marked 'unknown' because the keyword can appear anywhere in the argument array"}
	return []*command{
		{name: "sort", arity: -2, flags: []string{"write", "denyoom", "movablekeys"}, first: 1, last: 1, step: 1, acl: acl("@write"),
			specs: []keySpec{key, byGet, store}, keysOf: sortKeys, run: cmdSort},
		{name: "sort_ro", arity: -2, flags: []string{"readonly", "movablekeys"}, first: 1, last: 1, step: 1, acl: acl("@read"),
			specs: []keySpec{key, byGet}, run: cmdSort},
	}
}

// sortKeys: the key, and STORE's destination (the last STORE), as
// Redis's sortGetKeys finds them.
func sortKeys(args [][]byte) [][]byte {
	keys := [][]byte{args[1]}
	var dest []byte
	for j := 2; j < len(args); j++ {
		switch strings.ToLower(string(args[j])) {
		case "limit":
			j += 2
		case "get", "by":
			j++
		case "store":
			if j+1 < len(args) {
				dest = args[j+1]
			}
			j++
		}
	}
	if dest != nil {
		keys = append(keys, dest)
	}
	return keys
}

// sortArgs are SORT's options.
type sortArgs struct {
	desc, alpha, dontSort bool
	start, count          int64 // LIMIT (count -1: to the end)
	store                 []byte
}

// parseSort parses SORT's options in Redis's order, as Redis Cluster
// does (sortCommandGeneric).
func parseSort(args [][]byte, readonly bool) (sortArgs, []byte) {
	a := sortArgs{count: -1}
	for j := 2; j < len(args); j++ {
		left := len(args) - j - 1
		switch o := strings.ToLower(string(args[j])); {
		case o == "asc":
			a.desc = false
		case o == "desc":
			a.desc = true
		case o == "alpha":
			a.alpha = true
		case o == "limit" && left >= 2:
			start, ok1 := parseInt(args[j+1])
			count, ok2 := parseInt(args[j+2])
			if !ok1 || !ok2 {
				return a, errReply(errNotInteger)
			}
			a.start, a.count = start, count
			j += 2
		case o == "store" && left >= 1 && !readonly:
			a.store = args[j+1]
			j++
		case o == "by" && left >= 1:
			if bytes.IndexByte(args[j+1], '*') >= 0 {
				return a, errReply("ERR BY option of SORT denied in Cluster mode.")
			}
			a.dontSort = true
			j++
		case o == "get" && left >= 1:
			return a, errReply("ERR GET option of SORT denied in Cluster mode.")
		default:
			return a, errReply(errSyntax)
		}
	}
	return a, nil
}

func cmdSort(c *conn, p *pipeline, args [][]byte, slot int) {
	a, e := parseSort(args, strings.EqualFold(string(args[0]), "sort_ro"))
	if e != nil {
		p.reply(e)
		return
	}
	if a.store != nil {
		if e := c.listKeyError(a.store); e != nil {
			p.reply(e)
			return
		}
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	if a.store != nil {
		defer c.lockExclusive()()
	}
	b := &replyBound{s: c.s}
	entry, r, ok := c.readAnyNow(it, args[1], shardkv.ElemQuery{All: true}, b, nil)
	if !ok {
		return
	}
	if entry.Found && entry.Type != shardkv.TypeList && entry.Type != shardkv.TypeSet && entry.Type != shardkv.TypeZSet {
		b.release()
		it.out = errReply(errWrongType)
		return
	}
	elems, e := sortElems(entry.Type, r.Elems, a)
	if e != nil {
		b.release()
		it.out = e
		return
	}
	if a.store == nil {
		it.out = appendBulks(redcon.AppendArray(nil, len(elems)), elems)
		it.charge += int64(b.used)
		return
	}
	b.release()
	ops := []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_DELETE, Key: a.store}}
	if len(elems) > 0 {
		push := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_RPUSH, Key: a.store, Fields: elems}
		if e := c.pushSizeError(push); e != nil {
			it.out = e
			return
		}
		ops = append(ops, push)
	}
	c.writeNow(it, it.deadline, ops, func([]*shardkvpb.WriteResult) []byte { return redcon.AppendInt(nil, int64(len(elems))) })
}

// sortElems orders a collection's elements (of type typ, as read in
// element order) as SORT asks and applies its LIMIT, as Redis does: a
// list's or a set's elements (a sorted set's members) by their value as
// a number, ties by bytes, or by bytes with ALPHA; with BY nosort, a list
// in its order, a set in its (here: byte) order, a sorted set by score
// (sorted anyway, ALPHA, when a set is stored, as Redis does for
// replication).
func sortElems(typ shardkv.ValueType, elems []shardkv.Elem, a sortArgs) ([][]byte, []byte) {
	vals := make([][]byte, len(elems))
	for i, e := range elems {
		if typ == shardkv.TypeList {
			vals[i] = e.Value
		} else {
			vals[i] = e.Field
		}
	}
	if a.dontSort && typ == shardkv.TypeSet && a.store != nil {
		a.dontSort, a.alpha = false, true
	}
	switch {
	case a.dontSort && typ == shardkv.TypeZSet:
		order := make([]int, len(elems))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(i, j int) int { return byScore(elems[i], elems[j]) })
		sorted := make([][]byte, len(order))
		for k, i := range order {
			sorted[k] = vals[i]
		}
		vals = sorted
		if a.desc {
			slices.Reverse(vals)
		}
	case a.dontSort:
		if a.desc && typ == shardkv.TypeList {
			slices.Reverse(vals)
		}
	case a.alpha:
		slices.SortStableFunc(vals, func(x, y []byte) int { return sortSign(bytes.Compare(x, y), a.desc) })
	default:
		scores := make(map[string]float64, len(vals))
		for _, v := range vals {
			f, ok := sortScore(v)
			if !ok {
				return nil, errReply("ERR One or more scores can't be converted into double")
			}
			scores[string(v)] = f
		}
		slices.SortStableFunc(vals, func(x, y []byte) int {
			fx, fy := scores[string(x)], scores[string(y)]
			switch {
			case fx > fy:
				return sortSign(1, a.desc)
			case fx < fy:
				return sortSign(-1, a.desc)
			}
			return sortSign(bytes.Compare(x, y), a.desc)
		})
	}
	// LIMIT, with Redis's rules.
	n := int64(len(vals))
	start := max(a.start, 0)
	end := n - 1
	if a.count >= 0 {
		end = start + a.count - 1
	}
	if start >= n {
		start, end = n-1, n-2
	}
	end = min(end, n-1)
	if start > end || n == 0 {
		return nil, nil
	}
	return vals[start : end+1], nil
}

func sortSign(cmp int, desc bool) int {
	if desc {
		return -cmp
	}
	return cmp
}

// sortScore reads an element as SORT does: C's strtod over the element
// as a C string (leading white space allowed; an empty one is 0), all of
// it read, not NaN, within range.
func sortScore(v []byte) (float64, bool) {
	cs := cString(v)
	if len(cs) == 0 {
		return 0, true
	}
	f, n, erange := cStrtod(cs)
	return f, n == len(cs) && !erange && !math.IsNaN(f)
}
