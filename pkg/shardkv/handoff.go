package shardkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc/codes"
)

// The group-to-group shard hand-off API. Nothing authenticates its callers
// yet (that comes with TLS), so each call is checked against what the
// group knows for itself: the claimed caller must be the shard's new owner
// in the config the call names, and a call that would delete data
// (ShardInstalled) is confirmed with the new owner's own replicas, at the
// addresses the controller's config lists, before anything is deleted.

// barrierWait is how long a hand-off call (and a request for a shard
// behind its write barrier) waits for this replica to reach the state it
// needs, rather than refusing at once into the caller's backoff: the source
// and the target learn the cut-over config at about the same time.
const barrierWait = 2 * time.Second

// FetchShard streams shard s to the group it moves to: with precopy, a
// snapshot or a round of changes of a shard this group still serves, whose
// move to the caller is planned (its writes are recorded in the change
// index); otherwise from the frozen (BePulling) copy, whose data is final,
// ending with the dedup table. Any replica that has applied the state can
// serve it. Only the group the shard goes to may pull it.
func (g *Group) FetchShard(req *shardkvpb.FetchShardRequest, stream shardkvpb.KV_FetchShardServer) error {
	s := int(req.Shard)
	if n := len(g.sm.Config().Shards); n > 0 && s >= n {
		return invalid("shard %d does not exist (%d shards)", s, n)
	}
	if req.Precopy {
		m := g.sm.Shard(s)
		if m.State != Serving || !m.tracking() || m.Peer != req.Gid {
			return shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady,
				fmt.Sprintf("shard %d: no move to group %d is planned on this replica (it holds it as %v at config %d)", s, req.Gid, m, g.sm.Config().Num), nil)
		}
		if req.Delta {
			if err := checkCursor(s, req.Cursor, m); err != nil {
				return err
			}
			return g.sm.StreamChanges(s, req.Cursor, req.SessionsSince, false, 0, stream.Send)
		}
		return g.sm.StreamShard(s, req.AfterKey, req.Resume, stream.Send)
	}
	if err := g.checkHandoffCaller(s, req.ConfigNum, req.Gid); err != nil {
		return err
	}
	m, err := g.frozen(stream.Context(), s, req.ConfigNum)
	if err != nil {
		return err
	}
	if m.Peer != req.Gid {
		return notShardOwner(s, req.ConfigNum, req.Gid, m.Peer)
	}
	if req.Delta {
		if err := checkCursor(s, req.Cursor, m); err != nil {
			return err
		}
		return g.sm.StreamChanges(s, req.Cursor, req.SessionsSince, true, m.FrozeAtNs, stream.Send)
	}
	return g.sm.StreamShard(s, req.AfterKey, req.Resume, stream.Send)
}

// frozen waits, up to barrierWait, for this replica to hold shard s frozen
// (BePulling) for config num, and returns its state.
func (g *Group) frozen(ctx context.Context, s int, num uint64) (ShardMeta, error) {
	deadline := time.After(barrierWait)
	for {
		changed := g.sm.Changed()
		m, conf := g.sm.Shard(s), g.sm.Config()
		switch {
		case m.State == BePulling && m.Config == num:
			return m, nil
		case conf.Num < num || (m.State == BePulling && m.Config < num):
			select {
			case <-changed:
				continue
			case <-ctx.Done():
			case <-deadline:
			}
			return m, shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady,
				fmt.Sprintf("this replica is at config %d; shard %d for config %d is not ready to hand off", conf.Num, s, num), nil)
		default:
			return m, shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonInvalid,
				fmt.Sprintf("shard %d for config %d: this replica holds it as %v at config %d", s, num, m, conf.Num), nil)
		}
	}
}

// checkCursor refuses a round of changes from before the shard's change
// index starts (TrackFrom): those changes were never recorded. A copy's
// cursor starts after its snapshot, which a source only reads while it
// records (or from the frozen copy), so only a stale copy gets here.
func checkCursor(s int, cursor []byte, m ShardMeta) error {
	if len(cursor) < changePrefixLen || !bytes.HasPrefix(cursor, append(shardPrefix(s), tagChange)) {
		return invalid("cursor %x is not a position in shard %d's change index", cursor, s)
	}
	if at := changeIndex(cursor); m.TrackFrom != 0 && at < m.TrackFrom {
		return shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonInvalid,
			fmt.Sprintf("shard %d: changes before index %d were not recorded here (the copy asks from %d); copy it again", s, m.TrackFrom, at), nil)
	}
	return nil
}

