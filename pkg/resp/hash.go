package resp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Hash commands (docs/types.md). Writes are ops of the pipeline's write
// batches (HSET, HDEL, HINCR, HINCR_FLOAT), checked here against the
// group's limits before anything is proposed. Reads are ReadElems calls
// made when the command runs, after the reads and writes the pipeline has
// pending (which they must see), each bounded by MaxReplyBytes and the
// output budget as other reads are.

// hash-max-listpack-entries and hash-max-listpack-value (CONFIG SET,
// config.go; Redis 7.0's 128 and 64): a hash with more fields, or a field
// or value longer, is a hashtable (OBJECT ENCODING; HSCAN returns a small
// hash whole, as Redis does a listpack).

// hashPage bounds the elements one ReadElems of a sampling or paging
// read holds.
const hashPage = 1024

// Redis's RDB type of a hash of plain strings (DUMP).
const rdbTypeHash = 4

// fieldOverhead: a hash's key and a field together may be at most
// MaxKeyBytes minus this (the engine's element overhead).
const fieldOverhead = 10

// replyBound bounds what one read made now holds for its reply, as the
// pipeline's reads are bounded: at most MaxReplyBytes (but always the
// first element) and only what the output budget grants. used is charged
// to the reply's item, or given back.
type replyBound struct {
	s                  *Server
	used               int
	tooLarge, noMemory bool
	// typ is the type of the collection read (its too-large error names
	// how to read it in parts); a hash if unset.
	typ shardkv.ValueType
}

func (b *replyBound) reserve(n int) bool {
	n += 16
	if b.used > 0 && b.used+n > b.s.cfg.MaxReplyBytes {
		b.tooLarge = true
		return false
	}
	if !b.s.outBudget.take(int64(n)) {
		b.noMemory = true
		return false
	}
	b.used += n
	return true
}

func (b *replyBound) release() {
	b.s.outBudget.give(int64(b.used))
	b.used = 0
}

// errHashTooLarge is the reply to a read of a hash that passes
// MaxReplyBytes.
func (s *Server) errHashTooLarge() []byte { return s.errTooLarge(shardkv.TypeHash) }

// errTooLarge is the reply to a read of a collection of type t that
// passes MaxReplyBytes: it names how to read it in parts.
func (s *Server) errTooLarge(t shardkv.ValueType) []byte {
	s.stats.refused.Add(1)
	how := "the hash in parts with HSCAN"
	switch t {
	case shardkv.TypeSet:
		how = "the set in parts with SSCAN"
	case shardkv.TypeList:
		how = "the list in parts with LRANGE"
	case shardkv.TypeZSet:
		how = "the sorted set in parts with ZSCAN or ZRANGE"
	}
	return errReply(fmt.Sprintf("ERR the reply would be more than %d bytes, over the limit of %d bytes; read %s", s.cfg.MaxReplyBytes, s.cfg.MaxReplyBytes, how))
}

// startNow adds the item that a read made now will answer, after running
// what the pipeline has pending (the read must see its writes). It returns
// nil if the command is too late to start: it is then answered (errLate).
func (c *conn) startNow(p *pipeline, slot int) *item {
	p.barrier()
	it := &item{slot: slot}
	p.add(it)
	if len(c.s.late([]*item{it})) == 0 {
		return nil
	}
	return it
}

// readNowFailed sets its reply to a failed read (err from the backend,
// made under ctx) and gives back what b holds.
func (c *conn) readNowFailed(ctx context.Context, it *item, err error, b *replyBound) {
	s := c.s
	b.release()
	switch {
	case errors.Is(err, shardkv.ErrReadLimit) && b.noMemory:
		s.stats.outputRefusals.Add(1)
		it.out = errReply(s.outputFull())
	case errors.Is(err, shardkv.ErrReadLimit):
		it.out = s.errTooLarge(b.typ)
	default:
		it.out = s.readFailure(err, errors.Is(ctx.Err(), context.DeadlineExceeded), it.slot, it.tls)
	}
}

