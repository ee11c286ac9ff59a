package placement

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
)

func groupsOf(gids []uint64, weight func(uint64) uint32) []Group {
	var gs []Group
	for _, g := range gids {
		gs = append(gs, Group{GID: g, Weight: weight(g)})
	}
	return gs
}

// joining marks the groups of gs that are not in old.
func joining(gs []Group, old map[uint64]bool) []Group {
	for i := range gs {
		gs[i].Joining = !old[gs[i].GID]
	}
	return gs
}

func one(uint64) uint32 { return 1 }

func counts(tab []uint64, pins []uint64) map[uint64]int {
	c := map[uint64]int{}
	for s, g := range tab {
		if !isPinned(pins, s) {
			c[g]++
		}
	}
	return c
}

// checkBalanced asserts every group holds floor or ceil of its weighted
// share of the unpinned shards.
func checkBalanced(t *testing.T, tab []uint64, gs []Group, pins []uint64) {
	t.Helper()
	total := 0
	for s := range tab {
		if !isPinned(pins, s) {
			total++
		}
	}
	var W uint64
	for _, g := range gs {
		W += uint64(max(g.Weight, 1))
	}
	c := counts(tab, pins)
	sum := 0
	for _, g := range gs {
		num := uint64(total) * uint64(max(g.Weight, 1))
		lo, hi := int(num/W), int((num+W-1)/W)
		if c[g.GID] < lo || c[g.GID] > hi {
			t.Fatalf("group %d (weight %d) holds %d shards, want %d..%d; table %v", g.GID, g.Weight, c[g.GID], lo, hi, c)
		}
		sum += c[g.GID]
	}
	if len(gs) > 0 && sum != total {
		t.Fatalf("groups hold %d of %d unpinned shards: %v", sum, total, c)
	}
}

// checkMoves asserts that shards move between two groups that both stay
// only when balance forces it, and then no more than forced.
//
// With equal weights that never happens. With weights, shares below about
// one shard can make floor/ceil balance and "no move between staying groups"
// contradict each other: a staying group may have to drop below what it
// holds while the joining groups' ceilings cannot absorb the difference.
// Balance wins, by the fewest moves possible: the lower bound is the staying
// groups' excess over their new ceilings that joining groups cannot take,
// plus their deficit under their new floors that leaving groups' shards
// cannot fill.
func checkMoves(t *testing.T, before, after []uint64, gs []Group, oldSet map[uint64]bool, what string) {
	t.Helper()
	newSet := map[uint64]bool{}
	for _, g := range gs {
		newSet[g.GID] = true
	}
	staying := func(g uint64) bool { return g != 0 && oldSet[g] && newSet[g] }
	moves := 0
	for s := range before {
		if a, b := before[s], after[s]; a != b && staying(a) && staying(b) {
			moves++
		}
	}
	total := len(before)
	var W uint64
	for _, g := range gs {
		W += uint64(max(g.Weight, 1))
	}
	c := counts(before, nil)
	pool, excess, deficit, joinCap := 0, 0, 0, 0
	for g, n := range c {
		if !newSet[g] {
			pool += n
		}
	}
	for _, g := range gs {
		num := uint64(total) * uint64(max(g.Weight, 1))
		lo, hi := int(num/W), int((num+W-1)/W)
		if g.Joining {
			joinCap += hi
			continue
		}
		excess += max(0, c[g.GID]-hi)
		deficit += max(0, lo-c[g.GID])
	}
	forced := max(0, excess-joinCap) + max(0, deficit-pool)
	if moves > forced {
		t.Fatalf("%s: %d shards moved between staying groups, only %d forced by balance", what, moves, forced)
	}
	allEqual := true
	for _, g := range gs {
		allEqual = allEqual && max(g.Weight, 1) == 1
	}
	if allEqual && moves > 0 {
		t.Fatalf("%s: equal weights, yet %d shards moved between staying groups", what, moves)
	}
}

