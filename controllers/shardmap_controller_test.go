package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// setupShardMap registers a ShardMapReconciler over dp, with short resync
// periods; opts adjust it.
func setupShardMap(dp DataPlane, opts ...func(*ShardMapReconciler)) func(ctrl.Manager) error {
	return func(mgr ctrl.Manager) error {
		r := &ShardMapReconciler{
			DataPlane:    dp,
			DefaultImage: "shardkv:test",
			BusyResync:   300 * time.Millisecond,
			IdleResync:   2 * time.Second,
			CallTimeout:  2 * time.Second,
		}
		for _, o := range opts {
			o(r)
		}
		return r.SetupWithManager(mgr)
	}
}

func testShardMap(ns, name string, shards, ctrlers int32) *shardkvv1.ShardMap {
	return &shardkvv1.ShardMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: shardkvv1.ShardMapSpec{
			Shards: shards,
			Controller: shardkvv1.ControllerSpec{
				Replicas: ctrlers,
				Storage:  shardkvv1.StorageSpec{Size: resource.MustParse("256Mi")},
			},
		},
	}
}

func mustCreate(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8sClient.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// waitSM polls the ShardMap until check passes.
func waitSM(t *testing.T, ns, name, what string, check func(sm *shardkvv1.ShardMap) error) *shardkvv1.ShardMap {
	t.Helper()
	sm := &shardkvv1.ShardMap{}
	eventually(t, what, func() error {
		if err := get(context.Background(), ns, name, sm); err != nil {
			return err
		}
		return check(sm)
	})
	return sm
}

func condIs(sm *shardkvv1.ShardMap, typ string, status metav1.ConditionStatus, reason, msgSub string) error {
	c := meta.FindStatusCondition(sm.Status.Conditions, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msgSub) {
		return fmt.Errorf("%s=%s reason %s %q; want %s reason %s containing %q", typ, c.Status, c.Reason, c.Message, status, reason, msgSub)
	}
	return nil
}

// markCtrlerReady plays the StatefulSet controller: n of the controller
// StatefulSet's replicas are ready.
func markCtrlerReady(t *testing.T, ns, sm string, n int32, mutate ...func(*appsv1.StatefulSetStatus)) {
	t.Helper()
	eventually(t, "controller StatefulSet status", func() error {
		sts := &appsv1.StatefulSet{}
		if err := get(context.Background(), ns, CtrlerName(sm), sts); err != nil {
			return err
		}
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.ObservedGeneration = *sts.Spec.Replicas, n, sts.Generation
		for _, m := range mutate {
			m(&sts.Status)
		}
		return k8sClient.Status().Update(context.Background(), sts)
	})
}

// createGroup creates ReplicaGroup name of ShardMap sm with status.groupID
// gid (0: none yet). No ReplicaGroup reconciler runs in these tests.
func createGroup(t *testing.T, ns, name, sm string, gid int64) {
	t.Helper()
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: sm}}
	mustCreate(t, rg)
	if gid == 0 {
		return
	}
	rg.Status.GroupID = gid
	if err := k8sClient.Status().Update(context.Background(), rg); err != nil {
		t.Fatal(err)
	}
}

func smGroup(gid uint64) *shardkvpb.Group {
	return &shardkvpb.Group{Gid: gid, Weight: 1, Servers: []*shardkvpb.Server{{Id: 1, Addr: fmt.Sprintf("g%d-0:7000", gid)}}}
}

