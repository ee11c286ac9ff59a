// CLUSTER SLOTS/NODES/SHARDS views of every replica against the config.

package node_test

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func slotOwners(conf *shardkvpb.Config) []uint64 {
	owner := make([]uint64, routing.Slots)
	for s, gid := range conf.Shards {
		first, last := routing.SlotRange(s, len(conf.Shards))
		for slot := first; slot <= last; slot++ {
			owner[slot] = gid
		}
	}
	return owner
}

// checkClusterViews compares CLUSTER SLOTS and CLUSTER NODES on every
// replica of the config's groups with the config: each slot's master is a
// RESP address of its owning group (its leader, per the controller), its
// replicas are the group's other members, node ids match between the two
// commands. Replicas of groups in resp but not in the config (a group that
// left) must give the same CLUSTER SLOTS. Views may lag the config briefly,
// so it retries for 20s.
func checkClusterViews(t *testing.T, c *localCluster, conf *shardkvpb.Config, resp map[uint64][]string) {
	t.Helper()
	owner := slotOwners(conf)
	respOfGroup := map[uint64][]string{}
	gidOfRESP := map[string]uint64{}
	for _, g := range conf.Groups {
		for _, s := range g.Servers {
			respOfGroup[g.Gid] = append(respOfGroup[g.Gid], s.RespAddr)
			gidOfRESP[s.RespAddr] = g.Gid
		}
	}
	leaderRESP := map[uint64]string{}
	g2r := c.grpcToRESP()
	for _, g := range conf.Groups {
		addr, _ := groupLeader(t, c.ctrl, g.Gid, 20*time.Second)
		leaderRESP[g.Gid] = g2r[addr]
	}
	var nodes []string
	for _, g := range conf.Groups {
		nodes = append(nodes, respOfGroup[g.Gid]...)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, node := range nodes {
		for {
			problem := checkNodeView(node, true, owner, gidOfRESP, respOfGroup, leaderRESP)
			if problem == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("node %s (group %d): %s", node, gidOfRESP[node], problem)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The replicas of a group that left are no longer in the config, but
	// a client may still have them as seeds: their CLUSTER SLOTS must give
	// the config's layout too.
	for gid, addrs := range resp {
		if len(respOfGroup[gid]) > 0 {
			continue
		}
		for _, node := range addrs {
			for {
				problem := checkNodeView(node, false, owner, gidOfRESP, respOfGroup, leaderRESP)
				if problem == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("node %s (group %d, not in config %d): %s", node, gid, conf.Num, problem)
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
}

// checkNodeView checks one node's CLUSTER SLOTS, and with inConfig (the
// node is a server of the config) its CLUSTER NODES; "" if they agree.
func checkNodeView(node string, inConfig bool, owner []uint64, gidOfRESP map[string]uint64, respOfGroup map[uint64][]string, leaderRESP map[uint64]string) string {
	rc, err := dialRESP(node)
	if err != nil {
		return err.Error()
	}
	defer rc.Close()
	v, err := rc.do("CLUSTER", "SLOTS")
	if err != nil || v.kind != '*' {
		return fmt.Sprintf("CLUSTER SLOTS: %v %v", v, err)
	}
	seen := make([]bool, routing.Slots)
	idOf := map[string]string{} // addr -> node id, from CLUSTER SLOTS
	for _, e := range v.arr {
		if e.kind != '*' || len(e.arr) < 3 {
			return fmt.Sprintf("CLUSTER SLOTS entry %v", e)
		}
		first, err1 := strconv.Atoi(e.arr[0].str)
		last, err2 := strconv.Atoi(e.arr[1].str)
		if err1 != nil || err2 != nil || first < 0 || last >= routing.Slots || first > last {
			return fmt.Sprintf("CLUSTER SLOTS range %v", e)
		}
		var addrs []string
		for _, n := range e.arr[2:] {
			if n.kind != '*' || len(n.arr) < 3 {
				return fmt.Sprintf("CLUSTER SLOTS node %v", n)
			}
			addr := net.JoinHostPort(n.arr[0].str, n.arr[1].str)
			addrs = append(addrs, addr)
			idOf[addr] = n.arr[2].str
		}
		gid := gidOfRESP[addrs[0]]
		for slot := first; slot <= last; slot++ {
			if seen[slot] {
				return fmt.Sprintf("slot %d listed twice", slot)
			}
			seen[slot] = true
			if owner[slot] != gid {
				return fmt.Sprintf("CLUSTER SLOTS gives slots %d-%d to %s (group %d); the config gives slot %d to group %d", first, last, addrs[0], gid, slot, owner[slot])
			}
		}
		if addrs[0] != leaderRESP[gid] {
			return fmt.Sprintf("CLUSTER SLOTS: master of %d-%d is %s; group %d's leader is %s", first, last, addrs[0], gid, leaderRESP[gid])
		}
		if want := respOfGroup[gid]; !sameSet(addrs, want) {
			return fmt.Sprintf("CLUSTER SLOTS: nodes of %d-%d are %v; group %d has %v", first, last, addrs, gid, want)
		}
	}
	for slot, ok := range seen {
		if !ok && owner[slot] != 0 {
			return fmt.Sprintf("CLUSTER SLOTS leaves slot %d (group %d) out", slot, owner[slot])
		}
	}
	if !inConfig {
		return ""
	}

	v, err = rc.do("CLUSTER", "NODES")
	if err != nil || v.kind != '$' {
		return fmt.Sprintf("CLUSTER NODES: %v %v", v, err)
	}
	lines, err := parseClusterNodes(v.str)
	if err != nil {
		return err.Error()
	}
	byID := map[string]clusterNodeLine{}
	var self int
	nodeSlots := make([]uint64, routing.Slots)
	for _, l := range lines {
		byID[l.id] = l
		if l.has("myself") {
			self++
			if l.addr != node {
				return fmt.Sprintf("CLUSTER NODES: myself is %s", l.addr)
			}
		}
		gid, ok := gidOfRESP[l.addr]
		if !ok {
			return fmt.Sprintf("CLUSTER NODES lists %s, not a server of the config", l.addr)
		}
		if id := idOf[l.addr]; id != "" && id != l.id {
			return fmt.Sprintf("%s has id %s in CLUSTER NODES, %s in CLUSTER SLOTS", l.addr, l.id, id)
		}
		if l.has("master") != (l.addr == leaderRESP[gid]) {
			return fmt.Sprintf("CLUSTER NODES flags of %s: %v; group %d's leader is %s", l.addr, l.flags, gid, leaderRESP[gid])
		}
		for _, r := range l.slots {
			a, b, ok := strings.Cut(r, "-")
			if !ok {
				b = a
			}
			first, err1 := strconv.Atoi(a)
			last, err2 := strconv.Atoi(b)
			if err1 != nil || err2 != nil {
				return fmt.Sprintf("CLUSTER NODES slot range %q of %s", r, l.addr)
			}
			for slot := first; slot <= last && slot < routing.Slots; slot++ {
				nodeSlots[slot] = gid
			}
		}
	}
	if self != 1 {
		return fmt.Sprintf("CLUSTER NODES has %d myself lines:\n%s", self, v.str)
	}
	for _, l := range lines {
		if l.has("slave") {
			m, ok := byID[l.master]
			if !ok || !m.has("master") || gidOfRESP[m.addr] != gidOfRESP[l.addr] {
				return fmt.Sprintf("CLUSTER NODES: replica %s follows %s, not its group's master", l.addr, l.master)
			}
		}
	}
	if !slices.Equal(nodeSlots, owner) {
		for slot := range owner {
			if nodeSlots[slot] != owner[slot] {
				return fmt.Sprintf("CLUSTER NODES gives slot %d to group %d; the config to group %d", slot, nodeSlots[slot], owner[slot])
			}
		}
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// --- redis-cli ---
