package resp

import (
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// String commands beyond GET and SET: ranges of a value, SET with an
// expiry in the command's name, GET that changes the expiry.

// cmdSetEx serves SETEX key seconds value and PSETEX key ms value.
func cmdSetEx(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	kind := "ex"
	if name == "psetex" {
		kind = "px"
	}
	ms, e := setExpiry(kind, args[2], name)
	if e != nil {
		p.reply(e)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PUT, Key: args[1], Value: args[3], TtlMs: &ms}
	if e := c.sizeError(op.Key, op.Value); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func([]*shardkvpb.WriteResult) []byte { return okReply() })
}

// cmdGetEx: GETEX key [EX s | PX ms | EXAT unix-s | PXAT unix-ms |
// PERSIST]. Without an option it is a read; with one, a write that returns
// the value it found (a time in the past deletes the key, as Redis does).
func cmdGetEx(c *conn, p *pipeline, args [][]byte, slot int) {
	var kind string // "ex", "px", "exat", "pxat" or "persist"
	var arg []byte
	// Redis's parseExtendedStringArgumentsOrReply: the options exclude
	// each other; one repeated is accepted (the last value wins).
	for j := 2; j < len(args); j++ {
		opt := strings.ToLower(string(args[j]))
		switch {
		case opt == "persist" && (kind == "" || kind == opt):
			kind = opt
		case (opt == "ex" || opt == "px" || opt == "exat" || opt == "pxat") && (kind == "" || kind == opt) && j+1 < len(args):
			kind, arg = opt, args[j+1]
			j++
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	if kind == "" {
		cmdGet(c, p, args, slot)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_PERSIST, Key: args[1], ReturnPrev: true}
	if kind != "persist" {
		ms, e := setExpiry(kind, arg, "getex")
		if e != nil {
			// Redis looks the key up first: an absent key is nil whatever
			// the time.
			c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
				switch {
				case !v[0].Found:
					return c.null()
				case wrongType(v[0]):
					return errReply(errWrongType)
				}
				return e
			})
			return
		}
		op.Kind = shardkvpb.WriteOp_EXPIRE
		if kind == "ex" || kind == "px" {
			op.TtlMs = &ms
		} else {
			op.ExpireAtMs = ms
		}
	}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, c.prevReply)
}

// cmdGetRange serves GETRANGE and SUBSTR key start end: indexes count from
// the end when negative, and the range is clipped to the value, as Redis's
// getrangeCommand does.
func cmdGetRange(c *conn, p *pipeline, args [][]byte, slot int) {
	start, ok1 := parseInt(args[2])
	end, ok2 := parseInt(args[3])
	if !ok1 || !ok2 {
		p.reply(errReply(errNotInteger))
		return
	}
	c.readKeys(p, slot, args[1:2], func(v []shardkv.ValueEntry) []byte {
		if wrongType(v[0]) {
			return errReply(errWrongType)
		}
		return redcon.AppendBulk(nil, valueRange(v[0].Value, start, end))
	})
}

// valueRange is value[start..end] with Redis's index rules.
func valueRange(value []byte, start, end int64) []byte {
	if start < 0 && end < 0 && start > end {
		return nil
	}
	lo, hi, ok := clipRange(start, end, int64(len(value)))
	if !ok {
		return nil
	}
	return value[lo : hi+1]
}

// clipRange applies Redis's index rules to start..end (inclusive) of n
// elements: a negative index counts from the end, then both are clipped to
// the elements; ok is false when nothing is left.
func clipRange(start, end, n int64) (lo, hi int64, ok bool) {
	if start < 0 {
		start += n
	}
	if end < 0 {
		end += n
	}
	start, end = max(start, 0), max(end, 0)
	if end >= n {
		end = n - 1
	}
	return start, end, start <= end
}

// cmdSetRange: SETRANGE key offset value. An offset whose result would
// pass the value limit is refused before proposing (the apply checks too).
func cmdSetRange(c *conn, p *pipeline, args [][]byte, slot int) {
	off, ok := parseInt(args[2])
	if !ok {
		p.reply(errReply(errNotInteger))
		return
	}
	if off < 0 {
		p.reply(errReply("ERR offset is out of range"))
		return
	}
	if e := c.sizeError(args[1], args[3]); e != nil {
		p.reply(e)
		return
	}
	if len(args[3]) > 0 && off > int64(c.s.cfg.MaxValueBytes-len(args[3])) {
		c.refuseString(p, slot, args[1], errReply(opErrorText(shardkvpb.OpErrValueTooLarge)))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_SET_RANGE, Key: args[1], Value: args[3], Delta: off}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}
