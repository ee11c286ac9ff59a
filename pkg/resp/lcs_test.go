package resp_test

import (
	"strings"
	"testing"
)

// testLCS: LCS of strings whose table would pass lcsMaxCells is refused
// (the differential test has the replies Redis gives); the largest that
// fits is answered.
func (e *env) testLCS(t *testing.T) {
	a, b := "{lcs}a", "{lcs}b"
	c := e.conn(e.leaderAddr(e.owner(a)))
	long := strings.Repeat("ab", 2500)
	expect(t, c.do("set", a, long), status("OK"))
	expect(t, c.do("set", b, long), status("OK"))
	r, ok := c.do("lcs", a, b, "len").(rerr)
	if !ok || !strings.Contains(string(r), "needs a table of 25010001 cells, over the limit of 16777216") {
		t.Errorf("LCS of two strings of 5000 bytes: %#v", r)
	}
	expect(t, c.do("set", b, long[:3000]), status("OK"))
	expect(t, c.do("lcs", a, b, "len"), int64(3000))
	if got, ok := c.do("lcs", a, b).(string); !ok || got != long[:3000] {
		t.Errorf("LCS of a string and its first 3000 bytes: %.40q", got)
	}
}
