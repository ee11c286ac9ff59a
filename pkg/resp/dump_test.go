package resp

import (
	"bytes"
	"strings"
	"testing"
)

// Redis 7.0.15's own DUMP payloads (LZF, integer and plain encodings).
var redisDumps = map[string]string{
	strings.Repeat("a", 110):                           "\x00\xc3\t@n\x01aa\xe0a\x00\x01aa\n\x00\xb8\x8c\xf6\x9c\x17aV\xea",
	strings.Repeat("x", 70) + strings.Repeat("yz", 30): "\x00\xc3\x0f@\x82\x01xx\xe0;\x00\x01yz\xe0/\x01\x01yz\n\x00\x94\xb3l\x90S\xb3~\xa3",
	"12345":       "\x00\xc190\n\x00\x9d\x94\xea'\x93\xfc\b\xb9",
	"-5":          "\x00\xc0\xfb\n\x00I\xc4\xc6\xf4\xd7&?h",
	"hello":       "\x00\x05hello\n\x00cr\xdfve4 \n",
	"12345678901": "\x00\x0b12345678901\n\x000NR\xd7'\x17e\x10",
}

func TestDumpRestore(t *testing.T) {
	if got := crc64Jones([]byte("123456789")); got != 0xe9c6d914c4b8d9ca {
		t.Fatalf("CRC-64 Jones of 123456789: %x", got)
	}
	for v, payload := range redisDumps {
		got, err := restoreString([]byte(payload), 1<<20)
		if err != nil || string(got) != v {
			t.Errorf("RESTORE of Redis's DUMP of %.20q...: %q %v", v, got, err)
		}
		if len(v) <= 20 && string(dumpString([]byte(v))) != payload {
			t.Errorf("DUMP %q = %q, Redis's %q", v, dumpString([]byte(v)), payload)
		}
	}
	for _, v := range []string{"", "0", "-128", "127", "128", "-32769", "2147483647", "2147483648", "007", strings.Repeat("v", 100), strings.Repeat("w", 20000)} {
		got, err := restoreString(dumpString([]byte(v)), 1<<20)
		if err != nil || string(got) != v {
			t.Errorf("round trip of %.20q (%d bytes): %q %v", v, len(v), got, err)
		}
	}
	if _, err := restoreString(dumpString(bytes.Repeat([]byte{'x'}, 100)), 99); err != errValueLimit {
		t.Errorf("a value over the limit: %v", err)
	}
}

// FuzzRESTOREPayload: any payload is refused or restored within the
// limit, without a panic; any value survives DUMP then RESTORE.
func FuzzRESTOREPayload(f *testing.F) {
	for _, p := range redisDumps {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if v, err := restoreString(p, 4096); err == nil && len(v) > 4096 {
			t.Fatalf("restored %d bytes past the limit", len(v))
		}
		// As a payload body with a valid footer: exercises the decoder past
		// the checksum.
		body := append([]byte{rdbTypeString}, p...)
		framed := append(append([]byte{}, body...), byte(rdbVersion), 0)
		framed = append(framed, le64(crc64Jones(framed))...)
		if v, err := restoreString(framed, 4096); err == nil && len(v) > 4096 {
			t.Fatalf("restored %d bytes past the limit", len(v))
		}
		if got, err := restoreString(dumpString(p), len(p)); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("round trip of %q: %q %v", p, got, err)
		}
	})
}

func le64(n uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	return b
}
