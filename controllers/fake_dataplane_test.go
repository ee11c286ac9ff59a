package controllers

// fakeDataPlane is the DataPlane of the envtest tests (envtest runs no
// pods): a recording fake that plays back whatever state a test sets.
//
//   - Controllers are found by their service: Controller(addrs) parses the
//     first address "<sm>-ctrler-<i>.<sm>-ctrler.<ns>.svc:7000"; a test gets
//     the same fake with dp.Ctrler(ns, sm). An unknown controller is created
//     on first use with config 0 (no groups, no shards until SetShards).
//   - Replicas are found by address: dp.Member(addr) is the fake behind
//     Replica(addr); its MemberStatus is whatever the test sets.
//   - Every call is recorded (dp.Calls, dp.CallsTo); errors are injected per
//     method (FailWith) and returned until cleared with FailWith(m, nil).
//   - Mutations behave like a tiny controller: Join/Leave/Move/Unpin make a
//     new config (shards spread evenly over the groups in gid order, pins
//     honoured) and wake watchers, so reconcilers see the effect.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/protobuf/proto"
)

// fakeCall is one recorded call. Target is the controller's service name
// ("<sm>-ctrler.<ns>.svc") or the replica's address.
type fakeCall struct {
	Target string
	Method string
	Args   []any
}

func (c fakeCall) String() string { return fmt.Sprintf("%s %s%v", c.Target, c.Method, c.Args) }

type fakeDataPlane struct {
	mu       sync.Mutex
	ctrlers  map[string]*fakeController
	replicas map[string]*fakeReplica
	calls    []fakeCall
	// dialErr, if set, is returned by Controller and Replica themselves.
	dialErr error
	// hook runs after each successful replica membership call (outside
	// the lock, so it may call the fakes' setters).
	hook func(r *fakeReplica, c fakeCall)
}

var _ DataPlane = (*fakeDataPlane)(nil)

func newFakeDataPlane() *fakeDataPlane {
	return &fakeDataPlane{ctrlers: map[string]*fakeController{}, replicas: map[string]*fakeReplica{}}
}

// ctrlerKey is the controller service of a controller address:
// "<sm>-ctrler-0.<sm>-ctrler.<ns>.svc:7000" -> "<sm>-ctrler.<ns>.svc". Other
// address forms (pod IPs) are used as they are.
func ctrlerKey(addr string) string {
	host, _, _ := strings.Cut(addr, ":")
	if _, rest, ok := strings.Cut(host, "."); ok && strings.HasSuffix(rest, ".svc") {
		return rest
	}
	return addr
}

// Ctrler is the fake controller of ShardMap sm in ns (created if needed).
func (d *fakeDataPlane) Ctrler(ns, sm string) *fakeController {
	return d.ctrlerByKey(fmt.Sprintf("%s.%s.svc", CtrlerName(sm), ns))
}

// CtrlerAt is the fake controller reached at addr (a pod IP address in
// --dial-pod-ips mode); it may be the same fake as another key's via Alias.
func (d *fakeDataPlane) CtrlerAt(addr string) *fakeController { return d.ctrlerByKey(addr) }

// Alias makes addr reach the fake controller c too.
func (d *fakeDataPlane) Alias(addr string, c *fakeController) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctrlers[addr] = c
}

func (d *fakeDataPlane) ctrlerByKey(key string) *fakeController {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.ctrlers[key]
	if !ok {
		c = &fakeController{d: d, key: key, errs: map[string]error{}, leader: 1,
			configs: []*shardkvpb.Config{{Num: 0, Placement: "balanced"}}}
		d.ctrlers[key] = c
	}
	return c
}

// Member is the fake replica at addr (created if needed, with an empty
// MemberStatus).
func (d *fakeDataPlane) Member(addr string) *fakeReplica {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.memberLocked(addr)
}

func (d *fakeDataPlane) memberLocked(addr string) *fakeReplica {
	r, ok := d.replicas[addr]
	if !ok {
		r = &fakeReplica{d: d, addr: addr, errs: map[string]error{}, status: &shardkvpb.MemberStatus{Addr: addr}}
		d.replicas[addr] = r
	}
	return r
}

