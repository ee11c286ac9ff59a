package resp

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Set commands (docs/types.md). As the hash commands (hash.go): writes are
// ops of the pipeline's write batches (SADD, SREM, SPOP, SMOVE, SSTORE),
// checked here against the group's limits before anything is proposed;
// reads are ReadElems calls made when the command runs, after what the
// pipeline has pending, bounded by MaxReplyBytes and the output budget.
// SINTER, SUNION, SDIFF and SINTERCARD read their sets whole, at one point
// of the log (ReadElemsOf), and combine them here.

// set-max-intset-entries (CONFIG SET, config.go; Redis 7.0's 512): a set
// of at most this many members, all integers, is an intset (OBJECT
// ENCODING; SSCAN returns it whole), else a hashtable (Redis 7.0 has no
// listpack sets).

// Redis's RDB type of a set of plain strings (DUMP).
const rdbTypeSet = 2

func setCommands() []*command {
	var (
		aSetR  = []string{"@read", "@set", "@fast"}
		aSetRS = []string{"@read", "@set", "@slow"}
		aSetW  = []string{"@write", "@set", "@fast"}
		aSetWS = []string{"@write", "@set", "@slow"}
		order  = []string{"nondeterministic_output_order"}
		random = []string{"nondeterministic_output"}
	)
	one := func(name string, arity int, flags, acl, tips, keyFlags []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: 1, step: 1, acl: acl, tips: tips, keyFlags: keyFlags, run: run}
	}
	algebra := func(name string) *command {
		return &command{name: name, arity: -2, flags: []string{"readonly"}, first: 1, last: -1, step: 1, acl: aSetRS, tips: order,
			keyFlags: []string{"RO", "access"}, run: cmdSetAlgebra}
	}
	store := func(name string, destFlags []string) *command {
		return &command{name: name, arity: -3, flags: []string{"write", "denyoom"}, first: 1, last: -1, step: 1, acl: aSetWS,
			specs: []keySpec{{flags: destFlags, index: 1, step: 1}, {flags: []string{"RO", "access"}, index: 2, lastKey: -1, step: 1}},
			run:   cmdSetStore}
	}
	return []*command{
		one("sadd", -3, []string{"write", "denyoom", "fast"}, aSetW, nil, []string{"RW", "insert"}, cmdSAdd),
		one("srem", -3, []string{"write", "fast"}, aSetW, nil, []string{"RW", "delete"}, cmdSRem),
		one("smembers", 2, []string{"readonly"}, aSetRS, order, []string{"RO", "access"}, cmdSMembers),
		one("sismember", 3, []string{"readonly", "fast"}, aSetR, nil, []string{"RO"}, cmdSIsMember),
		one("smismember", -3, []string{"readonly", "fast"}, aSetR, nil, []string{"RO", "access"}, cmdSMIsMember),
		one("scard", 2, []string{"readonly", "fast"}, aSetR, nil, []string{"RO"}, cmdSCard),
		one("spop", -2, []string{"write", "fast"}, aSetW, random, []string{"RW", "access", "delete"}, cmdSPop),
		one("srandmember", -2, []string{"readonly"}, aSetRS, random, []string{"RO", "access"}, cmdSRandMember),
		{name: "smove", arity: 4, flags: []string{"write", "fast"}, first: 1, last: 2, step: 1, acl: aSetW,
			keyFlags: []string{"RW", "access", "delete"}, destFlags: []string{"RW", "insert"}, run: cmdSMove},
		algebra("sinter"),
		algebra("sunion"),
		algebra("sdiff"),
		store("sinterstore", []string{"RW", "update"}),
		store("sunionstore", []string{"OW", "update"}),
		store("sdiffstore", []string{"OW", "update"}),
		{name: "sintercard", arity: -3, flags: []string{"readonly", "movablekeys"}, acl: aSetRS,
			specs:  []keySpec{{flags: []string{"RO", "access"}, index: 1, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 1) }, run: cmdSInterCard},
		one("sscan", -3, []string{"readonly"}, aSetRS, random, []string{"RO", "access"}, cmdSScan),
	}
}

