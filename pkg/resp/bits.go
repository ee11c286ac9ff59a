package resp

import (
	"math/bits"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Bit commands on string values: GETBIT, SETBIT, BITCOUNT, BITPOS, BITOP. Bit 0
// is the most significant bit of the first byte, as in Redis. Arguments
// are checked in Redis's order: some after the key is read (a missing key
// answers before its range is parsed).

const errBitOffset = "ERR bit offset is not an integer or out of range"

// maxBitOffset: Redis refuses offsets whose byte is past
// proto-max-bulk-len (512 MB).
const maxBitOffset = 512<<20*8 - 1

func parseBitOffset(b []byte) (int64, bool) {
	n, ok := parseInt(b)
	return n, ok && n >= 0 && n <= maxBitOffset
}

func cmdGetBit(c *conn, p *pipeline, args [][]byte, slot int) {
	off, ok := parseBitOffset(args[2])
	if !ok {
		p.reply(errReply(errBitOffset))
		return
	}
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		if wrongType(v[0]) {
			return errReply(errWrongType)
		}
		if i := off >> 3; i < int64(len(v[0].Value)) && v[0].Value[i]&(0x80>>(off&7)) != 0 {
			return redcon.AppendInt(nil, 1)
		}
		return redcon.AppendInt(nil, 0)
	})
}

// cmdSetBit: SETBIT key offset 0|1; the old bit. An offset whose byte is
// past the value limit is refused before proposing.
func cmdSetBit(c *conn, p *pipeline, args [][]byte, slot int) {
	off, ok := parseBitOffset(args[2])
	if !ok {
		p.reply(errReply(errBitOffset))
		return
	}
	on, ok := parseInt(args[3])
	if !ok || (on != 0 && on != 1) {
		p.reply(errReply("ERR bit is not an integer or out of range"))
		return
	}
	if e := c.sizeError(args[1]); e != nil {
		p.reply(e)
		return
	}
	if off>>3 >= int64(c.s.cfg.MaxValueBytes) {
		c.refuseString(p, slot, args[1], errReply(opErrorText(shardkvpb.OpErrValueTooLarge)))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SET_BIT, Key: args[1], Delta: off, Value: []byte{byte(on)}}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// bitRange turns a BITCOUNT/BITPOS range (start, end, in bytes or with
// unit "bit" in bits; negative counts from the end) into an inclusive bit
// range of a value of n bytes, clipped; ok is false for an empty range.
// endGiven false: the range runs to the end.
func bitRange(n int64, start, end int64, endGiven, isBit bool) (lo, hi int64, ok bool) {
	total := n
	if isBit {
		total <<= 3
	}
	if !endGiven {
		end = total - 1
	}
	start, end, ok = clipRange(start, end, total)
	if !ok {
		return 0, 0, false
	}
	if isBit {
		return start, end, true
	}
	return start << 3, end<<3 + 7, true
}

// parseBitUnit parses BYTE or BIT.
func parseBitUnit(b []byte) (isBit, ok bool) {
	switch strings.ToLower(string(b)) {
	case "bit":
		return true, true
	case "byte":
		return false, true
	}
	return false, false
}

// cmdBitCount: BITCOUNT key [start end [BYTE|BIT]].
func cmdBitCount(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		switch {
		case !v[0].Found:
			return redcon.AppendInt(nil, 0)
		case wrongType(v[0]):
			return errReply(errWrongType)
		}
		val := v[0].Value
		lo, hi, ok := int64(0), int64(len(val))*8-1, len(val) > 0
		switch len(args) {
		case 2:
		case 4, 5:
			start, ok1 := parseInt(args[2])
			end, ok2 := parseInt(args[3])
			if !ok1 || !ok2 {
				return errReply(errNotInteger)
			}
			if start < 0 && end < 0 && start > end {
				return redcon.AppendInt(nil, 0)
			}
			isBit := false
			if len(args) == 5 {
				var okUnit bool
				if isBit, okUnit = parseBitUnit(args[4]); !okUnit {
					return errReply(errSyntax)
				}
			}
			lo, hi, ok = bitRange(int64(len(val)), start, end, true, isBit)
		default:
			return errReply(errSyntax)
		}
		if !ok {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, countBits(val, lo, hi))
	})
}

// countBits counts the set bits of val from bit lo to bit hi, inclusive.
func countBits(val []byte, lo, hi int64) int64 {
	var n int64
	for i := lo; i <= hi; {
		if i&7 == 0 && i+7 <= hi {
			n += int64(bits.OnesCount8(val[i>>3]))
			i += 8
			continue
		}
		if val[i>>3]&(0x80>>(i&7)) != 0 {
			n++
		}
		i++
	}
	return n
}

