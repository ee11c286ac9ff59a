package resp

import (
	"fmt"

	"github.com/shardkv/shardkv/pkg/shardkv"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"github.com/tidwall/redcon"
)

// Redis Cluster clients carry no request ids: they resend a command answered
// with MOVED, TRYAGAIN or CLUSTERDOWN. So those are the replies to a
// *shardkvpb.Refusal only (the command provably did not execute), rendered
// here from its facts: where the command belongs, by which group and leader.

// refusal renders a refusal as the redirect or retry error of Redis Cluster,
// for a command of slot.
func (s *Server) refusal(r *shardkvpb.Refusal, slot int, tls bool) []byte {
	s.stats.refused.Add(1)
	switch r.Reason {
	case shardkvpb.ReasonWrongGroup, shardkvpb.ReasonNotLeader:
		if r.Reason == shardkvpb.ReasonWrongGroup && r.Owner == 0 {
			return redcon.AppendError(nil, "CLUSTERDOWN Hash slot not served")
		}
		if addr := s.addrOf(s.b.Topology(), r.Owner, r.Leader, tls); addr != "" {
			return redcon.AppendError(nil, fmt.Sprintf("MOVED %d %s", slot, addr))
		}
		if r.Reason == shardkvpb.ReasonNotLeader {
			return redcon.AppendError(nil, "TRYAGAIN no leader is known for this group right now")
		}
		return redcon.AppendError(nil, fmt.Sprintf("TRYAGAIN group %d serves slot %d but has no known Redis address", r.Owner, slot))
	}
	why := r.Msg
	if why == "" {
		why = "please retry"
	}
	return redcon.AppendError(nil, "TRYAGAIN "+why)
}

// addrOf is the RESP address of replica id of group gid: from the newest
// config the backend knows, else its applied one. For another group whose
// replica id is unknown (0, or not listed), it is the address of the
// group's first replica that has one (which redirects again to its leader);
// for the backend's own group only the exact replica (its leader comes from
// Raft, possibly before any config lists it).
func (s *Server) addrOf(t shardkv.Topology, gid, id uint64, tls bool) string {
	var first string
	for _, c := range []*shardkvpb.Config{t.Newest, t.Applied} {
		for _, grp := range c.GetGroups() {
			if grp.Gid != gid {
				continue
			}
			for _, sv := range grp.Servers {
				addr := respAddr(sv, tls)
				if addr == "" {
					continue
				}
				if sv.Id == id && id != 0 {
					return addr
				}
				if first == "" {
					first = addr
				}
			}
		}
	}
	if gid == t.GID {
		return ""
	}
	return first
}

// respAddr is sv's Redis address for a client on a TLS connection (tls)
// or a plain one: a client is sent only where it can connect the same way.
func respAddr(sv *shardkvpb.Server, tls bool) string {
	if tls {
		return sv.RespTlsAddr
	}
	return sv.RespAddr
}
