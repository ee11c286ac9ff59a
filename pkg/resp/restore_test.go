package resp_test

import (
	"encoding/binary"
	"fmt"
	"hash/crc64"
	"strconv"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkv"
)

// testRestoreCollections: DUMP then RESTORE of each collection type on
// the same server gives the same contents (small ones, and ones of
// thousands of elements); Redis's own payloads of the compact encodings;
// REPLACE over another type, BUSYKEY without it (also in a transaction),
// the TTL; and payloads past one entry's write budget, refused with
// nothing changed.
func (e *env) testRestoreCollections(t *testing.T) {
	key := func(s string) string { return "{rc}" + s }
	c := e.conn(e.leaderAddr(e.owner(key(""))))
	for _, k := range []string{"h", "s", "l", "z", "hb", "sb", "lb", "zb", "t", "x"} {
		c.do("del", key(k), key(k+"2"))
	}
	c.do("hset", key("h"), "a", "1", "bb", "hello", "n", "-300", "e", "")
	c.do("sadd", key("s"), "x", "17", "-5", "yy")
	c.do("rpush", key("l"), "a", "b", "a", "", "12")
	c.do("zadd", key("z"), "1.5", "a", "-inf", "b", "3", "c", "3", "d")
	hsetMany(t, c, key("hb"), 5000, func(i int) string { return "f" + strconv.Itoa(i) }, func(i int) string { return strconv.Itoa(i * i) })
	saddMany(t, c, key("sb"), 5000, func(i int) string { return "m" + strconv.Itoa(i) })
	rpushMany(t, c, key("lb"), 10000, func(i int) string { return strconv.Itoa(i % 7) })
	zaddMany(t, c, key("zb"), 3000, func(i int) string { return "z" + strconv.Itoa(i) }, func(i int) float64 { return float64(i%100) / 4 })
	reads := map[string][]string{
		"h": {"hgetall"}, "s": {"smembers"}, "l": {"lrange", "", "0", "-1"}, "z": {"zrange", "", "0", "-1", "withscores"},
	}
	for _, k := range []string{"h", "s", "l", "z", "hb", "sb", "lb", "zb"} {
		read := reads[k[:1]]
		readOf := func(k string) []string { return append([]string{read[0], key(k)}, read[min(2, len(read)):]...) }
		payload, ok := c.do("dump", key(k)).(string)
		if !ok {
			t.Fatalf("DUMP %s: %#v", k, payload)
		}
		expect(t, c.do("restore", key(k+"2"), "0", payload), status("OK"), "RESTORE of ", k)
		want := c.do(readOf(k)...)
		expect(t, c.do(readOf(k+"2")...), want, "the restored ", k)
		expect(t, c.do("type", key(k+"2")), c.do("type", key(k)), "the type of ", k)
		expect(t, c.do("pttl", key(k+"2")), int64(-1))
		// BUSYKEY without REPLACE, and the key is unchanged.
		expect(t, c.do("restore", key(k+"2"), "0", payload), rerr("BUSYKEY Target key name already exists."))
		expect(t, c.do(readOf(k+"2")...), want)
	}

	// Redis 7.0.15's DUMP of a small hash (a listpack), of a sorted set
	// (a listpack), of a set of integers (an intset, LZF-compressed).
	hashLP := "\x1077\x00\x00\x00\x0a\x00\x81a\x02\x01\x01\x82bb\x03\x85hello\x06\x81c\x02\xdf\xef\x02\x84long\x05\xf4\x14\x1a\x99\xbe\x1c\x00\x00\x00\x09\x83neg\x04\xf2\x90\xee\xfe\x04\xff\x0a\x00B\x98\xdd\x0e a\xcb\x99"
	zsetLP := "\x11;;\x00\x00\x00\x0e\x00\x81g\x02\x84-inf\x05\x81c\x02\xdf\xfd\x02\x81e\x02\x00\x01\x81a\x02\x01\x01\x81b\x02\x832.5\x04\x81d\x02\x861e+100\x07\x81f\x02\x83inf\x04\xff\x0a\x00\xa8\x1a\x05\x01\x99vK5"
	intset := "\x0b\xc3-8\x04\x08\x00\x00\x00\x06 \x03\x07\x00\x0e\xfa\xd5\xfe\xff\xff\xff@\x03@\x00\x00\x01 \x12@\x00\x00\x0c@\x04 \x00\x00,\xa0\x10\x01p\x11@\x08\x01\x00\x00\x0a\x00\xff6\x9c$SA\xa81"
	// REPLACE over a string, with a TTL.
	c.do("set", key("t"), "a string")
	expect(t, c.do("restore", key("t"), "100000", hashLP, "replace"), status("OK"))
	expect(t, c.do("hmget", key("t"), "a", "bb", "c", "long", "neg"), []any{"1", "hello", "-17", "123456789012", "-70000"})
	if ttl, _ := c.do("pttl", key("t")).(int64); ttl <= 0 || ttl > 100000 {
		t.Errorf("PTTL of a hash restored with a TTL: %d", ttl)
	}
	expect(t, c.do("restore", key("t"), "0", zsetLP, "replace"), status("OK"))
	expect(t, c.do("zrange", key("t"), "0", "-1", "withscores"),
		[]any{"g", "-inf", "c", "-3", "e", "0", "a", "1", "b", "2.5", "d", "1e+100", "f", "inf"})
	expect(t, c.do("pttl", key("t")), int64(-1))
	// An absolute time in the past restores nothing, and REPLACE deletes.
	expect(t, c.do("restore", key("t"), "1000", intset, "replace", "absttl"), status("OK"))
	expect(t, c.do("exists", key("t")), int64(0))
	// In a transaction, without REPLACE.
	expect(t, c.do("multi"), status("OK"))
	expect(t, c.do("restore", key("t"), "0", intset), status("QUEUED"))
	expect(t, c.do("restore", key("t"), "0", intset), status("QUEUED"))
	expect(t, c.do("scard", key("t")), status("QUEUED"))
	expect(t, c.do("exec"), []any{status("OK"), rerr("BUSYKEY Target key name already exists."), int64(6)})
	expect(t, c.do("smembers", key("t")), []any{"-2", "-5000000000", "1", "12", "300", "70000"})
	// Redis's error texts.
	expect(t, c.do("restore", key("x"), "0", hashLP[:5]+"\x01"+hashLP[6:]), rerr("ERR DUMP payload version or checksum are wrong"))
	expect(t, c.do("restore", key("x"), "0", payloadOf("\x02\x02\x01a\x01a")), rerr("ERR Bad data format"))
	expect(t, c.do("restore", key("x"), "0", payloadOf("\x0f\x00")), rerr("ERR shardkv cannot restore RDB type 15 (streams, module values and zipmaps are not supported)"))
	expect(t, c.do("exists", key("x")), int64(0))

	// Past one entry's write budget: refused, nothing proposed (the key
	// keeps its value).
	c.do("set", key("x"), "kept")
	var b []byte
	b = append(b, 1, 0x80) // RDB_TYPE_LIST, 13,000 elements
	b = binary.BigEndian.AppendUint32(b, 13000)
	for range 13000 {
		b = append(b, 1, 'e')
	}
	expect(t, c.do("restore", key("x"), "0", payloadOf(string(b)), "replace"),
		rerr(fmt.Sprintf("ERR the payload holds more than 11997 elements, more than one command may write (at most %d records and %d bytes to storage)", shardkv.EntryMaxRecords, shardkv.EntryMaxBytes)))
	b = append([]byte{1, 0x80}, binary.BigEndian.AppendUint32(nil, 11000)...)
	for range 11000 {
		b = append(append(b, 0x40|200>>8, 200&0xFF), strings.Repeat("v", 200)...)
	}
	r, _ := c.do("restore", key("x"), "0", payloadOf(string(b)), "replace").(rerr)
	if !strings.HasPrefix(string(r), "ERR the command's 11000 elements may write 22005 records") {
		t.Errorf("RESTORE of 11,000 elements of 200 bytes: %q", r)
	}
	// Three values of 900 KB: past the entry's bytes.
	b = []byte{4, 3}
	for i := range 3 {
		b = append(b, 1, byte('a'+i), 0x80)
		b = append(binary.BigEndian.AppendUint32(b, 900_000), strings.Repeat("v", 900_000)...)
	}
	r, _ = c.do("restore", key("x"), "0", payloadOf(string(b)), "replace").(rerr)
	if !strings.HasPrefix(string(r), "ERR the command's 3 fields may write") {
		t.Errorf("RESTORE of 3 values of 900 KB: %q", r)
	}
	// An element past the value limit.
	b = []byte{2, 1, 0x80}
	b = append(binary.BigEndian.AppendUint32(b, shardkv.DefaultMaxValueBytes+1), strings.Repeat("m", shardkv.DefaultMaxValueBytes+1)...)
	expect(t, c.do("restore", key("x"), "0", payloadOf(string(b)), "replace"),
		rerr("ERR string exceeds maximum allowed size (the server's value limit)"))
	// A member too long for a key.
	b = []byte{2, 1, 0x80}
	b = append(binary.BigEndian.AppendUint32(b, 70000), strings.Repeat("m", 70000)...)
	r, _ = c.do("restore", key("x"), "0", payloadOf(string(b)), "replace").(rerr)
	if !strings.HasPrefix(string(r), "ERR key and member of 70005 bytes together exceed the limit of") {
		t.Errorf("RESTORE of a member of 70,000 bytes: %q", r)
	}
	expect(t, c.do("get", key("x")), "kept")
	// Without REPLACE, BUSYKEY comes first.
	expect(t, c.do("restore", key("x"), "0", payloadOf(string(b))), rerr("BUSYKEY Target key name already exists."))
}

// payloadOf frames an RDB object as DUMP does: RDB version 10, CRC-64.
func payloadOf(obj string) string {
	b := binary.LittleEndian.AppendUint16([]byte(obj), 10)
	var crc uint64
	for _, x := range b {
		crc = jones[byte(crc)^x] ^ (crc >> 8)
	}
	return string(binary.LittleEndian.AppendUint64(b, crc))
}

var jones = crc64.MakeTable(0x95AC9329AC4BC9B5)
