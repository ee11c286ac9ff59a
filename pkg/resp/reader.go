package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/tidwall/redcon"
)

// The request reader: RESP multibulk and inline (telnet) commands, as
// Redis 7 reads them (networking.c, processMultibulkBuffer and
// processInlineBuffer), with every length checked at its header, before a
// byte of its data is buffered. redcon's reader is not used for requests:
// its length arithmetic overflows (a panic), it loops over an announced
// argument count, and it waits for whatever length a header announces.

// Redis's fixed limits.
const (
	// maxLineBytes bounds an inline command and a header line
	// (PROTO_INLINE_MAX_SIZE).
	maxLineBytes = 64 << 10
	// DefaultMaxArgs bounds a multibulk count (Redis 6's 1024*1024).
	DefaultMaxArgs = 1 << 20
	// Before AUTH (a password set, not yet given) Redis allows 10
	// arguments and 16 KiB bulks.
	unauthMaxArgs = 10
	unauthMaxBulk = 16 << 10
)

// readInitialBytes is a connection's buffer when idle; it grows (doubling)
// only as far as one command being received needs.
const readInitialBytes = 4 << 10

// protoError is a protocol error: the client is answered "-ERR <it>" and
// disconnected, as Redis does.
type protoError string

func (e protoError) Error() string { return string(e) }

// Redis 7's texts.
const (
	errMultibulkLen   protoError = "Protocol error: invalid multibulk length"
	errUnauthMultiLen protoError = "Protocol error: unauthenticated multibulk length"
	errBulkLen        protoError = "Protocol error: invalid bulk length"
	errUnauthBulkLen  protoError = "Protocol error: unauthenticated bulk length"
	errMbulkLine      protoError = "Protocol error: too big mbulk count string"
	errBulkLine       protoError = "Protocol error: too big bulk count string"
	errInlineLine     protoError = "Protocol error: too big inline request"
	errQuotes         protoError = "Protocol error: unbalanced quotes in request"
)

// errInputBudget: the node's budget for buffered input is spent.
var errInputBudget = errors.New("input budget exhausted")

// readLimits bound one command as received.
type readLimits struct {
	maxArgs    int // multibulk count
	maxBulk    int // one bulk string (Redis proto-max-bulk-len)
	maxRequest int // one command's bytes on the wire (our own)
	unauth     bool
}

// reqReader reads commands from one connection. The commands it returns
// own their memory (a copy, or a buffer the reader let go of), so they stay
// valid after the next call.
type reqReader struct {
	r      io.Reader
	lim    readLimits
	budget *memBudget // nil: unbounded

	buf        []byte
	start, end int   // buf[start:end] is not yet returned as commands
	held       int64 // bytes taken from the budget: buf, and the last batch
	err        error // sticky; returned once the commands before it are

	// A multibulk command being received, at buf[start:]: offsets are
	// relative to start, so that compaction keeps them.
	inCmd bool
	argc  int     // announced argument count
	off   int     // next byte to parse
	bulk  int     // length of the bulk whose data is at off; -1: a header is next
	marks []int32 // arguments parsed so far: start, end pairs
}

func newReqReader(r io.Reader, lim readLimits, budget *memBudget) *reqReader {
	return &reqReader{r: r, lim: lim, budget: budget, bulk: -1}
}

// setLimits sets the limits for commands not yet started.
func (rd *reqReader) setLimits(lim readLimits) { rd.lim = lim }

// maxBuffer is the most the buffer needs: one command of maxRequest bytes
// plus a header line being received after it.
func (rd *reqReader) maxBuffer() int { return rd.lim.maxRequest + maxLineBytes + 16 }

// release returns the reader's memory to the budget (the connection is
// done).
func (rd *reqReader) release() {
	rd.budget.give(rd.held)
	rd.held, rd.buf, rd.start, rd.end = 0, nil, 0, 0
}