// readElems reads key's collection of type q.Type (a hash if unset) as q
// asks for its reply. On failure, or a key of another type (WRONGTYPE), it
// sets it.out, gives back what b holds and reports false.
func (c *conn) readElems(it *item, key []byte, q shardkv.ElemQuery, b *replyBound) (shardkv.ElemsReply, bool) {
	s := c.s
	if q.Type == shardkv.TypeString {
		q.Type = shardkv.TypeHash
	}
	b.typ = q.Type
	ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
	defer cancel()
	r, err := s.b.ReadElems(ctx, key, q, c.readonly, b.reserve)
	if err != nil {
		c.readNowFailed(ctx, it, err, b)
		return r, false
	}
	if r.Entry.Found && r.Entry.Type != q.Type {
		b.release()
		it.out = errReply(errWrongType)
		return r, false
	}
	return r, true
}

// readPage reads a page of key's collection of type typ as readElems
// does: at most count (at least 1) of its elements after field after
// (nil: from the first). A page that would pass the reply bound is read
// again with half the count, so a page holds at most MaxReplyBytes (but
// always one element).
func (c *conn) readPage(it *item, typ shardkv.ValueType, key, after []byte, count int, b *replyBound) (shardkv.ElemsReply, bool) {
	s := c.s
	b.typ = typ
	for count = max(count, 1); ; count /= 2 {
		q := shardkv.ElemQuery{Type: typ, All: true, After: after, Count: count}
		ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
		r, err := s.b.ReadElems(ctx, key, q, c.readonly, b.reserve)
		if errors.Is(err, shardkv.ErrReadLimit) && b.tooLarge && !b.noMemory && count > 1 {
			cancel()
			b.release()
			b.tooLarge = false
			continue
		}
		if err != nil {
			c.readNowFailed(ctx, it, err, b)
			cancel()
			return r, false
		}
		cancel()
		if r.Entry.Found && r.Entry.Type != typ {
			b.release()
			it.out = errReply(errWrongType)
			return r, false
		}
		return r, true
	}
}

// readHash serves a hash read: render makes the reply from what q read
// (r.Entry.Found false: no such key).
func (c *conn) readHash(p *pipeline, slot int, key []byte, q shardkv.ElemQuery, render func(r shardkv.ElemsReply) []byte) {
	q.Type = shardkv.TypeHash
	c.readColl(p, slot, key, q, render)
}

// readColl serves a read of the collection of type q.Type at key: render
// makes the reply from what q read (r.Entry.Found false: no such key).
func (c *conn) readColl(p *pipeline, slot int, key []byte, q shardkv.ElemQuery, render func(r shardkv.ElemsReply) []byte) {
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	r, ok := c.readElems(it, key, q, b)
	if !ok {
		return
	}
	it.out = render(r)
	it.charge += int64(b.used)
}

// readKeysNow reads keys now for the item it (of one slot; follower: as
// a READONLY connection may), bounded by b, which keeps what the values
// hold. On failure it sets it.out, gives back what b holds and reports
// false.
func (c *conn) readKeysNow(it *item, keys [][]byte, follower bool, b *replyBound) ([]shardkv.ValueEntry, bool) {
	s := c.s
	ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
	defer cancel()
	vals, err := s.b.ReadKeys(ctx, keys, follower, b.reserve)
	if err == nil && len(vals) != len(keys) {
		err = fmt.Errorf("backend returned %d values for %d keys", len(vals), len(keys))
	}
	if err != nil {
		c.readNowFailed(ctx, it, err, b)
		return nil, false
	}
	return vals, true
}