// --- limits ---

// opCost counts what an op may write to storage as the engine counts it
// before proposing (shardkv's worstCase: records, and their bytes as
// badger counts them), so that a command it would refuse is refused here
// with its elements named, and pops are cut to what one command may
// remove.
type opCost struct{ records, bytes int }

func (o *opCost) add(k, v int) {
	if v >= 1<<20 {
		v = 12 // in badger's value log: a pointer
	}
	o.records++
	o.bytes += k + v + 12
}

// collOp is the cost of any op on a collection at a key of k bytes: the
// key's record (its metadata) and index entries, and a dead-version mark.
func collOp(k int) opCost {
	var o opCost
	o.add(4+k, 17+shardkv.CollMetaMaxBytes)
	o.add(3+k, 0)
	o.add(11+k, 0)
	o.add(11+k, 0)
	o.add(13+k, 1)
	return o
}

// addElem adds an element (field f bytes, value v) and its change index
// entry.
func (o *opCost) addElem(k, f, v int) {
	o.add(14+k+f, 1+v)
	o.add(21+k+f, 0)
}

func (o opCost) fits() bool {
	return o.records <= shardkv.EntryMaxRecords && o.bytes <= shardkv.EntryMaxBytes
}

// maxPops is how many elements one pop may remove from a collection at a
// key of k bytes, each counted as an element of field f bytes: what the
// write budget allows, at most 12,000 (the engine's bound).
func maxPops(k, f int) int64 {
	base := collOp(k)
	var one opCost
	one.addElem(k, f, 0)
	n := min((shardkv.EntryMaxRecords-base.records)/one.records, (shardkv.EntryMaxBytes-base.bytes)/one.bytes)
	return int64(max(min(n, shardkv.EntryMaxRecords/2), 1))
}

// budgetError is the refusal of a command whose n elements (noun) may
// write more than one command may.
func budgetError(o opCost, n int, noun string) []byte {
	return errReply(fmt.Sprintf("ERR the command's %d %s may write %d records (%d bytes) to storage; one command may write at most %d records and %d bytes: send fewer %s per command",
		n, noun, o.records, o.bytes, shardkv.EntryMaxRecords, shardkv.EntryMaxBytes, noun))
}

// memberError checks a member against the key limit: a key and each of
// its members together are one stored key.
func (c *conn) memberError(key, member []byte) []byte {
	limit := c.s.b.MaxKeyBytes() - fieldOverhead
	if n := len(key) + len(member); n > limit {
		return errReply(fmt.Sprintf("ERR key and member of %d bytes together exceed the limit of %d bytes", n, limit))
	}
	return nil
}

// setSizeError checks an SADD or SREM against the group's limits (nil if
// it fits).
func (c *conn) setSizeError(op *shardkvpb.WriteOp) []byte {
	if e := c.sizeError(op.Key); e != nil {
		return e
	}
	o := collOp(len(op.Key))
	for _, m := range op.Fields {
		if e := c.memberError(op.Key, m); e != nil {
			return e
		}
		o.addElem(len(op.Key), len(m), 0)
	}
	if !o.fits() {
		return budgetError(o, len(op.Fields), "members")
	}
	return nil
}

// refuseColl answers a command on key of type typ with e, an argument
// error Redis finds only after looking at the key: missing (if not nil)
// when there is no key, WRONGTYPE for a key of another type.
func (c *conn) refuseColl(p *pipeline, slot int, key []byte, typ shardkv.ValueType, missing, e []byte) {
	c.readColl(p, slot, key, shardkv.ElemQuery{Type: typ}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found && missing != nil {
			return missing
		}
		return e
	})
}

// --- writes ---

// cmdSAdd: SADD key member [member ...], the number added.
func cmdSAdd(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SADD, Key: args[1], Fields: args[2:]}
	if e := c.setSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdSRem: SREM key member [member ...], the number removed; the set goes