func set(gids []uint64) map[uint64]bool {
	m := map[uint64]bool{}
	for _, g := range gids {
		m[g] = true
	}
	return m
}

func TestBalancedRandomJoinLeave(t *testing.T) {
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 7))
		n := []int{1, 4, 16, 256, 1024}[rng.IntN(5)]
		weighted := seed%3 == 0
		weight := func(g uint64) uint32 {
			if !weighted {
				return 1
			}
			return uint32(g%4 + 1)
		}
		tab := make([]uint64, n)
		var live []uint64
		next := uint64(1)
		for step := range 40 {
			before := slices.Clone(tab)
			old := set(live)
			if len(live) == 0 || (rng.IntN(3) > 0 && len(live) < 30) {
				k := 1 + rng.IntN(3)
				for range k {
					live = append(live, next)
					next++
				}
			} else {
				k := 1 + rng.IntN(len(live))
				if k == len(live) && rng.IntN(2) == 0 {
					k-- // sometimes keep at least one
				}
				rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
				live = live[k:]
			}
			gs := joining(groupsOf(live, weight), old)
			tab = Assign(Balanced, tab, gs, nil)
			what := fmt.Sprintf("seed %d step %d (n=%d, %d groups)", seed, step, n, len(live))
			if len(live) == 0 {
				for s, g := range tab {
					if g != 0 {
						t.Fatalf("%s: shard %d has gid %d with no groups", what, s, g)
					}
				}
				continue
			}
			checkBalanced(t, tab, gs, nil)
			checkMoves(t, before, tab, gs, old, what)
			if !weighted {
				c := counts(tab, nil)
				lo, hi := n, 0
				for _, g := range live {
					lo, hi = min(lo, c[g]), max(hi, c[g])
				}
				if hi-lo > 1 {
					t.Fatalf("%s: max-min = %d", what, hi-lo)
				}
			}
		}
	}
}

func TestBalancedMinimalMovement(t *testing.T) {
	for _, n := range []int{10, 256, 16384} {
		tab := make([]uint64, n)
		var live []uint64
		for g := uint64(1); g <= 20; g++ {
			before := slices.Clone(tab)
			old := set(live)
			live = append(live, g)
			tab = Assign(Balanced, tab, joining(groupsOf(live, one), old), nil)
			checkBalanced(t, tab, groupsOf(live, one), nil)
			for s := range tab {
				if before[s] != tab[s] && tab[s] != g {
					t.Fatalf("n=%d join %d: shard %d moved %d -> %d, not to the joining group", n, g, s, before[s], tab[s])
				}
			}
			checkMoves(t, before, tab, joining(groupsOf(live, one), old), old, "join")
		}
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		for len(live) > 1 {
			leaving := live[0]
			before := slices.Clone(tab)
			old := set(live)
			live = live[1:]
			tab = Assign(Balanced, tab, groupsOf(live, one), nil)
			checkBalanced(t, tab, groupsOf(live, one), nil)
			for s := range tab {
				if before[s] != tab[s] && before[s] != leaving {
					t.Fatalf("n=%d leave %d: shard %d of group %d moved", n, leaving, s, before[s])
				}
			}
			checkMoves(t, before, tab, groupsOf(live, one), old, "leave")
		}
	}
}

func TestPinsHonouredAndNotCounted(t *testing.T) {
	n := 64
	tab := Assign(Balanced, make([]uint64, n), groupsOf([]uint64{1, 2, 3}, one), nil)
	pins := make([]uint64, n)
	pins[0], pins[1], pins[2] = 3, 3, 3
	pins[63] = 1
	tab = Assign(Balanced, tab, groupsOf([]uint64{1, 2, 3}, one), pins)
	for s, g := range pins {
		if g != 0 && tab[s] != g {
			t.Fatalf("pinned shard %d on %d, want %d", s, tab[s], g)
		}
	}
	checkBalanced(t, tab, groupsOf([]uint64{1, 2, 3}, one), pins)
	// Re-running is a fixed point: a declarative pin never flaps.
	again := Assign(Balanced, tab, groupsOf([]uint64{1, 2, 3}, one), pins)
	if !slices.Equal(again, tab) {
		t.Fatal("assignment with pins is not stable")
	}
	// Consistent hashing honours pins too.
	ch := Assign(ConsistentHash, tab, groupsOf([]uint64{1, 2, 3}, one), pins)
	for s, g := range pins {
		if g != 0 && ch[s] != g {
			t.Fatalf("consistent-hash: pinned shard %d on %d, want %d", s, ch[s], g)
		}
	}
}

