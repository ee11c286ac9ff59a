package controllers

import (
	"context"
	"fmt"
	"sync"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
)

// DataPlane is the reconcilers' only way to reach shardkv: the controller
// group's API and each replica's admin API. envtest has no pods, so tests
// replace it with a recording fake; the real one dials gRPC.
type DataPlane interface {
	// Controller is a client of the controller group at addrs (gRPC
	// host:port, pod IPs or DNS names).
	Controller(addrs []string) (ControllerAPI, error)
	// Replica is the admin client of one replica at addr.
	Replica(addr string) (ReplicaAPI, error)
}

// ControllerAPI is the part of the controller's API the operator uses.
type ControllerAPI interface {
	Query(ctx context.Context, num int64) (*shardkvpb.Config, error)
	Status(ctx context.Context) (*shardkvpb.ClusterStatus, error)
	Join(ctx context.Context, groups ...*shardkvpb.Group) (*shardkvpb.Config, error)
	Leave(ctx context.Context, gids ...uint64) (*shardkvpb.Config, error)
	Move(ctx context.Context, shard int, gid uint64) (*shardkvpb.Config, error)
	Unpin(ctx context.Context, shard int) (*shardkvpb.Config, error)
	// Watch streams configs from `from` on until ctx ends.
	Watch(ctx context.Context, from uint64) <-chan *shardkvpb.Config
}

// ReplicaAPI is one replica's admin API. Membership calls must reach the
// group's leader; others fail with a NOT_LEADER error (shardkvpb.LeaderHint).
type ReplicaAPI interface {
	Status(ctx context.Context) (*shardkvpb.MemberStatus, error)
	AddLearner(ctx context.Context, id uint64, addr string) error
	Promote(ctx context.Context, id uint64) error
	RemoveMember(ctx context.Context, id uint64) error
	TransferLeader(ctx context.Context, to uint64) error
}

// GRPCDataPlane is the real DataPlane. It caches one connection per
// address set and closes them on Close.
type GRPCDataPlane struct {
	mu       sync.Mutex
	ctrlers  map[string]*ctrlerclient.Client
	replicas map[string]*grpc.ClientConn
}

// NewGRPCDataPlane returns a DataPlane over insecure gRPC.
func NewGRPCDataPlane() *GRPCDataPlane {
	return &GRPCDataPlane{ctrlers: map[string]*ctrlerclient.Client{}, replicas: map[string]*grpc.ClientConn{}}
}

// Controller implements DataPlane.
func (d *GRPCDataPlane) Controller(addrs []string) (ControllerAPI, error) {
	key := fmt.Sprint(addrs)
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.ctrlers[key]; ok {
		return c, nil
	}
	c, err := ctrlerclient.New(addrs)
	if err != nil {
		return nil, err
	}
	d.ctrlers[key] = c
	return c, nil
}

// Replica implements DataPlane.
func (d *GRPCDataPlane) Replica(addr string) (ReplicaAPI, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cc, ok := d.replicas[addr]
	if !ok {
		var err error
		if cc, err = grpc.NewClient(grpcdial.Target(addr), grpcdial.Options()...); err != nil {
			return nil, err
		}
		d.replicas[addr] = cc
	}
	return adminClient{shardkvpb.NewAdminClient(cc)}, nil
}

// Close closes every cached connection.
func (d *GRPCDataPlane) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, c := range d.ctrlers {
		c.Close()
		delete(d.ctrlers, k)
	}
	for k, c := range d.replicas {
		c.Close()
		delete(d.replicas, k)
	}
}

type adminClient struct{ c shardkvpb.AdminClient }

func (a adminClient) Status(ctx context.Context) (*shardkvpb.MemberStatus, error) {
	return a.c.Status(ctx, &shardkvpb.StatusRequest{})
}

func (a adminClient) AddLearner(ctx context.Context, id uint64, addr string) error {
	_, err := a.c.AddLearner(ctx, &shardkvpb.AddLearnerRequest{Id: id, Addr: addr})
	return err
}

func (a adminClient) Promote(ctx context.Context, id uint64) error {
	_, err := a.c.Promote(ctx, &shardkvpb.PromoteRequest{Id: id})
	return err
}

func (a adminClient) RemoveMember(ctx context.Context, id uint64) error {
	_, err := a.c.RemoveMember(ctx, &shardkvpb.RemoveMemberRequest{Id: id})
	return err
}

func (a adminClient) TransferLeader(ctx context.Context, to uint64) error {
	_, err := a.c.TransferLeader(ctx, &shardkvpb.TransferLeaderRequest{To: to})
	return err
}
