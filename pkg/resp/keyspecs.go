package resp

import (
	"github.com/tidwall/redcon"
)

// Key specs beyond what a command's first/last/step (and destFlags)
// describe: commands whose keys have specs of their own, as SINTERSTORE's
// destination and sources, and commands whose keys are found from a count
// among their arguments (Redis's "movablekeys": SINTERCARD, LMPOP, BLMPOP).

// keySpec is one key spec of Redis 7: an index begin_search, then a range
// find_keys (lastKey relative to index, or from the end when negative;
// step), or, with keyNum, a keynum find_keys (the count at index+numIdx,
// the keys from index+firstKey every step).
type keySpec struct {
	flags []string
	// unknown: begin_search and find_keys of type unknown (SORT's BY, GET
	// and STORE keys), with notes.
	unknown bool
	notes   string
	index   int
	lastKey int
	step    int
	keyNum  bool
	numIdx  int
	firstKy int
}

// appendSpec appends ks as COMMAND shows it.
func (c *conn) appendSpec(b []byte, ks keySpec) []byte {
	if ks.unknown {
		b = c.appendMap(b, 4)
		b = redcon.AppendBulkString(b, "notes")
		b = redcon.AppendBulkString(b, ks.notes)
		b = redcon.AppendBulkString(b, "flags")
		b = c.appendSet(b, ks.flags, redcon.AppendString)
		for _, part := range []string{"begin_search", "find_keys"} {
			b = redcon.AppendBulkString(b, part)
			b = c.appendMap(b, 2)
			b = redcon.AppendBulkString(b, "type")
			b = redcon.AppendBulkString(b, "unknown")
			b = redcon.AppendBulkString(b, "spec")
			b = c.appendMap(b, 0)
		}
		return b
	}
	if !ks.keyNum {
		return c.appendKeySpec(b, ks.flags, "", ks.index, ks.lastKey, ks.step)
	}
	b = c.appendMap(b, 3)
	b = redcon.AppendBulkString(b, "flags")
	b = c.appendSet(b, ks.flags, redcon.AppendString)
	b = redcon.AppendBulkString(b, "begin_search")
	b = c.appendMap(b, 2)
	b = redcon.AppendBulkString(b, "type")
	b = redcon.AppendBulkString(b, "index")
	b = redcon.AppendBulkString(b, "spec")
	b = c.appendMap(b, 1)
	b = redcon.AppendBulkString(b, "index")
	b = redcon.AppendInt(b, int64(ks.index))
	b = redcon.AppendBulkString(b, "find_keys")
	b = c.appendMap(b, 2)
	b = redcon.AppendBulkString(b, "type")
	b = redcon.AppendBulkString(b, "keynum")
	b = redcon.AppendBulkString(b, "spec")
	b = c.appendMap(b, 3)
	b = redcon.AppendBulkString(b, "keynumidx")
	b = redcon.AppendInt(b, int64(ks.numIdx))
	b = redcon.AppendBulkString(b, "firstkey")
	b = redcon.AppendInt(b, int64(ks.firstKy))
	b = redcon.AppendBulkString(b, "keystep")
	b = redcon.AppendInt(b, int64(ks.step))
	return b
}

// keysByCount returns the keys of a command whose key count is at
// args[countAt], the keys following from args[countAt+1], as Redis 7.0
// finds them (getKeysUsingKeySpecs, then its genericGetKeys fallback,
// which reads the count with atoi): none when the count is not a number of
// keys the arguments hold. The command then answers its own error.
func keysByCount(args [][]byte, countAt int) [][]byte {
	if countAt >= len(args) {
		return nil
	}
	first := countAt + 1
	n, ok := parseInt(args[countAt])
	if !ok || n < 0 || n > int64(len(args)-first) || n == 0 {
		// The spec fails; Redis's fallback reads the count with atoi
		// ("2abc" is 2) and wants at least one key.
		n = atoi(args[countAt])
		if n < 1 || n > int64(len(args)-first) {
			return nil
		}
	}
	return args[first : first+int(n)]
}

// atoi is C's atoi: leading blanks, a sign, the digits that follow (0 if
// none); it wraps as C's does not promise to, and stops at 19 digits.
func atoi(b []byte) int64 {
	i := 0
	for i < len(b) && (b[i] == ' ' || (b[i] >= '\t' && b[i] <= '\r')) {
		i++
	}
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	var n int64
	for d := 0; i < len(b) && b[i] >= '0' && b[i] <= '9' && d < 19; i, d = i+1, d+1 {
		n = n*10 + int64(b[i]-'0')
	}
	if neg {
		return -n
	}
	return n
}