// OnReplicaCall sets a hook run after each successful AddLearner, Promote,
// RemoveMember or TransferLeader (nil: none). It runs outside the lock and
// may use UpdateStatus / dp.Member(addr).SetStatus.
func (d *fakeDataPlane) OnReplicaCall(hook func(r *fakeReplica, c fakeCall)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = hook
}

// Addr is the replica's address.
func (r *fakeReplica) Addr() string { return r.addr }

// FailDial makes Controller and Replica fail with err (nil: succeed).
func (d *fakeDataPlane) FailDial(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialErr = err
}

// Calls returns a copy of every call so far, in order.
func (d *fakeDataPlane) Calls() []fakeCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// CallsTo returns the calls of the given methods (e.g. "Move", "Unpin").
func (d *fakeDataPlane) CallsTo(methods ...string) []fakeCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []fakeCall
	for _, c := range d.calls {
		if slices.Contains(methods, c.Method) {
			out = append(out, c)
		}
	}
	return out
}

// ResetCalls forgets the recorded calls.
func (d *fakeDataPlane) ResetCalls() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = nil
}

func (d *fakeDataPlane) record(target, method string, args ...any) {
	d.calls = append(d.calls, fakeCall{Target: target, Method: method, Args: args})
}

// setErr makes method of one fake fail with err (errs is that fake's
// table), or clears it when err is nil.
func (d *fakeDataPlane) setErr(errs map[string]error, method string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(errs, method)
	} else {
		errs[method] = err
	}
}

// Controller implements DataPlane.
func (d *fakeDataPlane) Controller(_ *mtls.Source, addrs []string) (ControllerAPI, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("fake: no controller addresses")
	}
	d.mu.Lock()
	err := d.dialErr
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return d.ctrlerByKey(ctrlerKey(addrs[0])), nil
}

// Replica implements DataPlane.
func (d *fakeDataPlane) Replica(_ *mtls.Source, addr string) (ReplicaAPI, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dialErr != nil {
		return nil, d.dialErr
	}
	return d.memberLocked(addr), nil
}

// fakeController is one controller group. Its methods lock the data
// plane's mutex.
type fakeController struct {
	d       *fakeDataPlane
	key     string
	configs []*shardkvpb.Config // configs[i].Num == i
	reports []*shardkvpb.GroupReport
	ages    map[uint64]int64 // report ages (ms) SetReportAge set; default 100
	leader  uint64           // the controller group's leader id (0: none)
	members *shardkvpb.MemberStatus
	errs    map[string]error
	watches []chan struct{}
	users   []*shardkvpb.User // by name
}

var _ ControllerAPI = (*fakeController)(nil)

// SetShards sets the number of shards of config 0 (and of the latest config
// if it has none yet).
func (c *fakeController) SetShards(n int) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	for _, cfg := range c.configs {
		if len(cfg.Shards) != n {
			cfg.Shards = make([]uint64, n)
		}
	}
}

// SetConfig appends cfg as the next config (its Num is set) and wakes
// watchers.
func (c *fakeController) SetConfig(cfg *shardkvpb.Config) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.appendLocked(proto.Clone(cfg).(*shardkvpb.Config))
}

func (c *fakeController) appendLocked(cfg *shardkvpb.Config) *shardkvpb.Config {
	cfg.Num = uint64(len(c.configs))
	if cfg.Placement == "" {
		cfg.Placement = "balanced"
	}
	c.configs = append(c.configs, cfg)
	for _, w := range c.watches {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	return proto.Clone(cfg).(*shardkvpb.Config)
}

// Latest returns a copy of the latest config.
func (c *fakeController) Latest() *shardkvpb.Config {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return proto.Clone(c.configs[len(c.configs)-1]).(*shardkvpb.Config)
}

// SetReports sets what the groups last reported (ClusterStatus.groups).
func (c *fakeController) SetReports(reports ...*shardkvpb.GroupReport) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.reports = nil
	for _, r := range reports {
		c.reports = append(c.reports, proto.Clone(r).(*shardkvpb.GroupReport))
	}
	slices.SortFunc(c.reports, func(a, b *shardkvpb.GroupReport) int { return int(a.Gid) - int(b.Gid) })
}