// with its last member.
func cmdSRem(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SREM, Key: args[1], Fields: args[2:]}
	if e := c.setSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdSPop: SPOP key [count]. Without a count, a member (nil: no set);
// with one, a set of up to count members (RESP3: a set). The engine picks
// them from the entry's deterministic random source (uniform for sets of
// up to 1,024 members, else consecutive members from a random position).
// One SPOP removes at most what the write budget allows (about 10,000
// members for short keys).
func cmdSPop(c *conn, p *pipeline, args [][]byte, slot int) {
	if len(args) > 3 {
		p.reply(errReply(errSyntax))
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
	if e := c.sizeError(args[1]); e != nil {
		p.reply(e)
		return
	}
	if count == 0 {
		// Nothing to remove; the key's type is still checked.
		c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeSet}, func(shardkv.ElemsReply) []byte {
			return c.appendSetLen(nil, 0)
		})
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SPOP, Key: args[1], Delta: min(count, maxPops(len(args[1]), 64))}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		if !hasCount {
			if len(r[0].Values) == 0 {
				return c.null()
			}
			return redcon.AppendBulk(nil, r[0].Values[0])
		}
		b := c.appendSetLen(nil, len(r[0].Values))
		for _, v := range r[0].Values {
			b = redcon.AppendBulk(b, v)
		}
		return b
	})
}

// cmdSMove: SMOVE source destination member, 1 if it moved.
func cmdSMove(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SMOVE, Key: args[1], Dest: args[2], Fields: args[3:4]}
	for _, k := range args[1:3] {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
		if e := c.memberError(k, args[3]); e != nil {
			p.reply(e)
			return
		}
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte { return boolInt(r[0].Ok) })
}

// setOps are the set algebra commands' engine ops, by name.
var setOps = map[string]int64{
	"sinter": shardkv.SetInter, "sinterstore": shardkv.SetInter,
	"sunion": shardkv.SetUnion, "sunionstore": shardkv.SetUnion,
	"sdiff": shardkv.SetDiff, "sdiffstore": shardkv.SetDiff,
}

// cmdSetStore serves SINTERSTORE, SUNIONSTORE and SDIFFSTORE destination
// key [key ...]: the result's size. The result replaces the destination
// whatever its type; an empty result deletes it. The engine computes it
// when the op applies (at most 12,000 members: beyond, ERR the command
// writes too much).
func cmdSetStore(c *conn, p *pipeline, args [][]byte, slot int) {
	for _, k := range args[1:] {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SSTORE, Dest: args[1], Key: args[2], MoreKeys: args[3:],
		Delta: setOps[strings.ToLower(string(args[0]))]}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// --- reads ---

// cmdSMembers: SMEMBERS key, in member byte order (Redis: the intset's
// numeric order, or the hash table's); RESP3: a set.
func cmdSMembers(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeSet, All: true}, func(r shardkv.ElemsReply) []byte {
		b := c.appendSetLen(nil, len(r.Elems))
		for _, e := range r.Elems {
			b = redcon.AppendBulk(b, e.Field)
		}
		return b
	})
}

// cmdSIsMember: SISMEMBER key member.
func cmdSIsMember(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeSet, Fields: args[2:3]}, func(r shardkv.ElemsReply) []byte {
		return boolInt(r.Entry.Found && len(r.Elems) > 0 && r.Elems[0].Found)
	})
}

// cmdSMIsMember: SMISMEMBER key member [member ...]; a missing key is an
// empty set.
func cmdSMIsMember(c *conn, p *pipeline, args [][]byte, slot int) {
	members := args[2:]
	c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeSet, Fields: members}, func(r shardkv.ElemsReply) []byte {
		b := redcon.AppendArray(nil, len(members))
		for i := range members {
			b = redcon.AppendInt(b, int64(boolToInt(r.Entry.Found && i < len(r.Elems) && r.Elems[i].Found)))
		}
		return b
	})
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cmdSCard: SCARD key, the number of members.
func cmdSCard(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readColl(p, slot, args[1], shardkv.ElemQuery{Type: shardkv.TypeSet}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, r.Len)
	})
}

