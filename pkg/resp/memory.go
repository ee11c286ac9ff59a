package resp

import (
	"strconv"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/tidwall/redcon"
)

// cmdMemoryUsage: MEMORY USAGE key [SAMPLES count], an estimate of the
// bytes the key takes here: its name and value (a collection's size times
// the average of its first `count` elements, 5 by default, all with 0),
// plus a fixed per-record overhead. shardkv's storage is badger's, not an
// allocator's, so it is an estimate in Redis's spirit, not a measure.
func cmdMemoryUsage(c *conn, p *pipeline, args [][]byte, slot int) {
	samples := int64(5)
	for i := 3; i < len(args); i += 2 {
		if !strings.EqualFold(string(args[i]), "samples") || i+1 >= len(args) {
			p.reply(errReply(errSyntax))
			return
		}
		n, err := strconv.ParseInt(string(args[i+1]), 10, 64)
		if err != nil || n < 0 {
			p.reply(errReply(errNotInteger))
			return
		}
		samples = n
		if samples == 0 {
			samples = 1 << 20 // every element, up to the reply bound's reads
		}
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	const overhead = 48 // a record's header and badger's per-key bytes
	b := &replyBound{s: c.s}
	e, r, ok := c.readAnyNow(it, args[2], shardkv.ElemQuery{All: true, Count: int(min(samples, 1<<20))}, b, nil)
	switch {
	case !ok:
		return
	case !e.Found:
		it.out = c.null()
	case e.Type == shardkv.TypeString:
		it.out = redcon.AppendInt(nil, int64(len(args[2])+len(e.Value)+overhead))
	default:
		size := int64(len(args[2]) + overhead)
		if n := len(r.Elems); n > 0 {
			sum := 0
			for _, el := range r.Elems {
				sum += len(el.Field) + len(el.Value) + overhead
			}
			size += r.Len * int64(sum/n)
		}
		it.out = redcon.AppendInt(nil, size)
	}
	b.release()
}
