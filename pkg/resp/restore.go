package resp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// RESTORE's payload decoder: an RDB object of Redis 7.0 (rdb.c's
// rdbLoadObject) of any type shardkv stores. Strings in their three
// encodings (plain, integer, LZF); sets (RDB_TYPE_SET, an intset); lists
// (RDB_TYPE_LIST, quicklists of listpacks or of ziplists, a bare
// ziplist); hashes (RDB_TYPE_HASH, a listpack, a ziplist); sorted sets
// (RDB_TYPE_ZSET and ZSET_2, a listpack, a ziplist). Streams, module
// values and zipmaps (Redis 2.4's hashes) are refused.
//
// The payload is untrusted: every length is checked against what is left
// of it before it is used, a slice made for a count holds no more than
// the bytes left could fill, and what decompression and integers add is
// bounded (restoreLimits). Every blob is validated as Redis does with
// sanitize-dump-payload yes (deep): its header against its size, each
// entry against its end, counts against the entries, and no duplicate
// field or member, so that what Redis would refuse as corrupt is refused
// here too ("Bad data format").

// Redis 7.0's RDB object types beyond those DUMP writes (rdb.h).
const (
	rdbTypeZSet           = 3
	rdbTypeListZiplist    = 10
	rdbTypeSetIntset      = 11
	rdbTypeZSetZiplist    = 12
	rdbTypeHashZiplist    = 13
	rdbTypeListQuicklist  = 14
	rdbTypeHashListpack   = 16
	rdbTypeZSetListpack   = 17
	rdbTypeListQuicklist2 = 18
)

// restoreLimits bounds what a payload may decode to: one string (an
// element, a field, a value), the elements (fields of a hash, members of
// a set or sorted set, elements of a list), and the bytes decoding makes
// beyond the payload's own (LZF's output, integers' decimal texts).
type restoreLimits struct {
	value, elems, total int
}

// restoredValue is a decoded payload: a string's value, or a
// collection's elements (fields of a hash with their values, members of
// a set, elements of a list in order, members of a sorted set with their
// scores). Plain strings are slices of the payload.
type restoredValue struct {
	typ    shardkv.ValueType
	value  []byte
	fields [][]byte
	values [][]byte
	scores []float64
}

// restoreLimitError is a payload that decodes to more than restoreLimits
// allow: the reply names the limit.
type restoreLimitError struct{ msg string }

func (e *restoreLimitError) Error() string { return e.msg }

// errRestoreType is the refusal of an RDB object type shardkv does not
// store.
func errRestoreType(t byte) error {
	return fmt.Errorf("shardkv cannot restore RDB type %d (streams, module values and zipmaps are not supported)", t)
}

// dumpBody checks a payload's trailer (RDB version, CRC-64) and returns
// the RDB object it carries.
func dumpBody(p []byte) ([]byte, error) {
	if len(p) < 10 {
		return nil, errDumpFooter
	}
	body, footer := p[:len(p)-8], p[len(p)-10:]
	if binary.LittleEndian.Uint16(footer) > rdbVersion || binary.LittleEndian.Uint64(footer[2:]) != crc64Jones(body) {
		return nil, errDumpFooter
	}
	return body[:len(body)-2], nil
}

