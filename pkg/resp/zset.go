package resp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/shardkv/shardkv/pkg/resp/acl"
	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Sorted-set commands (docs/redis.md, Sorted sets). Writes are ops of the
// pipeline's write batches (ZADD, ZREM, ZPOPMIN/ZPOPMAX, ZREMRANGE, and
// the stores ZSTORE and ZRANGESTORE, which the engine computes in the
// entry that writes them), checked here against the group's limits before
// anything is proposed.
// Reads are ReadElems calls made when the command runs, after what the
// pipeline has pending, bounded by MaxReplyBytes and the output budget as
// the hash reads are. ZUNION, ZINTER, ZDIFF and ZINTERCARD read their
// sources at one point of the log (ReadElemsOf) and combine them here, as
// Redis's zunionInterDiffGenericCommand does.
//
// Scores are parsed as Redis 7.0 parses them (strtod: string2d for scores,
// increments and weights; zslParseRange for score bounds) and shown as it
// shows them (addReplyDouble: "%.17g", inf and -inf; a RESP3 double after
// HELLO 3).

// zset-max-listpack-entries and zset-max-listpack-value (CONFIG SET,
// config.go; Redis 7.0's 128 and 64): a sorted set with more members, or a
// member longer, is a skiplist (OBJECT ENCODING; ZSCAN returns a small one
// whole, in score order, as Redis does a listpack).

// Redis's RDB type of a sorted set of plain strings with binary scores
// (DUMP).
const rdbTypeZSet2 = 5

// zsetMemberExtra is what a member's stored forms add to the key and the
// member beyond a hash field's: its score index entry ('s' score:8).
const zsetMemberExtra = 9

