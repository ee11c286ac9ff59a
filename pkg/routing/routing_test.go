package routing

import (
	"testing"
)

func TestCRC16Vector(t *testing.T) {
	if got := CRC16([]byte("123456789")); got != 0x31C3 {
		t.Fatalf("CRC16(123456789) = %#x, want 0x31c3", got)
	}
}

// Slots published by Redis Cluster (CLUSTER KEYSLOT) for these keys.
func TestSlotMatchesRedis(t *testing.T) {
	for key, want := range map[string]int{
		"foo":                  12182,
		"bar":                  5061,
		"hello":                866,
		"somekey":              11058,
		"{user1000}.following": 3443,
		"{user1000}.followers": 3443,
		"foo{}{bar}":           8363, // empty first tag: whole key is hashed
		"foo{{bar}}zap":        4015, // tag is "{bar"
		"foo{bar}{zap}":        5061, // first tag only: "bar"
		"{":                    SlotOf("{"),
		"":                     0,
	} {
		if got := SlotOf(key); got != want {
			t.Errorf("SlotOf(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"a{b}c": "b", "{}x": "{}x", "x{": "x{", "x}{y}": "y", "{a}{b}": "a", "nobraces": "nobraces", "{{a}}": "{a",
	} {
		if got := string(HashTag([]byte(key))); got != want {
			t.Errorf("HashTag(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestShardsAreContiguousSlotRanges(t *testing.T) {
	for _, n := range []int{1, 2, 256, 16384} {
		if err := ValidateShards(n); err != nil {
			t.Fatal(err)
		}
		next := 0
		for s := range n {
			first, last := SlotRange(s, n)
			if first != next || last < first {
				t.Fatalf("n=%d shard %d: range %d-%d, want start %d", n, s, first, last, next)
			}
			if Shard(first, n) != s || Shard(last, n) != s {
				t.Fatalf("n=%d shard %d: slots map back to %d/%d", n, s, Shard(first, n), Shard(last, n))
			}
			next = last + 1
		}
		if next != Slots {
			t.Fatalf("n=%d: ranges end at %d", n, next)
		}
	}
	for _, bad := range []int{0, -1, 3, 100, 16385, 32768} {
		if ValidateShards(bad) == nil {
			t.Errorf("ValidateShards(%d) accepted", bad)
		}
	}
}

func TestRanges(t *testing.T) {
	got := Ranges([]uint64{1, 1, 2, 2, 2, 1, 0})
	want := []Range{{0, 1, 1}, {2, 4, 2}, {5, 5, 1}, {6, 6, 0}}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// TestCRC16Table: the table-driven CRC agrees with the bit-by-bit
// definition on every single byte and on keys of every length up to 64.
func TestCRC16Table(t *testing.T) {
	bitwise := func(b []byte) uint16 {
		var crc uint16
		for _, c := range b {
			crc ^= uint16(c) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ 0x1021
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	for i := range 256 {
		if got, want := CRC16([]byte{byte(i)}), bitwise([]byte{byte(i)}); got != want {
			t.Fatalf("CRC16(%#x) = %#x, want %#x", i, got, want)
		}
	}
	key := make([]byte, 0, 64)
	for n := range 64 {
		key = append(key, byte(n*37+11))
		if got, want := CRC16(key), bitwise(key); got != want {
			t.Fatalf("CRC16 of %d bytes = %#x, want %#x", len(key), got, want)
		}
	}
}

func BenchmarkSlot(b *testing.B) {
	key := []byte("{pipebench-1764760000000000000-0}ctr")
	for b.Loop() {
		Slot(key)
	}
}
