package resp

import (
	"encoding/binary"
	"errors"
	"hash/crc64"
	"strconv"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// DUMP and RESTORE in Redis's serialization (an RDB object, the RDB
// version, a CRC-64), so that tools that move keys between Redis servers
// with them (redis-shake, RIOT, MIGRATE-like scripts) can move string
// keys into and out of shardkv. Only strings exist here: RESTORE of
// another type answers an error saying so.

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

// restoreString decodes a DUMP payload of a string (at most limit bytes).
func restoreString(p []byte, limit int) ([]byte, error) {
	if len(p) < 10 {
		return nil, errDumpFooter
	}
	body, footer := p[:len(p)-8], p[len(p)-10:]
	if binary.LittleEndian.Uint16(footer) > rdbVersion || binary.LittleEndian.Uint64(footer[2:]) != crc64Jones(body) {
		return nil, errDumpFooter
	}
	body = body[:len(body)-2]
	if len(body) == 0 {
		return nil, errBadFormat
	}
	if body[0] != rdbTypeString {
		return nil, errors.New("shardkv restores only string values (RDB type " + strconv.Itoa(int(body[0])) + ")")
	}
	r := rdbReader{b: body[1:]}
	n, enc, ok := r.length()
	if !ok {
		return nil, errBadFormat
	}
	if !enc {
		if n > uint64(limit) {
			return nil, errValueLimit
		}
		v, ok := r.bytes(n)
		if !ok {
			return nil, errBadFormat
		}
		return v, nil
	}
	switch n {
	case 0, 1, 2: // an integer of 1, 2 or 4 bytes, little-endian
		raw, ok := r.bytes(1 << n)
		if !ok {
			return nil, errBadFormat
		}
		var i int64
		switch n {
		case 0:
			i = int64(int8(raw[0]))
		case 1:
			i = int64(int16(binary.LittleEndian.Uint16(raw)))
		default:
			i = int64(int32(binary.LittleEndian.Uint32(raw)))
		}
		return strconv.AppendInt(nil, i, 10), nil
	case 3: // LZF: compressed length, original length, data
		clen, e1, ok1 := r.length()
		olen, e2, ok2 := r.length()
		if !ok1 || !ok2 || e1 || e2 {
			return nil, errBadFormat
		}
		if olen > uint64(limit) {
			return nil, errValueLimit
		}
		in, ok := r.bytes(clen)
		if !ok {
			return nil, errBadFormat
		}
		return lzfDecompress(in, int(olen))
	}
	return nil, errBadFormat
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
	var val []byte
	switch {
	case !ok:
		refusal = errReply(errNotInteger)
	case ttl < 0:
		refusal = errReply("ERR Invalid TTL value, must be >= 0")
	default:
		var err error
		if val, err = restoreString(args[3], c.s.cfg.MaxValueBytes); err != nil {
			refusal = errReply("ERR " + err.Error())
		}
	}
	if refusal == nil {
		refusal = c.sizeError(args[1])
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
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: val}
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