// zsetCommands is the sorted-set part of the command table, with Redis
// 7.0's arity, flags, ACL categories, tips and key specs.
func zsetCommands() []*command {
	var (
		fRO      = []string{"readonly", "fast"}
		fROSlow  = []string{"readonly"}
		fWrite   = []string{"write", "fast"}
		fWriteDO = []string{"write", "denyoom", "fast"}
		aR       = []string{"@read", "@sortedset", "@fast"}
		aRS      = []string{"@read", "@sortedset", "@slow"}
		aW       = []string{"@write", "@sortedset", "@fast"}
		aWS      = []string{"@write", "@sortedset", "@slow"}
		ro       = []string{"RO", "access"}
		nondet   = []string{"nondeterministic_output"}
	)
	key1 := func(name string, arity int, flags, acl, tips, keyFlags []string, run handler) *command {
		return &command{name: name, arity: arity, flags: flags, first: 1, last: 1, step: 1, acl: acl, tips: tips, keyFlags: keyFlags, run: run}
	}
	// ZUNION, ZINTER, ZDIFF, ZINTERCARD: numkeys key [key ...]
	// (movablekeys: a keynum key spec).
	byCount := func(name string, run handler) *command {
		return &command{name: name, arity: -3, flags: []string{"readonly", "movablekeys"}, acl: aRS,
			specs:  []keySpec{{flags: ro, index: 1, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: func(args [][]byte) [][]byte { return keysByCount(args, 1) }, run: run}
	}
	// ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE: dst numkeys key [key ...].
	byCountStore := func(name string) *command {
		return &command{name: name, arity: -4, flags: []string{"write", "denyoom", "movablekeys"}, first: 1, last: 1, step: 1, acl: aWS,
			specs:  []keySpec{{flags: []string{"OW", "update"}, index: 1, step: 1}, {flags: ro, index: 2, keyNum: true, numIdx: 0, firstKy: 1, step: 1}},
			keysOf: zstoreKeys, run: cmdZStore}
	}
	return []*command{
		key1("zadd", -4, fWriteDO, aW, nil, []string{"RW", "update"}, cmdZAdd),
		key1("zincrby", 4, fWriteDO, aW, nil, []string{"RW", "access", "update"}, cmdZAdd),
		key1("zrem", -3, fWrite, aW, nil, []string{"RW", "delete"}, cmdZRem),
		key1("zpopmin", -2, fWrite, aW, nil, []string{"RW", "access", "delete"}, cmdZPop),
		key1("zpopmax", -2, fWrite, aW, nil, []string{"RW", "access", "delete"}, cmdZPop),
		key1("zremrangebyrank", 4, []string{"write"}, aWS, nil, []string{"RW", "delete"}, cmdZRemRange),
		key1("zremrangebyscore", 4, []string{"write"}, aWS, nil, []string{"RW", "delete"}, cmdZRemRange),
		key1("zremrangebylex", 4, []string{"write"}, aWS, nil, []string{"RW", "delete"}, cmdZRemRange),
		key1("zcard", 2, fRO, aR, nil, []string{"RO"}, cmdZCard),
		key1("zscore", 3, fRO, aR, nil, ro, cmdZScore),
		key1("zmscore", -3, fRO, aR, nil, ro, cmdZScore),
		key1("zcount", 4, fRO, aR, nil, ro, cmdZCount),
		key1("zlexcount", 4, fRO, aR, nil, ro, cmdZCount),
		key1("zrank", 3, fRO, aR, nil, ro, cmdZRank),
		key1("zrevrank", 3, fRO, aR, nil, ro, cmdZRank),
		key1("zrange", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zrevrange", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zrangebyscore", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zrevrangebyscore", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zrangebylex", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zrevrangebylex", -4, fROSlow, aRS, nil, ro, cmdZRange),
		key1("zscan", -3, fROSlow, aRS, nondet, ro, cmdZScan),
		key1("zrandmember", -2, fROSlow, aRS, nondet, ro, cmdZRandMember),
		byCount("zunion", cmdZSetOp),
		byCount("zinter", cmdZSetOp),
		byCount("zdiff", cmdZSetOp),
		byCount("zintercard", cmdZSetOp),
		{name: "zrangestore", arity: -5, flags: []string{"write", "denyoom"}, first: 1, last: 2, step: 1, acl: aWS,
			specs: []keySpec{{flags: []string{"OW", "update"}, index: 1, step: 1}, {flags: ro, index: 2, step: 1}}, run: cmdZRangeStore},
		byCountStore("zunionstore"),
		byCountStore("zinterstore"),
		byCountStore("zdiffstore"),
	}
}

// --- scores ---

func isCSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHexDigit(c byte) bool { return isDigit(c) || ('a' <= c|0x20 && c|0x20 <= 'f') }

// hasPrefixFold reports whether s starts with p (lower case), ignoring
// ASCII case.
func hasPrefixFold(s []byte, p string) bool {
	if len(s) < len(p) {
		return false
	}
	for i := range len(p) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != p[i] {
			return false
		}
	}
	return true
}

// cStrtod parses the longest prefix of s that glibc's strtod reads: white
// space, a sign, then inf, infinity, nan or nan(chars), a hexadecimal float
// (0x, digits, an optional p exponent) or a decimal one. It returns the
// value, how many bytes were read (0: no number) and whether strtod sets
// ERANGE (an overflow, or a nonzero number that underflows to zero; the
// callers care about no other case). NUL is not part of a number, so a C
// string's end needs no special case.
func cStrtod(s []byte) (float64, int, bool) {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	signed := func(f float64) float64 {
		if neg {
			return -f
		}
		return f
	}
	switch {
	case hasPrefixFold(s[i:], "inf"):
		i += 3
		if hasPrefixFold(s[i:], "inity") {
			i += 5
		}
		return signed(math.Inf(1)), i, false
	case hasPrefixFold(s[i:], "nan"):
		i += 3
		if i < len(s) && s[i] == '(' {
			j := i + 1
			for j < len(s) && (isDigit(s[j]) || ('a' <= s[j]|0x20 && s[j]|0x20 <= 'z') || s[j] == '_') {
				j++
			}
			if j < len(s) && s[j] == ')' {
				i = j + 1
			}
		}
		return math.NaN(), i, false
	case i+1 < len(s) && s[i] == '0' && s[i+1]|0x20 == 'x':
		j := i + 2
		var mant []byte
		digits, nonzero := 0, false
		for j < len(s) && isHexDigit(s[j]) {
			nonzero = nonzero || s[j] != '0'
			mant, j, digits = append(mant, s[j]), j+1, digits+1
		}
		if j < len(s) && s[j] == '.' {
			mant, j = append(mant, '.'), j+1
			for j < len(s) && isHexDigit(s[j]) {
				nonzero = nonzero || s[j] != '0'
				mant, j, digits = append(mant, s[j]), j+1, digits+1
			}
		}
		if digits == 0 {
			return signed(0), i + 1, false // the 0 of "0x"
		}
		exp := "0"
		if j < len(s) && s[j]|0x20 == 'p' {
			k := j + 1
			if k < len(s) && (s[k] == '+' || s[k] == '-') {
				k++
			}
			if k < len(s) && isDigit(s[k]) {
				for k < len(s) && isDigit(s[k]) {
					k++
				}
				exp, j = string(s[j+1:k]), k
			}
		}
		return strtodValue("0x"+string(mant)+"p"+exp, neg, nonzero, j)
	}
	j := i
	digits, nonzero := 0, false
	for j < len(s) && isDigit(s[j]) {
		nonzero = nonzero || s[j] != '0'
		j, digits = j+1, digits+1
	}
	if j < len(s) && s[j] == '.' {
		j++
		for j < len(s) && isDigit(s[j]) {
			nonzero = nonzero || s[j] != '0'
			j, digits = j+1, digits+1
		}
	}
	if digits == 0 {
		return 0, 0, false
	}
	if j < len(s) && s[j]|0x20 == 'e' {
		k := j + 1
		if k < len(s) && (s[k] == '+' || s[k] == '-') {
			k++
		}
		if k < len(s) && isDigit(s[k]) {
			for k < len(s) && isDigit(s[k]) {
				k++
			}
			j = k
		}
	}
	return strtodValue(string(s[i:j]), neg, nonzero, j)
}

// strtodValue converts the number cStrtod found (text: without its sign,
// in a form strconv reads; nonzero: a nonzero digit in its mantissa).
func strtodValue(text string, neg, nonzero bool, n int) (float64, int, bool) {
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !math.IsInf(f, 0) {
		f = 0 // not expected: the text is well formed
	}
	erange := math.IsInf(f, 0) || f == 0 && nonzero
	if neg {
		f = -f
	}
	return f, n, erange
}

// parseScore parses a score, an increment or a weight as Redis's string2d
// does: the whole argument one number strtod reads, not starting with
// white space, not NaN, and neither overflowing nor underflowing to zero.
func parseScore(b []byte) (float64, bool) {
	if len(b) == 0 || isCSpace(b[0]) {
		return 0, false
	}
	f, n, erange := cStrtod(b)
	if n != len(b) || math.IsNaN(f) || erange && (math.IsInf(f, 0) || f == 0) {
		return 0, false
	}
	return f, true
}

// cString is b up to its first NUL, as C code that takes an argument as
// a string sees it.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// parseScoreBound parses a bound of a score range as Redis's
// zslParseRange: "(" makes it exclusive, and the rest (as a C string) must
// be all that strtod reads (white space before it, an empty string: 0;
// out of range: the infinity or 0 strtod gives), but not NaN.
func parseScoreBound(b []byte) (shardkv.Bound, bool) {
	kind := shardkv.BoundIncl
	if len(b) > 0 && b[0] == '(' {
		kind, b = shardkv.BoundExcl, b[1:]
	}
	b = cString(b)
	f, n, _ := cStrtod(b)
	if n != len(b) || math.IsNaN(f) {
		return shardkv.Bound{}, false
	}
	return shardkv.Bound{Kind: kind, Score: f}, true
}

// parseLexBound parses a bound of a lex range as Redis's
// zslParseLexRangeItem: "-" and "+" (alone, as C strings), "[member" or
// "(member".
func parseLexBound(b []byte) (shardkv.Bound, bool) {
	if len(b) == 0 {
		return shardkv.Bound{}, false
	}
	switch b[0] {
	case '-', '+':
		if len(b) > 1 && b[1] != 0 {
			return shardkv.Bound{}, false
		}
		if b[0] == '-' {
			return shardkv.Bound{Kind: shardkv.BoundNegInf}, true
		}
		return shardkv.Bound{Kind: shardkv.BoundPosInf}, true
	case '(':
		return shardkv.Bound{Kind: shardkv.BoundExcl, Lex: b[1:]}, true
	case '[':
		return shardkv.Bound{Kind: shardkv.BoundIncl, Lex: b[1:]}, true
	}
	return shardkv.Bound{}, false
}

const (
	errScoreRange = "ERR min or max is not a float"
	errLexRange   = "ERR min or max not valid string range item"
)

// formatDouble is a score as Redis 7.0's addReplyDouble shows it: "%.17g",
// with inf and -inf.
func formatDouble(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	return strconv.FormatFloat(f, 'g', 17, 64)
}

// d2string is a score as Redis 7.0 stores it in a listpack (d2string),
// which ZSCAN of a listpack returns: an integer within ±2^62 as such, else
// as formatDouble.
func d2string(f float64) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0"
		}
		return "0"
	}
	const lim = float64(math.MaxInt64 / 2)
	if f >= -lim && f <= lim && f == math.Trunc(f) {
		return strconv.FormatInt(int64(f), 10)
	}
	return formatDouble(f)
}

// elemScore is an element's score (0 if it has none).
func elemScore(e shardkv.Elem) float64 {
	f, _ := shardkv.ValueScore(e.Value)
	return f
}

// byScore orders members as a sorted set does: by score, then by member.
func byScore(a, b shardkv.Elem) int {
	fa, fb := elemScore(a), elemScore(b)
	switch {
	case fa < fb:
		return -1
	case fa > fb:
		return 1
	}
	return bytes.Compare(a.Field, b.Field)
}