func TestShardMapCreatesObjects(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp))
	ctx := context.Background()

	sm := testShardMap(ns, "demo", 64, 3)
	sm.Spec.Controller.Image = "example/shardkv:1"
	sm.Spec.Controller.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	mustCreate(t, sm)

	name := CtrlerName("demo")
	isOwned := func(o client.Object) error {
		for _, ref := range o.GetOwnerReferences() {
			if ref.Kind == "ShardMap" && ref.Name == "demo" && ref.UID == sm.UID && ref.Controller != nil && *ref.Controller {
				return nil
			}
		}
		return fmt.Errorf("%s has no controller reference to the ShardMap: %v", o.GetName(), o.GetOwnerReferences())
	}

	sts := &appsv1.StatefulSet{}
	eventually(t, "controller StatefulSet", func() error {
		if err := get(ctx, ns, name, sts); err != nil {
			return err
		}
		return isOwned(sts)
	})
	if got := *sts.Spec.Replicas; got != 3 {
		t.Errorf("replicas %d, want 3", got)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType || sts.Spec.ServiceName != name {
		t.Errorf("podManagementPolicy %s, updateStrategy %s, serviceName %s", sts.Spec.PodManagementPolicy, sts.Spec.UpdateStrategy.Type, sts.Spec.ServiceName)
	}
	if vct := sts.Spec.VolumeClaimTemplates; len(vct) != 1 || vct[0].Name != "data" || vct[0].Spec.Resources.Requests.Storage().String() != "256Mi" {
		t.Errorf("volumeClaimTemplates %+v", vct)
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	wantArgs := []string{
		"serve", "--role=ctrler", "--id=auto", "--data-dir=/data", "--listen=0.0.0.0:7000",
		"--advertise=$(POD_NAME).demo-ctrler." + ns + ".svc:7000",
		"--peers=" + PeersFlag(name, 3, ns),
		"--shards=64", "--placement=balanced", "--http=0.0.0.0:8080",
	}
	if c.Name != "node" || c.Image != "example/shardkv:1" || c.ImagePullPolicy != corev1.PullIfNotPresent || !slices.Equal(c.Command, []string{"/node"}) {
		t.Errorf("container %s image %s pull %s command %v", c.Name, c.Image, c.ImagePullPolicy, c.Command)
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args\n got %q\nwant %q", c.Args, wantArgs)
	}
	if !strings.Contains(strings.Join(c.Args, " "), "1=demo-ctrler-0.demo-ctrler."+ns+".svc:7000,2=demo-ctrler-1.") {
		t.Errorf("peers %q", c.Args)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "POD_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env %+v", c.Env)
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v", what, p)
		}
	}
	if q := c.Resources.Requests[corev1.ResourceCPU]; q.String() != "100m" {
		t.Errorf("resources %+v", c.Resources)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.FSGroup == nil || *pod.SecurityContext.FSGroup != NodeUID {
		t.Errorf("pod security context %+v", pod.SecurityContext)
	}

	svc := &corev1.Service{}
	eventually(t, "controller Service", func() error {
		if err := get(ctx, ns, name, svc); err != nil {
			return err
		}
		return isOwned(svc)
	})
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || len(svc.Spec.Ports) != 2 ||
		svc.Spec.Ports[0].Port != GRPCPort || svc.Spec.Ports[1].Port != HTTPPort {
		t.Errorf("service spec %+v", svc.Spec)
	}

	pdb := &policyv1.PodDisruptionBudget{}
	eventually(t, "controller PDB", func() error {
		if err := get(ctx, ns, name, pdb); err != nil {
			return err
		}
		return isOwned(pdb)
	})
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("PDB minAvailable %v, want 2 (a majority of 3)", pdb.Spec.MinAvailable)
	}

	// No pod is ready (envtest runs no StatefulSet controller): the wait is
	// recorded, and no data-plane call is made.
	waitSM(t, ns, "demo", "Ready=False WaitingForControllerQuorum", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.NextGroupID != 1 || sm.Status.ObservedGeneration != sm.Generation {
			return fmt.Errorf("nextGroupID %d observedGeneration %d", sm.Status.NextGroupID, sm.Status.ObservedGeneration)
		}
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonWaitingForControllerQuorum, "0/3 controller pods ready (2 needed for a quorum)")
	})
	if calls := dp.CallsTo("Status"); len(calls) != 0 {
		t.Errorf("data-plane calls without a quorum: %v", calls)
	}
	eventually(t, "Created events", func() error { return hasEvent(ns, "demo", "Created", "StatefulSet "+name) })

	// A one-replica controller group: default image, PDB minAvailable 1.
	mustCreate(t, testShardMap(ns, "solo", 16, 1))
	eventually(t, "solo PDB", func() error { return get(ctx, ns, CtrlerName("solo"), pdb) })
	if pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("solo PDB minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if err := get(ctx, ns, CtrlerName("solo"), sts); err != nil {
		t.Fatal(err)
	}
	if img := sts.Spec.Template.Spec.Containers[0].Image; img != "shardkv:test" {
		t.Errorf("default image %q, want the operator's shardkv:test", img)
	}

	// A spec change reaches the template (the operator rolls pods itself).
	eventually(t, "image update", func() error {
		var cur shardkvv1.ShardMap
		if err := get(ctx, ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Controller.Image = "example/shardkv:2"
		return k8sClient.Update(ctx, &cur)
	})
	eventually(t, "new image in the template", func() error {
		if err := get(ctx, ns, name, sts); err != nil {
			return err
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "example/shardkv:2" {
			return fmt.Errorf("image %s", img)
		}
		return nil
	})

	// Volumes cannot change: said in status.
	eventually(t, "storage change", func() error {
		var cur shardkvv1.ShardMap
		if err := get(ctx, ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Controller.Storage.Size = resource.MustParse("512Mi")
		return k8sClient.Update(ctx, &cur)
	})
	waitSM(t, ns, "demo", "Degraded StorageImmutable", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionDegraded, metav1.ConditionTrue, ReasonStorageImmutable, "(512Mi) differs from the volumes the controller group was created with (256Mi)")
	})

	// Resizing the controller group is refused by the CRD (CEL) until it
	// is supported; the StatefulSet keeps its size.
	var cur shardkvv1.ShardMap
	if err := get(ctx, ns, "demo", &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Controller.Replicas = 5
	expectRefused(t, "controller resize", k8sClient.Update(ctx, &cur), "resizing the controller group is not supported")
	if err := get(ctx, ns, name, sts); err != nil || *sts.Spec.Replicas != 3 {
		t.Errorf("after resize request: replicas %d (%v), want 3", *sts.Spec.Replicas, err)
	}
}

func TestShardMapStatusFromController(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(8)
	startManager(t, ns, setupShardMap(dp))

	mustCreate(t, testShardMap(ns, "demo", 8, 3))
	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)
	createGroup(t, ns, "other-cluster", "elsewhere", 7)
	markCtrlerReady(t, ns, "demo", 2)

	// A quorum runs but no group joined.
	waitSM(t, ns, "demo", "Ready=False NoGroups", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ControllerReadyReplicas != 2 {
			return fmt.Errorf("controllerReadyReplicas %d", sm.Status.ControllerReadyReplicas)
		}
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonNoGroups, "no ReplicaGroup has joined")
	})

	// Groups 1 and 2 own 4 shards each; shards 6 and 7 are moving from
	// a to b (b pulls, a keeps the frozen copy).
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	num := fc.Latest().Num
	fc.SetReports(
		&shardkvpb.GroupReport{Gid: 1, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"},
			{Shard: 6, State: "BePulling", PeerGid: 2}, {Shard: 7, State: "BePulling", PeerGid: 2},
		}},
		&shardkvpb.GroupReport{Gid: 2, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 4, State: "Serving"}, {Shard: 5, State: "Serving"},
			{Shard: 6, State: "Pulling", PeerGid: 1, Keys: 30, TotalKeys: 100},
			{Shard: 7, State: "Pulling", PeerGid: 1, Keys: 20, TotalKeys: 100},
		}},
	)
	sm := waitSM(t, ns, "demo", "migration in status", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != int64(num) || sm.Status.MigratingShards != 2 {
			return fmt.Errorf("configNum %d migratingShards %d", sm.Status.ConfigNum, sm.Status.MigratingShards)
		}
		return nil
	})
	wantTable := []shardkvv1.ShardRange{
		{First: 0, Last: 3, Group: "a", GroupID: 1, State: "Serving"},
		{First: 4, Last: 5, Group: "b", GroupID: 2, State: "Serving"},
		{First: 6, Last: 7, Group: "b", GroupID: 2, State: "Pulling"},
	}
	if !slices.Equal(sm.Status.Table, wantTable) {
		t.Errorf("table\n got %+v\nwant %+v", sm.Status.Table, wantTable)
	}
	wantGroups := []shardkvv1.GroupRef{{Name: "a", GroupID: 1, Shards: 4}, {Name: "b", GroupID: 2, Shards: 4}}
	if !slices.Equal(sm.Status.Groups, wantGroups) || sm.Status.GroupCount != 2 {
		t.Errorf("groups %+v count %d", sm.Status.Groups, sm.Status.GroupCount)
	}
	if sm.Status.ShardStates["Serving"] != 6 || sm.Status.ShardStates["Pulling"] != 2 || len(sm.Status.ShardStates) != 2 {
		t.Errorf("shardStates %v", sm.Status.ShardStates)
	}
	wantMig := []shardkvv1.Migration{{Source: "a", Target: "b", Shards: 2, Keys: 50, TotalKeys: 200, Progress: "25%"}}
	if !slices.Equal(sm.Status.Migrations, wantMig) {
		t.Errorf("migrations %+v, want %+v", sm.Status.Migrations, wantMig)
	}
	for _, err := range []error{
		condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonShardsNotServing, "2 of 8 shards not serving"),
		condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionFalse, ReasonMigrationsInFlight, "2 shards migrating"),
		condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonShardsMoving, "a->b 2 shards 25%"),
	} {
		if err != nil {
			t.Error(err)
		}
	}

	// Reports change without a new config: the periodic resync picks up
	// the progress, then the end of the migration.
	fc.SetReports(
		&shardkvpb.GroupReport{Gid: 1, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"},
			{Shard: 6, State: "GCing", PeerGid: 2}, {Shard: 7, State: "BePulling", PeerGid: 2},
		}},
		&shardkvpb.GroupReport{Gid: 2, ConfigNum: num, Shards: []*shardkvpb.ShardState{
			{Shard: 4, State: "Serving"}, {Shard: 5, State: "Serving"},
			{Shard: 6, State: "Acking", PeerGid: 1, Keys: 100},
			{Shard: 7, State: "Pulling", PeerGid: 1, Keys: 80, TotalKeys: 100},
		}},
	)
	waitSM(t, ns, "demo", "progress 90%", func(sm *shardkvv1.ShardMap) error {
		if len(sm.Status.Migrations) != 1 || sm.Status.Migrations[0].Progress != "90%" {
			return fmt.Errorf("migrations %+v", sm.Status.Migrations)
		}
		return nil
	})
	serving := func(gid, num uint64, shards ...uint32) *shardkvpb.GroupReport {
		r := &shardkvpb.GroupReport{Gid: gid, ConfigNum: num}
		for _, s := range shards {
			r.Shards = append(r.Shards, &shardkvpb.ShardState{Shard: s, State: "Serving"})
		}
		return r
	}
	fc.SetReports(serving(1, num, 0, 1, 2, 3), serving(2, num, 4, 5, 6, 7))
	sm = waitSM(t, ns, "demo", "Ready and Balanced", func(sm *shardkvv1.ShardMap) error {
		if err := condIs(sm, shardkvv1.ConditionReady, metav1.ConditionTrue, ReasonServing, "all 8 shards serving on 2 groups"); err != nil {
			return err
		}
		return condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionTrue, ReasonSettled, "")
	})
	if err := condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionFalse, ReasonNoMigrations, ""); err != nil {
		t.Error(err)
	}
	if len(sm.Status.Migrations) != 0 || sm.Status.MigratingShards != 0 || !slices.Equal(sm.Status.Table, []shardkvv1.ShardRange{
		{First: 0, Last: 3, Group: "a", GroupID: 1, State: "Serving"}, {First: 4, Last: 7, Group: "b", GroupID: 2, State: "Serving"}}) {
		t.Errorf("settled status: %+v", sm.Status)
	}

	// A group no ReplicaGroup claims is shown by gid; one that has not
	// applied the config keeps the cluster unbalanced, its new shards
	// Pending and moving from their previous owner; nextGroupID stays
	// above every gid in use.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 9, 9}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2), smGroup(9)}})
	num2 := fc.Latest().Num
	fc.SetReports(serving(1, num2, 0, 1, 2, 3), serving(2, num2, 4, 5, 6, 7))
	sm = waitSM(t, ns, "demo", "unknown gid", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != int64(num2) {
			return fmt.Errorf("configNum %d", sm.Status.ConfigNum)
		}
		return nil
	})
	if last := sm.Status.Table[len(sm.Status.Table)-1]; last != (shardkvv1.ShardRange{First: 6, Last: 7, Group: "gid-9", GroupID: 9, State: "Pending"}) {
		t.Errorf("last range %+v", last)
	}
	if want := []shardkvv1.Migration{{Source: "b", Target: "gid-9", Shards: 2}}; !slices.Equal(sm.Status.Migrations, want) {
		t.Errorf("migrations %+v, want %+v", sm.Status.Migrations, want)
	}
	if sm.Status.NextGroupID != 10 {
		t.Errorf("nextGroupID %d, want 10", sm.Status.NextGroupID)
	}
	for _, err := range []error{
		condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionFalse, ReasonMigrationsInFlight, "gid-9 have not applied"),
		condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonShardsNotServing, "Pending=2"),
	} {
		if err != nil {
			t.Error(err)
		}
	}

	// The controller stops answering: the last known table stays, the
	// conditions say why.
	fc.FailWith("Status", errors.New("connection refused"))
	sm = waitSM(t, ns, "demo", "ControllerUnavailable", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonControllerUnavailable, "connection refused")
	})
	if sm.Status.ConfigNum != int64(num2) || len(sm.Status.Table) == 0 {
		t.Errorf("last known status lost: config %d table %v", sm.Status.ConfigNum, sm.Status.Table)
	}
	if err := condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionUnknown, ReasonControllerUnavailable, ""); err != nil {
		t.Error(err)
	}
}

