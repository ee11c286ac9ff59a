package resp

import (
	"crypto/sha1"
	"encoding/hex"
	"slices"
	"strconv"

	"github.com/shardkv/shardkv/pkg/routing"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The Redis Cluster topology, built from the backend's neutral facts
// (shardkv.Topology): every data group is a Redis Cluster shard, a replica
// is a node with a stable node id, a slot belongs to the group that owns
// its shard, and the config number is the epoch.

// NodeID is a replica's Redis Cluster node id: 40 hex characters, stable
// across restarts (derived from the group and replica ids).
func NodeID(gid, replica uint64) string {
	h := sha1.Sum([]byte("shardkv-node:" + strconv.FormatUint(gid, 10) + ":" + strconv.FormatUint(replica, 10)))
	return hex.EncodeToString(h[:])
}

// node is one replica as Redis Cluster clients see it.
type node struct {
	ID        string // NodeID
	GID       uint64
	ReplicaID uint64
	Addr      string // RESP host:port (a hostname is allowed)
	Leader    bool
	Self      bool
}

// nodeGroup is one data group of the config.
type nodeGroup struct {
	GID   uint64
	Nodes []node // the leader first when known, then by replica id
}

// slotOwner is a contiguous slot range and the group that owns it.
type slotOwner struct {
	Start, End int // inclusive
	GID        uint64
}

// clusterView is the cluster in Redis Cluster terms, as this replica knows
// it.
type clusterView struct {
	ConfigNum  uint64 // the epoch: the config the view is of
	AppliedNum uint64 // the config this replica has applied
	Self       node
	Groups     []nodeGroup // by gid; groups of the config that serve RESP
	Slots      []slotOwner // by start slot
}

// group returns gid's entry (nil if absent).
func (v *clusterView) group(gid uint64) *nodeGroup {
	for i := range v.Groups {
		if v.Groups[i].GID == gid {
			return &v.Groups[i]
		}
	}
	return nil
}

// view builds the cluster view from the backend's topology: the newest
// config it knows (the one its redirects follow), with the leaders it
// knows.
func (s *Server) view(tls bool) clusterView {
	t := s.b.Topology()
	conf := t.Newest
	if conf == nil {
		conf = &shardkvpb.Config{}
	}
	v := clusterView{ConfigNum: conf.Num, AppliedNum: t.Applied.GetNum()}
	for _, grp := range conf.Groups {
		lead := t.Leaders[grp.Gid]
		ng := nodeGroup{GID: grp.Gid}
		for _, sv := range grp.Servers {
			addr := respAddr(sv, tls)
			if addr == "" {
				continue
			}
			ng.Nodes = append(ng.Nodes, node{ID: NodeID(grp.Gid, sv.Id), GID: grp.Gid, ReplicaID: sv.Id, Addr: addr,
				Leader: sv.Id == lead && lead != 0, Self: grp.Gid == t.GID && sv.Id == t.ReplicaID})
		}
		if len(ng.Nodes) == 0 {
			continue
		}
		slices.SortStableFunc(ng.Nodes, func(a, b node) int {
			if a.Leader != b.Leader {
				if a.Leader {
					return -1
				}
				return 1
			}
			return int(a.ReplicaID) - int(b.ReplicaID)
		})
		v.Groups = append(v.Groups, ng)
	}
	slices.SortFunc(v.Groups, func(a, b nodeGroup) int { return int(a.GID) - int(b.GID) })
	self := s.cfg.Advertise
	if tls {
		self = s.cfg.TLSAdvertise
	}
	if self == "" {
		self = s.addrOf(t, t.GID, t.ReplicaID, tls)
	}
	v.Self = node{ID: NodeID(t.GID, t.ReplicaID), GID: t.GID, ReplicaID: t.ReplicaID, Addr: self, Leader: t.Leads, Self: true}
	n := len(conf.Shards)
	for _, r := range routing.Ranges(conf.Shards) {
		if r.GID == 0 {
			continue
		}
		first, _ := routing.SlotRange(r.First, n)
		_, last := routing.SlotRange(r.Last, n)
		v.Slots = append(v.Slots, slotOwner{Start: first, End: last, GID: r.GID})
	}
	return v
}