// writeNow runs ops as a write of their own for the item it (due by
// deadline), its reply render's: the write's item, whose results the
// caller may look at.
func (c *conn) writeNow(it *item, deadline time.Time, ops []*shardkvpb.WriteOp, render func([]*shardkvpb.WriteResult) []byte) *item {
	w := &item{slot: it.slot, tls: it.tls, ops: ops, deadline: deadline, arrived: it.arrived, seq: it.seq, onWrite: render}
	c.s.runWrites([]*item{w})
	it.out = w.out
	return w
}

// readAnyNow reads key now, whatever its type: a string's value, or a
// collection's elements as q asks. The key is read first, then the
// elements if it is a collection; if it changed type in between it is read
// again. The elements are bounded by b, or by elemReserve if set: then its
// refusal ends the read and the collection is returned with no element
// (ok is true; the caller's reserve knows why it refused).
func (c *conn) readAnyNow(it *item, key []byte, q shardkv.ElemQuery, b *replyBound, elemReserve func(int) bool) (shardkv.ValueEntry, shardkv.ElemsReply, bool) {
	s := c.s
	for range 3 {
		vals, ok := c.readKeysNow(it, [][]byte{key}, c.readonly, b)
		if !ok {
			return shardkv.ValueEntry{}, shardkv.ElemsReply{}, false
		}
		if e := vals[0]; !e.Found || e.Type == shardkv.TypeString {
			return e, shardkv.ElemsReply{}, true
		}
		b.release()
		q.Type = vals[0].Type
		b.typ = q.Type
		reserve := b.reserve
		if elemReserve != nil {
			reserve = elemReserve
		}
		ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
		r, err := s.b.ReadElems(ctx, key, q, c.readonly, reserve)
		if elemReserve != nil && errors.Is(err, shardkv.ErrReadLimit) {
			// The caller's reserve refused an element: the key is of
			// q.Type (only its elements are offered to it).
			cancel()
			return vals[0], shardkv.ElemsReply{}, true
		}
		if err != nil {
			c.readNowFailed(ctx, it, err, b)
			cancel()
			return shardkv.ValueEntry{}, shardkv.ElemsReply{}, false
		}
		cancel()
		if !r.Entry.Found || r.Entry.Type == q.Type {
			return r.Entry, r, true
		}
		b.release() // another type now: read it again
	}
	s.stats.refused.Add(1)
	it.out = errReply("TRYAGAIN the key changed type while it was read; please retry")
	return shardkv.ValueEntry{}, shardkv.ElemsReply{}, false
}

// hashEncoding is the encoding Redis 7.0 gives a hash of n fields of
// which elems are the first (at most hashListpackEntries of them): a
// listpack while it is small, else a hashtable. Redis never converts a
// hashtable back; this looks at the hash as it is.
func (s *Server) hashEncoding(n int64, elems []shardkv.Elem) string {
	if n > s.tun.get("hash-max-listpack-entries") {
		return "hashtable"
	}
	lim := int(s.tun.get("hash-max-listpack-value"))
	for _, e := range elems {
		if len(e.Field) > lim || len(e.Value) > lim {
			return "hashtable"
		}
	}
	return "listpack"
}

// dumpHash is a hash's DUMP payload: RDB_TYPE_HASH (plain strings, which
// Redis loads whatever the encoding it then chooses).
func dumpHash(elems []shardkv.Elem) []byte {
	b := appendRDBLen([]byte{rdbTypeHash}, uint64(len(elems)))
	for _, e := range elems {
		b = append(appendRDBLen(b, uint64(len(e.Field))), e.Field...)
		b = append(appendRDBLen(b, uint64(len(e.Value))), e.Value...)
	}
	b = binary.LittleEndian.AppendUint16(b, rdbVersion)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b))
}

// --- writes ---

