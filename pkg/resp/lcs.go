package resp

import (
	"fmt"
	"strings"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/tidwall/redcon"
)

// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]: the longest
// common subsequence of two strings (in one slot), read at one point of
// the log and computed here as Redis 7.0's lcsCommand computes it (the
// same table, the same walk back, so the same subsequence and matches
// where several are longest).

// lcsMaxCells bounds LCS's table: (len1+1)*(len2+1) cells of 4 bytes, 64
// MiB at most, so two long strings cannot take a replica's memory or
// minutes of its CPU (Redis bounds it by proto-max-bulk-len, 512 MiB).
const lcsMaxCells = 16 << 20

func cmdLCS(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readKeys(p, slot, args[1:3], func(v []shardkv.ValueEntry) []byte {
		if wrongType(v[0]) || wrongType(v[1]) {
			return errReply("ERR The specified keys must contain string values")
		}
		return c.lcsReply(v[0].Value, v[1].Value, args[3:])
	})
}

// lcsReply parses LCS's options (after the type check, as Redis) and
// answers for the strings a and b.
func (c *conn) lcsReply(a, b []byte, opts [][]byte) []byte {
	var getLen, getIdx, withLen bool
	var minLen int64
	for j := 0; j < len(opts); j++ {
		switch o := strings.ToLower(string(opts[j])); {
		case o == "idx":
			getIdx = true
		case o == "len":
			getLen = true
		case o == "withmatchlen":
			withLen = true
		case o == "minmatchlen" && j+1 < len(opts):
			n, ok := parseInt(opts[j+1])
			if !ok {
				return errReply(errNotInteger)
			}
			minLen = max(n, 0)
			j++
		default:
			return errReply(errSyntax)
		}
	}
	if getIdx && getLen {
		return errReply("ERR If you want both the length and indexes, please just use IDX.")
	}
	if cells := int64(len(a)+1) * int64(len(b)+1); cells > lcsMaxCells {
		return errReply(fmt.Sprintf("ERR LCS of strings of %d and %d bytes needs a table of %d cells, over the limit of %d; compare shorter strings",
			len(a), len(b), cells, lcsMaxCells))
	}
	t := lcsTable(a, b)
	n := t.at(len(a), len(b))
	if getLen {
		return redcon.AppendInt(nil, int64(n))
	}
	seq, matches := t.walk(a, b, n)
	if !getIdx {
		return redcon.AppendBulk(nil, seq)
	}
	out := c.appendMap(nil, 2)
	out = redcon.AppendBulkString(out, "matches")
	kept := 0
	for _, m := range matches {
		if m.len() >= minLen {
			kept++
		}
	}
	out = redcon.AppendArray(out, kept)
	for _, m := range matches {
		if m.len() < minLen {
			continue
		}
		out = redcon.AppendArray(out, 2+btoi(withLen))
		out = redcon.AppendArray(out, 2)
		out = redcon.AppendInt(out, m.aStart)
		out = redcon.AppendInt(out, m.aEnd)
		out = redcon.AppendArray(out, 2)
		out = redcon.AppendInt(out, m.bStart)
		out = redcon.AppendInt(out, m.bEnd)
		if withLen {
			out = redcon.AppendInt(out, m.len())
		}
	}
	out = redcon.AppendBulkString(out, "len")
	return redcon.AppendInt(out, int64(n))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lcsCells is the table of LCS lengths: cell (i, j) holds the length of
// the LCS of a[:i] and b[:j].
type lcsCells struct {
	cells []uint32
	width int // len(b)+1
}

func (t *lcsCells) at(i, j int) uint32 { return t.cells[i*t.width+j] }

func lcsTable(a, b []byte) *lcsCells {
	t := &lcsCells{cells: make([]uint32, (len(a)+1)*(len(b)+1)), width: len(b) + 1}
	for i := 1; i <= len(a); i++ {
		row, prev := t.cells[i*t.width:], t.cells[(i-1)*t.width:]
		for j := 1; j <= len(b); j++ {
			if a[i-1] == b[j-1] {
				row[j] = prev[j-1] + 1
			} else {
				row[j] = max(prev[j], row[j-1])
			}
		}
	}
	return t
}

// lcsMatch is one run of the subsequence contiguous in both strings.
type lcsMatch struct{ aStart, aEnd, bStart, bEnd int64 }

func (m lcsMatch) len() int64 { return m.aEnd - m.aStart + 1 }

// walk goes back from the table's last cell as Redis does (on a mismatch,
// up when that cell is strictly longer, else left): the subsequence of n
// bytes, and its runs from the strings' ends back.
func (t *lcsCells) walk(a, b []byte, n uint32) ([]byte, []lcsMatch) {
	seq := make([]byte, n)
	var matches []lcsMatch
	var cur *lcsMatch
	for i, j, k := len(a), len(b), int(n); i > 0 && j > 0; {
		if a[i-1] == b[j-1] {
			k--
			seq[k] = a[i-1]
			if cur == nil {
				cur = &lcsMatch{aStart: int64(i - 1), aEnd: int64(i - 1), bStart: int64(j - 1), bEnd: int64(j - 1)}
			} else {
				cur.aStart, cur.bStart = int64(i-1), int64(j-1)
			}
			i--
			j--
			if i == 0 || j == 0 {
				matches = append(matches, *cur)
				cur = nil
			}
			continue
		}
		if t.at(i-1, j) > t.at(i, j-1) {
			i--
		} else {
			j--
		}
		if cur != nil {
			matches = append(matches, *cur)
			cur = nil
		}
	}
	return seq, matches
}
