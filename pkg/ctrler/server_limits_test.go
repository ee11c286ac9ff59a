package ctrler_test

import (
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reports are soft state on the leader. Before, it kept one per gid anyone
// reported, of any size (up to the gRPC message limit, 24 MiB): a client
// inventing gids grew the leader's memory without bound. Now a report past
// MaxReportBytes is refused, and of gids outside the latest config only
// the 64 most recent are kept.
func TestReportsBounded(t *testing.T) {
	cc := newCtrlCluster(t, 1, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	if _, err := c.Join(cx, group(1), group(2)); err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, cc.Nodes[cc.WaitLeader(5*time.Second)].Addr)
	big := &shardkvpb.GroupReport{Gid: 1, LeaderAddr: string(make([]byte, ctrler.MaxReportBytes))}
	if _, err := raw.Report(cx, big); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("report of %d bytes: %v, want InvalidArgument", ctrler.MaxReportBytes, err)
	}
	for gid := uint64(1); gid <= 1000; gid++ {
		if _, err := raw.Report(cx, &shardkvpb.GroupReport{Gid: gid, ConfigNum: 1}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := raw.Status(cx, &shardkvpb.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Groups); n != 2+64 {
		t.Fatalf("%d reports kept, want the 2 groups' and 64 others", n)
	}
	if st.Groups[0].Report.Gid != 1 || st.Groups[1].Report.Gid != 2 || st.Groups[2].Report.Gid != 1000-63 {
		t.Fatalf("kept reports of gids %d, %d, %d, ...", st.Groups[0].Report.Gid, st.Groups[1].Report.Gid, st.Groups[2].Report.Gid)
	}
}

// A request past the config limits is refused with InvalidArgument before
// it is proposed: the log does not grow.
func TestOverLimitRequestNotProposed(t *testing.T) {
	cc := newCtrlCluster(t, 1, 16, "balanced", nil)
	c := cc.client(t)
	cx := ctx(t, 30*time.Second)
	if _, err := c.Join(cx, group(1)); err != nil {
		t.Fatal(err)
	}
	leader := cc.WaitLeader(5 * time.Second)
	raw := rawClient(t, cc.Nodes[leader].Addr)
	var groups []*shardkvpb.Group
	for gid := uint64(2); gid <= ctrler.MaxGroups+2; gid++ {
		groups = append(groups, group(gid))
	}
	before := cc.Replica(leader).StatusProto().Applied
	for _, req := range []*shardkvpb.JoinRequest{
		{Groups: groups},
		{Groups: []*shardkvpb.Group{{Gid: 5, Weight: ctrler.MaxTotalWeight + 1, Servers: group(5).Servers}}},
		{Groups: []*shardkvpb.Group{{Gid: 6, Servers: []*shardkvpb.Server{{Id: 1, Addr: string(make([]byte, ctrler.MaxConfigBytes))}}}}},
	} {
		if _, err := raw.Join(cx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("join of %d groups: %v, want InvalidArgument", len(req.Groups), err)
		}
	}
	if _, err := raw.Leave(cx, &shardkvpb.LeaveRequest{Gids: make([]uint64, ctrler.MaxGroups+1)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("leave of %d gids: %v, want InvalidArgument", ctrler.MaxGroups+1, err)
	}
	if after := cc.Replica(leader).StatusProto().Applied; after != before {
		t.Fatalf("refused requests were logged: applied %d -> %d", before, after)
	}
}
