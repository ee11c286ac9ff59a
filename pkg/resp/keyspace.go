package resp

import (
	"fmt"
	"strings"
	"time"

	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Keyspace commands beyond DEL, EXISTS and the expiry ones: renaming and
// copying a key within its slot, KEYS.

// cmdRename serves RENAME and RENAMENX src dst (the dispatcher checked
// that both keys share a slot, so they share a shard).
func cmdRename(c *conn, p *pipeline, args [][]byte, slot int) {
	nx := strings.EqualFold(string(args[0]), "renamenx")
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_RENAME, Key: args[1], Dest: args[2]}
	if nx {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	}
	c.writePair(p, slot, op, func(r []*shardkvpb.WriteResult) []byte {
		if nx {
			return boolInt(r[0].Ok)
		}
		return okReply()
	})
}

// writePair adds a RENAME or COPY to the pipeline once both its keys fit
// the key limit.
func (c *conn) writePair(p *pipeline, slot int, op *shardkvpb.WriteOp, render func([]*shardkvpb.WriteResult) []byte) {
	for _, k := range [][]byte{op.Key, op.Dest} {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, render)
}

// cmdCopy: COPY src dst [DB n] [REPLACE]. Only database 0 exists in
// cluster mode, as in Redis Cluster.
func cmdCopy(c *conn, p *pipeline, args [][]byte, slot int) {
	replace := false
	var db int64
	for j := 3; j < len(args); j++ {
		switch opt := strings.ToLower(string(args[j])); {
		case opt == "replace":
			replace = true
		case opt == "db" && j+1 < len(args):
			n, ok := parseInt(args[j+1])
			switch {
			case !ok || n != int64(int32(n)):
				p.reply(errReply(errNotInteger))
				return
			case n < 0 || n >= 16:
				p.reply(errReply("ERR DB index is out of range"))
				return
			}
			db = n
			j++
		default:
			p.reply(errReply(errSyntax))
			return
		}
	}
	if db != 0 {
		p.reply(errReply("ERR Copying to another database is not allowed in cluster mode"))
		return
	}
	if string(args[1]) == string(args[2]) {
		p.reply(errReply("ERR source and destination objects are the same"))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_COPY, Key: args[1], Dest: args[2]}
	if !replace {
		op.Cond = shardkvpb.WriteOp_IF_ABSENT
	}
	c.writePair(p, slot, op, func(r []*shardkvpb.WriteResult) []byte { return boolInt(r[0].Ok) })
}

// maxKeysReply bounds what KEYS returns: Redis answers every matching key,
// which on a large replica is a reply of gigabytes built in memory; SCAN
// has no such limit.
const maxKeysReply = 64 << 20

// cmdKeys: KEYS pattern, over the keys of the shards this replica serves
// (as SCAN, from its own state).
func cmdKeys(c *conn, p *pipeline, args [][]byte, _ int) {
	pattern := args[1]
	var match func([]byte) bool
	if string(pattern) != "*" {
		match = func(k []byte) bool { return acl.Glob(pattern, k, false) }
	}
	p.barrier()
	var keys [][]byte
	size := 0
	var after []byte
	for first := true; first || after != nil; first = false {
		batch, next, err := c.s.b.Scan(after, 1024, match)
		if err != nil {
			p.reply(errReply("ERR " + err.Error()))
			return
		}
		for _, k := range batch {
			size += len(k) + 16
		}
		if size > maxKeysReply {
			p.reply(errReply(fmt.Sprintf("ERR KEYS would return more than %d MiB of keys; use SCAN", maxKeysReply>>20)))
			return
		}
		keys, after = append(keys, batch...), next
	}
	b := redcon.AppendArray(nil, len(keys))
	for _, k := range keys {
		b = redcon.AppendBulk(b, k)
	}
	p.reply(b)
}

// cmdTime: TIME, this server's clock (seconds and microseconds). Data never
// depends on it (docs/time.md).
func cmdTime(_ *conn, p *pipeline, _ [][]byte, _ int) {
	now := time.Now()
	b := redcon.AppendArray(nil, 2)
	b = redcon.AppendBulkString(b, fmt.Sprint(now.Unix()))
	b = redcon.AppendBulkString(b, fmt.Sprint(now.Nanosecond()/1000))
	p.reply(b)
}