// appendScored appends members, with their scores if withScores, as
// Redis 7.0 replies to ZRANGE ... WITHSCORES: a flat array in RESP2,
// [member, score] pairs in RESP3.
func (c *conn) appendScored(b []byte, elems []shardkv.Elem, withScores bool) []byte {
	pairs := withScores && c.resp3.Load()
	if withScores && !pairs {
		b = redcon.AppendArray(b, 2*len(elems))
	} else {
		b = redcon.AppendArray(b, len(elems))
	}
	for _, e := range elems {
		if pairs {
			b = redcon.AppendArray(b, 2)
		}
		b = redcon.AppendBulk(b, e.Field)
		if withScores {
			b = c.appendDouble(b, elemScore(e))
		}
	}
	return b
}

// zsetEncoding is the encoding Redis 7.0 gives a sorted set of n members
// of which elems are the first (at most zsetListpackEntries of them), long
// if one is known to be longer than zsetListpackValue: a listpack while it
// is small, else a skiplist. Redis never converts a skiplist back; this
// looks at the set as it is.
func (s *Server) zsetEncoding(long bool, n int64, elems []shardkv.Elem) string {
	if long || !s.zsetCompact(n, elems) {
		return "skiplist"
	}
	return "listpack"
}

// zsetCompact reports whether a sorted set of n members, elems among
// them, is one Redis keeps as a listpack.
func (s *Server) zsetCompact(n int64, elems []shardkv.Elem) bool {
	if n > s.tun.get("zset-max-listpack-entries") {
		return false
	}
	lim := int(s.tun.get("zset-max-listpack-value"))
	for _, e := range elems {
		if len(e.Field) > lim {
			return false
		}
	}
	return true
}

// dumpZSet is a sorted set's DUMP payload: RDB_TYPE_ZSET_2 (members and
// binary scores), which Redis loads whatever the encoding it then chooses.
func dumpZSet(elems []shardkv.Elem) []byte {
	b := appendRDBLen([]byte{rdbTypeZSet2}, uint64(len(elems)))
	for _, e := range elems {
		b = append(appendRDBLen(b, uint64(len(e.Field))), e.Field...)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(elemScore(e)))
	}
	b = binary.LittleEndian.AppendUint16(b, rdbVersion)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b))
}

// --- writes ---

// zsetWritten estimates what a sorted-set op writes to storage, for the
// pipeline's batches (pipeline.written): each member's score record and
// its score index entry (deleted and written). ZREMRANGE, ZSTORE and
// ZRANGESTORE write what is known only at apply, and an entry past its
// budget fails whole: each is counted as a whole batch, so it goes alone.
func zsetWritten(op *shardkvpb.WriteOp) int {
	k := len(op.Key)
	w := k + 64
	switch op.Kind {
	case shardkvpb.WriteOp_ZADD, shardkvpb.WriteOp_ZREM:
		for _, f := range op.Fields {
			w += 3 * (k + len(f) + zsetMemberExtra + 40)
		}
	case shardkvpb.WriteOp_ZPOPMIN, shardkvpb.WriteOp_ZPOPMAX:
		w += int(min(op.Delta, 1<<20)) * 2 * (k + 64 + zsetMemberExtra + 40)
	case shardkvpb.WriteOp_ZREMRANGE, shardkvpb.WriteOp_ZSTORE, shardkvpb.WriteOp_ZRANGESTORE:
		w = maxBatchWritten
	}
	return w
}

// zsetCost is a storage record's size as the engine's write budget counts
// it (shardkv's recordCost).
func zsetCost(k, v int) int {
	if v >= 1<<20 {
		v = 12
	}
	return k + v + 12
}

// zsetBase is the records and bytes any sorted-set op may write as the
// engine's budget counts them (shardkv's worstCase): the key's record,
// its three index entries and a possible dead-version mark.
func zsetBase(k int) (records, bytes int) {
	return 5, zsetCost(4+k, 17+16) + zsetCost(3+k, 0) + 2*zsetCost(11+k, 0) + zsetCost(13+k, 1)
}

// zsetElemCost is what the budget counts for one element of a key of k
// bytes (shardkv's addElem): the element (field f, value v) and its
// change index entry.
func zsetElemCost(k, f, v int) int {
	return zsetCost(14+k+f, 1+v) + zsetCost(21+k+f, 0)
}

// zpopLimit is the most members one ZPOPMIN or ZPOPMAX of a key of k
// bytes may pop: the engine's budget counts each at two elements of 64
// and 72 bytes.
func zpopLimit(k int) int64 {
	records, bytes := zsetBase(k)
	per := zsetElemCost(k, 64, 0) + zsetElemCost(k, 72, 0)
	n := min((shardkv.EntryMaxRecords-records)/4, (shardkv.EntryMaxBytes-bytes)/per)
	return int64(max(n, 1))
}

// zsetSizeError checks a ZADD or ZREM against the group's limits: the key,
// each member with the key, and what the command may write against what
// one command may (nil if it fits). Nothing is proposed for a command that
// does not fit.
func (c *conn) zsetSizeError(op *shardkvpb.WriteOp) []byte {
	if e := c.sizeError(op.Key); e != nil {
		return e
	}
	limit := c.s.b.MaxKeyBytes() - fieldOverhead - zsetMemberExtra
	for _, f := range op.Fields {
		if n := len(op.Key) + len(f); n > limit {
			return errReply(fmt.Sprintf("ERR key and member of %d bytes together exceed the limit of %d bytes", n, limit))
		}
	}
	k := len(op.Key)
	records, bytes := zsetBase(k)
	for _, f := range op.Fields {
		records += 6
		bytes += zsetElemCost(k, 1+len(f), 8) + 2*zsetElemCost(k, zsetMemberExtra+len(f), 0)
	}
	if records > shardkv.EntryMaxRecords || bytes > shardkv.EntryMaxBytes {
		return errReply(fmt.Sprintf("ERR the command's %d members may write %d records (%d bytes) to storage; one command may write at most %d records and %d bytes: send fewer members per command",
			len(op.Fields), records, bytes, shardkv.EntryMaxRecords, shardkv.EntryMaxBytes))
	}
	return nil
}

// refuseZSet answers a sorted-set command on key with the error e, found
// before proposing (an argument past the server's limits), unless the key
// holds another type (WRONGTYPE: Redis checks the type first) or none
// (missing: Redis's reply for a missing key).
func (c *conn) refuseZSet(p *pipeline, slot int, key []byte, missing, e []byte) {
	c.readKeys(p, slot, [][]byte{key}, func(v []shardkv.ValueEntry) []byte {
		switch {
		case v[0].Found && v[0].Type != shardkv.TypeZSet:
			return errReply(errWrongType)
		case !v[0].Found:
			return missing
		}
		return e
	})
}