func TestDeterministicAndOrderIndependent(t *testing.T) {
	gs := groupsOf([]uint64{5, 1, 9, 3}, func(g uint64) uint32 { return uint32(g%3 + 1) })
	rev := slices.Clone(gs)
	slices.Reverse(rev)
	for _, st := range []Strategy{Balanced, ConsistentHash} {
		a := Assign(st, make([]uint64, 256), gs, nil)
		b := Assign(st, make([]uint64, 256), rev, nil)
		if !slices.Equal(a, b) {
			t.Fatalf("%s depends on group order", st)
		}
	}
}

func TestNoGroupsMeansGIDZero(t *testing.T) {
	tab := Assign(Balanced, []uint64{1, 2, 3, 1}, nil, nil)
	for _, g := range tab {
		if g != 0 {
			t.Fatalf("got %v", tab)
		}
	}
}

func TestConsistentHashMovesOnlyToOrFromChangedGroup(t *testing.T) {
	var live []uint64
	tab := make([]uint64, 1024)
	for g := uint64(1); g <= 16; g++ {
		before := slices.Clone(tab)
		live = append(live, g)
		tab = Assign(ConsistentHash, tab, groupsOf(live, one), nil)
		if g > 1 {
			for s := range tab {
				if before[s] != tab[s] && tab[s] != g {
					t.Fatalf("join %d: shard %d moved %d -> %d", g, s, before[s], tab[s])
				}
			}
		}
	}
}

// TestPlacementReport measures both strategies as groups go from 1 to 32 and
// back (docs/placement.md). Set PLACEMENT_REPORT=1 to print the table.
func TestPlacementReport(t *testing.T) {
	const n = 256
	var b strings.Builder
	fmt.Fprintf(&b, "| step | groups | balanced moved | balanced max/min | consistent-hash moved | consistent-hash max/min |\n|---|---|---|---|---|---|\n")
	tabs := map[Strategy][]uint64{Balanced: make([]uint64, n), ConsistentHash: make([]uint64, n)}
	var live []uint64
	row := func(step string) {
		fmt.Fprintf(&b, "| %s | %d ", step, len(live))
		for _, st := range []Strategy{Balanced, ConsistentHash} {
			before := tabs[st]
			tabs[st] = Assign(st, before, groupsOf(live, one), nil)
			moved := 0
			for s := range before {
				if before[s] != tabs[st][s] {
					moved++
				}
			}
			c := counts(tabs[st], nil)
			lo, hi := n, 0
			for _, g := range live {
				lo, hi = min(lo, c[g]), max(hi, c[g])
			}
			if len(live) == 0 {
				lo = 0
			}
			fmt.Fprintf(&b, "| %d | %d/%d ", moved, hi, lo)
			if st == Balanced && len(live) > 0 && hi-lo > 1 {
				t.Fatalf("balanced unbalanced at %s", step)
			}
		}
		b.WriteString("|\n")
	}
	for g := uint64(1); g <= 32; g++ {
		live = append(live, g)
		row(fmt.Sprintf("join %d", g))
	}
	for len(live) > 1 {
		g := live[len(live)-1]
		live = live[:len(live)-1]
		row(fmt.Sprintf("leave %d", g))
	}
	if os.Getenv("PLACEMENT_REPORT") != "" {
		fmt.Print(b.String())
	}
}
