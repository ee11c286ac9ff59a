package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
)

// chunkReader returns data in pieces of pseudo-random sizes (1 to 64
// bytes) drawn from seed: the reader must parse the same commands however
// the bytes arrive.
type chunkReader struct {
	data []byte
	seed uint32
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	c.seed = c.seed*1664525 + 1013904223
	n := min(len(p), len(c.data), int(c.seed>>26)+1)
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// readAll reads commands until an error, checking the limits on each.
func readAll(t *testing.T, r io.Reader, lim readLimits) (cmds []string, err error) {
	t.Helper()
	budget := &memBudget{limit: 1 << 40}
	rd := newReqReader(r, lim, budget)
	for calls := 0; ; calls++ {
		if calls > 1<<20 {
			t.Fatal("the reader makes no progress")
		}
		batch, err := rd.readCommands()
		if cap(rd.buf) > rd.maxBuffer() {
			t.Fatalf("buffer of %d bytes, limit %d", cap(rd.buf), rd.maxBuffer())
		}
		if used := budget.inUse(); used != rd.held || used < int64(cap(rd.buf)) {
			t.Fatalf("budget %d, reader holds %d, buffer %d", used, rd.held, cap(rd.buf))
		}
		if err != nil {
			rd.release()
			if budget.inUse() != 0 {
				t.Fatalf("budget %d after release", budget.inUse())
			}
			return cmds, err
		}
		if lim.unauth && len(batch) != 1 {
			t.Fatalf("%d commands in one batch before AUTH", len(batch))
		}
		for _, c := range batch {
			if len(c.Args) == 0 {
				t.Fatal("a command without arguments")
			}
			if c.Raw[0] == '*' {
				maxArgs, maxBulk := lim.maxArgs, lim.maxBulk
				if lim.unauth {
					maxArgs, maxBulk = min(maxArgs, unauthMaxArgs), min(maxBulk, unauthMaxBulk)
				}
				if len(c.Args) > maxArgs || len(c.Raw) > lim.maxRequest {
					t.Fatalf("a command of %d args, %d bytes passed the limits", len(c.Args), len(c.Raw))
				}
				for _, a := range c.Args {
					if len(a) > maxBulk {
						t.Fatalf("an argument of %d bytes passed the limit", len(a))
					}
				}
			} else if len(c.Raw) > maxLineBytes+1 {
				t.Fatalf("an inline command of %d bytes", len(c.Raw))
			}
			cmds = append(cmds, fmt.Sprintf("%q", c.Args))
		}
	}
}

// checkErr: reading ends with a protocol error or the end of the input.
func checkErr(t *testing.T, err error) {
	t.Helper()
	var pe protoError
	if !errors.As(err, &pe) && err != io.EOF {
		t.Fatalf("reading ended with %v", err)
	}
}

var fuzzLimits = []readLimits{
	{maxArgs: 8, maxBulk: 64, maxRequest: 300},
	{maxArgs: 20, maxBulk: 20000, maxRequest: 40000, unauth: true},
	{maxArgs: DefaultMaxArgs, maxBulk: 1 << 20, maxRequest: 16 << 20},
}

// FuzzRESPReader: random bytes never panic the reader, never take it past
// its limits, and give the same commands and the same error however they
// are split into reads.
func FuzzRESPReader(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\nPING\r\n",
		"*1\r\n$9223372036854775807\r\n",
		"*9223372036854775807\r\n",
		"*3000000000\r\n",
		"*1\r\n$2000000000\r\n",
		"*0\r\n*-1\r\n*1\r\n$1\r\nx\r\n",
		"SET k \"a\\x41\\n\" 'b\\'c'\r\nGET k\n\r\n",
		"*2\r\n$1\r\na\r\n$-1\r\n",
		"*1\r\n$4\r\nPINGxx\r\n",
		"*1\r\n+PING\r\n",
		"ECHO \"a\"b\r\n",
		"*11\r\n",
		"*1\r\n$16385\r\n",
	} {
		f.Add([]byte(s), uint32(7), uint8(0))
		f.Add([]byte(s), uint32(1), uint8(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint32, which uint8) {
		lim := fuzzLimits[int(which)%len(fuzzLimits)]
		whole, errWhole := readAll(t, bytes.NewReader(data), lim)
		split, errSplit := readAll(t, &chunkReader{data: data, seed: seed}, lim)
		checkErr(t, errWhole)
		checkErr(t, errSplit)
		if strings.Join(whole, " ") != strings.Join(split, " ") || errWhole.Error() != errSplit.Error() {
			t.Fatalf("whole: %v, %v; in pieces: %v, %v", whole, errWhole, split, errSplit)
		}
	})
}

// TestReaderAllocation: a header announcing a huge count or length costs
// next to nothing before it is refused.
func TestReaderAllocation(t *testing.T) {
	lim := readLimits{maxArgs: DefaultMaxArgs, maxBulk: 1 << 20, maxRequest: 16 << 20}
	for _, in := range []string{
		"*1\r\n$9223372036854775807\r\n",
		"*9223372036854775807\r\n",
		"*1048576\r\n$1048576\r\n",
		"*1048576\r\n",
		"*1\r\n$1048576\r\n",
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cmds, err := readAll(t, strings.NewReader(in), lim)
		runtime.ReadMemStats(&after)
		if len(cmds) != 0 {
			t.Errorf("%q: commands %v", in, cmds)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
			t.Errorf("%q: %d bytes allocated before %v", in, alloc, err)
		}
	}
}