// zaddFlags are ZADD's options (and ZINCRBY's, which is ZADD INCR).
var zaddFlags = map[string]int64{
	"nx": shardkv.ZAddNX, "xx": shardkv.ZAddXX, "gt": shardkv.ZAddGT, "lt": shardkv.ZAddLT,
	"ch": shardkv.ZAddCH, "incr": shardkv.ZAddIncr,
}

// cmdZAdd serves ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member
// [score member ...] and ZINCRBY key increment member, with Redis's checks
// in its order (zaddGenericCommand): the options, the pairs, the options
// together, INCR's single pair, the scores, then the key. The reply: the
// members added (and changed, with CH), or with INCR the new score (nil
// if NX, XX, GT or LT held it back).
func cmdZAdd(c *conn, p *pipeline, args [][]byte, slot int) {
	var flags int64
	if strings.EqualFold(string(args[0]), "zincrby") {
		flags = shardkv.ZAddIncr
	}
	i := 2
	for ; i < len(args); i++ {
		f, ok := zaddFlags[strings.ToLower(string(args[i]))]
		if !ok {
			break
		}
		flags |= f
	}
	n := len(args) - i
	has := func(f int64) bool { return flags&f != 0 }
	switch {
	case n == 0 || n%2 == 1:
		p.reply(errReply(errSyntax))
		return
	case has(shardkv.ZAddNX) && has(shardkv.ZAddXX):
		p.reply(errReply("ERR XX and NX options at the same time are not compatible"))
		return
	case has(shardkv.ZAddNX) && (has(shardkv.ZAddGT) || has(shardkv.ZAddLT)), has(shardkv.ZAddGT) && has(shardkv.ZAddLT):
		p.reply(errReply("ERR GT, LT, and/or NX options at the same time are not compatible"))
		return
	case has(shardkv.ZAddIncr) && n > 2:
		p.reply(errReply("ERR INCR option supports a single increment-element pair"))
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZADD, Key: args[1], Delta: flags}
	for ; i < len(args); i += 2 {
		f, ok := parseScore(args[i])
		if !ok {
			p.reply(errReply(errNotFloat))
			return
		}
		op.Fields = append(op.Fields, args[i+1])
		op.FieldValues = append(op.FieldValues, shardkv.ScoreValue(f))
	}
	if e := c.zsetSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		if !has(shardkv.ZAddIncr) {
			return numReply(r)
		}
		f, ok := shardkv.ValueScore(r[0].Value)
		if !r[0].Ok || !ok {
			return c.null()
		}
		return c.appendDouble(nil, f)
	})
}

// cmdZRem: ZREM key member [member ...], the number of members removed;
// the set goes with its last member. A member too long to be stored is
// not one: it is left out (none left: 0, once the key's type is checked).
func cmdZRem(c *conn, p *pipeline, args [][]byte, slot int) {
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZREM, Key: args[1]}
	limit := c.s.b.MaxKeyBytes() - fieldOverhead - zsetMemberExtra
	for _, m := range args[2:] {
		if len(args[1])+len(m) <= limit {
			op.Fields = append(op.Fields, m)
		}
	}
	if len(op.Fields) == 0 && c.sizeError(op.Key) == nil {
		zero := redcon.AppendInt(nil, 0)
		c.refuseZSet(p, slot, args[1], zero, zero)
		return
	}
	if e := c.zsetSizeError(op); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdZPop serves ZPOPMIN and ZPOPMAX key [count], with Redis's checks in
// its order: the arguments, the count, the key (missing: an empty array),
// its type. The members and their scores: a flat array, or, in RESP3 with
// a count, [member, score] pairs. One command pops at most zpopLimit
// members (one log entry's write budget): a larger count is refused.
func cmdZPop(c *conn, p *pipeline, args [][]byte, slot int) {
	if len(args) > 3 {
		p.reply(errReply(errSyntax))
		return
	}
	kind := shardkvpb.WriteOp_ZPOPMIN
	if strings.EqualFold(string(args[0]), "zpopmax") {
		kind = shardkvpb.WriteOp_ZPOPMAX
	}
	count, hasCount := int64(1), len(args) == 3
	if hasCount {
		n, ok := parseInt(args[2])
		if !ok || n < 0 {
			// getPositiveLongFromObjectOrReply: one error for both.
			p.reply(errReply("ERR value is out of range, must be positive"))
			return
		}
		count = n
	}
	empty := redcon.AppendArray(nil, 0)
	if limit := zpopLimit(len(args[1])); count > limit {
		name := strings.ToUpper(string(args[0]))
		c.refuseZSet(p, slot, args[1], empty, errReply(fmt.Sprintf("ERR %s pops at most %d members per command (one log entry's write budget); pop fewer", name, limit)))
		return
	}
	if count == 0 {
		c.refuseZSet(p, slot, args[1], empty, empty)
		return
	}
	op := &shardkvpb.WriteOp{Kind: kind, Key: args[1], Delta: count}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, func(r []*shardkvpb.WriteResult) []byte {
		vals := r[0].Values
		elems := make([]shardkv.Elem, 0, len(vals)/2)
		for i := 0; i+1 < len(vals); i += 2 {
			elems = append(elems, shardkv.Elem{Field: vals[i], Value: vals[i+1], Found: true})
		}
		if hasCount && c.resp3.Load() {
			return c.appendScored(nil, elems, true)
		}
		b := redcon.AppendArray(nil, 2*len(elems))
		for _, e := range elems {
			b = redcon.AppendBulk(b, e.Field)
			b = c.appendDouble(b, elemScore(e))
		}
		return b
	})
}

// cmdZRemRange serves ZREMRANGEBYRANK key start stop, ZREMRANGEBYSCORE
// key min max and ZREMRANGEBYLEX key min max: the range is checked first,
// as in Redis, then the engine removes it (at most what one log entry may
// write). The number removed; the set goes with its last member.
func cmdZRemRange(c *conn, p *pipeline, args [][]byte, slot int) {
	var by int
	var lo, hi shardkv.Bound
	switch strings.ToLower(string(args[0])) {
	case "zremrangebyrank":
		start, ok1 := parseInt(args[2])
		if !ok1 {
			p.reply(errReply(errNotInteger))
			return
		}
		stop, ok2 := parseInt(args[3])
		if !ok2 {
			p.reply(errReply(errNotInteger))
			return
		}
		by, lo, hi = shardkv.ZByRank, shardkv.Bound{Rank: start}, shardkv.Bound{Rank: stop}
	case "zremrangebyscore":
		var ok1, ok2 bool
		lo, ok1 = parseScoreBound(args[2])
		hi, ok2 = parseScoreBound(args[3])
		if !ok1 || !ok2 {
			p.reply(errReply(errScoreRange))
			return
		}
		by = shardkv.ZByScore
	default:
		var ok1, ok2 bool
		lo, ok1 = parseLexBound(args[2])
		hi, ok2 = parseLexBound(args[3])
		if !ok1 || !ok2 {
			p.reply(errReply(errLexRange))
			return
		}
		by = shardkv.ZByLex
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZREMRANGE, Key: args[1], Delta: int64(by), Fields: [][]byte{lo.Encode(by), hi.Encode(by)}}
	if e := c.sizeError(op.Key); e != nil {
		p.reply(e)
		return
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// --- reads ---

// readZSet serves a read of key's sorted set as q asks: render makes the
// reply (r.Entry.Found false: no such key).
func (c *conn) readZSet(p *pipeline, slot int, key []byte, q shardkv.ElemQuery, render func(r shardkv.ElemsReply) []byte) {
	q.Type = shardkv.TypeZSet
	c.readColl(p, slot, key, q, render)
}

// cmdZCard: ZCARD key, the number of members (0: no key).
func cmdZCard(c *conn, p *pipeline, args [][]byte, slot int) {
	c.readZSet(p, slot, args[1], shardkv.ElemQuery{}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, r.Len)
	})
}