// readCommands returns the next complete commands (at least one), reading
// from the connection as needed. An error comes only after every command
// received before it was returned. Before AUTH it returns one command at a
// time, so that AUTH can raise the limits for the next.
func (rd *reqReader) readCommands() ([]redcon.Command, error) {
	// The previous batch is the caller's now: it leaves the budget.
	rd.budget.give(rd.held - int64(cap(rd.buf)))
	rd.held = int64(cap(rd.buf))
	for {
		cmds, err := rd.parse()
		if len(cmds) > 0 {
			if err != nil {
				rd.err = err
			}
			return cmds, nil
		}
		if err == nil {
			err = rd.err
		}
		if err != nil {
			return nil, err
		}
		if err := rd.fill(); err != nil {
			rd.err = err
		}
	}
}

// parse returns the complete commands in buf[start:end].
func (rd *reqReader) parse() ([]redcon.Command, error) {
	var cmds []redcon.Command
	for rd.start < rd.end && !(rd.lim.unauth && len(cmds) > 0) {
		var cmd redcon.Command
		var ok bool
		var err error
		if rd.inCmd || rd.buf[rd.start] == '*' {
			cmd, ok, err = rd.multibulk()
		} else {
			cmd, ok, err = rd.inline()
		}
		if err != nil || !ok {
			return cmds, err
		}
		if cmd.Args != nil {
			cmds = append(cmds, cmd)
		}
	}
	return cmds, nil
}

// multibulk parses the command at buf[start:], resuming where the last
// call stopped; ok is false while it is incomplete. A complete command
// with no arguments (*0, *-1) has no Args: Redis skips it.
func (rd *reqReader) multibulk() (cmd redcon.Command, ok bool, err error) {
	b := rd.buf[rd.start:rd.end]
	if !rd.inCmd {
		line, ln, err := headerLine(b[1:], errMbulkLine, errMultibulkLen)
		if err != nil || ln == 0 {
			return cmd, false, err
		}
		count, ok := parseLength(line)
		switch {
		case !ok || count > int64(rd.lim.maxArgs):
			return cmd, false, errMultibulkLen
		case rd.lim.unauth && count > unauthMaxArgs:
			return cmd, false, errUnauthMultiLen
		case count <= 0:
			rd.start += 1 + ln
			return cmd, true, nil
		}
		rd.inCmd, rd.argc, rd.off, rd.bulk, rd.marks = true, int(count), 1+ln, -1, rd.marks[:0]
	}
	for len(rd.marks) < 2*rd.argc {
		if rd.bulk < 0 {
			if rd.off == len(b) {
				return cmd, false, nil
			}
			if b[rd.off] != '$' {
				return cmd, false, protoError("Protocol error: expected '$', got '" + string(b[rd.off:rd.off+1]) + "'")
			}
			line, ln, err := headerLine(b[rd.off+1:], errBulkLine, errBulkLen)
			if err != nil || ln == 0 {
				return cmd, false, err
			}
			size, ok := parseLength(line)
			switch {
			case !ok || size < 0 || size > int64(rd.lim.maxBulk):
				return cmd, false, errBulkLen
			case rd.lim.unauth && size > unauthMaxBulk:
				return cmd, false, errUnauthBulkLen
			case int64(rd.off+1+ln)+size+2 > int64(rd.lim.maxRequest):
				return cmd, false, protoError(fmt.Sprintf("Protocol error: request too large (limit %d bytes)", rd.lim.maxRequest))
			}
			rd.off += 1 + ln
			rd.bulk = int(size)
		}
		if len(b)-rd.off < rd.bulk+2 {
			return cmd, false, nil
		}
		if b[rd.off+rd.bulk] != '\r' || b[rd.off+rd.bulk+1] != '\n' {
			return cmd, false, errBulkLen
		}
		rd.marks = append(rd.marks, int32(rd.off), int32(rd.off+rd.bulk))
		rd.off += rd.bulk + 2
		rd.bulk = -1
	}
	raw, err := rd.take(rd.off, argBytes*rd.argc)
	if err != nil {
		return cmd, false, err
	}
	cmd.Raw = raw
	cmd.Args = make([][]byte, rd.argc)
	for i := range cmd.Args {
		s, e := rd.marks[2*i], rd.marks[2*i+1]
		cmd.Args[i] = raw[s:e:e]
	}
	rd.inCmd = false
	if cap(rd.marks) > 4096 {
		rd.marks = nil // a huge command's marks are not kept
	}
	return cmd, true, nil
}

