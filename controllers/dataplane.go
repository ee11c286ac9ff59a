package controllers

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/grpcdial"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// DataPlane is the reconcilers' only way to reach shardkv: the controller
// group's API and each replica's admin API. envtest has no pods, so tests
// replace it with a recording fake; the real one dials gRPC.
//
// creds is the operator's certificate for a cluster with TLS on
// (TLSCredentials), nil for one in plain text.
type DataPlane interface {
	// Controller is a client of the controller group at addrs (gRPC
	// host:port, pod IPs or DNS names).
	Controller(creds *mtls.Source, addrs []string) (ControllerAPI, error)
	// Replica is the admin client of one replica at addr.
	Replica(creds *mtls.Source, addr string) (ReplicaAPI, error)
}

// ControllerAPI is the part of the controller's API the operator uses.
type ControllerAPI interface {
	Query(ctx context.Context, num int64) (*shardkvpb.Config, error)
	Status(ctx context.Context) (*shardkvpb.ClusterStatus, error)
	Join(ctx context.Context, groups ...*shardkvpb.Group) (*shardkvpb.Config, error)
	Leave(ctx context.Context, gids ...uint64) (*shardkvpb.Config, error)
	Move(ctx context.Context, shard int, gid uint64) (*shardkvpb.Config, error)
	Unpin(ctx context.Context, shard int) (*shardkvpb.Config, error)
	// Users and SetUsers: the Redis ACL users (shardmap_users.go).
	Users(ctx context.Context) (*shardkvpb.UsersReply, error)
	SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error)
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

// GRPCDataPlane is the real DataPlane. Its connections, to controller and
// group replicas alike, are one pool per credentials (plain text, or one
// cluster's certificate) keyed by address; the controller clients (leader
// and sequence numbers) are kept per credentials and address set.
//
// Pods are replaced and, with DialPodIPs, come back at new addresses, so
// it forgets what the reconcilers stop asking for: every IdleTimeout, a
// connection that carried no RPC and was not asked for since the previous
// sweep is closed (one with a Watch stream open is kept), and so is a
// controller client not asked for since. The reconcilers ask for every
// live pod at least once per resync (a minute at most), well within it.
type GRPCDataPlane struct {
	// pools are by credentials (nil: plain text).
	pools map[*mtls.Source]*grpcdial.Pool
	// idle is IdleTimeout; now is the clock (a fake in tests).
	idle time.Duration
	now  func() time.Time

	mu        sync.Mutex
	ctrlers   map[ctrlerClientKey]*ctrlerEntry
	lastSweep time.Time
}

type ctrlerClientKey struct {
	creds *mtls.Source
	addrs string
}

type ctrlerEntry struct {
	c    *ctrlerclient.Client
	used bool // asked for since the last sweep
}

// IdleTimeout is how often GRPCDataPlane sweeps: a connection is closed
// after between one and two of these without use.
const IdleTimeout = 5 * time.Minute

// NewGRPCDataPlane returns a DataPlane over gRPC.
func NewGRPCDataPlane() *GRPCDataPlane {
	return &GRPCDataPlane{pools: map[*mtls.Source]*grpcdial.Pool{}, idle: IdleTimeout, now: time.Now,
		ctrlers: map[ctrlerClientKey]*ctrlerEntry{}, lastSweep: time.Now()}
}

// poolLocked is the pool of creds' connections. The operator dials
// replicas of both kinds and accepts any replica certificate of the
// cluster's CA: the CA is the cluster's own.
func (d *GRPCDataPlane) poolLocked(creds *mtls.Source) *grpcdial.Pool {
	p, ok := d.pools[creds]
	if !ok {
		if creds == nil {
			p = grpcdial.NewPool()
		} else {
			p = grpcdial.NewPool(grpcdial.OptionsWith(creds.ClientCredentials(mtls.AnyNode))...)
		}
		d.pools[creds] = p
	}
	return p
}

// Controller implements DataPlane.
func (d *GRPCDataPlane) Controller(creds *mtls.Source, addrs []string) (ControllerAPI, error) {
	key := ctrlerClientKey{creds, strings.Join(addrs, ",")}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepLocked()
	if e, ok := d.ctrlers[key]; ok {
		e.used = true
		return e.c, nil
	}
	c, err := ctrlerclient.NewWithPool(addrs, d.poolLocked(creds))
	if err != nil {
		return nil, err
	}
	d.ctrlers[key] = &ctrlerEntry{c: c, used: true}
	return c, nil
}

// Replica implements DataPlane.
func (d *GRPCDataPlane) Replica(creds *mtls.Source, addr string) (ReplicaAPI, error) {
	d.mu.Lock()
	d.sweepLocked()
	pool := d.poolLocked(creds)
	d.mu.Unlock()
	cc, err := pool.Get(addr)
	if err != nil {
		return nil, err
	}
	return adminClient{shardkvpb.NewAdminClient(cc)}, nil
}

// sweepLocked forgets, once per d.idle, what was not used since the last
// sweep. Dropping a controller client closes nothing: its connections are
// the pool's.
func (d *GRPCDataPlane) sweepLocked() {
	if now := d.now(); now.Sub(d.lastSweep) >= d.idle {
		d.lastSweep = now
		for _, p := range d.pools {
			p.CloseIdle()
		}
		for k, e := range d.ctrlers {
			if !e.used {
				delete(d.ctrlers, k)
			}
			e.used = false
		}
	}
}

// Close closes every connection.
func (d *GRPCDataPlane) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctrlers = map[ctrlerClientKey]*ctrlerEntry{}
	for _, p := range d.pools {
		p.Close()
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