// cmdZScore serves ZSCORE key member (the score, nil if none) and ZMSCORE
// key member [member ...] (an array of them; a missing key is an empty
// set).
func cmdZScore(c *conn, p *pipeline, args [][]byte, slot int) {
	members := args[2:]
	multi := strings.EqualFold(string(args[0]), "zmscore")
	c.readZSet(p, slot, args[1], shardkv.ElemQuery{Fields: members}, func(r shardkv.ElemsReply) []byte {
		score := func(b []byte, i int) []byte {
			if !r.Entry.Found || i >= len(r.Elems) || !r.Elems[i].Found {
				return c.appendNull(b)
			}
			return c.appendDouble(b, elemScore(r.Elems[i]))
		}
		if !multi {
			return score(nil, 0)
		}
		b := redcon.AppendArray(nil, len(members))
		for i := range members {
			b = score(b, i)
		}
		return b
	})
}

// cmdZCount serves ZCOUNT key min max and ZLEXCOUNT key min max: the range
// is checked first, then the key (missing: 0).
func cmdZCount(c *conn, p *pipeline, args [][]byte, slot int) {
	z := &shardkv.ZRange{By: shardkv.ZByScore, Count: -1}
	parse, e := parseScoreBound, errScoreRange
	if strings.EqualFold(string(args[0]), "zlexcount") {
		z.By, parse, e = shardkv.ZByLex, parseLexBound, errLexRange
	}
	var ok1, ok2 bool
	z.Min, ok1 = parse(args[2])
	z.Max, ok2 = parse(args[3])
	if !ok1 || !ok2 {
		p.reply(errReply(e))
		return
	}
	c.readZSet(p, slot, args[1], shardkv.ElemQuery{Z: z, CountOnly: true}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found {
			return redcon.AppendInt(nil, 0)
		}
		return redcon.AppendInt(nil, r.Count)
	})
}

// cmdZRank serves ZRANK and ZREVRANK key member: the member's rank from
// the lowest score (ZREVRANK: the highest), nil if none.
func cmdZRank(c *conn, p *pipeline, args [][]byte, slot int) {
	rev := strings.EqualFold(string(args[0]), "zrevrank")
	c.readZSet(p, slot, args[1], shardkv.ElemQuery{RankOf: args[2], Rev: rev}, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found || r.Rank < 0 {
			return c.null()
		}
		return redcon.AppendInt(nil, r.Rank)
	})
}

// zrangeKinds: what each range command fixes of ZRANGE's options (by and
// rev: -1 if the options choose).
var zrangeKinds = map[string]struct{ by, rev int }{
	"zrange":           {-1, -1},
	"zrangestore":      {-1, -1},
	"zrevrange":        {shardkv.ZByRank, 1},
	"zrangebyscore":    {shardkv.ZByScore, 0},
	"zrevrangebyscore": {shardkv.ZByScore, 1},
	"zrangebylex":      {shardkv.ZByLex, 0},
	"zrevrangebylex":   {shardkv.ZByLex, 1},
}

// parseZRange parses the range of ZRANGE and its older forms (args from
// the source key on: key min max [options]) as Redis's
// zrangeGenericCommand does, in its order: the options left to right
// (no WITHSCORES for ZRANGESTORE: store), LIMIT and WITHSCORES against the
// range's kind, then the range (REV ranges by score or lex are given max
// first). empty is true for a LIMIT with a negative offset, which Redis
// answers with nothing. On an error it returns the reply.
func parseZRange(name string, args [][]byte, store bool) (z *shardkv.ZRange, withScores, empty bool, e []byte) {
	kind := zrangeKinds[name]
	by, rev := kind.by, kind.rev
	offset, limit := int64(0), int64(-1)
	for j := 3; j < len(args); j++ {
		opt := strings.ToLower(string(args[j]))
		switch {
		case opt == "withscores" && !store:
			withScores = true
		case opt == "limit" && len(args)-j-1 >= 2:
			o, ok := parseInt(args[j+1])
			if !ok {
				return nil, false, false, errReply(errNotInteger)
			}
			l, ok := parseInt(args[j+2])
			if !ok {
				return nil, false, false, errReply(errNotInteger)
			}
			offset, limit = o, l
			j += 2
		case opt == "rev" && rev < 0:
			rev = 1
		case opt == "bylex" && by < 0:
			by = shardkv.ZByLex
		case opt == "byscore" && by < 0:
			by = shardkv.ZByScore
		default:
			return nil, false, false, errReply(errSyntax)
		}
	}
	by, rev = max(by, shardkv.ZByRank), max(rev, 0)
	switch {
	case limit != -1 && by == shardkv.ZByRank:
		return nil, false, false, errReply("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX")
	case withScores && by == shardkv.ZByLex:
		return nil, false, false, errReply("ERR syntax error, WITHSCORES not supported in combination with BYLEX")
	}
	z = &shardkv.ZRange{By: by, Rev: rev == 1, Offset: offset, Count: limit}
	lo, hi := args[1], args[2]
	if z.Rev && by != shardkv.ZByRank {
		lo, hi = hi, lo // the range is given as max, min
	}
	var ok1, ok2 bool
	switch by {
	case shardkv.ZByRank:
		if z.Min.Rank, ok1 = parseInt(lo); !ok1 {
			return nil, false, false, errReply(errNotInteger)
		}
		if z.Max.Rank, ok2 = parseInt(hi); !ok2 {
			return nil, false, false, errReply(errNotInteger)
		}
		z.Offset, z.Count = 0, -1
	case shardkv.ZByScore:
		z.Min, ok1 = parseScoreBound(lo)
		z.Max, ok2 = parseScoreBound(hi)
		if !ok1 || !ok2 {
			return nil, false, false, errReply(errScoreRange)
		}
	default:
		z.Min, ok1 = parseLexBound(lo)
		z.Max, ok2 = parseLexBound(hi)
		if !ok1 || !ok2 {
			return nil, false, false, errReply(errLexRange)
		}
	}
	// Redis walks past the end for a negative offset.
	return z, withScores, by != shardkv.ZByRank && offset < 0, nil
}

