// Package routing owns shardkv's key → slot → shard → group mapping. Every
// component (data groups, the Go client, the Redis protocol, kvctl) routes
// through it, so they can never disagree.
//
//   - slot = CRC16-XMODEM(key) mod 16384, exactly as Redis Cluster computes
//     it, including {hash tag} rules.
//   - shard = slot / (16384 / NShards). NShards is a power of two from 1 to
//     16384, so a shard is a contiguous slot range.
//   - group = the config's owner of that shard.
package routing

import (
	"fmt"
	"math/bits"
)

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// DefaultShards is the shard count of a new cluster unless told otherwise.
const DefaultShards = 256

// ValidateShards checks that n is a power of two from 1 to 16384.
func ValidateShards(n int) error {
	if n < 1 || n > Slots || bits.OnesCount(uint(n)) != 1 {
		return fmt.Errorf("shard count %d must be a power of two from 1 to %d", n, Slots)
	}
	return nil
}

// crc16 is CRC-16/XMODEM (poly 0x1021, init 0), as used by Redis Cluster,
// a byte at a time from crcTable: every keyed command computes one, and
// bit by bit it was 8% of a leader's CPU under a pipeline of small
// commands.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return crc
}

// crcTable[i] is the CRC of the byte i; filled once, never changed.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// CRC16 returns the CRC-16/XMODEM checksum of b.
func CRC16(b []byte) uint16 { return crc16(b) }

// HashTag returns the part of key that is hashed: the content of the first
// {...} if it is non-empty, else the whole key (Redis Cluster rules).
func HashTag(key []byte) []byte {
	for i, c := range key {
		if c != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return key // "{}" hashes the whole key
				}
				return key[i+1 : j]
			}
		}
		return key // no closing brace
	}
	return key
}

// Slot returns the Redis Cluster hash slot of key.
func Slot(key []byte) int { return int(crc16(HashTag(key)) % Slots) }

// SlotOf is Slot for a string key.
func SlotOf(key string) int { return Slot([]byte(key)) }

// Shard returns the shard that holds slot, for a cluster of nshards shards.
func Shard(slot, nshards int) int { return slot / (Slots / nshards) }

// ShardOf returns the shard of key.
func ShardOf(key []byte, nshards int) int { return Shard(Slot(key), nshards) }

// SlotRange returns the first and last slot (inclusive) of shard.
func SlotRange(shard, nshards int) (first, last int) {
	per := Slots / nshards
	return shard * per, shard*per + per - 1
}

// GroupOf returns the gid that owns key in a config's shard table
// (shards[i] is the gid of shard i). It returns 0 for an empty table.
func GroupOf(key []byte, shards []uint64) uint64 {
	if len(shards) == 0 {
		return 0
	}
	return shards[ShardOf(key, len(shards))]
}

// Range is an inclusive range of shards or slots with one owner.
type Range struct {
	First, Last int
	GID         uint64
}

// Ranges compresses a shard table into runs of equal owners, in order.
func Ranges(shards []uint64) []Range {
	var out []Range
	for i, g := range shards {
		if n := len(out); n > 0 && out[n-1].GID == g && out[n-1].Last == i-1 {
			out[n-1].Last = i
			continue
		}
		out = append(out, Range{First: i, Last: i, GID: g})
	}
	return out
}