// cmdSRandMember: SRANDMEMBER key [count], with Redis's checks in its
// order; the picks are HRANDFIELD's (randomFields): a count of at least
// the set's size is the whole set, a positive one that many distinct
// members, a negative one that many picks that may repeat.
func cmdSRandMember(c *conn, p *pipeline, args [][]byte, slot int) {
	var count int64
	hasCount := len(args) == 3
	switch {
	case len(args) > 3:
		p.reply(errReply(errSyntax))
		return
	case hasCount:
		n, ok := parseInt(args[2])
		switch {
		case !ok:
			p.reply(errReply(errNotInteger))
			return
		case n == math.MinInt64:
			p.reply(errReply(fmt.Sprintf("ERR value is out of range, value must between %d and %d", -math.MaxInt64, int64(math.MaxInt64))))
			return
		}
		count = n
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	picked, ok := c.randomFields(it, shardkv.TypeSet, args[1], count, hasCount)
	if !ok {
		return
	}
	if !hasCount {
		if picked.none {
			it.out = c.null()
		} else {
			it.out = redcon.AppendBulk(nil, picked.elems[0].Field)
		}
		it.charge += int64(picked.b.used)
		return
	}
	b := redcon.AppendArray(nil, len(picked.elems))
	for _, e := range picked.elems {
		b = redcon.AppendBulk(b, e.Field)
	}
	if len(b) > c.s.cfg.MaxReplyBytes {
		picked.b.release()
		it.out = c.s.errTooLarge(shardkv.TypeSet)
		return
	}
	it.out = b
	it.charge += int64(picked.b.used)
}

// readSets reads the sets at keys whole, at one point of the log: their
// members in byte order (none for a missing key). On failure, or a key of
// another type (WRONGTYPE, whichever key it is, as Redis checks them all),
// it sets it.out, gives back what b holds and reports false.
func (c *conn) readSets(it *item, keys [][]byte, b *replyBound) ([][][]byte, bool) {
	s := c.s
	b.typ = shardkv.TypeSet
	ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
	defer cancel()
	rs, err := s.b.ReadElemsOf(ctx, keys, shardkv.ElemQuery{Type: shardkv.TypeSet, All: true}, c.readonly, b.reserve)
	if err == nil && len(rs) != len(keys) {
		err = fmt.Errorf("backend returned %d collections for %d keys", len(rs), len(keys))
	}
	if err != nil {
		c.readNowFailed(ctx, it, err, b)
		return nil, false
	}
	sets := make([][][]byte, len(rs))
	for i, r := range rs {
		if r.Entry.Found && r.Entry.Type != shardkv.TypeSet {
			b.release()
			it.out = errReply(errWrongType)
			return nil, false
		}
		for _, e := range r.Elems {
			sets[i] = append(sets[i], e.Field)
		}
	}
	return sets, true
}

// cmdSetAlgebra serves SINTER, SUNION and SDIFF key [key ...]: the
// result in member byte order (Redis: its own order); RESP3: a set.
func cmdSetAlgebra(c *conn, p *pipeline, args [][]byte, slot int) {
	op := setOps[strings.ToLower(string(args[0]))]
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	sets, ok := c.readSets(it, args[1:], b)
	if !ok {
		return
	}
	result := shardkv.SetAlgebra(int(op), sets)
	out := c.appendSetLen(nil, len(result))
	for _, m := range result {
		out = redcon.AppendBulk(out, m)
	}
	it.out = out
	it.charge += int64(b.used)
}

// cmdSInterCard: SINTERCARD numkeys key [key ...] [LIMIT limit], the size
// of the intersection (at most limit, if not 0).
func cmdSInterCard(c *conn, p *pipeline, args [][]byte, slot int) {
	numErr := errReply("ERR numkeys should be greater than 0")
	n, ok := parseInt(args[1])
	switch {
	case !ok || n < 1:
		p.reply(numErr)
		return
	case n > int64(len(args)-2):
		p.reply(errReply("ERR Number of keys can't be greater than number of args"))
		return
	}
	var limit int64
	for j := 2 + int(n); j < len(args); j++ {
		if !strings.EqualFold(string(args[j]), "limit") || j+1 >= len(args) {
			p.reply(errReply(errSyntax))
			return
		}
		j++
		l, ok := parseInt(args[j])
		if !ok || l < 0 {
			p.reply(errReply("ERR LIMIT can't be negative"))
			return
		}
		limit = l
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	sets, ok := c.readSets(it, args[2:2+n], b)
	if !ok {
		return
	}
	card := int64(len(shardkv.SetAlgebra(shardkv.SetInter, sets)))
	if limit > 0 {
		card = min(card, limit)
	}
	b.release()
	it.out = redcon.AppendInt(nil, card)
}

// cmdSScan: SSCAN key cursor [MATCH pattern] [COUNT count], as HSCAN
// (scanColl): a set Redis keeps as an intset (at most 512 members, all
// integers) comes whole, cursor 0, as in Redis.
func cmdSScan(c *conn, p *pipeline, args [][]byte, slot int) {
	c.scanColl(p, args, slot, collScan{typ: shardkv.TypeSet, whole: int(min(c.s.tun.get("set-max-intset-entries"), maxEncodingRead)), compact: intMembers})
}

// intMembers reports whether every member is an integer as Redis stores
// one in an intset (string2ll: canonical, 64 bits).
func intMembers(elems []shardkv.Elem) bool {
	for _, e := range elems {
		if _, ok := parseInt(e.Field); !ok {
			return false
		}
	}
	return true
}

// setEncoding is the encoding Redis 7.0 gives a set of n members of which
// elems are the first (at most setIntsetEntries): an intset while it
// holds integers only and is small, else a hashtable. Redis never converts
// a hashtable back; this looks at the set as it is.
func (s *Server) setEncoding(n int64, elems []shardkv.Elem) string {
	if n > s.tun.get("set-max-intset-entries") || int64(len(elems)) < n || !intMembers(elems) {
		return "hashtable"
	}
	return "intset"
}

// dumpSet is a set's DUMP payload: RDB_TYPE_SET (plain strings, which
// Redis loads as an intset or a hashtable by its own rules).
func dumpSet(elems []shardkv.Elem) []byte {
	b := appendRDBLen([]byte{rdbTypeSet}, uint64(len(elems)))
	for _, e := range elems {
		b = append(appendRDBLen(b, uint64(len(e.Field))), e.Field...)
	}
	b = binary.LittleEndian.AppendUint16(b, rdbVersion)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b))
}

