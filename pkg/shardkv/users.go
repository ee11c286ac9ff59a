package shardkv

import (
	"context"
	"errors"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// The cluster's users live in the controller (its Users API), so that every
// replica of every group agrees on them. A replica that serves a front end
// (GroupConfig.TrackLeaders) keeps the newest copy it has heard of; what a
// user is, the front end decides (the specs are its text).

// UsersPollInterval is how often a replica asks the controller for the
// users: a change made through another replica reaches this one within it.
const UsersPollInterval = time.Second

// ErrNoController: the replica has no controller client (tests).
var ErrNoController = errors.New("no controller client")

// Users returns the newest users this replica has heard of, nil before it
// first heard. A replica that does not track them (no front end, or no
// controller) has none: version 0.
func (g *Group) Users() *shardkvpb.UsersReply {
	if !g.cfg.TrackLeaders || g.cfg.Ctrler == nil {
		return &shardkvpb.UsersReply{}
	}
	return g.users.Load()
}

// SetUsers changes the cluster's users through the controller, and keeps
// the result, so that the change holds here as soon as it returns.
func (g *Group) SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error) {
	if g.cfg.Ctrler == nil {
		return nil, ErrNoController
	}
	u, err := g.cfg.Ctrler.SetUsers(ctx, req)
	if err != nil {
		return nil, err
	}
	g.keepUsers(u)
	return u, nil
}

// keepUsers keeps u unless a newer version is kept already.
func (g *Group) keepUsers(u *shardkvpb.UsersReply) {
	for {
		cur := g.users.Load()
		if cur != nil && cur.Version >= u.Version {
			return
		}
		if g.users.CompareAndSwap(cur, u) {
			return
		}
	}
}

// trackUsers polls the controller for the users.
func (g *Group) trackUsers() {
	defer g.wg.Done()
	if g.cfg.Ctrler == nil {
		return
	}
	t := time.NewTicker(UsersPollInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(g.ctx, 2*time.Second)
		u, err := g.cfg.Ctrler.Users(ctx)
		cancel()
		if err == nil {
			g.keepUsers(u)
		}
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
	}
}