// SetReportAge sets how old (ms) group gid's report is said to be in
// ClusterStatus (default 100 ms).
func (c *fakeController) SetReportAge(gid uint64, ms int64) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if c.ages == nil {
		c.ages = map[uint64]int64{}
	}
	c.ages[gid] = ms
}

// SetLeader sets the controller group's leader id (0: no leader: Status
// and mutations fail like a leaderless group).
func (c *fakeController) SetLeader(id uint64) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.leader = id
}

// SetMemberStatus sets ClusterStatus.controller (the default is built from
// the leader id).
func (c *fakeController) SetMemberStatus(st *shardkvpb.MemberStatus) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.members = proto.Clone(st).(*shardkvpb.MemberStatus)
}

// FailWith makes method (Query, Status, Join, Leave, Move, Unpin) fail with
// err until cleared with nil.
func (c *fakeController) FailWith(method string, err error) {
	c.d.setErr(c.errs, method, err)
}

// Watchers is how many Watch streams are open.
func (c *fakeController) Watchers() int {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	return len(c.watches)
}

var errFakeNoLeader = fmt.Errorf("fake controller: no leader")

// begin records the call and returns the injected error, if any.
func (c *fakeController) begin(method string, mutation bool, args ...any) error {
	c.d.record(c.key, method, args...)
	if err := c.errs[method]; err != nil {
		return err
	}
	if mutation && c.leader == 0 {
		return errFakeNoLeader
	}
	return nil
}

func (c *fakeController) Query(_ context.Context, num int64) (*shardkvpb.Config, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.begin("Query", false, num); err != nil {
		return nil, err
	}
	if num < 0 || num >= int64(len(c.configs)) {
		num = int64(len(c.configs) - 1)
	}
	return proto.Clone(c.configs[num]).(*shardkvpb.Config), nil
}

func (c *fakeController) Status(_ context.Context) (*shardkvpb.ClusterStatus, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.begin("Status", true); err != nil { // leader-only, like the real one
		return nil, err
	}
	latest := c.configs[len(c.configs)-1]
	st := &shardkvpb.ClusterStatus{Latest: proto.Clone(latest).(*shardkvpb.Config), Nshards: uint32(len(latest.Shards))}
	if c.members != nil {
		st.Controller = proto.Clone(c.members).(*shardkvpb.MemberStatus)
	} else {
		st.Controller = &shardkvpb.MemberStatus{Id: c.leader, Role: "leader", Leader: c.leader}
	}
	for _, r := range c.reports {
		age, ok := c.ages[r.Gid]
		if !ok {
			age = 100
		}
		st.Groups = append(st.Groups, &shardkvpb.GroupStatus{Report: proto.Clone(r).(*shardkvpb.GroupReport), AgeMs: age})
	}
	return st, nil
}

// next returns a copy of the latest config to modify into the next one.
func (c *fakeController) next() *shardkvpb.Config {
	return proto.Clone(c.configs[len(c.configs)-1]).(*shardkvpb.Config)
}

func (c *fakeController) Join(_ context.Context, groups ...*shardkvpb.Group) (*shardkvpb.Config, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	var gids []uint64
	for _, g := range groups {
		gids = append(gids, g.Gid)
	}
	if err := c.begin("Join", true, gids); err != nil {
		return nil, err
	}
	cfg := c.next()
	for _, g := range groups {
		if i := slices.IndexFunc(cfg.Groups, func(x *shardkvpb.Group) bool { return x.Gid == g.Gid }); i >= 0 {
			return nil, fmt.Errorf("fake: join: group %d is already in the config", g.Gid)
		}
		cfg.Groups = append(cfg.Groups, proto.Clone(g).(*shardkvpb.Group))
	}
	slices.SortFunc(cfg.Groups, func(a, b *shardkvpb.Group) int { return int(a.Gid) - int(b.Gid) })
	fakeRebalance(cfg)
	return c.appendLocked(cfg), nil
}