// collWritten estimates what a set or list op writes to storage (the
// pipeline's batch bound, see pipeline.written): as a hash's, each member
// or element is a record of its own with its change index entry, and a
// pop deletes what it removes.
func collWritten(op *shardkvpb.WriteOp) int {
	w := 2*len(op.Key) + len(op.Dest) + len(op.Value) + 128
	for _, f := range op.Fields {
		w += 2*(len(op.Key)+len(f)+32) + len(f)
	}
	switch op.Kind {
	case shardkvpb.WriteOp_SPOP, shardkvpb.WriteOp_LPOP, shardkvpb.WriteOp_RPOP:
		w += int(min(op.Delta, maxBatchWritten/64)) * 2 * (len(op.Key) + 64)
	case shardkvpb.WriteOp_LMOVE:
		// It writes the element it moves, of any size up to the value
		// limit, which only the apply knows: alone in its batch, so that
		// a large one cannot fail the others' entry (an entry past its
		// budget fails whole). So does an SPOP of several members (the
		// engine counts them at 64 bytes each; a member may be 64 KB).
		return maxBatchWritten
	}
	if op.Kind == shardkvpb.WriteOp_SPOP && op.Delta > 1 {
		return maxBatchWritten
	}
	return min(w, maxBatchWritten)
}