// cmdZRange serves ZRANGE key min max [BYSCORE|BYLEX] [REV] [WITHSCORES]
// [LIMIT offset count] and the older ZREVRANGE, ZRANGEBYSCORE,
// ZREVRANGEBYSCORE, ZRANGEBYLEX and ZREVRANGEBYLEX (which fix some of
// those options): the range is checked first (parseZRange), then the key
// (missing: an empty array).
func cmdZRange(c *conn, p *pipeline, args [][]byte, slot int) {
	z, withScores, empty, e := parseZRange(strings.ToLower(string(args[0])), args[1:], false)
	if e != nil {
		p.reply(e)
		return
	}
	q := shardkv.ElemQuery{Z: z}
	if empty {
		q.Z = nil // nothing, once the key's type is checked
	}
	c.readZSet(p, slot, args[1], q, func(r shardkv.ElemsReply) []byte {
		if !r.Entry.Found || q.Z == nil {
			return redcon.AppendArray(nil, 0)
		}
		return c.appendScored(nil, r.Elems, withScores)
	})
}

// cmdZRangeStore: ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV]
// [LIMIT offset count], ZRANGE's range (parseZRange) stored at dst in one
// op (the engine's ZRANGESTORE), replacing it whatever its type, or
// deleting it when the range is empty. The number of members stored.
func cmdZRangeStore(c *conn, p *pipeline, args [][]byte, slot int) {
	z, _, empty, e := parseZRange("zrangestore", args[2:], true)
	if e != nil {
		p.reply(e)
		return
	}
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZRANGESTORE, Key: args[2], Dest: args[1], Delta: int64(z.By),
		Fields: [][]byte{z.Min.Encode(z.By), z.Max.Encode(z.By)}, Rev: z.Rev, Offset: z.Offset, Count: z.Count}
	if empty {
		op.Offset, op.Count = 0, 0
	}
	for _, k := range args[1:3] {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// zstoreKeys are the keys of ZUNIONSTORE, ZINTERSTORE and ZDIFFSTORE dst
// numkeys key [key ...] as Redis 7.0 finds them: by the key specs (dst,
// then the sources) when numkeys is a number of keys the arguments hold,
// else by its genericGetKeys fallback (the sources, then dst; none when
// atoi's count is not one either).
func zstoreKeys(args [][]byte) [][]byte {
	srcs := keysByCount(args, 2)
	if srcs == nil {
		return nil
	}
	if n, ok := parseInt(args[2]); ok && n == int64(len(srcs)) {
		return append([][]byte{args[1]}, srcs...)
	}
	return append(slices.Clone(srcs), args[1])
}

// cmdZStore serves ZUNIONSTORE and ZINTERSTORE dst numkeys key [key ...]
// [WEIGHTS weight ...] [AGGREGATE SUM|MIN|MAX] and ZDIFFSTORE dst numkeys
// key [key ...], with Redis's checks in its order: numkeys, the sources'
// types (sorted sets or sets), then the options. The engine computes the
// result and replaces dst with it in one op (ZSTORE); the reply is its
// size.
func cmdZStore(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	n, ok := parseInt(args[2])
	switch {
	case !ok:
		p.reply(errReply(errNotInteger))
		return
	case n < 1:
		p.reply(errReply(fmt.Sprintf("ERR at least 1 input key is needed for '%s' command", name)))
		return
	case n > int64(len(args)-3):
		p.reply(errReply(errSyntax))
		return
	}
	srcs := args[3 : 3+n]
	op := &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_ZSTORE, Key: srcs[0], MoreKeys: srcs[1:], Dest: args[1],
		Delta: shardkv.SetUnion, Aggregate: shardkv.ZAggSum}
	switch name {
	case "zinterstore":
		op.Delta = shardkv.SetInter
	case "zdiffstore":
		op.Delta = shardkv.SetDiff
	}
	diff := op.Delta == shardkv.SetDiff
	var optErr []byte
	for j := 3 + int(n); j < len(args) && optErr == nil; {
		left, opt := len(args)-j, strings.ToLower(string(args[j]))
		switch {
		case !diff && left >= int(n)+1 && opt == "weights":
			op.Weights = make([]float64, n)
			for i := range op.Weights {
				w, ok := parseScore(args[j+1+i])
				if !ok {
					optErr = errReply("ERR weight value is not a float")
					break
				}
				op.Weights[i] = w
			}
			j += 1 + int(n)
		case !diff && left >= 2 && opt == "aggregate":
			switch strings.ToLower(string(args[j+1])) {
			case "sum":
				op.Aggregate = shardkv.ZAggSum
			case "min":
				op.Aggregate = shardkv.ZAggMin
			case "max":
				op.Aggregate = shardkv.ZAggMax
			default:
				optErr = errReply(errSyntax)
			}
			j += 2
		default:
			optErr = errReply(errSyntax)
		}
	}
	if optErr != nil {
		// Redis looks at the sources before the options.
		c.readKeys(p, slot, srcs, func(v []shardkv.ValueEntry) []byte {
			for _, e := range v {
				if e.Found && e.Type != shardkv.TypeZSet && e.Type != shardkv.TypeSet {
					return errReply(errWrongType)
				}
			}
			return optErr
		})
		return
	}
	for _, k := range append([][]byte{args[1]}, srcs...) {
		if e := c.sizeError(k); e != nil {
			p.reply(e)
			return
		}
	}
	writeOps(p, slot, []*shardkvpb.WriteOp{op}, numReply)
}