// ShardInstalled: the new owner says it has the shard; start deleting our
// copy. Accepted only from the shard's new owner in the named config, and
// only once that group's replicas confirm they hold the shard.
func (g *Group) ShardInstalled(ctx context.Context, req *shardkvpb.ShardInstalledRequest) (*shardkvpb.ShardInstalledReply, error) {
	s := int(req.Shard)
	if err := g.checkHandoffCaller(s, req.ConfigNum, req.Gid); err != nil {
		return nil, err
	}
	m := g.sm.Shard(s)
	conf := g.sm.Config()
	switch {
	case m.State == BePulling && m.Config == req.ConfigNum:
		if m.Peer != req.Gid {
			return nil, notShardOwner(s, req.ConfigNum, req.Gid, m.Peer)
		}
		if err := g.confirmInstalled(ctx, s, m); err != nil {
			return nil, shardkvpb.Error(codes.FailedPrecondition, shardkvpb.ReasonNotInstalled,
				fmt.Sprintf("shard %d for config %d: group %d does not confirm it holds the shard; the copy here is kept: %v", s, m.Config, m.Peer, err),
				map[string]string{"shard": strconv.Itoa(s), "config_num": strconv.FormatUint(m.Config, 10)})
		}
		if _, err := g.propose(ctx, &shardkvpb.GroupCommand{Gc: &shardkvpb.ShardRef{Shard: req.Shard, ConfigNum: req.ConfigNum}}); err != nil {
			return nil, raftgroup.GRPCError(err)
		}
		return &shardkvpb.ShardInstalledReply{}, nil
	case (m.State == GCing && m.Config >= req.ConfigNum) || (m.State == NotOwned && conf.Num >= req.ConfigNum) || m.Config > req.ConfigNum:
		return &shardkvpb.ShardInstalledReply{}, nil // already handed off; changes nothing
	}
	if !g.r.IsLeader() {
		id, addr := g.r.Leader()
		return nil, shardkvpb.NotLeaderError("shard hand-off goes through the leader", id, addr)
	}
	return nil, shardkvpb.Error(codes.Unavailable, shardkvpb.ReasonNotReady,
		fmt.Sprintf("shard %d for config %d: at config %d, state %v", s, req.ConfigNum, conf.Num, m), nil)
}

// checkHandoffCaller refuses a hand-off call for a shard that does not
// exist, or whose claimed caller gid is not the shard's owner in config num
// when this replica knows that config (its current or previous one).
func (g *Group) checkHandoffCaller(s int, num, gid uint64) error {
	conf := g.sm.Config()
	if n := len(conf.Shards); n > 0 && s >= n {
		return invalid("shard %d does not exist (%d shards)", s, n)
	}
	for _, c := range []*shardkvpb.Config{conf, g.sm.PrevConfig()} {
		if c.Num == num && num > 0 && s < len(c.Shards) && c.Shards[s] != gid {
			return notShardOwner(s, num, gid, c.Shards[s])
		}
	}
	return nil
}

func notShardOwner(s int, num, caller, owner uint64) error {
	return shardkvpb.Error(codes.PermissionDenied, shardkvpb.ReasonNotShardOwner,
		fmt.Sprintf("shard %d goes to group %d in config %d, not to group %d", s, owner, num, caller),
		map[string]string{"shard": strconv.Itoa(s), "config_num": strconv.FormatUint(num, 10), "owner_gid": strconv.FormatUint(owner, 10)})
}

// confirmInstalled asks the replicas of m.Peer (shard s's new owner), at
// the addresses of our configs, whether they hold shard s from config
// m.Config on. One replica that says so is proof: its shard state is
// applied from its group's committed log. The reply must come from group
// m.Peer (an address may have been reused by another group).
func (g *Group) confirmInstalled(ctx context.Context, s int, m ShardMeta) error {
	addrs := g.servers(m.Peer)
	if len(addrs) == 0 {
		return fmt.Errorf("group %d has no known servers", m.Peer)
	}
	var errs []error
	for _, addr := range addrs {
		cc, err := g.pool.Get(addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := shardkvpb.NewKVClient(cc).GroupInfo(actx, &shardkvpb.GroupInfoRequest{})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		if err := holdsShard(info, m.Peer, s, m.Config); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		return nil
	}
	return errors.Join(errs...)
}

// holdsShard: the replica that answered info is of group gid and has
// installed shard s for config num: it serves it (Acking or Serving) from
// that config on, or has since handed it on (a later BePulling or GCing),
// which it does only with the shard Serving. Being at a later config is no
// proof: a group steps on while it still pulls shards the step does not
// touch.
func holdsShard(info *shardkvpb.GroupInfoReply, gid uint64, s int, num uint64) error {
	if info.GetGid() != gid {
		return fmt.Errorf("the replica there is of group %d, not %d", info.GetGid(), gid)
	}
	for _, st := range info.GetShards() {
		if int(st.GetShard()) != s {
			continue
		}
		switch ShardState(st.GetState()) {
		case Acking, Serving:
			if st.GetConfigNum() >= num {
				return nil
			}
		case BePulling, GCing:
			if st.GetConfigNum() > num {
				return nil
			}
		}
	}
	return fmt.Errorf("it has not installed shard %d for config %d (at config %d)", s, num, info.GetConfig().GetNum())
}
