package controllers

// Helpers of the ReplicaGroup envtest tests: the reconciler's setup, a
// client and data plane that record or adjust calls, and object helpers.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

const testImage = "registry.local/shardkv/node:test"

// setupReplicaGroup registers a ReplicaGroupReconciler on the fake data
// plane, with short requeues. Its client records StatefulSet scaling and
// pod/claim deletions into dp's call log (targets "sts", "pod", "pvc"), so
// tests can check their order against the data-plane calls.
func setupReplicaGroup(dp *fakeDataPlane, opts ...func(*ReplicaGroupReconciler)) func(ctrl.Manager) error {
	return func(mgr ctrl.Manager) error {
		r := &ReplicaGroupReconciler{
			Client:       recordingClient{Client: mgr.GetClient(), dp: dp},
			DataPlane:    joinUpdatesDataPlane{dp},
			DefaultImage: testImage,
			RequeueShort: 50 * time.Millisecond,
			RequeueIdle:  time.Second,
			CallTimeout:  time.Second,
		}
		for _, o := range opts {
			o(r)
		}
		return r.SetupWithManager(mgr)
	}
}

// note appends a call to dp's log.
func (d *fakeDataPlane) note(target, method string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.record(target, method, args...)
}

// recordingClient notes the reconciler's scaling and deletions.
type recordingClient struct {
	client.Client
	dp *fakeDataPlane
}

func (c recordingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	if s, ok := obj.(*appsv1.StatefulSet); ok && err == nil {
		c.dp.note("sts", "Scale", s.Name, *s.Spec.Replicas)
	}
	return err
}

func (c recordingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := c.Client.Delete(ctx, obj, opts...)
	if err == nil {
		switch obj.(type) {
		case *corev1.Pod:
			c.dp.note("pod", "DeletePod", obj.GetName())
		case *corev1.PersistentVolumeClaim:
			c.dp.note("pvc", "DeletePVC", obj.GetName())
		}
	}
	return err
}

// joinUpdatesDataPlane makes the fake controller's Join of a gid already
// in the config an update of its servers and weight, as the real
// controller does (docs/controller.md); the shared fake refuses it.
type joinUpdatesDataPlane struct{ *fakeDataPlane }

func (d joinUpdatesDataPlane) Controller(creds *mtls.Source, addrs []string) (ControllerAPI, error) {
	c, err := d.fakeDataPlane.Controller(creds, addrs)
	if err != nil {
		return nil, err
	}
	return joinUpdates{c.(*fakeController)}, nil
}

type joinUpdates struct{ *fakeController }

func (c joinUpdates) Join(ctx context.Context, groups ...*shardkvpb.Group) (*shardkvpb.Config, error) {
	latest := c.Latest()
	if !slices.ContainsFunc(groups, func(g *shardkvpb.Group) bool { return configGroup(latest, g.Gid) != nil }) {
		return c.fakeController.Join(ctx, groups...)
	}
	var gids []uint64
	for _, g := range groups {
		gids = append(gids, g.Gid)
	}
	c.d.note(c.key, "Join", gids)
	c.d.mu.Lock()
	err := c.errs["Join"]
	c.d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	next := proto.Clone(latest).(*shardkvpb.Config)
	for _, g := range groups {
		for i, x := range next.Groups {
			if x.Gid == g.Gid {
				next.Groups[i] = proto.Clone(g).(*shardkvpb.Group)
			}
		}
		if configGroup(next, g.Gid) == nil {
			next.Groups = append(next.Groups, proto.Clone(g).(*shardkvpb.Group))
		}
	}
	slices.SortFunc(next.Groups, func(a, b *shardkvpb.Group) int { return cmpU64(a.Gid, b.Gid) })
	if len(next.Groups) != len(latest.Groups) {
		fakeRebalance(next)
	}
	c.SetConfig(next)
	return c.Latest(), nil
}

func newShardMap(t *testing.T, ns, name string) *shardkvv1.ShardMap {
	t.Helper()
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: shardkvv1.ShardMapSpec{Shards: 16, Controller: shardkvv1.ControllerSpec{Replicas: 3}}}
	if err := k8sClient.Create(context.Background(), sm); err != nil {
		t.Fatalf("create shardmap: %v", err)
	}
	return sm
}