// cmdBitPos: BITPOS key bit [start [end [BYTE|BIT]]]: the first bit equal
// to bit in the range, or -1. A missing key is all zeros; looking for a 0
// with no end given, a range of ones answers the bit just after the value
// (as if it went on with zeros), as Redis does.
func cmdBitPos(c *conn, p *pipeline, args [][]byte, slot int) {
	bit, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	if bit != 0 && bit != 1 {
		p.reply(errReply("ERR The bit argument must be 1 or 0."))
		return
	}
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		switch {
		case !v[0].Found:
			return redcon.AppendInt(nil, map[bool]int64{true: -1, false: 0}[bit == 1])
		case wrongType(v[0]):
			return errReply(errWrongType)
		}
		val := v[0].Value
		n := int64(len(val))
		var start, end int64
		endGiven, isBit := false, false
		switch len(args) {
		case 3:
			start = 0
		case 4, 5, 6:
			var ok1 bool
			if start, ok1 = parseInt(args[3]); !ok1 {
				return errReply(errNotInteger)
			}
			if len(args) == 6 {
				var okUnit bool
				if isBit, okUnit = parseBitUnit(args[5]); !okUnit {
					return errReply(errSyntax)
				}
			}
			if len(args) >= 5 {
				var ok2 bool
				if end, ok2 = parseInt(args[4]); !ok2 {
					return errReply(errNotInteger)
				}
				endGiven = true
			}
		default:
			return errReply(errSyntax)
		}
		lo, hi, ok := bitRange(n, start, end, endGiven, isBit)
		if !ok {
			return redcon.AppendInt(nil, -1)
		}
		for i := lo; i <= hi; i++ {
			if (val[i>>3]&(0x80>>(i&7)) != 0) == (bit == 1) {
				return redcon.AppendInt(nil, i)
			}
		}
		if bit == 0 && !endGiven {
			return redcon.AppendInt(nil, n*8)
		}
		return redcon.AppendInt(nil, -1)
	})
}

// cmdBitOp: BITOP AND|OR|XOR|NOT destkey key [key ...] (keys in one
// slot): the sources are read and the result written (or the
// destination deleted, when it is empty) as two steps, with the node's
// transaction lock held, as EXEC holds it (multi.go): no other Redis
// command of the node comes between them (a write through the gRPC API
// may). The reply is the result's length. Missing sources are empty, and
// shorter ones padded with zero bytes, as in Redis.
func cmdBitOp(c *conn, p *pipeline, args [][]byte, slot int) {
	op := strings.ToLower(string(args[1]))
	switch op {
	case "and", "or", "xor":
	case "not":
		if len(args) != 4 {
			p.reply(errReply("ERR BITOP NOT must be called with a single source key."))
			return
		}
	default:
		p.reply(errReply(errSyntax))
		return
	}
	dest, srcs := args[2], args[3:]
	if e := c.sizeError(dest); e != nil {
		p.reply(e)
		return
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	defer c.lockExclusive()()
	b := &replyBound{s: c.s}
	vals, ok := c.readKeysNow(it, srcs, false, b)
	if !ok {
		return
	}
	b.release()
	var res []byte
	for i, v := range vals {
		if wrongType(v) {
			it.out = errReply(errWrongType)
			return
		}
		res = bitOp(op, res, v.Value, i == 0)
	}
	w := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: dest, Value: res}
	if len(res) == 0 {
		w = &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_DELETE, Key: dest}
	}
	c.writeNow(it, it.deadline, []*shardkvpb.WriteOp{w}, func([]*shardkvpb.WriteResult) []byte { return redcon.AppendInt(nil, int64(len(res))) })
}

// bitOp folds the source v into the result res (first: v is the first
// source), the shorter padded with zero bytes.
func bitOp(op string, res, v []byte, first bool) []byte {
	if first {
		res = append([]byte(nil), v...)
		if op == "not" {
			for i := range res {
				res[i] = ^res[i]
			}
		}
		return res
	}
	if len(v) > len(res) {
		res = append(res, make([]byte, len(v)-len(res))...)
	}
	for i := range res {
		var x byte
		if i < len(v) {
			x = v[i]
		}
		switch op {
		case "and":
			res[i] &= x
		case "or":
			res[i] |= x
		case "xor":
			res[i] ^= x
		}
	}
	return res
}