// parseRestorePayload decodes a DUMP payload within lim. Errors:
// errDumpFooter, errBadFormat (Redis's texts), errValueLimit, a
// *restoreLimitError, or errRestoreType's. Bytes after the object are
// ignored, as Redis does.
func parseRestorePayload(p []byte, lim restoreLimits) (*restoredValue, error) {
	body, err := dumpBody(p)
	if err != nil {
		return nil, err
	}
	if len(body) == 0 {
		return nil, errBadFormat
	}
	d := &rdbDecoder{rdbReader: rdbReader{b: body[1:]}, lim: lim}
	v := &restoredValue{}
	switch t := body[0]; t {
	case rdbTypeString:
		v.typ = shardkv.TypeString
		v.value, err = d.str(lim.value)
	case rdbTypeList:
		v.typ = shardkv.TypeList
		err = d.plain(v, false, false)
	case rdbTypeListZiplist, rdbTypeListQuicklist, rdbTypeListQuicklist2:
		v.typ = shardkv.TypeList
		err = d.packedList(v, t)
	case rdbTypeSet:
		v.typ = shardkv.TypeSet
		err = d.plain(v, false, true)
	case rdbTypeSetIntset:
		v.typ = shardkv.TypeSet
		err = d.intset(v)
	case rdbTypeHash:
		v.typ = shardkv.TypeHash
		err = d.plain(v, true, true)
	case rdbTypeHashListpack, rdbTypeHashZiplist, rdbTypeZSetListpack, rdbTypeZSetZiplist:
		v.typ = shardkv.TypeHash
		if t == rdbTypeZSetListpack || t == rdbTypeZSetZiplist {
			v.typ = shardkv.TypeZSet
		}
		err = d.packedPairs(v, t == rdbTypeHashZiplist || t == rdbTypeZSetZiplist)
	case rdbTypeZSet, rdbTypeZSet2:
		v.typ = shardkv.TypeZSet
		err = d.plainZSet(v, t == rdbTypeZSet2)
	case 6, 7, 9, 15, 19: // module values, a zipmap, streams
		return nil, errRestoreType(t)
	default: // not an object type (rdbIsObjectType)
		return nil, errBadFormat
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

// rdbDecoder reads an RDB object's strings and blobs within its limits.
type rdbDecoder struct {
	rdbReader
	lim   restoreLimits
	total int // bytes decoded beyond the payload's own
	elems int
}

// grow accounts for n more bytes made by decoding.
func (d *rdbDecoder) grow(n int) error {
	if n > d.lim.total-d.total {
		return &restoreLimitError{fmt.Sprintf("the payload decodes to more than %d bytes, over the limit of %d bytes for one command", d.lim.total, d.lim.total)}
	}
	d.total += n
	return nil
}

// elem accounts for one more element.
func (d *rdbDecoder) elem() error {
	if d.elems >= d.lim.elems {
		return &restoreLimitError{fmt.Sprintf("the payload holds more than %d elements, more than one command may write (at most %d records and %d bytes to storage)", d.lim.elems, shardkv.EntryMaxRecords, shardkv.EntryMaxBytes)}
	}
	d.elems++
	return nil
}

// count reads a collection's element count: at least one (Redis refuses
// an empty key), and no more than the bytes left could hold (at least
// one each).
func (d *rdbDecoder) count() (int, error) {
	n, enc, ok := d.length()
	if !ok || enc || n == 0 || n > uint64(len(d.b)) {
		return 0, errBadFormat
	}
	return int(n), nil
}

// capFor is a slice capacity for n elements: no more than the bytes left
// or the element limit allow.
func (d *rdbDecoder) capFor(n int) int { return min(n, len(d.b), d.lim.elems) }

// intText is i's decimal text, accounted for.
func (d *rdbDecoder) intText(i int64) ([]byte, error) {
	b := strconv.AppendInt(nil, i, 10)
	return b, d.grow(len(b))
}

// str reads an RDB string of at most limit bytes (rdbGenericLoadStringObject):
// a plain one is a slice of the payload.
func (d *rdbDecoder) str(limit int) ([]byte, error) {
	n, enc, ok := d.length()
	if !ok {
		return nil, errBadFormat
	}
	if !enc {
		switch {
		case n > uint64(len(d.b)):
			return nil, errBadFormat // a short read, in Redis
		case n > uint64(limit):
			return nil, errValueLimit
		}
		v, _ := d.bytes(n)
		return v, nil
	}
	switch n {
	case 0, 1, 2: // an integer of 1, 2 or 4 bytes, little-endian
		raw, ok := d.bytes(1 << n)
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
		return d.intText(i)
	case 3: // LZF: compressed length, original length, data
		clen, e1, ok1 := d.length()
		olen, e2, ok2 := d.length()
		if !ok1 || !ok2 || e1 || e2 || clen > uint64(len(d.b)) {
			return nil, errBadFormat
		}
		if olen > uint64(limit) {
			return nil, errValueLimit
		}
		// LZF makes at most 264 bytes of 3 (a back reference of the
		// longest kind): more cannot be this data's.
		if olen > 88*clen {
			return nil, errBadFormat
		}
		if err := d.grow(int(olen)); err != nil {
			return nil, err
		}
		in, _ := d.bytes(clen)
		return lzfDecompress(in, int(olen))
	}
	return nil, errBadFormat
}

// blob reads a string holding a listpack, a ziplist or an intset: at
// most what the whole payload may decode to.
func (d *rdbDecoder) blob() ([]byte, error) {
	b, err := d.str(d.lim.total)
	if errors.Is(err, errValueLimit) {
		return nil, &restoreLimitError{fmt.Sprintf("the payload decodes to more than %d bytes, over the limit of %d bytes for one command", d.lim.total, d.lim.total)}
	}
	return b, err
}

// packedList: a quicklist (RDB_TYPE_LIST_QUICKLIST_2: a count of nodes,
// each a container kind, 1 plain (one element) or 2 packed (a
// listpack); RDB_TYPE_LIST_QUICKLIST: ziplists), or one ziplist
// (RDB_TYPE_LIST_ZIPLIST). Empty packed nodes are skipped, as Redis does;
// a list left empty is refused.
func (d *rdbDecoder) packedList(v *restoredValue, t byte) error {
	add := func(e []byte) error {
		if err := d.elem(); err != nil {
			return err
		}
		if len(e) > d.lim.value {
			return errValueLimit
		}
		v.fields = append(v.fields, e)
		return nil
	}
	nodes := 1
	if t != rdbTypeListZiplist {
		var err error
		if nodes, err = d.count(); err != nil {
			return err
		}
	}
	for range nodes {
		container := uint64(2)
		if t == rdbTypeListQuicklist2 {
			var enc, ok bool
			if container, enc, ok = d.length(); !ok || enc || container < 1 || container > 2 {
				return errBadFormat
			}
		}
		data, err := d.blob()
		if err != nil {
			return err
		}
		switch {
		case t != rdbTypeListZiplist && len(data) == 0:
			return errBadFormat
		case container == 1:
			err = add(data)
		case t == rdbTypeListQuicklist2:
			err = d.listpack(data, add)
		default:
			err = d.ziplist(data, add)
		}
		if err != nil {
			return err
		}
	}
	if len(v.fields) == 0 {
		return errBadFormat
	}
	return nil
}

// intset: RDB_TYPE_SET_INTSET, a string holding an intset (intset.c):
// its integer width (2, 4 or 8 bytes), its count, then the integers,
// little-endian, ascending.
func (d *rdbDecoder) intset(v *restoredValue) error {
	b, err := d.blob()
	if err != nil {
		return err
	}
	if len(b) < 8 {
		return errBadFormat
	}
	width := uint64(binary.LittleEndian.Uint32(b))
	n := uint64(binary.LittleEndian.Uint32(b[4:]))
	if (width != 2 && width != 4 && width != 8) || n == 0 || 8+n*width != uint64(len(b)) {
		return errBadFormat
	}
	v.fields = make([][]byte, 0, d.capFor(int(n)))
	var prev int64
	for i := range int(n) {
		at := b[8+i*int(width):]
		var x int64
		switch width {
		case 2:
			x = int64(int16(binary.LittleEndian.Uint16(at)))
		case 4:
			x = int64(int32(binary.LittleEndian.Uint32(at)))
		default:
			x = int64(binary.LittleEndian.Uint64(at))
		}
		if i > 0 && x <= prev {
			return errBadFormat // out of order or a duplicate
		}
		prev = x
		if err := d.elem(); err != nil {
			return err
		}
		m, err := d.intText(x)
		if err != nil {
			return err
		}
		v.fields = append(v.fields, m)
	}
	return nil
}

// packedPairs: a hash's or a sorted set's listpack or ziplist, field
// (member) and value (score) in turn.
func (d *rdbDecoder) packedPairs(v *restoredValue, ziplist bool) error {
	b, err := d.blob()
	if err != nil {
		return err
	}
	var first []byte
	odd := false
	add := func(e []byte) error {
		if odd = !odd; odd {
			first = e
			return nil
		}
		if err := d.elem(); err != nil {
			return err
		}
		if len(first) > d.lim.value || len(e) > d.lim.value {
			return errValueLimit
		}
		v.fields = append(v.fields, first)
		if v.typ == shardkv.TypeHash {
			v.values = append(v.values, e)
			return nil
		}
		f, err := packedScore(e)
		v.scores = append(v.scores, f)
		return err
	}
	if ziplist {
		err = d.ziplist(b, add)
	} else {
		err = d.listpack(b, add)
	}
	switch {
	case err != nil:
		return err
	case odd || len(v.fields) == 0:
		return errBadFormat
	}
	return noDuplicates(v.fields)
}

// packedScore is a score as a listpack or ziplist holds it (zzlStrtod):
// the number strtod reads at the start of its first 127 bytes (none: 0),
// not NaN.
func packedScore(e []byte) (float64, error) {
	f, _, _ := cStrtod(cString(e[:min(len(e), 127)]))
	if math.IsNaN(f) {
		return 0, errBadFormat
	}
	return f, nil
}

// plain reads RDB_TYPE_LIST, RDB_TYPE_SET or RDB_TYPE_HASH: a count,
// then each element (a hash's field and value, if pairs); a set's or a
// hash's elements must be distinct (unique).
func (d *rdbDecoder) plain(v *restoredValue, pairs, unique bool) error {
	n, err := d.count()
	if err != nil {
		return err
	}
	v.fields = make([][]byte, 0, d.capFor(n))
	if pairs {
		v.values = make([][]byte, 0, d.capFor(n))
	}
	for range n {
		if err := d.elem(); err != nil {
			return err
		}
		f, err := d.str(d.lim.value)
		if err != nil {
			return err
		}
		v.fields = append(v.fields, f)
		if pairs {
			val, err := d.str(d.lim.value)
			if err != nil {
				return err
			}
			v.values = append(v.values, val)
		}
	}
	if unique {
		return noDuplicates(v.fields)
	}
	return nil
}

// plainZSet: RDB_TYPE_ZSET_2 (a count, then each member and its score, a
// little-endian binary double) or RDB_TYPE_ZSET (the score as text: a
// length byte and the text, 253 NaN, 254 +inf, 255 -inf).
func (d *rdbDecoder) plainZSet(v *restoredValue, binaryScores bool) error {
	n, err := d.count()
	if err != nil {
		return err
	}
	v.fields = make([][]byte, 0, d.capFor(n))
	v.scores = make([]float64, 0, d.capFor(n))
	for range n {
		if err := d.elem(); err != nil {
			return err
		}
		m, err := d.str(d.lim.value)
		if err != nil {
			return err
		}
		var f float64
		if binaryScores {
			raw, ok := d.bytes(8)
			if !ok {
				return errBadFormat
			}
			f = math.Float64frombits(binary.LittleEndian.Uint64(raw))
		} else if f, err = d.textScore(); err != nil {
			return err
		}
		if math.IsNaN(f) {
			return errBadFormat
		}
		v.fields = append(v.fields, m)
		v.scores = append(v.scores, f)
	}
	return noDuplicates(v.fields)
}

// textScore reads an RDB_TYPE_ZSET score (rdbLoadDoubleValue): what
// sscanf's %lg reads of the text.
func (d *rdbDecoder) textScore() (float64, error) {
	h, ok := d.bytes(1)
	if !ok {
		return 0, errBadFormat
	}
	switch h[0] {
	case 253:
		return math.NaN(), nil
	case 254:
		return math.Inf(1), nil
	case 255:
		return math.Inf(-1), nil
	}
	text, ok := d.bytes(uint64(h[0]))
	if !ok {
		return 0, errBadFormat
	}
	f, n, _ := cStrtod(cString(text))
	if n == 0 {
		return 0, errBadFormat
	}
	return f, nil
}

// noDuplicates refuses a set, hash or sorted set that names a member or
// field twice (Redis: "Duplicate ... detected", or with deep
// sanitization for listpacks). It sorts a copy of the headers only.
func noDuplicates(fields [][]byte) error {
	s := slices.Clone(fields)
	slices.SortFunc(s, bytes.Compare)
	for i := 1; i < len(s); i++ {
		if bytes.Equal(s[i-1], s[i]) {
			return errBadFormat
		}
	}
	return nil
}

// listpack calls each for every entry of lp (listpack.c, Redis 7.0): a
// 6-byte header (total bytes, 32 bits; entry count, 16 bits, 65535:
// unknown), the entries, and a 0xFF terminator. An entry is its encoding
// and data, then its length (of encoding and data) backwards in 7-bit
// groups. A string entry is a slice of lp; an integer's is its decimal
// text.
func (d *rdbDecoder) listpack(lp []byte, each func([]byte) error) error {
	if len(lp) < 7 || binary.LittleEndian.Uint32(lp) != uint32(len(lp)) || uint64(len(lp)) > math.MaxUint32 || lp[len(lp)-1] != 0xFF {
		return errBadFormat
	}
	want := int(binary.LittleEndian.Uint16(lp[4:]))
	end := len(lp) - 1 // the terminator
	count := 0
	for p := 6; p < end; count++ {
		rest := lp[p:end]
		b := rest[0]
		var head, size int // encoding bytes; encoding and data
		var str bool
		var x int64
		switch {
		case b < 0x80: // 7-bit unsigned
			head, size, x = 1, 1, int64(b)
		case b < 0xC0: // string, 6-bit length
			head, str = 1, true
			size = 1 + int(b&0x3F)
		case b < 0xE0: // 13-bit signed
			head, size = 1, 2
		case b < 0xF0: // string, 12-bit length
			head, str = 2, true
			if len(rest) >= 2 {
				size = 2 + (int(b&0x0F)<<8 | int(rest[1]))
			}
		case b == 0xF0: // string, 32-bit length
			head, str = 5, true
			if len(rest) >= 5 {
				n := uint64(binary.LittleEndian.Uint32(rest[1:]))
				if n > uint64(len(rest)) {
					return errBadFormat
				}
				size = 5 + int(n)
			}
		case b == 0xF1:
			head, size = 1, 3
		case b == 0xF2:
			head, size = 1, 4
		case b == 0xF3:
			head, size = 1, 5
		case b == 0xF4:
			head, size = 1, 9
		default:
			return errBadFormat
		}
		if size < head || size > len(rest) {
			return errBadFormat
		}
		back := lpBacklen(size)
		if size+len(back) > len(rest) || !bytes.Equal(rest[size:size+len(back)], back) {
			return errBadFormat
		}
		var e []byte
		if str {
			e = rest[head:size]
		} else {
			data := rest[1:size]
			switch b {
			case 0xF1:
				x = int64(int16(binary.LittleEndian.Uint16(data)))
			case 0xF2:
				x = int64(int32(uint32(data[0])<<8|uint32(data[1])<<16|uint32(data[2])<<24) >> 8)
			case 0xF3:
				x = int64(int32(binary.LittleEndian.Uint32(data)))
			case 0xF4:
				x = int64(binary.LittleEndian.Uint64(data))
			default:
				if b >= 0xC0 { // 13 bits, two's complement
					x = int64(b&0x1F)<<8 | int64(data[0])
					if x >= 1<<12 {
						x -= 1 << 13
					}
				}
			}
			var err error
			if e, err = d.intText(x); err != nil {
				return err
			}
		}
		if err := each(e); err != nil {
			return err
		}
		p += size + len(back)
	}
	if want != 65535 && want != count {
		return errBadFormat
	}
	return nil
}

// lpBacklen is how a listpack entry of n bytes (encoding and data)
// records its length after itself (lpEncodeBacklen).
func lpBacklen(n int) []byte {
	switch {
	case n <= 127:
		return []byte{byte(n)}
	case n < 16383:
		return []byte{byte(n >> 7), byte(n&127) | 128}
	case n < 2097151:
		return []byte{byte(n >> 14), byte(n>>7&127) | 128, byte(n&127) | 128}
	case n < 268435455:
		return []byte{byte(n >> 21), byte(n>>14&127) | 128, byte(n>>7&127) | 128, byte(n&127) | 128}
	}
	return []byte{byte(n >> 28), byte(n>>21&127) | 128, byte(n>>14&127) | 128, byte(n>>7&127) | 128, byte(n&127) | 128}
}

// ziplist calls each for every entry of zl (ziplist.c, Redis before 7.0;
// Redis 7.0 still loads it): a 10-byte header (total bytes, the last
// entry's offset, 32 bits each; the entry count, 16 bits, 65535:
// unknown), the entries, and a 0xFF terminator. An entry is the previous
// entry's length (1 byte, or 0xFE and 32 bits), its encoding and its
// data. A string entry is a slice of zl; an integer's is its decimal
// text.
func (d *rdbDecoder) ziplist(zl []byte, each func([]byte) error) error {
	if len(zl) < 11 || binary.LittleEndian.Uint32(zl) != uint32(len(zl)) || uint64(len(zl)) > math.MaxUint32 || zl[len(zl)-1] != 0xFF {
		return errBadFormat
	}
	tail := int(binary.LittleEndian.Uint32(zl[4:]))
	want := int(binary.LittleEndian.Uint16(zl[8:]))
	end := len(zl) - 1
	if tail > end {
		return errBadFormat
	}
	count, prevSize, last := 0, 0, -1
	for p := 10; p < end; count++ {
		rest := zl[p:end]
		prevLen, h := int(rest[0]), 1
		if rest[0] == 0xFE {
			if len(rest) < 5 {
				return errBadFormat
			}
			prevLen, h = int(binary.LittleEndian.Uint32(rest[1:])), 5
		}
		if prevLen != prevSize || h >= len(rest) {
			return errBadFormat
		}
		b := rest[h]
		var head, n int // encoding bytes; data bytes
		str := b < 0xC0
		switch {
		case b < 0x40:
			head, n = 1, int(b)
		case b < 0x80:
			head = 2
			if h+2 <= len(rest) {
				n = int(b&0x3F)<<8 | int(rest[h+1])
			}
		case b < 0xC0:
			head = 5
			if h+5 <= len(rest) {
				u := uint64(binary.BigEndian.Uint32(rest[h+1:]))
				if u > uint64(len(rest)) {
					return errBadFormat
				}
				n = int(u)
			}
		case b == 0xC0:
			head, n = 1, 2
		case b == 0xD0:
			head, n = 1, 4
		case b == 0xE0:
			head, n = 1, 8
		case b == 0xF0:
			head, n = 1, 3
		case b == 0xFE:
			head, n = 1, 1
		case b >= 0xF1 && b <= 0xFD:
			head, n = 1, 0
		default:
			return errBadFormat
		}
		size := h + head + n
		if size > len(rest) {
			return errBadFormat
		}
		data := rest[h+head : size]
		var e []byte
		if str {
			e = data
		} else {
			var x int64
			switch b {
			case 0xC0:
				x = int64(int16(binary.LittleEndian.Uint16(data)))
			case 0xD0:
				x = int64(int32(binary.LittleEndian.Uint32(data)))
			case 0xE0:
				x = int64(binary.LittleEndian.Uint64(data))
			case 0xF0:
				x = int64(int32(uint32(data[0])<<8|uint32(data[1])<<16|uint32(data[2])<<24) >> 8)
			case 0xFE:
				x = int64(int8(data[0]))
			default:
				x = int64(b&0x0F) - 1
			}
			var err error
			if e, err = d.intText(x); err != nil {
				return err
			}
		}
		if err := each(e); err != nil {
			return err
		}
		last, prevSize = p, size
		p += size
	}
	if (last >= 0 && last != tail) || (want != 65535 && want != count) {
		return errBadFormat
	}
	return nil
}

// --- RESTORE's writes ---

// restoreOps are the ops that write a decoded collection at key, in one
// log entry: the key's delete (the old value, whatever its type, goes),
// the elements (HSET, SADD, RPUSH in order, ZADD), then its expiry
// (expireAt: absolute Unix ms; else ttl relative, 0: none).
func restoreOps(key []byte, v *restoredValue, ttl int64, absTTL bool) []*shardkvpb.WriteOp {
	add := &shardkvpb.WriteOp{Key: key, Fields: v.fields}
	switch v.typ {
	case shardkv.TypeHash:
		add.Kind, add.FieldValues = shardkvpb.WriteOp_HSET, v.values
	case shardkv.TypeSet:
		add.Kind = shardkvpb.WriteOp_SADD
	case shardkv.TypeList:
		add.Kind = shardkvpb.WriteOp_RPUSH
	case shardkv.TypeZSet:
		add.Kind = shardkvpb.WriteOp_ZADD
		add.FieldValues = make([][]byte, len(v.scores))
		for i, f := range v.scores {
			add.FieldValues[i] = shardkv.ScoreValue(f)
		}
	}
	ops := []*shardkvpb.WriteOp{{Kind: shardkvpb.WriteOp_DELETE, Key: key}, add}
	switch {
	case ttl > 0 && absTTL:
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Key: key, ExpireAtMs: ttl})
	case ttl > 0:
		ops = append(ops, &shardkvpb.WriteOp{Kind: shardkvpb.WriteOp_EXPIRE, Key: key, TtlMs: &ttl})
	}
	return ops
}