// hashSizeError checks a hash write's key, fields and values against the
// group's limits, and what it may write against what one command may
// (nil if it fits). Nothing is proposed for a command that does not fit.
func (c *conn) hashSizeError(op *shardkvpb.WriteOp) []byte {
	if e := c.sizeError(op.Key, op.FieldValues...); e != nil {
		return e
	}
	limit := c.s.b.MaxKeyBytes() - fieldOverhead
	for _, f := range op.Fields {
		if n := len(op.Key) + len(f); n > limit {
			return errReply(fmt.Sprintf("ERR key and field of %d bytes together exceed the limit of %d bytes", n, limit))
		}
	}
	// As the engine's write budget counts it (shardkv's worstCase), so
	// that a command it would refuse is refused here with the fields
	// named: the key's record and its three index entries, a possible
	// dead-version mark, and per field its record and its change index
	// entry, each at its size as badger counts it.
	cost := func(k, v int) int {
		if v >= 1<<20 {
			v = 12 // in badger's value log: a pointer
		}
		return k + v + 12
	}
	k := len(op.Key)
	records, bytes := 5, cost(4+k, 17+16)+cost(3+k, 0)+2*cost(11+k, 0)+cost(13+k, 1)
	for i, f := range op.Fields {
		v := 0
		if i < len(op.FieldValues) {
			v = len(op.FieldValues[i])
		}
		records += 2
		bytes += cost(14+k+len(f), 1+v) + cost(21+k+len(f), 0)
	}
	if records > shardkv.EntryMaxRecords || bytes > shardkv.EntryMaxBytes {
		return errReply(fmt.Sprintf("ERR the command's %d fields may write %d records (%d bytes) to storage; one command may write at most %d records and %d bytes: send fewer fields per command",
			len(op.Fields), records, bytes, shardkv.EntryMaxRecords, shardkv.EntryMaxBytes))
	}
	return nil
}

// writeHash adds a hash write to the pipeline once it fits the limits.
func (c *conn) writeHash(p *pipeline, slot int, op *shardkvpb.WriteOp, render func([]*shardkvpb.WriteResult) []byte) {
	if e := c.hashSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, render)
}

// cmdHSet serves HSET and HMSET key field value [field value ...]: the
// number of fields added (HMSET: OK).
func cmdHSet(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	if len(args)%2 == 1 {
		p.reply(wrongArgs(name))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HSET, Key: args[1]}
	for i := 2; i < len(args); i += 2 {
		op.Fields = append(op.Fields, args[i])
		op.FieldValues = append(op.FieldValues, args[i+1])
	}
	c.writeHash(p, slot, op, func(r []*shardkvpb.WriteResult) []byte {
		if name == "hmset" {
			return okReply()
		}
		return numReply(r)
	})
}

// cmdHSetNX: HSETNX key field value, 1 if the field was set.
func cmdHSetNX(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HSET, Key: args[1], Fields: args[2:3], FieldValues: args[3:4], Cond: shardkvpb.WriteOp_IF_ABSENT}
	c.writeHash(p, slot, op, numReply)
}

// cmdHDel: HDEL key field [field ...], the number of fields removed; the
// hash goes with its last field.
func cmdHDel(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HDEL, Key: args[1], Fields: args[2:]}
	c.writeHash(p, slot, op, numReply)
}

// cmdHIncrBy: HINCRBY key field increment.
func cmdHIncrBy(c *conn, p *pipeline, args [][]byte, slot int) {
	delta, ok := parseInt(args[3])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HINCR, Key: args[1], Fields: args[2:3], Delta: delta}
	c.writeHash(p, slot, op, numReply)
}

// cmdHIncrByFloat: HINCRBYFLOAT key field increment; the new value as
// stored (see INCRBYFLOAT for how it is added and shown). The increment is
// checked as Redis does (string2ld) before the key is looked at.
func cmdHIncrByFloat(c *conn, p *pipeline, args [][]byte, slot int) {
	arg := args[3]
	f, err := strconv.ParseFloat(string(arg), 64)
	switch {
	case len(arg) >= 5*1024 || strings.ContainsRune(string(arg), '_'):
		p.reply(errReply(errNotFloat))
		return
	case errors.Is(err, strconv.ErrRange) && math.IsInf(f, 0):
		// Finite in Redis's long double, beyond float64.
		p.reply(errReply("ERR increment would produce NaN or Infinity"))
		return
	case err != nil || math.IsNaN(f):
		p.reply(errReply(errNotFloat))
		return
	case math.IsInf(f, 0):
		p.reply(errReply("ERR value is NaN or Infinity"))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_HINCR_FLOAT, Key: args[1], Fields: args[2:3], Value: arg}
	c.writeHash(p, slot, op, func(r []*shardkvpb.WriteResult) []byte {
		return redcon.AppendBulk(nil, r[0].Value)
	})
}