func (c *fakeController) Leave(_ context.Context, gids ...uint64) (*shardkvpb.Config, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.begin("Leave", true, gids); err != nil {
		return nil, err
	}
	cfg := c.next()
	cfg.Groups = slices.DeleteFunc(cfg.Groups, func(g *shardkvpb.Group) bool { return slices.Contains(gids, g.Gid) })
	cfg.Pins = slices.DeleteFunc(cfg.Pins, func(p *shardkvpb.Pin) bool { return slices.Contains(gids, p.Gid) })
	fakeRebalance(cfg)
	return c.appendLocked(cfg), nil
}

func (c *fakeController) Move(_ context.Context, shard int, gid uint64) (*shardkvpb.Config, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.begin("Move", true, shard, gid); err != nil {
		return nil, err
	}
	cfg := c.next()
	if shard < 0 || shard >= len(cfg.Shards) {
		return nil, fmt.Errorf("fake: move: shard %d is out of range [0, %d)", shard, len(cfg.Shards))
	}
	if !slices.ContainsFunc(cfg.Groups, func(g *shardkvpb.Group) bool { return g.Gid == gid }) {
		return nil, fmt.Errorf("fake: move: group %d is not in the config", gid)
	}
	cfg.Pins = slices.DeleteFunc(cfg.Pins, func(p *shardkvpb.Pin) bool { return int(p.Shard) == shard })
	cfg.Pins = append(cfg.Pins, &shardkvpb.Pin{Shard: uint32(shard), Gid: gid})
	slices.SortFunc(cfg.Pins, func(a, b *shardkvpb.Pin) int { return int(a.Shard) - int(b.Shard) })
	fakeRebalance(cfg)
	return c.appendLocked(cfg), nil
}

func (c *fakeController) Unpin(_ context.Context, shard int) (*shardkvpb.Config, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.begin("Unpin", true, shard); err != nil {
		return nil, err
	}
	cfg := c.next()
	cfg.Pins = slices.DeleteFunc(cfg.Pins, func(p *shardkvpb.Pin) bool { return int(p.Shard) == shard })
	fakeRebalance(cfg)
	return c.appendLocked(cfg), nil
}

// Users is not recorded as a call: the reconciler reads it every pass.
func (c *fakeController) Users(_ context.Context) (*shardkvpb.UsersReply, error) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	if err := c.errs["Users"]; err != nil {
		return nil, err
	}
	out := &shardkvpb.UsersReply{}
	for _, u := range c.users {
		out.Users = append(out.Users, proto.Clone(u).(*shardkvpb.User))
	}
	return out, nil
}

// SetUsers applies req as the controller does: replace_managed drops the
// managed users first, then set adds or replaces by name.
func (c *fakeController) SetUsers(ctx context.Context, req *shardkvpb.SetUsersRequest) (*shardkvpb.UsersReply, error) {
	c.d.mu.Lock()
	names := []string{}
	for _, u := range req.GetSet() {
		names = append(names, u.GetName())
	}
	if err := c.begin("SetUsers", true, strings.Join(names, ",")); err != nil {
		c.d.mu.Unlock()
		return nil, err
	}
	if req.GetReplaceManaged() {
		c.users = slices.DeleteFunc(c.users, (*shardkvpb.User).GetManaged)
	}
	for _, u := range req.GetSet() {
		c.users = slices.DeleteFunc(c.users, func(x *shardkvpb.User) bool { return x.GetName() == u.GetName() })
		c.users = append(c.users, proto.Clone(u).(*shardkvpb.User))
	}
	for _, n := range req.GetDelete() {
		c.users = slices.DeleteFunc(c.users, func(x *shardkvpb.User) bool { return x.GetName() == n })
	}
	slices.SortFunc(c.users, func(a, b *shardkvpb.User) int { return strings.Compare(a.GetName(), b.GetName()) })
	c.d.mu.Unlock()
	return c.Users(ctx)
}

