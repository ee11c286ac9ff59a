package resp

import (
	"strconv"

	"github.com/tidwall/redcon"
)

// Replies whose shape depends on the connection's protocol: RESP2 by
// default, RESP3 after HELLO 3. Only these differ for the commands served:
// a null, a map (a flat array of pairs in RESP2), a set (COMMAND's flags,
// categories, tips and key specs), and the free text of INFO, CLIENT
// INFO/LIST and CLUSTER INFO/NODES (a verbatim string in RESP3, a bulk
// string in RESP2), as Redis 7.0 sends them.

// null is a missing value.
func (c *conn) null() []byte { return c.appendNull(nil) }

func (c *conn) appendNull(b []byte) []byte {
	if c.resp3.Load() {
		return append(b, "_\r\n"...)
	}
	return redcon.AppendNull(b)
}

// appendMap starts a map of n pairs.
func (c *conn) appendMap(b []byte, n int) []byte {
	if c.resp3.Load() {
		return append(strconv.AppendInt(append(b, '%'), int64(n), 10), '\r', '\n')
	}
	return redcon.AppendArray(b, 2*n)
}

// appendVerbatim appends free text.
func (c *conn) appendVerbatim(b []byte, s string) []byte {
	if c.resp3.Load() {
		b = strconv.AppendInt(append(b, '='), int64(len(s)+4), 10)
		return append(append(append(b, "\r\ntxt:"...), s...), '\r', '\n')
	}
	return redcon.AppendBulkString(b, s)
}

// appendSetLen starts a set of n elements (an array in RESP2).
func (c *conn) appendSetLen(b []byte, n int) []byte {
	if c.resp3.Load() {
		return append(strconv.AppendInt(append(b, '~'), int64(n), 10), '\r', '\n')
	}
	return redcon.AppendArray(b, n)
}

// appendSet appends a set of strings, each by add (as a status or bulk).
func (c *conn) appendSet(b []byte, l []string, add func([]byte, string) []byte) []byte {
	b = c.appendSetLen(b, len(l))
	for _, s := range l {
		b = add(b, s)
	}
	return b
}

// appendDouble appends a double as Redis 7.0's addReplyDouble: a RESP3
// double, or in RESP2 a bulk string ("%.17g", inf, -inf).
func (c *conn) appendDouble(b []byte, f float64) []byte {
	if c.resp3.Load() {
		return append(append(append(b, ','), formatDouble(f)...), '\r', '\n')
	}
	return redcon.AppendBulkString(b, formatDouble(f))
}