// TestShardMapFollowsWatch: with periodic resyncs far away, a new config
// still reaches the status promptly (through the Watch stream).
func TestShardMapFollowsWatch(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.BusyResync, r.IdleResync = time.Hour, time.Hour }))
	mustCreate(t, testShardMap(ns, "demo", 4, 1))
	markCtrlerReady(t, ns, "demo", 1)
	waitSM(t, ns, "demo", "first status", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonNoGroups, "")
	})
	eventually(t, "a Watch stream", func() error {
		if fc.Watchers() != 1 {
			return fmt.Errorf("%d watchers", fc.Watchers())
		}
		return nil
	})
	for i := range 3 {
		fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1}, Groups: []*shardkvpb.Group{smGroup(1)}})
		want := int64(fc.Latest().Num)
		eventuallyWithin(t, 20*time.Second, fmt.Sprintf("config %d (round %d)", want, i), func() error {
			sm := &shardkvv1.ShardMap{}
			if err := get(context.Background(), ns, "demo", sm); err != nil {
				return err
			}
			if sm.Status.ConfigNum != want {
				return fmt.Errorf("configNum %d, want %d", sm.Status.ConfigNum, want)
			}
			return nil
		})
	}

	// Deleting the ShardMap ends its Watch.
	sm := &shardkvv1.ShardMap{}
	if err := get(context.Background(), ns, "demo", sm); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(context.Background(), sm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Watch stream closed", func() error {
		if n := fc.Watchers(); n != 0 {
			return fmt.Errorf("%d watchers", n)
		}
		return nil
	})
}