// restoreSizeError checks a restore's ops against the group's limits: the
// key and each element as the type's own write command checks them, then
// the entry as a whole, which holds the delete and the expiry too (nil if
// it fits). Nothing is proposed for a restore that does not fit.
func (c *conn) restoreSizeError(ops []*shardkvpb.WriteOp) []byte {
	add := ops[1]
	var e []byte
	noun := "elements"
	switch add.Kind {
	case shardkvpb.WriteOp_HSET:
		e, noun = c.hashSizeError(add), "fields"
	case shardkvpb.WriteOp_SADD:
		e, noun = c.setSizeError(add), "members"
	case shardkvpb.WriteOp_RPUSH:
		e = c.pushSizeError(add)
	case shardkvpb.WriteOp_ZADD:
		e, noun = c.zsetSizeError(add), "members"
	}
	if e != nil {
		return e
	}
	// The engine's worst case (shardkv's worstCase) for the three ops:
	// the key's record once, with the largest value an op may leave (an
	// EXPIRE's is the value limit), its index entries, one dead-version
	// mark per op, the elements, and the expiry's index entry.
	k := len(add.Key)
	meta := shardkv.CollMetaMaxBytes
	if len(ops) > 2 {
		meta = max(meta, c.s.b.MaxValueBytes())
	}
	var o opCost
	o.add(4+k, 17+meta)
	o.add(3+k, 0)
	o.add(11+k, 0)
	o.add(11+k, 0)
	for range ops {
		o.add(13+k, 1)
	}
	if len(ops) > 2 {
		o.add(11+k, 0)
	}
	for i, f := range add.Fields {
		switch add.Kind {
		case shardkvpb.WriteOp_HSET:
			o.addElem(k, len(f), len(add.FieldValues[i]))
		case shardkvpb.WriteOp_SADD:
			o.addElem(k, len(f), 0)
		case shardkvpb.WriteOp_RPUSH:
			o.addElem(k, 8, len(f))
		case shardkvpb.WriteOp_ZADD:
			o.addElem(k, 1+len(f), 8)
			o.addElem(k, zsetMemberExtra+len(f), 0)
			o.addElem(k, zsetMemberExtra+len(f), 0)
		}
	}
	if !o.fits() {
		return budgetError(o, len(add.Fields), noun)
	}
	return nil
}
