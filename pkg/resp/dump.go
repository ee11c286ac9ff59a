package resp

import (
	"encoding/binary"
	"errors"
	"hash/crc64"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// DUMP and RESTORE in Redis's serialization (an RDB object, the RDB
// version, a CRC-64), so that tools that move keys between Redis servers
// with them (redis-shake, RIOT, MIGRATE-like scripts) can move keys into
// and out of shardkv. DUMP writes the plain encodings (a string, and
// RDB_TYPE_HASH, SET, LIST, ZSET_2); RESTORE reads every encoding Redis
// 7.0 writes or loads of strings, hashes, sets, lists and sorted sets
// (restore.go).

const (
	rdbVersion    = 10 // Redis 7.0's
	rdbTypeString = 0
)

// crcJones is Redis's CRC-64 (Jones polynomial, reflected, no inversion).
var crcJones = crc64.MakeTable(0x95AC9329AC4BC9B5)

func crc64Jones(p []byte) uint64 {
	var crc uint64
	for _, b := range p {
		crc = crcJones[byte(crc)^b] ^ (crc >> 8)
	}
	return crc
}

// dumpString is v's DUMP payload: an integer that fits in 32 bits as
// Redis encodes it, anything else as a plain length-prefixed string (not
// LZF-compressed: Redis restores it all the same).
func dumpString(v []byte) []byte {
	b := []byte{rdbTypeString}
	if n, ok := parseInt(v); ok && len(v) <= 11 {
		switch {
		case n >= -1<<7 && n < 1<<7:
			b = append(b, 0xC0, byte(int8(n)))
		case n >= -1<<15 && n < 1<<15:
			b = binary.LittleEndian.AppendUint16(append(b, 0xC1), uint16(int16(n)))
		case n >= -1<<31 && n < 1<<31:
			b = binary.LittleEndian.AppendUint32(append(b, 0xC2), uint32(int32(n)))
		}
	}
	if len(b) == 1 {
		b = append(appendRDBLen(b, uint64(len(v))), v...)
	}
	b = binary.LittleEndian.AppendUint16(b, rdbVersion)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b))
}

func appendRDBLen(b []byte, n uint64) []byte {
	switch {
	case n < 1<<6:
		return append(b, byte(n))
	case n < 1<<14:
		return append(b, 0x40|byte(n>>8), byte(n))
	case n <= 0xFFFFFFFF:
		return binary.BigEndian.AppendUint32(append(b, 0x80), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0x81), n)
}

var (
	errDumpFooter = errors.New("DUMP payload version or checksum are wrong")
	//lint:ignore ST1005 Redis's own reply text, sent as is
	errBadFormat = errors.New("Bad data format")
)

// restoreString decodes a DUMP payload of a string (at most limit bytes);
// a payload of another type is refused (restore.go decodes them all).
func restoreString(p []byte, limit int) ([]byte, error) {
	v, err := parseRestorePayload(p, restoreLimits{value: limit, elems: 1, total: limit})
	if err != nil {
		return nil, err
	}
	if v.typ != shardkv.TypeString {
		return nil, errors.New("not a string payload")
	}
	return v.value, nil
}

var errValueLimit = errors.New(strings.TrimPrefix(opErrorText(shardkvpb.OpErrValueTooLarge), "ERR "))

// rdbReader reads RDB lengths and bytes, refusing to run past its input.
type rdbReader struct{ b []byte }