// cmdZScan: ZSCAN key cursor [MATCH pattern] [COUNT count], in Redis's
// order of checks: the cursor, the key (missing: an empty page, with no
// option checked), its type, then the options. A page holds about COUNT
// members in member order (fewer once it holds MaxReplyBytes), each with
// its score as Redis shows it ("%.17g"). A sorted set of at most 128
// members comes whole, cursor 0, in score order, as Redis returns a
// listpack (with a listpack's integer scores when Redis would keep it
// so). Cursors are HSCAN's (member names).
func cmdZScan(c *conn, p *pipeline, args [][]byte, slot int) {
	cur, err := strconv.ParseUint(string(args[2]), 10, 64)
	if err != nil {
		p.reply(errReply("ERR invalid cursor"))
		return
	}
	after, ok := c.s.decodeHashCursor(cur)
	if !ok {
		p.reply(errReply("ERR invalid cursor"))
		return
	}
	count := int64(10)
	var pattern, optErr []byte
	for i := 3; i < len(args) && optErr == nil; i += 2 {
		more := i+1 < len(args)
		switch opt := string(args[i]); {
		case strings.EqualFold(opt, "count") && more:
			n, ok := parseInt(args[i+1])
			switch {
			case !ok:
				optErr = errReply(errNotInteger)
			case n < 1:
				optErr = errReply(errSyntax)
			default:
				count = n
			}
		case strings.EqualFold(opt, "match") && more:
			pattern = args[i+1]
			if string(pattern) == "*" {
				pattern = nil
			}
		default:
			optErr = errReply(errSyntax)
		}
	}
	pageCount := int(min(count, hashPage*1024))
	first := after == nil
	if first {
		pageCount = max(pageCount, int(min(c.s.tun.get("zset-max-listpack-entries"), maxEncodingRead)))
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s, typ: shardkv.TypeZSet}
	var r shardkv.ElemsReply
	if optErr != nil {
		r, ok = c.readElems(it, args[1], shardkv.ElemQuery{Type: shardkv.TypeZSet}, b) // the key's type only
	} else {
		r, ok = c.readPage(it, shardkv.TypeZSet, args[1], after, pageCount, b)
	}
	switch {
	case !ok:
		return
	case !r.Entry.Found:
		b.release()
		it.out = appendZScanPage(nil, "0", nil, nil, formatDouble)
		return
	case optErr != nil:
		b.release()
		it.out = optErr
		return
	}
	elems, next := r.Elems, r.Next
	format := formatDouble
	if first && next == nil && r.Len <= c.s.tun.get("zset-max-listpack-entries") {
		elems = slices.Clone(elems)
		slices.SortFunc(elems, byScore)
		if c.s.zsetCompact(r.Len, elems) {
			format = d2string
		}
	} else if int64(len(elems)) > count {
		elems = elems[:count]
		next = elems[len(elems)-1].Field
	}
	cursor := "0"
	if next != nil {
		cursor = strconv.FormatUint(c.s.encodeHashCursor(next), 10)
	}
	it.out = appendZScanPage(nil, cursor, elems, pattern, format)
	it.charge += int64(b.used)
}

// appendZScanPage appends a ZSCAN reply: the cursor, then the members
// that match pattern (nil: all), each followed by its score as format
// shows it.
func appendZScanPage(b []byte, cursor string, elems []shardkv.Elem, pattern []byte, format func(float64) string) []byte {
	n := 0
	for _, e := range elems {
		if pattern == nil || acl.Glob(pattern, e.Field, false) {
			n++
		}
	}
	b = redcon.AppendArray(b, 2)
	b = redcon.AppendBulkString(b, cursor)
	b = redcon.AppendArray(b, 2*n)
	for _, e := range elems {
		if pattern == nil || acl.Glob(pattern, e.Field, false) {
			b = redcon.AppendBulk(b, e.Field)
			b = redcon.AppendBulkString(b, format(elemScore(e)))
		}
	}
	return b
}

// cmdZRandMember: ZRANDMEMBER key [count [WITHSCORES]], with Redis's
// checks in its order, picked as HRANDFIELD picks (randomFields). Without
// a count, a member (nil: no key); a count of at least the set's size is
// the whole set, from the highest score down as in Redis; a positive one
// that many distinct members (in that order too), a negative one that
// many picks that may repeat, in random order.
func cmdZRandMember(c *conn, p *pipeline, args [][]byte, slot int) {
	count, withScores, hasCount, refusal := randCountArgs(args, "withscores")
	if refusal != nil {
		p.reply(refusal)
		return
	}
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	picked, ok := c.randomFields(it, shardkv.TypeZSet, args[1], count, hasCount)
	if !ok {
		return
	}
	s := c.s
	if !hasCount {
		if picked.none {
			it.out = c.null()
		} else {
			it.out = redcon.AppendBulk(nil, picked.elems[0].Field)
		}
		it.charge += int64(picked.b.used)
		return
	}
	if count > 0 {
		// Redis iterates a sorted set from its highest score down
		// (zuiInitIterator) when it returns it whole; a sample of
		// distinct members comes in no particular order.
		slices.SortFunc(picked.elems, func(a, b shardkv.Elem) int { return byScore(b, a) })
	}
	b := c.appendScored(nil, picked.elems, withScores)
	if len(b) > s.cfg.MaxReplyBytes {
		picked.b.release()
		it.out = s.errTooLarge(shardkv.TypeZSet)
		return
	}
	it.out = b
	it.charge += int64(picked.b.used)
}

// zsetOps: the set operation of each of ZUNION, ZINTER, ZDIFF and
// ZINTERCARD.
const (
	zopUnion = iota
	zopInter
	zopDiff
	zopInterCard
)

// zsetSource is one source of a set operation: its members with their
// scores, and its weight.
type zsetSource struct {
	elems  []shardkv.Elem
	weight float64
}

// Aggregates (ZUNION and ZINTER's AGGREGATE).
const (
	aggSum = iota
	aggMin
	aggMax
)

// cmdZSetOp serves ZUNION and ZINTER numkeys key [key ...] [WEIGHTS
// weight ...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES], ZDIFF numkeys key
// [key ...] [WITHSCORES] and ZINTERCARD numkeys key [key ...] [LIMIT
// limit], with Redis's checks in its order (zunionInterDiffGenericCommand):
// numkeys, the keys (sorted sets or sets, whose members score 1), then the
// options. The keys are read at one point of the log (ReadElemsOf; sets
// among them at a second point, see docs/redis.md) and combined here.
func cmdZSetOp(c *conn, p *pipeline, args [][]byte, slot int) {
	name := strings.ToLower(string(args[0]))
	op := map[string]int{"zunion": zopUnion, "zinter": zopInter, "zdiff": zopDiff, "zintercard": zopInterCard}[name]
	n, ok := parseInt(args[1])
	switch {
	case !ok:
		p.reply(errReply(errNotInteger))
		return
	case n < 1:
		p.reply(errReply(fmt.Sprintf("ERR at least 1 input key is needed for '%s' command", name)))
		return
	case n > int64(len(args)-2):
		p.reply(errReply(errSyntax))
		return
	}
	keys := args[2 : 2+n]
	it := c.startNow(p, slot)
	if it == nil {
		return
	}
	b := &replyBound{s: c.s, typ: shardkv.TypeZSet}
	srcs, ok := c.readSources(it, keys, b)
	if !ok {
		return
	}
	// The options.
	agg, withScores, limit := aggSum, false, int64(0)
	for j := 2 + int(n); j < len(args); {
		left := len(args) - j
		opt := strings.ToLower(string(args[j]))
		switch {
		case op != zopDiff && op != zopInterCard && left >= int(n)+1 && opt == "weights":
			for i := range srcs {
				w, ok := parseScore(args[j+1+i])
				if !ok {
					b.release()
					it.out = errReply("ERR weight value is not a float")
					return
				}
				srcs[i].weight = w
			}
			j += 1 + int(n)
		case op != zopDiff && op != zopInterCard && left >= 2 && opt == "aggregate":
			switch strings.ToLower(string(args[j+1])) {
			case "sum":
				agg = aggSum
			case "min":
				agg = aggMin
			case "max":
				agg = aggMax
			default:
				b.release()
				it.out = errReply(errSyntax)
				return
			}
			j += 2
		case op != zopInterCard && opt == "withscores":
			withScores = true
			j++
		case op == zopInterCard && left >= 2 && opt == "limit":
			l, ok := parseInt(args[j+1])
			if !ok || l < 0 {
				b.release()
				it.out = errReply("ERR LIMIT can't be negative")
				return
			}
			limit = l
			j += 2
		default:
			b.release()
			it.out = errReply(errSyntax)
			return
		}
	}
	result := combineZSets(op, agg, srcs)
	if op == zopInterCard {
		b.release()
		card := int64(len(result))
		if limit > 0 {
			card = min(card, limit)
		}
		it.out = redcon.AppendInt(nil, card)
		return
	}
	out := c.appendScored(nil, result, withScores)
	if len(out) > c.s.cfg.MaxReplyBytes {
		b.release()
		it.out = c.s.errTooLarge(shardkv.TypeZSet)
		return
	}
	it.out = out
	it.charge += int64(b.used) // what was read for the reply (its copy)
}