func TestShardMapMoves(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(8)
	// Shard 7 is pinned to group 1, which spec.moves does not ask for.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 2, 1}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)},
		Pins: []*shardkvpb.Pin{{Shard: 7, Gid: 1}}})
	startManager(t, ns, setupShardMap(dp))

	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)
	createGroup(t, ns, "late", "demo", 0) // no group id yet
	sm := testShardMap(ns, "demo", 8, 3)
	sm.Spec.Moves = []shardkvv1.ShardMove{{Shard: 5, Group: "a"}, {Shard: 0, Group: "b"}, {Shard: 2, Group: "late"}}
	mustCreate(t, sm)
	markCtrlerReady(t, ns, "demo", 3)

	eventually(t, "two Moves and an Unpin", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n < 3 {
			return fmt.Errorf("%d calls: %v", n, dp.CallsTo("Move", "Unpin"))
		}
		return nil
	})
	// No further call: each pass re-reads the pins, so nothing is repeated.
	consistently(t, 2*time.Second, "no repeated call", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n != 3 {
			return fmt.Errorf("%d calls: %v", n, dp.CallsTo("Move", "Unpin"))
		}
		return nil
	})
	var got []string
	for _, c := range dp.CallsTo("Move", "Unpin") {
		got = append(got, fmt.Sprint(c.Method, c.Args))
	}
	if want := []string{"Move[0 2]", "Move[5 1]", "Unpin[7]"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v (in shard order, one per pass)", got, want)
	}
	pins := fc.Latest().Pins
	if len(pins) != 2 || pins[0].Shard != 0 || pins[0].Gid != 2 || pins[1].Shard != 5 || pins[1].Gid != 1 {
		t.Errorf("pins %v", pins)
	}
	for _, want := range [][2]string{{"Moved", "pinned shard 0 to b (gid 2)"}, {"Moved", "pinned shard 5 to a (gid 1)"}, {"Unpinned", "unpinned shard 7"}} {
		eventually(t, "event "+want[1], func() error { return hasEvent(ns, "demo", want[0], want[1]) })
	}
	waitSM(t, ns, "demo", "the move to late waits", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForMoves, "ReplicaGroup late has no group id yet")
	})

	// A failing Move is an Event and a condition; it is retried.
	fc.FailWith("Move", errors.New("not leader"))
	eventually(t, "spec.moves change", func() error {
		var cur shardkvv1.ShardMap
		if err := get(context.Background(), ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Moves = []shardkvv1.ShardMove{{Shard: 5, Group: "a"}, {Shard: 0, Group: "b"}, {Shard: 1, Group: "b"}}
		return k8sClient.Update(context.Background(), &cur)
	})
	eventually(t, "MoveFailed event", func() error { return hasEvent(ns, "demo", "MoveFailed", "move shard 1 to b (gid 2): not leader") })
	fc.FailWith("Move", nil)
	waitSM(t, ns, "demo", "moves applied", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonUpToDate, "")
	})
	if pins := fc.Latest().Pins; len(pins) != 3 || pins[1].Shard != 1 || pins[1].Gid != 2 {
		t.Errorf("pins %v", pins)
	}
}