func newReplicaGroup(t *testing.T, ns, name, sm string, replicas int32, mutate ...func(*shardkvv1.ReplicaGroup)) *shardkvv1.ReplicaGroup {
	t.Helper()
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: shardkvv1.ReplicaGroupSpec{ShardMap: sm, Replicas: ptr.To(replicas)}}
	for _, m := range mutate {
		m(rg)
	}
	if err := k8sClient.Create(context.Background(), rg); err != nil {
		t.Fatalf("create replicagroup: %v", err)
	}
	return rg
}

func getRG(ns, name string) (*shardkvv1.ReplicaGroup, error) {
	rg := &shardkvv1.ReplicaGroup{}
	return rg, get(context.Background(), ns, name, rg)
}

// updateRG changes a ReplicaGroup's spec, retrying conflicts.
func updateRG(t *testing.T, ns, name string, f func(*shardkvv1.ReplicaGroup)) {
	t.Helper()
	eventually(t, "update "+name, func() error {
		rg, err := getRG(ns, name)
		if err != nil {
			return err
		}
		f(rg)
		return k8sClient.Update(context.Background(), rg)
	})
}

func condition(rg *shardkvv1.ReplicaGroup, typ string) *metav1.Condition {
	return meta.FindStatusCondition(rg.Status.Conditions, typ)
}

// waitServing waits until the group is Ready and Serving with n members.
func waitServing(t *testing.T, ns, name string, n int) *shardkvv1.ReplicaGroup {
	t.Helper()
	var rg *shardkvv1.ReplicaGroup
	eventually(t, name+" serving with "+fmt.Sprint(n)+" members", func() error {
		var err error
		if rg, err = getRG(ns, name); err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionReady)
		// A status older than the spec (observedGeneration) may still say
		// "serving with n" from before a change the test just made: a
		// scale-in to 3 and back to 4 found the old status of 4 members
		// while the group had 3 (CI at c8a9159).
		if rg.Status.ObservedGeneration != rg.Generation || rg.Status.Phase != shardkvv1.PhaseServing || c == nil ||
			c.Status != metav1.ConditionTrue || len(rg.Status.Members) != n || rg.Status.Replicas != int32(n) {
			return fmt.Errorf("generation %d observed %d, phase %q, %d members, ready %v", rg.Generation, rg.Status.ObservedGeneration, rg.Status.Phase, len(rg.Status.Members), c)
		}
		return nil
	})
	return rg
}

// callsOf filters the log to these methods and renders "Method(args)".
func callsOf(dp *fakeDataPlane, methods ...string) []string {
	var out []string
	for _, c := range dp.CallsTo(methods...) {
		out = append(out, fmt.Sprintf("%s%v", c.Method, c.Args))
	}
	return out
}

// startTwoGroups starts the ReplicaGroup reconciler (and the ShardMap
// reconciler too, with withShardMap), ShardMap "sm" (16 shards at the fake
// controller), and groups "a" and "b" of n replicas each, simulated and
// serving.
func startTwoGroups(t *testing.T, n int, withShardMap bool) (ns string, dp *fakeDataPlane) {
	t.Helper()
	ns = newNamespace(t)
	dp = newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	setups := []func(ctrl.Manager) error{setupReplicaGroup(dp)}
	if withShardMap {
		setups = append(setups, setupShardMap(dp))
	}
	startManager(t, ns, setups...)
	newShardMap(t, ns, "sm")
	a := startGroupSim(t, ns, "a", n, dp)
	b := startGroupSim(t, ns, "b", n, dp)
	simHooks(dp, a, b)
	for _, g := range []string{"a", "b"} {
		newReplicaGroup(t, ns, g, "sm", int32(n))
	}
	for _, g := range []string{"a", "b"} {
		waitServing(t, ns, g, n)
	}
	return ns, dp
}

// startSimGroup starts the ReplicaGroup reconciler, ShardMap "sm" (16
// shards at the fake controller) and the simulation of group "g"
// bootstrapped with n replicas; the test creates the ReplicaGroup.
func startSimGroup(t *testing.T, n int) (ns string, dp *fakeDataPlane, g *groupSim) {
	t.Helper()
	ns = newNamespace(t)
	dp = newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g = startGroupSim(t, ns, "g", n, dp)
	simHooks(dp, g)
	return ns, dp, g
}