// readSources reads the sorted sets or sets at keys, all in one read of
// their slot (sets in a second one: ReadElemsOf reads one type), bounded
// by b. A key of another type is WRONGTYPE; a missing key is an empty
// source. On failure it sets it.out and reports false.
func (c *conn) readSources(it *item, keys [][]byte, b *replyBound) ([]zsetSource, bool) {
	s := c.s
	read := func(typ shardkv.ValueType, keys [][]byte) ([]shardkv.ElemsReply, bool) {
		ctx, cancel := s.roundContext(s.cfg.ReadTimeout, it)
		defer cancel()
		rs, err := s.b.ReadElemsOf(ctx, keys, shardkv.ElemQuery{Type: typ, All: true}, c.readonly, b.reserve)
		if err == nil && len(rs) != len(keys) {
			err = fmt.Errorf("backend returned %d replies for %d keys", len(rs), len(keys))
		}
		if err != nil {
			c.readNowFailed(ctx, it, err, b)
			return nil, false
		}
		return rs, true
	}
	rs, ok := read(shardkv.TypeZSet, keys)
	if !ok {
		return nil, false
	}
	var setKeys [][]byte
	var setAt []int
	srcs := make([]zsetSource, len(keys))
	for i, r := range rs {
		srcs[i] = zsetSource{weight: 1}
		switch {
		case !r.Entry.Found:
		case r.Entry.Type == shardkv.TypeZSet:
			srcs[i].elems = r.Elems
		case r.Entry.Type == shardkv.TypeSet:
			setKeys, setAt = append(setKeys, keys[i]), append(setAt, i)
		default:
			b.release()
			it.out = errReply(errWrongType)
			return nil, false
		}
	}
	if len(setKeys) == 0 {
		return srcs, true
	}
	sets, ok := read(shardkv.TypeSet, setKeys)
	if !ok {
		return nil, false
	}
	one := shardkv.ScoreValue(1)
	for j, r := range sets {
		switch {
		case !r.Entry.Found:
		case r.Entry.Type == shardkv.TypeSet:
			elems := make([]shardkv.Elem, len(r.Elems))
			for k, e := range r.Elems {
				elems[k] = shardkv.Elem{Field: e.Field, Value: one, Found: true}
			}
			srcs[setAt[j]].elems = elems
		case r.Entry.Type == shardkv.TypeZSet:
			// A set then, a sorted set now: its members are unknown here.
			b.release()
			s.stats.refused.Add(1)
			it.out = errReply("TRYAGAIN the key changed type while it was read; please retry")
			return nil, false
		default:
			b.release()
			it.out = errReply(errWrongType)
			return nil, false
		}
	}
	return srcs, true
}

// combineZSets computes ZUNION, ZINTER (ZINTERCARD) or ZDIFF of srcs as
// Redis 7.0 does: union and intersection take the sources from the
// smallest (a stable sort, as glibc's qsort), each score times its
// source's weight (NaN: 0), combined by agg (a sum of opposite infinities
// is 0); the difference keeps the first source's members that no other
// has, with their scores. The result is in score order, then member order.
func combineZSets(op, agg int, srcs []zsetSource) []shardkv.Elem {
	weighted := func(e shardkv.Elem, w float64) float64 {
		f := elemScore(e) * w
		if math.IsNaN(f) {
			return 0
		}
		return f
	}
	aggregate := func(target *float64, v float64) {
		switch agg {
		case aggSum:
			*target += v
			if math.IsNaN(*target) {
				*target = 0
			}
		case aggMin:
			if v < *target {
				*target = v
			}
		case aggMax:
			if v > *target {
				*target = v
			}
		}
	}
	find := func(src zsetSource, member []byte) (shardkv.Elem, bool) {
		i, ok := slices.BinarySearchFunc(src.elems, member, func(e shardkv.Elem, m []byte) int { return bytes.Compare(e.Field, m) })
		if !ok {
			return shardkv.Elem{}, false
		}
		return src.elems[i], true
	}
	for _, src := range srcs {
		// Member order (ReadElems returns it; sets too), for find.
		if !slices.IsSortedFunc(src.elems, func(a, b shardkv.Elem) int { return bytes.Compare(a.Field, b.Field) }) {
			slices.SortFunc(src.elems, func(a, b shardkv.Elem) int { return bytes.Compare(a.Field, b.Field) })
		}
	}
	var out []shardkv.Elem
	add := func(member []byte, score float64) {
		out = append(out, shardkv.Elem{Field: member, Value: shardkv.ScoreValue(score), Found: true})
	}
	if op != zopDiff {
		srcs = slices.Clone(srcs)
		slices.SortStableFunc(srcs, func(a, b zsetSource) int { return len(a.elems) - len(b.elems) })
	}
	switch op {
	case zopInter, zopInterCard:
		for _, e := range srcs[0].elems {
			score := weighted(e, srcs[0].weight)
			all := true
			for _, src := range srcs[1:] {
				o, ok := find(src, e.Field)
				if !ok {
					all = false
					break
				}
				// Redis: the other source's score times its weight, NaN
				// left to the aggregate.
				aggregate(&score, elemScore(o)*src.weight)
			}
			if all {
				add(e.Field, score)
			}
		}
	case zopUnion:
		acc := map[string]int{} // member: its index in out
		for _, src := range srcs {
			for _, e := range src.elems {
				score := weighted(e, src.weight)
				if i, ok := acc[string(e.Field)]; ok {
					f := elemScore(out[i])
					aggregate(&f, score)
					out[i].Value = shardkv.ScoreValue(f)
					continue
				}
				acc[string(e.Field)] = len(out)
				add(e.Field, score)
			}
		}
	case zopDiff:
		for _, e := range srcs[0].elems {
			found := false
			for _, src := range srcs[1:] {
				if _, found = find(src, e.Field); found {
					break
				}
			}
			if !found {
				add(e.Field, elemScore(e))
			}
		}
	}
	slices.SortFunc(out, byScore)
	return out
}