// argBytes is what an argument costs beyond its bytes (its slice header),
// charged to the budget with them.
const argBytes = 24

// take removes the first n bytes of buf[start:] and returns them in memory
// of their own: the buffer itself when they fill most of a grown one (a
// large command is not copied; the rest moves to a new buffer), else a
// copy. Either way they are charged to the budget, with extra bytes of
// overhead, until the next readCommands.
func (rd *reqReader) take(n, extra int) ([]byte, error) {
	if n > readInitialBytes && n >= cap(rd.buf)/2 {
		rest := rd.buf[rd.start+n : rd.end]
		size := max(readInitialBytes, len(rest))
		if !rd.budget.take(int64(size + extra)) {
			return nil, errInputBudget
		}
		rd.held += int64(size + extra)
		out := rd.buf[rd.start : rd.start+n : rd.start+n]
		rd.buf = make([]byte, size)
		rd.start, rd.end = 0, copy(rd.buf, rest)
		return out, nil
	}
	if !rd.budget.take(int64(n + extra)) {
		return nil, errInputBudget
	}
	rd.held += int64(n + extra)
	out := append([]byte(nil), rd.buf[rd.start:rd.start+n]...)
	rd.start += n
	return out, nil
}

// inline parses the inline command at buf[start:]: a line of blank
// separated arguments, with Redis's quoting; ok is false while the line is
// incomplete. An empty line has no Args.
func (rd *reqReader) inline() (cmd redcon.Command, ok bool, err error) {
	b := rd.buf[rd.start:rd.end]
	i := bytes.IndexByte(b[:min(len(b), maxLineBytes+1)], '\n')
	switch {
	case i < 0 && len(b) > maxLineBytes:
		return cmd, false, errInlineLine
	case i < 0:
		return cmd, false, nil
	}
	line := b[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	args, ok := splitArgs(line)
	if !ok {
		return cmd, false, errQuotes
	}
	if len(args) == 0 {
		rd.start += i + 1
		return cmd, true, nil
	}
	if cmd.Raw, err = rd.take(i+1, argBytes*len(args)); err != nil {
		return cmd, false, err
	}
	cmd.Args = args
	return cmd, true, nil
}

// fill reads more input into buf, first making room: moving the unparsed
// bytes to the front, or growing the buffer (doubling, within the budget).
func (rd *reqReader) fill() error {
	if rd.start == rd.end {
		rd.start, rd.end = 0, 0
		if cap(rd.buf) > readInitialBytes {
			rd.budget.give(int64(cap(rd.buf)))
			rd.held -= int64(cap(rd.buf))
			rd.buf = nil
		}
	}
	if rd.buf == nil {
		if !rd.budget.take(readInitialBytes) {
			return errInputBudget
		}
		rd.held += readInitialBytes
		rd.buf = make([]byte, readInitialBytes)
	}
	if rd.end == len(rd.buf) {
		switch {
		case rd.start > 0:
			rd.end = copy(rd.buf, rd.buf[rd.start:rd.end])
			rd.start = 0
		case len(rd.buf) >= rd.maxBuffer():
			// The limits checked at the headers make this unreachable.
			return fmt.Errorf("resp: request buffer full at %d bytes", len(rd.buf))
		default:
			size := min(2*len(rd.buf), rd.maxBuffer())
			if !rd.budget.take(int64(size - len(rd.buf))) {
				return errInputBudget
			}
			rd.held += int64(size - len(rd.buf))
			nb := make([]byte, size)
			copy(nb, rd.buf[:rd.end])
			rd.buf = nb
		}
	}
	n, err := rd.r.Read(rd.buf[rd.end:])
	rd.end += n
	return err
}

// headerLine finds the "\r\n"-terminated line at the start of b (a count
// after '*' or '$'). ln is the line's length with its "\r\n", 0 while it
// is incomplete. A line is at most maxLineBytes, as in Redis.
func headerLine(b []byte, tooBig, bad protoError) (line []byte, ln int, err error) {
	i := bytes.IndexByte(b[:min(len(b), maxLineBytes+1)], '\r')
	switch {
	case i < 0 && len(b) > maxLineBytes:
		return nil, 0, tooBig
	case i < 0 || i+1 == len(b):
		return nil, 0, nil
	case b[i+1] != '\n':
		return nil, 0, bad
	}
	return b[:i], i + 2, nil
}

// parseLength parses a decimal as Redis's string2ll does: an optional '-',
// no '+', no leading zeros, no overflow.
func parseLength(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 || (b[0] == '0' && (len(b) > 1 || neg)) {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0') // 19 digits cannot overflow a uint64
	}
	switch {
	case !neg && v <= math.MaxInt64:
		return int64(v), true
	case neg && v <= math.MaxInt64+1:
		return int64(-v), true
	}
	return 0, false
}

// splitArgs splits an inline line as Redis's sdssplitargs does: blanks
// separate arguments; "double quotes" take \n \r \t \b \a \xHH and \<c>
// escapes; 'single quotes' take \'; a closing quote must be followed by a
// blank or the end. A NUL byte ends the line (sdssplitargs reads a C
// string). ok is false for unbalanced quotes. Unquoted arguments alias
// line.
func splitArgs(line []byte) (args [][]byte, ok bool) {
	isSpace := func(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f' }
	if i := bytes.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	p := 0
	for {
		for p < len(line) && isSpace(line[p]) {
			p++
		}
		if p == len(line) {
			return args, true
		}
		var cur []byte
		inq, insq, done := false, false, false
		for !done {
			var c byte
			if p < len(line) {
				c = line[p]
			}
			switch {
			case inq:
				switch {
				case c == '\\' && p+3 < len(line) && line[p+1] == 'x' && isHex(line[p+2]) && isHex(line[p+3]):
					cur = append(cur, unhex(line[p+2])<<4|unhex(line[p+3]))
					p += 3
				case c == '\\' && p+1 < len(line):
					p++
					switch e := line[p]; e {
					case 'n':
						cur = append(cur, '\n')
					case 'r':
						cur = append(cur, '\r')
					case 't':
						cur = append(cur, '\t')
					case 'b':
						cur = append(cur, '\b')
					case 'a':
						cur = append(cur, '\a')
					default:
						cur = append(cur, e)
					}
				case c == '"':
					if p+1 < len(line) && !isSpace(line[p+1]) {
						return nil, false
					}
					done = true
				case p == len(line):
					return nil, false
				default:
					cur = append(cur, c)
				}
			case insq:
				switch {
				case c == '\\' && p+1 < len(line) && line[p+1] == '\'':
					p++
					cur = append(cur, '\'')
				case c == '\'':
					if p+1 < len(line) && !isSpace(line[p+1]) {
						return nil, false
					}
					done = true
				case p == len(line):
					return nil, false
				default:
					cur = append(cur, c)
				}
			default:
				switch {
				case p == len(line) || isSpace(c):
					done = true
				case c == '"':
					inq = true
				case c == '\'':
					insq = true
				default:
					cur = append(cur, c)
				}
			}
			if p < len(line) {
				p++
			}
		}
		if cur == nil {
			cur = []byte{}
		}
		args = append(args, cur)
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}