// cmdRandomKey: RANDOMKEY, a live key of the replica asked (nil if it has
// none), as SCAN and KEYS from its own state.
func cmdRandomKey(c *conn, p *pipeline, _ [][]byte, _ int) {
	p.barrier()
	k, err := c.s.b.RandomKey()
	switch {
	case err != nil:
		p.reply(errReply("ERR " + err.Error()))
	case k == nil:
		p.reply(c.null())
	default:
		p.reply(redcon.AppendBulk(nil, k))
	}
}

// cmdObject serves OBJECT ENCODING, REFCOUNT, FREQ and IDLETIME key. A
// value is reported in the encoding Redis would give it (int, embstr or
// raw; a hash: listpack or hashtable, see hashEncoding; a set: intset or
// hashtable, see setEncoding; a list: quicklist, Redis 7.0's only list
// encoding); nothing is shared (REFCOUNT 1). Access is not tracked: FREQ answers Redis's error
// for a server without an LFU policy (there is no eviction), IDLETIME
// says so.
func cmdObject(c *conn, p *pipeline, args [][]byte, slot int) {
	sub := strings.ToLower(string(args[1]))
	if sub == "encoding" {
		// A hash's encoding depends on its fields: read now, after what
		// the pipeline has pending.
		it := c.startNow(p, slot)
		if it == nil {
			return
		}
		b := &replyBound{s: c.s}
		// A field or value past the listpack bound ends the read: the
		// hash is a hashtable.
		long := false
		small := func(n int) bool {
			long = long || n > 2*int(max(c.s.tun.get("hash-max-listpack-value"), c.s.tun.get("zset-max-listpack-value")))
			return !long
		}
		e, r, ok := c.readAnyNow(it, args[2], shardkv.ElemQuery{All: true, Count: int(min(max(c.s.tun.get("hash-max-listpack-entries"), c.s.tun.get("zset-max-listpack-entries"), 1), maxEncodingRead))}, b, small)
		switch {
		case !ok:
			return
		case !e.Found:
			it.out = c.null()
		case e.Type == shardkv.TypeHash && long:
			it.out = redcon.AppendBulkString(nil, "hashtable")
		case e.Type == shardkv.TypeHash:
			it.out = redcon.AppendBulkString(nil, c.s.hashEncoding(r.Len, r.Elems))
		case e.Type == shardkv.TypeList:
			it.out = redcon.AppendBulkString(nil, "quicklist")
		case e.Type == shardkv.TypeSet && !long && r.Len > int64(len(r.Elems)) && r.Len <= c.s.tun.get("set-max-intset-entries") && r.Len <= maxEncodingRead:
			// More members than the first read holds, few enough for an
			// intset: read them all.
			b.release()
			var more shardkv.ElemsReply
			if more, ok = c.readElems(it, args[2], shardkv.ElemQuery{Type: shardkv.TypeSet, All: true, Count: int(min(c.s.tun.get("set-max-intset-entries"), maxEncodingRead))}, b); !ok {
				return
			}
			it.out = c.null() // deleted meanwhile
			if more.Entry.Found {
				it.out = redcon.AppendBulkString(nil, c.s.setEncoding(more.Len, more.Elems))
			}
		case e.Type == shardkv.TypeSet:
			// A member past the listpack bound (no integer is that long)
			// ended the read.
			it.out = redcon.AppendBulkString(nil, "hashtable")
			if !long {
				it.out = redcon.AppendBulkString(nil, c.s.setEncoding(r.Len, r.Elems))
			}
		case e.Type == shardkv.TypeZSet:
			it.out = redcon.AppendBulkString(nil, c.s.zsetEncoding(long, r.Len, r.Elems))
		case e.Type != shardkv.TypeString:
			it.out = errReply("ERR shardkv does not report the encoding of a value of type " + e.Type.String())
		default:
			it.out = redcon.AppendBulkString(nil, stringEncoding(e.Value))
		}
		b.release() // the reply holds none of the values read
		return
	}
	c.readKeys(p, slot, args[2:3], func(v []shardkv.ValueEntry) []byte {
		if !v[0].Found {
			return c.null()
		}
		switch sub {
		case "encoding":
			return redcon.AppendBulkString(nil, stringEncoding(v[0].Value))
		case "refcount":
			return redcon.AppendInt(nil, 1)
		case "freq":
			return errReply("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.")
		}
		return errReply("ERR shardkv does not track when a key was last accessed")
	})
}

// stringEncoding is the encoding Redis 7.0 gives a string value: int for
// a canonical integer of up to 20 bytes, embstr up to 44 bytes, else raw.
func stringEncoding(v []byte) string {
	if _, ok := parseInt(v); ok {
		return "int"
	}
	if len(v) <= 44 {
		return "embstr"
	}
	return "raw"
}