// --- reads ---

// cmdHGet: HGET key field.
func cmdHGet(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readHash(p, slot, args[1], shardkv.ElemQuery{Fields: args[2:3]}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found || len(r.Elems) == 0 || !r.Elems[0].Found {
			return c.null()
		}
		return redcon.AppendBulk(nil, r.Elems[0].Value)
	})
}

// cmdHMGet: HMGET key field [field ...]; a missing key is an empty hash.
func cmdHMGet(c *conn, p *pipeline, args [][]byte, slot int) {
	fields := args[2:]
	c.readHash(p, slot, args[1], shardkv.ElemQuery{Fields: fields}, func(r shardkv.ElemsReply) []byte {
		b := redcon.AppendArray(nil, len(fields))
		for i := range fields {
			if r.Entry.Found && i < len(r.Elems) && r.Elems[i].Found {
				b = redcon.AppendBulk(b, r.Elems[i].Value)
			} else {
				b = c.appendNull(b)
			}
		}
		return b
	})
}

// cmdHExists: HEXISTS key field.
func cmdHExists(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readHash(p, slot, args[1], shardkv.ElemQuery{Fields: args[2:3]}, func(r shardkv.ElemsReply) []byte {
		return boolInt(r.Entry.Found && len(r.Elems) > 0 && r.Elems[0].Found)
	})
}

// cmdHStrlen: HSTRLEN key field, the length of the field's value (0 if
// none).
func cmdHStrlen(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readHash(p, slot, args[1], shardkv.ElemQuery{Fields: args[2:3]}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found || len(r.Elems) == 0 {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, int64(len(r.Elems[0].Value)))
	})
}

// cmdHLen: HLEN key, the number of fields.
func cmdHLen(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readHash(p, slot, args[1], shardkv.ElemQuery{}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, r.Len)
	})
}

// cmdHGetAll serves HGETALL (a map: a flat array in RESP2), HKEYS and
// HVALS, in field order (Redis: insertion order for a small hash, the
// hash table's otherwise).
func cmdHGetAll(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	c.readHash(p, slot, args[1], shardkv.ElemQuery{All: true}, func(r shardkv.ElemsReply) []byte {
		var b []byte
		switch name {
		case "hgetall":
			b = c.appendMap(nil, len(r.Elems))
		default:
			b = redcon.AppendArray(nil, len(r.Elems))
		}
		for _, e := range r.Elems {
			if name != "hvals" {
				b = redcon.AppendBulk(b, e.Field)
			}
			if name != "hkeys" {
				b = redcon.AppendBulk(b, e.Value)
			}
		}
		return b
	})
}

// HSCAN cursors are numbers (clients parse them so), in two forms. A
// field of at most 7 bytes is the cursor itself, valid on every replica:
// bit 62 set, its length in bits 56-58, its bytes from bit 55 down. A
// longer field is kept in the server's cursor table (as SCAN's positions)
// under an id below 2^62; such a cursor is known only to the replica that
// made it.
const (
	cursorInline    = 1 << 62
	cursorInlineMax = 7
)

// encodeHashCursor is the cursor that goes on after field.
func (s *Server) encodeHashCursor(field []byte) uint64 {
	if len(field) > cursorInlineMax {
		return s.cursors.putBelow(field, 62)
	}
	var v uint64
	for i, c := range field {
		v |= uint64(c) << (8 * (6 - i))
	}
	return cursorInline | uint64(len(field))<<56 | v
}