func TestShardMapPaused(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	startManager(t, ns, setupShardMap(dp))
	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)

	sm := testShardMap(ns, "demo", 4, 1)
	sm.Spec.Paused = true
	sm.Spec.Moves = []shardkvv1.ShardMove{{Shard: 0, Group: "b"}}
	mustCreate(t, sm)
	waitSM(t, ns, "demo", "Progressing=False Paused", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonPaused, "spec.paused is set")
	})
	eventually(t, "Paused event", func() error { return hasEvent(ns, "demo", "Paused", "") })
	consistently(t, 2*time.Second, "nothing created while paused", func() error {
		err := get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("StatefulSet: %v", err)
		}
		return nil
	})

	// Unpause: the objects come, then the move.
	setPaused := func(p bool) {
		eventually(t, fmt.Sprintf("paused=%v", p), func() error {
			var cur shardkvv1.ShardMap
			if err := get(context.Background(), ns, "demo", &cur); err != nil {
				return err
			}
			cur.Spec.Paused = p
			return k8sClient.Update(context.Background(), &cur)
		})
	}
	setPaused(false)
	eventually(t, "StatefulSet after unpause", func() error {
		return get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{})
	})
	eventually(t, "Resumed event", func() error { return hasEvent(ns, "demo", "Resumed", "") })
	markCtrlerReady(t, ns, "demo", 1)
	eventually(t, "the move", func() error {
		if len(dp.CallsTo("Move")) != 1 {
			return fmt.Errorf("calls %v", dp.CallsTo("Move"))
		}
		return nil
	})

	// Paused again: status still follows the controller, but no mutation
	// (the new pin request waits) and no object change.
	setPaused(true)
	waitSM(t, ns, "demo", "paused again", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonPaused, "")
	})
	eventually(t, "moves and image while paused", func() error {
		var cur shardkvv1.ShardMap
		if err := get(context.Background(), ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Moves = append(cur.Spec.Moves, shardkvv1.ShardMove{Shard: 3, Group: "a"})
		cur.Spec.Controller.Image = "example/other:1"
		return k8sClient.Update(context.Background(), &cur)
	})
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{2, 1, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}, Pins: []*shardkvpb.Pin{{Shard: 0, Gid: 2}}})
	want := int64(fc.Latest().Num)
	waitSM(t, ns, "demo", "status updated while paused", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != want {
			return fmt.Errorf("configNum %d want %d", sm.Status.ConfigNum, want)
		}
		return nil
	})
	consistently(t, 2*time.Second, "no mutation while paused", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n != 1 {
			return fmt.Errorf("calls %v", dp.CallsTo("Move", "Unpin"))
		}
		sts := &appsv1.StatefulSet{}
		if err := get(context.Background(), ns, CtrlerName("demo"), sts); err != nil {
			return err
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "shardkv:test" {
			return fmt.Errorf("image changed to %s while paused", img)
		}
		return nil
	})
}

