// Package placement decides which group owns each shard. It is pure and
// deterministic: the same inputs give the same table on every replica, and
// nothing depends on Go map order.
package placement

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// Strategy names a placement algorithm. It is fixed per cluster at creation.
type Strategy string

const (
	// Balanced gives each group floor or ceil of its weighted share and
	// moves as few shards as possible: a join moves shards only to joining
	// groups, a leave only the leaving groups' shards.
	Balanced Strategy = "balanced"
	// ConsistentHash puts virtual nodes of every group (their number
	// proportional to weight) on a hash ring; a shard belongs to the next
	// virtual node clockwise. It needs nothing but the group set.
	ConsistentHash Strategy = "consistent-hash"
)

// Parse validates a strategy name ("" means Balanced).
func Parse(s string) (Strategy, error) {
	switch Strategy(s) {
	case "", Balanced:
		return Balanced, nil
	case ConsistentHash:
		return ConsistentHash, nil
	}
	return "", fmt.Errorf("unknown placement %q: use %q or %q", s, Balanced, ConsistentHash)
}

// Group is a group that can own shards.
type Group struct {
	GID    uint64
	Weight uint32 // >= 1
	// Joining marks groups added by the change being placed. When several
	// groups could take a spare shard, joining ones come first, so shards
	// never move between two groups that both stay.
	Joining bool
}

// Assign computes the new shard table.
//
// cur is the current table (cur[s] is the gid of shard s, 0 for none);
// groups is the new group set; pins[s] != 0 pins shard s to that gid, which
// must be in groups. Pinned shards are left out of the balance.
func Assign(st Strategy, cur []uint64, groups []Group, pins []uint64) []uint64 {
	gs := slices.Clone(groups)
	slices.SortFunc(gs, func(a, b Group) int { return cmp.Compare(a.GID, b.GID) })
	for i := range gs {
		gs[i].Weight = max(gs[i].Weight, 1)
	}
	out := slices.Clone(cur)
	if len(gs) == 0 {
		clear(out)
		return out
	}
	switch st {
	case ConsistentHash:
		ring := newRing(gs)
		for s := range out {
			out[s] = ring.owner(s)
		}
	default:
		balance(out, gs, pins)
	}
	for s, g := range pins {
		if g != 0 && s < len(out) {
			out[s] = g
		}
	}
	return out
}

func isPinned(pins []uint64, s int) bool { return s < len(pins) && pins[s] != 0 }

// balance rewrites out in place: shards of groups not in gs are orphaned,
// groups over their quota release shards (highest shard ids first), and the
// freed shards fill groups under quota, lowest gid first.
func balance(out []uint64, gs []Group, pins []uint64) {
	idx := map[uint64]int{}
	for i, g := range gs {
		idx[g.GID] = i
	}
	count := make([]int, len(gs))
	owned := make([][]int, len(gs))
	var pool []int
	total := 0
	for s, g := range out {
		if isPinned(pins, s) {
			continue
		}
		total++
		if i, ok := idx[g]; ok && g != 0 {
			count[i]++
			owned[i] = append(owned[i], s)
		} else {
			pool = append(pool, s)
		}
	}
	quota := quotas(total, gs, count)
	for i := range gs {
		for count[i] > quota[i] {
			last := owned[i][len(owned[i])-1]
			owned[i] = owned[i][:len(owned[i])-1]
			pool = append(pool, last)
			count[i]--
		}
	}
	sort.Ints(pool)
	p := 0
	for i := range gs {
		for count[i] < quota[i] && p < len(pool) {
			out[pool[p]] = gs[i].GID
			p++
			count[i]++
		}
	}
}

// quotas gives each group floor(total*w/W) shards, and one more to as many
// groups as the remainder allows, chosen so as few shards as possible move:
// first groups that already hold more than their floor, then groups below it
// (they receive shards anyway), then the rest; ties go to the larger
// fractional share, then the lower gid.
func quotas(total int, gs []Group, count []int) []int {
	var W uint64
	for _, g := range gs {
		W += uint64(g.Weight)
	}
	q := make([]int, len(gs))
	rem := make([]uint64, len(gs))
	sum := 0
	for i, g := range gs {
		num := uint64(total) * uint64(g.Weight)
		q[i] = int(num / W)
		rem[i] = num % W
		sum += q[i]
	}
	extra := total - sum
	order := make([]int, len(gs))
	for i := range order {
		order[i] = i
	}
	tier := func(i int) int {
		switch {
		case count[i] > q[i]:
			return 0
		case count[i] < q[i]:
			return 1
		}
		return 2
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		// A group whose share is a whole number gets exactly that.
		if (rem[i] > 0) != (rem[j] > 0) {
			return rem[i] > 0
		}
		if ti, tj := tier(i), tier(j); ti != tj {
			return ti < tj
		}
		if gs[i].Joining != gs[j].Joining {
			return gs[i].Joining
		}
		if rem[i] != rem[j] {
			return rem[i] > rem[j]
		}
		return gs[i].GID < gs[j].GID
	})
	for k := 0; k < extra; k++ {
		q[order[k]]++
	}
	return q
}

// ring is a consistent-hash ring of virtual nodes.
type ring struct {
	pos  []uint64
	gids []uint64
}

// VNodesPerWeight is the number of virtual nodes per unit of weight.
const VNodesPerWeight = 128

func newRing(gs []Group) *ring {
	type vn struct{ pos, gid uint64 }
	var vns []vn
	for _, g := range gs {
		for i := range uint64(g.Weight) * VNodesPerWeight {
			vns = append(vns, vn{mix(g.GID<<20 ^ i ^ 0x5bd1e995), g.GID})
		}
	}
	slices.SortFunc(vns, func(a, b vn) int {
		if c := cmp.Compare(a.pos, b.pos); c != 0 {
			return c
		}
		return cmp.Compare(a.gid, b.gid)
	})
	r := &ring{}
	for _, v := range vns {
		r.pos = append(r.pos, v.pos)
		r.gids = append(r.gids, v.gid)
	}
	return r
}

func (r *ring) owner(shard int) uint64 {
	h := mix(uint64(shard) ^ 0x9e3779b97f4a7c15)
	i := sort.Search(len(r.pos), func(i int) bool { return r.pos[i] >= h })
	if i == len(r.pos) {
		i = 0
	}
	return r.gids[i]
}

// mix is splitmix64's finaliser: a fixed, well-spread 64-bit hash.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