// decodeHashCursor is the field a cursor goes on after (nil for 0).
func (s *Server) decodeHashCursor(cur uint64) ([]byte, bool) {
	switch {
	case cur == 0:
		return nil, true
	case cur&cursorInline == 0:
		return s.cursors.get(cur)
	case cur>>59 != cursorInline>>59:
		return nil, false // bits 59-61 or 63 set
	}
	n := int(cur >> 56 & 7)
	if cur&(1<<(8*(7-n))-1) != 0 {
		return nil, false
	}
	field := make([]byte, n)
	for i := range field {
		field[i] = byte(cur >> (8 * (6 - i)))
	}
	return field, true
}

// cmdHScan: HSCAN key cursor [MATCH pattern] [COUNT count] (scanColl):
// a hash Redis keeps as a listpack (128 fields or fewer) comes whole,
// cursor 0, as in Redis.
func cmdHScan(c *conn, p *pipeline, args [][]byte, slot int) {
	c.scanColl(p, args, slot, collScan{typ: shardkv.TypeHash, whole: int(c.s.tun.get("hash-max-listpack-entries")), values: true})
}

// collScan is what HSCAN and SSCAN differ in: the type scanned, the size
// up to which Redis keeps it in a compact encoding that SCAN returns whole
// (compact, if set, tells whether a collection of at most that size is
// so encoded), and whether elements come with their values.
type collScan struct {
	typ     shardkv.ValueType
	whole   int
	compact func(elems []shardkv.Elem) bool
	values  bool
}

