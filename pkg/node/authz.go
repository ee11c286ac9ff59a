package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// authorizer lets a caller make an RPC only if its certificate's identity
// may (the table below). With TLS on, every RPC passes it; a method
// missing from the table is refused to everyone, so a new RPC is closed
// until someone decides who may call it.
type authorizer struct {
	self     mtls.Identity
	refusals *mtls.Refusals
}

// rule decides whether caller may make a call to self; req is the first
// request message (nil for client streams, whose rules do not look).
type rule struct {
	allow func(self, caller mtls.Identity, req any) error
	// needsReq: the rule reads the request, which for a server stream
	// arrives only with the handler's first RecvMsg.
	needsReq bool
}

var authzRules = map[string]rule{
	// Raft traffic: only members of the same group.
	shardkvpb.Raft_Send_FullMethodName:     {allow: sameGroup},
	shardkvpb.Raft_Snapshot_FullMethodName: {allow: sameGroup},
	// Membership: only admins (the operator, kvctl); status for replicas
	// too (a starting replica asks its peers).
	shardkvpb.Admin_Status_FullMethodName:         {allow: nodeOrAdmin},
	shardkvpb.Admin_AddLearner_FullMethodName:     {allow: adminOnly},
	shardkvpb.Admin_Promote_FullMethodName:        {allow: adminOnly},
	shardkvpb.Admin_RemoveMember_FullMethodName:   {allow: adminOnly},
	shardkvpb.Admin_TransferLeader_FullMethodName: {allow: adminOnly},
	// Ownership: only admins change it; everyone reads the configs (clients
	// route by them); a group reports only for itself.
	shardkvpb.Controller_Join_FullMethodName:  {allow: adminOnly},
	shardkvpb.Controller_Leave_FullMethodName: {allow: adminOnly},
	shardkvpb.Controller_Move_FullMethodName:  {allow: adminOnly},
	shardkvpb.Controller_Unpin_FullMethodName: {allow: adminOnly},
	shardkvpb.Controller_Query_FullMethodName: {allow: anyone},
	shardkvpb.Controller_Watch_FullMethodName: {allow: anyone},
	// Groups read the cluster status for the Redis front end's topology.
	shardkvpb.Controller_Status_FullMethodName: {allow: nodeOrAdmin},
	// Users: replicas read them (the Redis front end's ACL); admins and
	// data-group replicas (ACL SETUSER from a Redis user allowed to run
	// it) change them.
	shardkvpb.Controller_Users_FullMethodName:    {allow: nodeOrAdmin},
	shardkvpb.Controller_SetUsers_FullMethodName: {allow: groupOrAdmin},
	shardkvpb.Controller_Report_FullMethodName: {allow: func(_, c mtls.Identity, req any) error {
		return groupIs(c, req.(*shardkvpb.GroupReport).GetGid(), "report for")
	}, needsReq: true},
	// Data: clients and admins.
	shardkvpb.KV_Get_FullMethodName:        {allow: clientOrAdmin},
	shardkvpb.KV_Write_FullMethodName:      {allow: clientOrAdmin},
	shardkvpb.KV_MultiGet_FullMethodName:   {allow: clientOrAdmin},
	shardkvpb.KV_MultiWrite_FullMethodName: {allow: clientOrAdmin},
	shardkvpb.KV_GetElems_FullMethodName:   {allow: clientOrAdmin},
	// Shard hand-off: a group pulls and confirms only for itself; the
	// handlers then check the shard is owed to that group.
	shardkvpb.KV_FetchShard_FullMethodName: {allow: func(_, c mtls.Identity, req any) error {
		return groupIs(c, req.(*shardkvpb.FetchShardRequest).GetGid(), "pull shards for")
	}, needsReq: true},
	shardkvpb.KV_ShardInstalled_FullMethodName: {allow: func(_, c mtls.Identity, req any) error {
		return groupIs(c, req.(*shardkvpb.ShardInstalledRequest).GetGid(), "confirm shards for")
	}, needsReq: true},
	shardkvpb.KV_GroupInfo_FullMethodName: {allow: groupOrAdmin},
}

func anyone(_, _ mtls.Identity, _ any) error { return nil }

func sameGroup(self, c mtls.Identity, _ any) error {
	if c.Role != self.Role || c.Group != self.Group {
		return fmt.Errorf("only members of %s exchange Raft traffic with it, and this is %s", self, c)
	}
	return nil
}

func adminOnly(_, c mtls.Identity, _ any) error {
	if c.Role != mtls.RoleAdmin {
		return fmt.Errorf("only admins may, and this is %s", c)
	}
	return nil
}

func nodeOrAdmin(_, c mtls.Identity, _ any) error {
	if c.IsNode() || c.Role == mtls.RoleAdmin {
		return nil
	}
	return fmt.Errorf("only replicas and admins may, and this is %s", c)
}

func groupOrAdmin(_, c mtls.Identity, _ any) error {
	if c.Role == mtls.RoleGroup || c.Role == mtls.RoleAdmin {
		return nil
	}
	return fmt.Errorf("only data-group replicas and admins may, and this is %s", c)
}

func clientOrAdmin(_, c mtls.Identity, _ any) error {
	if c.Role == mtls.RoleClient || c.Role == mtls.RoleAdmin {
		return nil
	}
	return fmt.Errorf("only clients and admins read and write data, and this is %s", c)
}

func groupIs(c mtls.Identity, gid uint64, what string) error {
	if c.Role != mtls.RoleGroup || c.Group != gid {
		return fmt.Errorf("only group %d may %s group %d, and this is %s", gid, what, gid, c)
	}
	return nil
}

func newAuthorizer(self mtls.Identity, log *slog.Logger) *authorizer {
	return &authorizer{self: self, refusals: mtls.NewRefusals(log, time.Minute)}
}

// check returns the PermissionDenied error for a refused call, logged once
// per caller, method and reason.
func (a *authorizer) check(ctx context.Context, method string, req any) error {
	caller, err := mtls.PeerIdentity(ctx)
	who := caller.String()
	if err != nil {
		who = "(no certificate)"
	} else {
		r, ok := authzRules[method]
		if !ok {
			err = fmt.Errorf("%s is not open to anyone", method)
		} else {
			err = r.allow(a.self, caller, req)
		}
	}
	if err == nil {
		return nil
	}
	a.refusals.Refuse(who+" "+method+" "+err.Error(), "call refused", "caller", who, "method", method, "err", err)
	return shardkvpb.Error(codes.PermissionDenied, shardkvpb.ReasonNotAuthorized, fmt.Sprintf("%s refused: %v", method, err), map[string]string{"caller": who})
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if r, ok := authzRules[info.FullMethod]; ok && r.needsReq {
		return h(srv, &checkedStream{ServerStream: ss, a: a, method: info.FullMethod})
	}
	if err := a.check(ss.Context(), info.FullMethod, nil); err != nil {
		return err
	}
	return h(srv, ss)
}

// checkedStream checks the first request of a server stream before the
// handler sees it.
type checkedStream struct {
	grpc.ServerStream
	a       *authorizer
	method  string
	checked bool
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.checked {
		if err := s.a.check(s.Context(), s.method, m); err != nil {
			return err
		}
		s.checked = true
	}
	return nil
}
