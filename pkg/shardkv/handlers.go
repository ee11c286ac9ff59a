package shardkv

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The gRPC KV service. Every error is in the one vocabulary of
// pkg/shardkvpb: a *shardkvpb.Refusal (not executed; grpc-go renders it
// with its GRPCStatus), a status with a reason, or an engine error that
// raftgroup.GRPCError renders.

// Get reads linearizably on any replica (ReadIndex, then local state).
func (g *Group) Get(ctx context.Context, req *shardkvpb.GetRequest) (*shardkvpb.GetReply, error) {
	out, err := g.MultiGet(ctx, &shardkvpb.MultiGetRequest{Keys: [][]byte{req.Key}})
	if err != nil {
		return nil, err
	}
	return out.Values[0], nil
}

// MultiGet reads several keys of this group after one ReadIndex.
func (g *Group) MultiGet(ctx context.Context, req *shardkvpb.MultiGetRequest) (*shardkvpb.MultiGetReply, error) {
	for _, k := range req.Keys {
		if code := g.routeWait(ctx, k, false); code != OK {
			return nil, g.opError(k, code, false)
		}
	}
	if err := g.r.ReadIndex(ctx); err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	out := &shardkvpb.MultiGetReply{}
	var refused error
	err := g.sm.GetEntries(req.Keys, func(i int, e ValueEntry, code Code) bool {
		if code != OK {
			refused = g.opError(req.Keys[i], code, false)
			return false
		}
		out.Values = append(out.Values, &shardkvpb.GetReply{Value: e.Value, Found: e.Found, Type: uint32(e.Type)})
		return true
	})
	if err != nil {
		return nil, internal(err)
	}
	if refused != nil {
		return nil, refused
	}
	return out, nil
}

// Write applies one mutation through the log.
func (g *Group) Write(ctx context.Context, req *shardkvpb.WriteRequest) (*shardkvpb.WriteReply, error) {
	res, err := g.submit(ctx, []*shardkvpb.WriteOp{req.Op})
	if err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	if res[0].Code != OK {
		// Only the leader runs a write: a follower names it.
		return nil, g.opError(req.Op.Key, res[0].Code, true)
	}
	return &shardkvpb.WriteReply{Result: res[0].Result}, nil
}

// MultiWrite applies several mutations as one log entry. Ops the group
// cannot execute (wrong group, not ready) are marked in their result.
func (g *Group) MultiWrite(ctx context.Context, req *shardkvpb.MultiWriteRequest) (*shardkvpb.MultiWriteReply, error) {
	res, err := g.submit(ctx, req.Ops)
	if err != nil {
		return nil, raftgroup.GRPCError(err)
	}
	out := &shardkvpb.MultiWriteReply{}
	for _, r := range res {
		if r.Code == OK {
			out.Results = append(out.Results, r.Result)
		} else {
			out.Results = append(out.Results, &shardkvpb.WriteResult{NotExecuted: r.Code.Reason()})
		}
	}
	return out, nil
}

// GroupInfo describes this replica's view of the group.
func (g *Group) GroupInfo(ctx context.Context, req *shardkvpb.GroupInfoRequest) (*shardkvpb.GroupInfoReply, error) {
	out := &shardkvpb.GroupInfoReply{Gid: g.sm.gid, Config: g.sm.Config(), Member: g.r.StatusProto(), Stranded: g.Stranded()}
	out.Shards = g.shardStates()
	if req.GetCountKeys() {
		for _, st := range out.Shards {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n, err := g.sm.CountKeys(int(st.Shard))
			if err != nil {
				return nil, fmt.Errorf("count keys of shard %d: %w", st.Shard, err)
			}
			out.Keys += uint64(n)
		}
	}
	return out, nil
}

// maxElemsReply bounds one GetElems reply (a client pages with count).
const maxElemsReply = 64 << 20

// GetElems reads elements of a collection (ReadElems) for the Go client.
func (g *Group) GetElems(ctx context.Context, req *shardkvpb.ReadElemsRequest) (*shardkvpb.ReadElemsReply, error) {
	q := ElemQuery{Type: ValueType(req.Type), Fields: req.Fields, All: req.All, Count: int(req.Count), Range: req.Range, Start: req.Start, Stop: req.Stop,
		CountOnly: req.CountOnly, Rev: req.Rev}
	if req.Z {
		by := int(req.ZBy)
		lo, ok1 := DecodeBound(by, req.ZMin)
		hi, ok2 := DecodeBound(by, req.ZMax)
		if !ok1 || !ok2 {
			return nil, invalid("bad sorted-set range bounds")
		}
		q.Z = &ZRange{By: by, Min: lo, Max: hi, Rev: req.Rev, Offset: req.ZOffset, Count: req.ZCount}
	}
	if req.HasRankOf {
		q.RankOf = req.RankOf
		if q.RankOf == nil {
			q.RankOf = []byte{}
		}
	}
	if req.HasAfter {
		q.After = req.After
		if q.After == nil {
			q.After = []byte{}
		}
	}
	used := 0
	reserve := func(n int) bool {
		used += n + 16
		return used <= maxElemsReply
	}
	r, err := g.ReadElems(ctx, req.Key, q, true, reserve)
	switch {
	case errors.Is(err, ErrReadLimit):
		return nil, status.Errorf(codes.ResourceExhausted, "the reply would pass %d bytes: read fewer fields, or page with count", maxElemsReply)
	case err != nil:
		var ref *shardkvpb.Refusal
		if errors.As(err, &ref) {
			return nil, ref
		}
		return nil, raftgroup.GRPCError(err)
	}
	out := &shardkvpb.ReadElemsReply{Found: r.Entry.Found, Type: uint32(r.Entry.Type), Len: r.Len, Next: r.Next, More: r.Next != nil, ExpireAtMs: r.Entry.ExpireAtMs,
		Count: r.Count, Rank: r.Rank}
	for _, e := range r.Elems {
		out.Elems = append(out.Elems, &shardkvpb.Elem{Field: e.Field, Value: e.Value, Found: e.Found})
	}
	return out, nil
}