// scanColl serves HSCAN and SSCAN key cursor [MATCH pattern] [COUNT
// count], in Redis's order of checks: the cursor, the key (missing: an
// empty page, with no option checked), its type, then the options. A page
// holds about COUNT elements in field order (fewer once it holds
// MaxReplyBytes); a collection Redis keeps in a compact encoding comes
// whole, cursor 0, as in Redis.
func (c *conn) scanColl(p *pipeline, args [][]byte, slot int, k collScan) {
	cur, err := strconv.ParseUint(string(args[2]), 10, 64)
	if err != nil {
		p.reply(errReply("ERR invalid cursor"))
		return
	}
	after, ok := c.s.decodeHashCursor(cur)
	if !ok {
		p.reply(errReply("ERR invalid cursor"))
		return
	}
	count := int64(10)
	var pattern []byte
	var optErr []byte
	for i := 3; i < len(args) && optErr == nil; i += 2 {
		more := i+1 < len(args)
		switch opt := string(args[i]); {
		case strings.EqualFold(opt, "count") && more:
			n, ok := parseInt(args[i+1])
			switch {
			case !ok:
				optErr = errReply(errNotInteger)
			case n < 1:
				optErr = errReply(errSyntax)
			default:
				count = n
			}
		case strings.EqualFold(opt, "match") && more:
			pattern = args[i+1]
			if string(pattern) == "*" {
				pattern = nil
			}
		default:
			optErr = errReply(errSyntax)
		}
	}
	pageCount := int(min(count, hashPage*1024))
	first := after == nil
	if first {
		pageCount = max(pageCount, k.whole)
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	var r shardkv.ElemsReply
	if optErr != nil {
		r, ok = c.readElems(it, args[1], shardkv.ElemQuery{Type: k.typ}, b) // the key's type only
	} else {
		r, ok = c.readPage(it, k.typ, args[1], after, pageCount, b)
	}
	switch {
	case !ok:
		return
	case !r.Entry.Found:
		b.release()
		it.out = appendScanPage(nil, "0", nil, nil, k.values)
		return
	case optErr != nil:
		b.release()
		it.out = optErr
		return
	}
	elems, next := r.Elems, r.Next
	whole := first && next == nil && r.Len <= int64(k.whole) && (k.compact == nil || k.compact(elems))
	if !whole && int64(len(elems)) > count {
		elems = elems[:count]
		next = elems[len(elems)-1].Field
	}
	cursor := "0"
	if next != nil {
		cursor = strconv.FormatUint(c.s.encodeHashCursor(next), 10)
	}
	it.out = appendScanPage(nil, cursor, elems, pattern, k.values)
	it.charge += int64(b.used)
}

// appendScanPage appends an HSCAN or SSCAN reply: the cursor, then the
// fields that match pattern (nil: all), with their values if values.
func appendScanPage(b []byte, cursor string, elems []shardkv.Elem, pattern []byte, values bool) []byte {
	n := 0
	for _, e := range elems {
		if pattern == nil || acl.Glob(pattern, e.Field, false) {
			n++
		}
	}
	if values {
		n *= 2
	}
	b = redcon.AppendArray(b, 2)
	b = redcon.AppendBulkString(b, cursor)
	b = redcon.AppendArray(b, n)
	for _, e := range elems {
		if pattern == nil || acl.Glob(pattern, e.Field, false) {
			b = redcon.AppendBulk(b, e.Field)
			if values {
				b = redcon.AppendBulk(b, e.Value)
			}
		}
	}
	return b
}

// randCountArgs parses HRANDFIELD's and ZRANDMEMBER's key [count [word]]
// with Redis's checks in its order; refusal, when set, is the reply.
func randCountArgs(args [][]byte, word string) (count int64, with, hasCount bool, refusal []byte) {
	if hasCount = len(args) >= 3; !hasCount {
		return 0, false, false, nil
	}
	n, ok := parseInt(args[2])
	switch {
	case !ok:
		return 0, false, true, errReply(errNotInteger)
	case n == math.MinInt64:
		return 0, false, true, errReply(fmt.Sprintf("ERR value is out of range, value must between %d and %d", -math.MaxInt64, int64(math.MaxInt64)))
	case len(args) > 4 || (len(args) == 4 && !strings.EqualFold(string(args[3]), word)):
		return 0, false, true, errReply(errSyntax)
	case len(args) == 4 && (n < -math.MaxInt64/2 || n > math.MaxInt64/2):
		return 0, false, true, errReply("ERR value is out of range")
	}
	return n, len(args) == 4, true, nil
}

// cmdHRandField: HRANDFIELD key [count [WITHVALUES]], with Redis's checks
// in its order. Without a count, a field (nil: no key); a count of at least
// the hash's size is the whole hash; a positive one that many distinct
// fields, a negative one that many picks that may repeat. The picks are
// uniform: positions are drawn from the hash's size, then the hash is read
// in pages of hashPage fields up to the last of them.
func cmdHRandField(c *conn, p *pipeline, args [][]byte, slot int) {
	count, withValues, hasCount, refusal := randCountArgs(args, "withvalues")
	if refusal != nil {
		p.reply(refusal)
		return
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	picked, ok := c.randomFields(it, shardkv.TypeHash, args[1], count, hasCount)
	if !ok {
		return
	}
	s := c.s
	if !hasCount {
		if picked.none {
			it.out = c.null()
		} else {
			it.out = redcon.AppendBulk(nil, picked.elems[0].Field)
		}
		it.charge += int64(picked.b.used)
		return
	}
	n := len(picked.elems)
	var b []byte
	if withValues && !c.resp3.Load() {
		b = redcon.AppendArray(nil, 2*n)
	} else {
		b = redcon.AppendArray(nil, n)
	}
	for _, e := range picked.elems {
		if withValues && c.resp3.Load() {
			b = redcon.AppendArray(b, 2)
		}
		b = redcon.AppendBulk(b, e.Field)
		if withValues {
			b = redcon.AppendBulk(b, e.Value)
		}
	}
	if len(b) > s.cfg.MaxReplyBytes {
		picked.b.release()
		it.out = s.errHashTooLarge()
		return
	}
	it.out = b
	it.charge += int64(picked.b.used)
}

// randomPick is what randomFields picked: the elements (what they hold
// reserved in b), or none (no such key).
type randomPick struct {
	elems []shardkv.Elem
	none  bool
	b     *replyBound
}

// randomFields picks HRANDFIELD's (and SRANDMEMBER's) elements of key's
// collection of type typ (see cmdHRandField); on failure it sets it.out
// and reports false.
func (c *conn) randomFields(it *item, typ shardkv.ValueType, key []byte, count int64, hasCount bool) (randomPick, bool) {
	s := c.s
	out := randomPick{b: &replyBound{s: s, typ: typ}}
	// Each page is read under a bound of its own, given back once the
	// picks are copied out of it.
	page := &replyBound{s: s}
	r, ok := c.readPage(it, typ, key, nil, hashPage, page)
	if !ok {
		return out, false
	}
	defer func() { page.release() }()
	if !r.Entry.Found || (hasCount && count == 0) {
		out.none = !r.Entry.Found
		return out, true
	}
	size := r.Len
	if size <= 0 {
		out.none = true
		return out, true
	}
	// The positions to pick, in order (a position may repeat), and
	// whether to shuffle the picks (Redis returns them in random order).
	var pos []int64
	shuffle := true
	switch {
	case !hasCount:
		pos = []int64{rand.Int64N(size)}
	case count < 0:
		m := -count
		if m > int64(s.cfg.MaxReplyBytes/16) {
			it.out = s.errTooLarge(typ)
			return out, false
		}
		pos = make([]int64, m)
		for i := range pos {
			pos[i] = rand.Int64N(size)
		}
		slices.Sort(pos)
	case count >= size:
		shuffle = false // the whole hash, in field order
	default:
		// Floyd's algorithm: count distinct positions.
		seen := make(map[int64]bool, count)
		for j := size - count; j < size; j++ {
			t := rand.Int64N(j + 1)
			if seen[t] {
				t = j
			}
			seen[t] = true
			pos = append(pos, t)
		}
		slices.Sort(pos)
	}
	all := pos == nil
	var at int64 // the position of r.Elems[0]
	for {
		for i, e := range r.Elems {
			p := at + int64(i)
			for all || (len(pos) > 0 && pos[0] == p) {
				if !out.b.reserve(len(e.Field) + len(e.Value)) {
					page.release()
					out.b.release()
					if out.b.noMemory {
						s.stats.outputRefusals.Add(1)
						it.out = errReply(s.outputFull())
					} else {
						it.out = s.errTooLarge(typ)
					}
					return out, false
				}
				out.elems = append(out.elems, shardkv.Elem{Field: e.Field, Value: e.Value, Found: true})
				if all {
					break
				}
				pos = pos[1:]
			}
		}
		at += int64(len(r.Elems))
		page.release()
		if r.Next == nil || (!all && len(pos) == 0) {
			break
		}
		if r, ok = c.readPage(it, typ, key, r.Next, hashPage, page); !ok {
			out.b.release()
			return out, false
		}
		if !r.Entry.Found {
			break // deleted meanwhile: what was picked stands
		}
	}
	if len(pos) > 0 && count < 0 && len(out.elems) > 0 {
		// The hash shrank while it was read: the remaining picks repeat
		// earlier ones.
		for range pos {
			e := out.elems[rand.IntN(len(out.elems))]
			if !out.b.reserve(len(e.Field) + len(e.Value)) {
				out.b.release()
				it.out = s.errTooLarge(typ)
				return out, false
			}
			out.elems = append(out.elems, e)
		}
	}
	if len(out.elems) == 0 {
		out.none = true
		if !hasCount {
			return out, true
		}
	}
	if shuffle {
		rand.Shuffle(len(out.elems), func(i, j int) { out.elems[i], out.elems[j] = out.elems[j], out.elems[i] })
	}
	return out, true
}