// Watch streams configs from `from` on, like the real client: it never
// closes before ctx ends. It is recorded as a call ("Watch", from).
func (c *fakeController) Watch(ctx context.Context, from uint64) <-chan *shardkvpb.Config {
	out := make(chan *shardkvpb.Config, 16)
	wake := make(chan struct{}, 1)
	c.d.mu.Lock()
	c.d.record(c.key, "Watch", from)
	c.watches = append(c.watches, wake)
	c.d.mu.Unlock()
	go func() {
		defer close(out)
		defer func() {
			c.d.mu.Lock()
			c.watches = slices.DeleteFunc(c.watches, func(w chan struct{}) bool { return w == wake })
			c.d.mu.Unlock()
		}()
		next := from
		for {
			c.d.mu.Lock()
			var pending []*shardkvpb.Config
			for ; next < uint64(len(c.configs)); next++ {
				pending = append(pending, proto.Clone(c.configs[next]).(*shardkvpb.Config))
			}
			c.d.mu.Unlock()
			for _, cfg := range pending {
				select {
				case out <- cfg:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// fakeRebalance spreads the shards evenly over the groups in gid order
// (shard i to groups[i*len/n]), pinned shards to their pin.
func fakeRebalance(cfg *shardkvpb.Config) {
	n := len(cfg.Shards)
	for i := range cfg.Shards {
		cfg.Shards[i] = 0
		if len(cfg.Groups) > 0 {
			cfg.Shards[i] = cfg.Groups[i*len(cfg.Groups)/n].Gid
		}
	}
	for _, p := range cfg.Pins {
		if int(p.Shard) < n {
			cfg.Shards[p.Shard] = p.Gid
		}
	}
}

// fakeReplica is one replica's admin API.
type fakeReplica struct {
	d      *fakeDataPlane
	addr   string
	status *shardkvpb.MemberStatus
	errs   map[string]error
}

var _ ReplicaAPI = (*fakeReplica)(nil)

// SetStatus sets what Status returns (a copy of st).
func (r *fakeReplica) SetStatus(st *shardkvpb.MemberStatus) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	r.status = proto.Clone(st).(*shardkvpb.MemberStatus)
}

// UpdateStatus changes the status in place under the lock.
func (r *fakeReplica) UpdateStatus(f func(st *shardkvpb.MemberStatus)) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	f(r.status)
}

// FailWith makes method (Status, AddLearner, Promote, RemoveMember,
// TransferLeader) fail with err until cleared with nil.
func (r *fakeReplica) FailWith(method string, err error) {
	r.d.setErr(r.errs, method, err)
}

func (r *fakeReplica) begin(method string, args ...any) error {
	r.d.record(r.addr, method, args...)
	return r.errs[method]
}

func (r *fakeReplica) Status(context.Context) (*shardkvpb.MemberStatus, error) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if err := r.begin("Status"); err != nil {
		return nil, err
	}
	return proto.Clone(r.status).(*shardkvpb.MemberStatus), nil
}

// The membership calls only record (and fail if told to). A test that
// wants them to take effect sets a hook (dp.OnReplicaCall) that changes the
// statuses, e.g. AddLearner adds a learner to the leader's member list.

func (r *fakeReplica) call(method string, args ...any) error {
	r.d.mu.Lock()
	err := r.begin(method, args...)
	hook := r.d.hook
	r.d.mu.Unlock()
	if err == nil && hook != nil {
		hook(r, fakeCall{Target: r.addr, Method: method, Args: args})
	}
	return err
}

func (r *fakeReplica) AddLearner(_ context.Context, id uint64, addr string) error {
	return r.call("AddLearner", id, addr)
}

func (r *fakeReplica) Promote(_ context.Context, id uint64) error {
	return r.call("Promote", id)
}

func (r *fakeReplica) RemoveMember(_ context.Context, id uint64) error {
	return r.call("RemoveMember", id)
}

func (r *fakeReplica) TransferLeader(_ context.Context, to uint64) error {
	return r.call("TransferLeader", to)
}