func (r *rdbReader) bytes(n uint64) ([]byte, bool) {
	if n > uint64(len(r.b)) {
		return nil, false
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v, true
}

// length reads an RDB length, or (encoded) the kind of a special encoding.
func (r *rdbReader) length() (n uint64, encoded, ok bool) {
	h, ok := r.bytes(1)
	if !ok {
		return 0, false, false
	}
	switch h[0] >> 6 {
	case 0:
		return uint64(h[0] & 0x3F), false, true
	case 1:
		lo, ok := r.bytes(1)
		if !ok {
			return 0, false, false
		}
		return uint64(h[0]&0x3F)<<8 | uint64(lo[0]), false, true
	case 3:
		return uint64(h[0] & 0x3F), true, true
	}
	switch h[0] {
	case 0x80:
		b, ok := r.bytes(4)
		if !ok {
			return 0, false, false
		}
		return uint64(binary.BigEndian.Uint32(b)), false, true
	case 0x81:
		b, ok := r.bytes(8)
		if !ok {
			return 0, false, false
		}
		return binary.BigEndian.Uint64(b), false, true
	}
	return 0, false, false
}

// lzfDecompress expands LZF data (liblzf's format, as Redis writes it) to
// exactly n bytes.
func lzfDecompress(in []byte, n int) ([]byte, error) {
	out := make([]byte, 0, n)
	for i := 0; i < len(in); {
		ctrl := int(in[i])
		i++
		if ctrl < 1<<5 { // a run of ctrl+1 literal bytes
			l := ctrl + 1
			if i+l > len(in) || len(out)+l > n {
				return nil, errBadFormat
			}
			out = append(out, in[i:i+l]...)
			i += l
			continue
		}
		l := ctrl >> 5 // a back reference
		if l == 7 {
			if i >= len(in) {
				return nil, errBadFormat
			}
			l += int(in[i])
			i++
		}
		if i >= len(in) {
			return nil, errBadFormat
		}
		ref := len(out) - (ctrl&0x1F)<<8 - 1 - int(in[i])
		i++
		l += 2
		if ref < 0 || len(out)+l > n {
			return nil, errBadFormat
		}
		for k := range l { // may overlap what it appends
			out = append(out, out[ref+k])
		}
	}
	if len(out) != n {
		return nil, errBadFormat
	}
	return out, nil
}

// cmdDump: DUMP key, its serialized value (nil if it does not exist). A
// hash's elements are read too, so DUMP reads now, after what the
// pipeline has pending.
func cmdDump(c *conn, p *pipeline, args [][]byte, slot int) {
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	e, r, ok := c.readAnyNow(it, args[1], shardkv.ElemQuery{All: true}, b, nil)
	switch {
	case !ok:
		return
	case !e.Found:
		it.out = c.null()
	case e.Type == shardkv.TypeHash:
		it.out = redcon.AppendBulk(nil, dumpHash(r.Elems))
	case e.Type == shardkv.TypeSet:
		it.out = redcon.AppendBulk(nil, dumpSet(r.Elems))
	case e.Type == shardkv.TypeList:
		it.out = redcon.AppendBulk(nil, dumpList(r.Elems))
	case e.Type == shardkv.TypeZSet:
		it.out = redcon.AppendBulk(nil, dumpZSet(r.Elems))
	case e.Type != shardkv.TypeString:
		it.out = errReply("ERR shardkv cannot DUMP a value of type " + e.Type.String())
	default:
		it.out = redcon.AppendBulk(nil, dumpString(e.Value))
	}
	it.charge += int64(b.used)
}

// cmdRestore: RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s]
// [FREQ f]. ttl 0 is no expiry; ABSTTL makes it a Unix time in ms (one in
// the past restores nothing). IDLETIME and FREQ are checked and ignored
// (access is not tracked). Without REPLACE an existing key answers
// BUSYKEY, before the other checks, as in Redis.
//
// A string is one PUT (IF_ABSENT without REPLACE). A collection is one
// log entry of ops (restoreOps): the key's delete, its elements, its
// expiry; it must fit the group's limits and one entry's write budget
// (restoreSizeError), else nothing is proposed.
func cmdRestore(c *conn, p *pipeline, args [][]byte, slot int) {
	var replace, absTTL, idle, freq bool
	for j := 4; j < len(args); j++ {
		more := len(args) - j - 1
		switch opt := strings.ToLower(string(args[j])); {
		case opt == "replace":
			replace = true
		case opt == "absttl":
			absTTL = true
		case (opt == "idletime" && !freq || opt == "freq" && !idle) && more >= 1:
			n, ok := parseInt(args[j+1])
			switch {
			case !ok:
				p.reply(errReply(errNotInteger))
				return
			case opt == "idletime" && n < 0:
				p.reply(errReply("ERR Invalid IDLETIME value, must be >= 0"))
				return
			case opt == "freq" && (n < 0 || n > 255):
				p.reply(errReply("ERR Invalid FREQ value, must be >= 0 and <= 255"))
				return
			}
			idle, freq = idle || opt == "idletime", freq || opt == "freq"
			j++
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	var refusal []byte
	ttl, ok := parseInt(args[2])
	var v *restoredValue
	switch {
	case !ok:
		refusal = errReply(errNotInteger)
	case ttl < 0:
		refusal = errReply("ERR Invalid TTL value, must be >= 0")
	default:
		var err error
		if v, err = parseRestorePayload(args[3], c.restoreLimits()); err != nil {
			refusal = errReply("ERR " + err.Error())
		}
	}
	if refusal == nil {
		refusal = c.sizeError(args[1])
	}
	var ops []*shardkvpb.WriteOp
	if refusal == nil && v.typ != shardkv.TypeString {
		ops = restoreOps(args[1], v, ttl, absTTL)
		refusal = c.restoreSizeError(ops)
	}
	if refusal != nil {
		if replace {
			p.reply(refusal)
			return
		}
		c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
			if v[0].Found {
				return errReply("BUSYKEY Target key name already exists.")
			}
			return refusal
		})
		return
	}
	switch {
	case ops != nil && replace:
		writeOps(p, slot, ops, func([]*shardkvpb.WriteResult) []byte { return okReply() })
		return
	case ops != nil:
		c.restoreIfAbsent(p, slot, ops)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: v.value}
	switch {
	case ttl > 0 && absTTL:
		op.ExpireAtMs = ttl
	case ttl > 0:
		op.TtlMs = &ttl
	}
	if !replace {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		if !r[0].Ok {
			return errReply("BUSYKEY Target key name already exists.")
		}
		return okReply()
	})
}

// maxRestoreElems bounds the elements a payload may hold: each is at
// least two records of one entry's write budget, besides the key's five.
const maxRestoreElems = (shardkv.EntryMaxRecords - 5) / 2

// restoreLimits are what a RESTORE payload may decode to here: each
// string within the value limit, no more elements than one entry could
// write, and no more bytes made by decompression than one command may
// carry.
func (c *conn) restoreLimits() restoreLimits {
	return restoreLimits{value: c.s.cfg.MaxValueBytes, elems: maxRestoreElems, total: c.s.cfg.MaxRequestBytes}
}

// restoreIfAbsent writes a restored collection (ops, see restoreOps) if
// its key does not exist: BUSYKEY if it does. The engine has no op that
// writes a collection only where no key is, so the key is read first (on
// the leader, after what the pipeline has pending) and the ops proposed
// after: a key another client writes between the two is a known race
// (docs/redis.md): the ops begin with the key's delete, so the restored
// value replaces it, as with REPLACE, rather than merging with it.
func (c *conn) restoreIfAbsent(p *pipeline, slot int, ops []*shardkvpb.WriteOp) {
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s}
	vals, ok := c.readKeysNow(it, [][]byte{ops[0].Key}, false, b)
	if !ok {
		return
	}
	b.release()
	if vals[0].Found {
		it.out = errReply("BUSYKEY Target key name already exists.")
		return
	}
	c.writeNow(it, it.deadline, ops, func([]*shardkvpb.WriteResult) []byte { return okReply() })
}