// TestShardMapRollsPods: a template change rolls the controller pods one at
// a time, each only when all are ready, followers first and the leader last.
func TestShardMapRollsPods(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	// The leader is pod 1.
	fc.SetMemberStatus(&shardkvpb.MemberStatus{Id: 2, Leader: 2, Role: "leader", Addr: "demo-ctrler-1.demo-ctrler." + ns + ".svc:7000"})
	startManager(t, ns, setupShardMap(dp))
	mustCreate(t, testShardMap(ns, "demo", 4, 3))
	eventually(t, "StatefulSet", func() error { return get(context.Background(), ns, CtrlerName("demo"), &appsv1.StatefulSet{}) })

	// Play the StatefulSet controller and kubelet: pods at revision r1,
	// the StatefulSet's update revision r2.
	mkPod := func(ord int, rev string) {
		t.Helper()
		sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
		labels := ctrlerLabels(sm)
		labels[stsRevisionLabel] = rev
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("demo-ctrler-%d", ord), Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "x"}}},
		}
		mustCreate(t, pod)
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		pod.Status.PodIP = fmt.Sprintf("10.0.0.%d", ord+1)
		if err := k8sClient.Status().Update(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		mkPod(i, "r1")
	}
	markCtrlerReady(t, ns, "demo", 3, func(s *appsv1.StatefulSetStatus) { s.CurrentRevision, s.UpdateRevision = "r1", "r2" })

	deleted := func() []string {
		var out []string
		var pods corev1.PodList
		if err := k8sClient.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			name := fmt.Sprintf("demo-ctrler-%d", i)
			if !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == name }) {
				out = append(out, name)
			}
		}
		return out
	}
	var order []string
	for round := range 3 {
		eventually(t, fmt.Sprintf("round %d: a pod deleted", round), func() error {
			if d := deleted(); len(d) != 1 {
				return fmt.Errorf("deleted %v", d)
			}
			return nil
		})
		gone := deleted()[0]
		order = append(order, gone)
		// While one pod is missing nothing else is deleted.
		markCtrlerReady(t, ns, "demo", 2)
		consistently(t, 700*time.Millisecond, "one pod at a time", func() error {
			if d := deleted(); len(d) != 1 {
				return fmt.Errorf("deleted %v", d)
			}
			return nil
		})
		var ord int
		fmt.Sscanf(gone, "demo-ctrler-%d", &ord)
		mkPod(ord, "r2")
		markCtrlerReady(t, ns, "demo", 3)
	}
	if want := []string{"demo-ctrler-2", "demo-ctrler-0", "demo-ctrler-1"}; !slices.Equal(order, want) {
		t.Errorf("roll order %v, want %v (followers from the highest ordinal, the leader last)", order, want)
	}
	consistently(t, time.Second, "done rolling", func() error {
		if d := deleted(); len(d) != 0 {
			return fmt.Errorf("deleted %v", d)
		}
		return nil
	})
	eventually(t, "RollingPod event", func() error {
		return hasEvent(ns, "demo", "RollingPod", "deleting controller pod demo-ctrler-1 (leader)")
	})
}

// TestShardMapDialPodIPs: with DialPodIPs the controller is reached at its
// pods' IPs.
func TestShardMapDialPodIPs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.CtrlerAt("10.1.0.1:7000")
	fc.SetShards(2)
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{4, 4}, Groups: []*shardkvpb.Group{smGroup(4)}})
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.DialPodIPs = true }))
	mustCreate(t, testShardMap(ns, "demo", 2, 1))
	markCtrlerReady(t, ns, "demo", 1)
	waitSM(t, ns, "demo", "waiting for a pod IP", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionReady, metav1.ConditionFalse, ReasonControllerUnavailable, "no controller pod has an IP yet")
	})
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: ns}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo-ctrler-0", Labels: ctrlerLabels(sm)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: "x"}}},
	}
	mustCreate(t, pod)
	pod.Status.PodIP = "10.1.0.1"
	if err := k8sClient.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	waitSM(t, ns, "demo", "status from the pod IP", func(sm *shardkvv1.ShardMap) error {
		if sm.Status.ConfigNum != 1 || sm.Status.GroupCount != 1 {
			return fmt.Errorf("configNum %d groups %d", sm.Status.ConfigNum, sm.Status.GroupCount)
		}
		return nil
	})
}
