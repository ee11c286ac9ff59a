package controllers

// envtest tests of the ReplicaGroup reconciler. envtest runs only the API
// server: no StatefulSet controller, no kubelet, no pods. So each test runs
// a groupSim beside the reconciler: it plays the StatefulSet controller
// (pods and claims for spec.replicas, the update revision), the kubelet
// (pods ready) and the replicas themselves (node's --id=auto, Raft
// membership changes on the fake data plane's calls), and publishes each
// replica's admin status on the fake.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

var debugSim = false

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

func (d joinUpdatesDataPlane) Controller(addrs []string) (ControllerAPI, error) {
	c, err := d.fakeDataPlane.Controller(addrs)
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

// ---- the simulated cluster of one group ----

type simReplica struct {
	podUID types.UID
	id     uint64
}

type groupSim struct {
	t         *testing.T
	ns, name  string
	dp        *fakeDataPlane
	bootstrap int

	mu           sync.Mutex
	members      []memberView
	learnerAge   map[uint64]int
	leader       uint64
	term, commit uint64
	nextID       uint64
	everUsed     map[uint64]bool
	removed      map[uint64]bool
	disks        map[types.UID]uint64 // PVC uid -> replica id on it
	running      map[int]simReplica
	// catchUp: ticks a new learner needs to catch up.
	catchUp int
	// freeze stops pod creation for ordinals listed (a pod that does not
	// come back yet).
	freeze map[int]bool
	// dialIPs: the replicas answer at their pod IPs (10.1.0.<ord+1>).
	dialIPs bool
}

var errSimDown = errors.New("sim: replica not running")

// startGroupSim runs the simulation of ReplicaGroup name (bootstrapped
// with bootstrap replicas) until t ends.
func startGroupSim(t *testing.T, ns, name string, bootstrap int, dp *fakeDataPlane) *groupSim {
	g := &groupSim{t: t, ns: ns, name: name, dp: dp, bootstrap: bootstrap,
		learnerAge: map[uint64]int{}, term: 1, commit: 500, nextID: 100, everUsed: map[uint64]bool{},
		removed: map[uint64]bool{}, disks: map[types.UID]uint64{}, running: map[int]simReplica{}, catchUp: 3,
		freeze: map[int]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(30 * time.Millisecond)
		defer tk.Stop()
		for {
			if err := g.tick(ctx); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) {
				t.Logf("sim %s: %v", name, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return g
}

// simHooks routes the data plane's membership calls to the group sims.
func simHooks(dp *fakeDataPlane, sims ...*groupSim) {
	dp.OnReplicaCall(func(r *fakeReplica, c fakeCall) {
		for _, g := range sims {
			if g.owns(r.Addr()) {
				g.onCall(r.Addr(), c)
			}
		}
	})
}

func (g *groupSim) addr(ord int) string {
	return fmt.Sprintf("%s:%d", PodDNS(g.name, ord, g.ns), GRPCPort)
}

// ipAddr is where pod ord answers in pod-IP mode (createPod's pod IP).
func (g *groupSim) ipAddr(ord int) string { return fmt.Sprintf("10.1.0.%d:%d", ord+1, GRPCPort) }

// dialAddr is where the operator reaches pod ord.
func (g *groupSim) dialAddr(ord int) string {
	if g.dialIPs {
		return g.ipAddr(ord)
	}
	return g.addr(ord)
}

// SetDialIPs makes the replicas answer at their pod IPs instead.
func (g *groupSim) SetDialIPs() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dialIPs = true
}

// owns reports whether the fake at addr is one of this group's replicas.
func (g *groupSim) owns(addr string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ord := range 16 {
		if addr == g.dialAddr(ord) {
			return true
		}
	}
	return false
}

func (g *groupSim) onCall(addr string, c fakeCall) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if lo := g.ordinalOfID(g.leader); g.leader == 0 || addr != g.dialAddr(lo) {
		g.t.Errorf("sim %s: %s sent to %s, not to the leader %d", g.name, c.Method, addr, g.leader)
		return
	}
	switch c.Method {
	case "AddLearner":
		id, a := c.Args[0].(uint64), c.Args[1].(string)
		g.members = append(g.members, memberView{ID: id, Ordinal: ordinalOf(g.name, g.ns, a), Learner: true})
		g.learnerAge[id] = 0
	case "Promote":
		id := c.Args[0].(uint64)
		for i := range g.members {
			if g.members[i].ID == id {
				if g.members[i].Match < g.commit {
					g.t.Errorf("sim %s: promoting %d before it caught up", g.name, id)
				}
				g.members[i].Learner = false
			}
		}
	case "RemoveMember":
		id := c.Args[0].(uint64)
		if id == g.leader {
			g.t.Errorf("sim %s: removing the leader %d", g.name, id)
		}
		g.members = slices.DeleteFunc(g.members, func(m memberView) bool { return m.ID == id })
		g.removed[id] = true
	case "TransferLeader":
		to := c.Args[0].(uint64)
		if g.ordinalOfID(to) < 0 {
			g.t.Errorf("sim %s: transfer to non-member %d", g.name, to)
		}
		g.leader = to
		g.term++
	}
	g.publishLocked()
}

func (g *groupSim) ordinalOfID(id uint64) int {
	for _, m := range g.members {
		if m.ID == id {
			return m.Ordinal
		}
	}
	return -1
}

// SetLeader moves leadership (as an election would).
func (g *groupSim) SetLeader(id uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leader = id
	g.term++
	g.publishLocked()
}

// Freeze keeps pod ord from being (re)created until unfrozen.
func (g *groupSim) Freeze(ord int, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.freeze[ord] = on
}

func (g *groupSim) Members() []memberView {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.members)
}

func (g *groupSim) Leader() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leader
}

func (g *groupSim) podTemplateRevision(sts *appsv1.StatefulSet) string {
	return sts.Name + "-" + sts.Annotations[annotationTemplateHash]
}

// tick plays one round of the StatefulSet controller, the kubelet and the
// replicas.
func (g *groupSim) tick(ctx context.Context) error {
	sts := &appsv1.StatefulSet{}
	if err := get(ctx, g.ns, g.name, sts); err != nil {
		return client.IgnoreNotFound(err)
	}
	rev := g.podTemplateRevision(sts)
	if sts.Status.ObservedGeneration != sts.Generation || sts.Status.UpdateRevision != rev {
		sts.Status.ObservedGeneration = sts.Generation
		sts.Status.UpdateRevision = rev
		if sts.Status.CurrentRevision == "" {
			sts.Status.CurrentRevision = rev
		}
		sts.Status.Replicas = *sts.Spec.Replicas
		if err := k8sClient.Status().Update(ctx, sts); err != nil {
			return err
		}
	}
	replicas := int(*sts.Spec.Replicas)

	var pods corev1.PodList
	if err := k8sClient.List(ctx, &pods, client.InNamespace(g.ns), client.MatchingLabels{LabelGroup: g.name}); err != nil {
		return err
	}
	byOrd := map[int]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		ord := podOrdinal(g.name, p.Name)
		if ord >= replicas && p.DeletionTimestamp.IsZero() {
			if err := client.IgnoreNotFound(k8sClient.Delete(ctx, p)); err != nil {
				return err
			}
			continue
		}
		byOrd[ord] = p
	}
	// Claims being deleted go once their pod is gone (pvc-protection).
	var pvcs corev1.PersistentVolumeClaimList
	if err := k8sClient.List(ctx, &pvcs, client.InNamespace(g.ns)); err != nil {
		return err
	}
	for i := range pvcs.Items {
		c := &pvcs.Items[i]
		ord := pvcOrdinal(g.name, c.Name)
		if ord < 0 || c.DeletionTimestamp.IsZero() || len(c.Finalizers) == 0 {
			continue
		}
		if _, podThere := byOrd[ord]; !podThere {
			c.Finalizers = nil
			if err := client.IgnoreNotFound(k8sClient.Update(ctx, c)); err != nil {
				return err
			}
		}
	}
	// A replica stops with its pod, before any new pod takes its name.
	g.mu.Lock()
	for ord, rr := range g.running {
		if p, ok := byOrd[ord]; !ok || p.UID != rr.podUID || !p.DeletionTimestamp.IsZero() {
			delete(g.running, ord)
		}
	}
	g.publishLocked()
	frozen := maps2slice(g.freeze)
	g.mu.Unlock()
	for ord := range replicas {
		if _, ok := byOrd[ord]; ok || slices.Contains(frozen, ord) {
			continue
		}
		p, err := g.createPod(ctx, sts, ord, rev)
		if err != nil {
			return err
		}
		if p != nil {
			byOrd[ord] = p
		}
	}

	// The replicas: start on new pods, stop on gone ones.
	g.mu.Lock()
	defer g.mu.Unlock()
	for ord, rr := range g.running {
		if p, ok := byOrd[ord]; !ok || p.UID != rr.podUID || !p.DeletionTimestamp.IsZero() {
			delete(g.running, ord)
		}
	}
	for ord, p := range byOrd {
		if _, ok := g.running[ord]; ok || !p.DeletionTimestamp.IsZero() {
			continue
		}
		claim := &corev1.PersistentVolumeClaim{}
		if err := get(ctx, g.ns, pvcName(g.name, ord), claim); err != nil {
			continue // not yet
		}
		id := g.disks[claim.UID]
		if id == 0 { // --id=auto on an empty disk
			if len(g.members) == 0 { // the first replica up bootstraps the group
				for i := range g.bootstrap {
					g.members = append(g.members, memberView{ID: uint64(i + 1), Ordinal: i})
				}
			}
			if ord < g.bootstrap && !g.everUsed[uint64(ord+1)] {
				id = uint64(ord + 1) // its --peers id, never on a disk before
			} else {
				g.nextID++
				id = g.nextID
			}
			g.disks[claim.UID] = id
			g.everUsed[id] = true
		}
		g.running[ord] = simReplica{podUID: p.UID, id: id}
		if debugSim {
			g.t.Logf("sim %s: pod %s uid %s claim %s runs replica %d", g.name, p.Name, p.UID, claim.UID, id)
		}
	}
	// Election: the lowest running voter once a majority runs.
	if g.leader == 0 || !g.isRunningLocked(g.leader) {
		var up []uint64
		voters := 0
		for _, m := range g.members {
			if m.Learner {
				continue
			}
			voters++
			if g.isRunningLocked(m.ID) {
				up = append(up, m.ID)
			}
		}
		if voters > 0 && len(up) >= majority(voters) {
			slices.Sort(up)
			g.leader = up[0]
			g.term++
		} else {
			g.leader = 0
		}
	}
	// Replication: running members catch up (learners after a while).
	for i := range g.members {
		m := &g.members[i]
		if !g.isRunningLocked(m.ID) {
			continue
		}
		if m.Learner {
			g.learnerAge[m.ID]++
			if g.learnerAge[m.ID] < g.catchUp {
				continue
			}
		}
		m.Match = g.commit
	}
	g.publishLocked()
	return nil
}

func maps2slice(m map[int]bool) []int {
	var out []int
	for k, v := range m {
		if v {
			out = append(out, k)
		}
	}
	return out
}

func (g *groupSim) isRunningLocked(id uint64) bool {
	ord := g.ordinalOfID(id)
	rr, ok := g.running[ord]
	return ok && rr.id == id
}

// createPod creates pod ord (and its claim) as the StatefulSet controller
// would, and marks it ready as the kubelet would.
func (g *groupSim) createPod(ctx context.Context, sts *appsv1.StatefulSet, ord int, rev string) (*corev1.Pod, error) {
	claim := &corev1.PersistentVolumeClaim{}
	if err := get(ctx, g.ns, pvcName(g.name, ord), claim); apierrors.IsNotFound(err) {
		claim = &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: g.ns, Name: pvcName(g.name, ord), Labels: sts.Spec.Selector.MatchLabels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if err := k8sClient.Create(ctx, claim); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	} else if !claim.DeletionTimestamp.IsZero() {
		return nil, nil // wait until it is gone
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: g.ns, Name: fmt.Sprintf("%s-%d", g.name, ord),
			Labels:      map[string]string{appsv1.ControllerRevisionHashLabelKey: rev, appsv1.StatefulSetPodNameLabel: fmt.Sprintf("%s-%d", g.name, ord)},
			Annotations: sts.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: *sts.Spec.Template.Spec.DeepCopy(),
	}
	for k, v := range sts.Spec.Template.Labels {
		p.Labels[k] = v
	}
	p.Spec.Hostname = p.Name
	p.Spec.Subdomain = sts.Spec.ServiceName
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: dataVolume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvcName(g.name, ord)}}})
	if err := k8sClient.Create(ctx, p); err != nil {
		return nil, client.IgnoreAlreadyExists(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = fmt.Sprintf("10.1.0.%d", ord+1)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := k8sClient.Status().Update(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// publishLocked sets every replica's admin status on the fake.
func (g *groupSim) publishLocked() {
	for ord := range 16 {
		rr, ok := g.running[ord]
		r := g.dp.Member(g.dialAddr(ord))
		if !ok {
			r.FailWith("Status", errSimDown)
			continue
		}
		r.FailWith("Status", nil)
		st := &shardkvpb.MemberStatus{Id: rr.id, Addr: g.addr(ord), Term: g.term, Commit: g.commit, Applied: g.commit, Leader: g.leader}
		switch {
		case g.ordinalOfID(rr.id) == ord:
			for _, m := range g.members {
				if m.ID == rr.id {
					switch {
					case m.Learner:
						st.Role = "learner"
					case m.ID == g.leader:
						st.Role = "leader"
					default:
						st.Role = "follower"
					}
				}
			}
		case g.removed[rr.id]:
			st.Role = "removed"
		default:
			st.Role = "joining"
		}
		if st.Role == "leader" {
			for _, m := range g.members {
				st.Members = append(st.Members, &shardkvpb.Member{Id: m.ID, Addr: g.addr(m.Ordinal), Learner: m.Learner, Match: m.Match})
			}
		}
		r.SetStatus(st)
	}
}

// ---- helpers ----

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
		if rg.Status.Phase != shardkvv1.PhaseServing || c == nil || c.Status != metav1.ConditionTrue || len(rg.Status.Members) != n ||
			rg.Status.Replicas != int32(n) {
			return fmt.Errorf("phase %q, %d members, ready %v", rg.Status.Phase, len(rg.Status.Members), c)
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

// ---- tests ----

func TestReplicaGroupObjectsAndGroupIDs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupReplicaGroup(dp))
	ctx := context.Background()
	newShardMap(t, ns, "sm")
	// Two groups at once: different ids, whoever wins the race.
	newReplicaGroup(t, ns, "a", "sm", 3, func(rg *shardkvv1.ReplicaGroup) {
		rg.Spec.PodTemplate.Annotations = map[string]string{"team": "kv"}
		rg.Spec.PodTemplate.NodeSelector = map[string]string{"disk": "ssd"}
		rg.Spec.PodTemplate.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
		rg.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	})
	newReplicaGroup(t, ns, "b", "sm", 5, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Image = "custom:1" })

	gids := map[string]int64{}
	for _, name := range []string{"a", "b"} {
		eventually(t, name+" gets a group id and its objects", func() error {
			rg, err := getRG(ns, name)
			if err != nil {
				return err
			}
			if rg.Status.GroupID == 0 {
				return errors.New("no group id yet")
			}
			if !slices.Contains(rg.Finalizers, Finalizer) {
				return errors.New("no finalizer")
			}
			gids[name] = rg.Status.GroupID
			return get(ctx, ns, name, &corev1.Service{})
		})
	}
	if gids["a"] == gids["b"] || gids["a"] < 1 || gids["a"] > 2 || gids["b"] < 1 || gids["b"] > 2 {
		t.Fatalf("group ids %v, want 1 and 2", gids)
	}
	sm := &shardkvv1.ShardMap{}
	if err := get(ctx, ns, "sm", sm); err != nil || sm.Status.NextGroupID != 3 {
		t.Fatalf("shardmap nextGroupID %d (%v), want 3", sm.Status.NextGroupID, err)
	}

	rg, _ := getRG(ns, "a")
	if rg.Annotations[AnnotationBootstrapReplicas] != "3" {
		t.Fatalf("bootstrap annotation %q", rg.Annotations[AnnotationBootstrapReplicas])
	}
	if rg.Status.Selector == "" || rg.Status.Phase != shardkvv1.PhasePending {
		t.Fatalf("status %+v", rg.Status)
	}
	ownedByA := func(o metav1.Object) error {
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "ReplicaGroup" || refs[0].Name != "a" || refs[0].UID != rg.UID || !ptr.Deref(refs[0].Controller, false) {
			return fmt.Errorf("%s: owner references %+v", o.GetName(), refs)
		}
		return nil
	}

	sts := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "a", sts); err != nil {
		t.Fatal(err)
	}
	if err := ownedByA(sts); err != nil {
		t.Fatal(err)
	}
	if *sts.Spec.Replicas != 3 || sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement ||
		sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType || sts.Spec.ServiceName != "a" ||
		len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Fatalf("statefulset spec %+v", sts.Spec)
	}
	pod := sts.Spec.Template.Spec
	c := pod.Containers[0]
	wantArgs := []string{"serve", "--role=group", fmt.Sprintf("--group=%d", gids["a"]), "--id=auto", "--data-dir=/data",
		"--listen=0.0.0.0:7000", fmt.Sprintf("--advertise=$(POD_NAME).a.%s.svc:7000", ns),
		"--peers=" + PeersFlag("a", 3, ns), "--ctrler=" + strings.Join(CtrlerAddrs("sm", 3, ns), ","),
		"--resp=0.0.0.0:6379", fmt.Sprintf("--resp-advertise=$(POD_NAME).a.%s.svc:6379", ns), "--http=0.0.0.0:8080"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Fatalf("args\n got %q\nwant %q", c.Args, wantArgs)
	}
	if c.Image != testImage || c.ImagePullPolicy != corev1.PullIfNotPresent || c.Env[0].Name != "POD_NAME" ||
		c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" || c.ReadinessProbe.HTTPGet.Path != "/healthz" ||
		c.Resources.Requests.Cpu().String() != "250m" {
		t.Fatalf("container %+v", c)
	}
	if pod.NodeSelector["disk"] != "ssd" || len(pod.Tolerations) != 1 || sts.Spec.Template.Annotations["team"] != "kv" {
		t.Fatalf("pod overrides not applied: %+v", pod)
	}
	if sts.Spec.Template.Labels[LabelGroup] != "a" || sts.Spec.Template.Labels[LabelInstance] != "sm" {
		t.Fatalf("pod labels %v", sts.Spec.Template.Labels)
	}

	svc := &corev1.Service{}
	if err := get(ctx, ns, "a", svc); err != nil {
		t.Fatal(err)
	}
	if err := ownedByA(svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || len(svc.Spec.Ports) != 3 {
		t.Fatalf("service %+v", svc.Spec)
	}
	eventually(t, "pdb of a", func() error {
		pdb := &policyv1.PodDisruptionBudget{}
		if err := get(ctx, ns, "a", pdb); err != nil {
			return err
		}
		if err := ownedByA(pdb); err != nil {
			return err
		}
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
			return fmt.Errorf("minAvailable %v, want 2", pdb.Spec.MinAvailable)
		}
		return nil
	})
	stsB := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "b", stsB); err != nil || stsB.Spec.Template.Spec.Containers[0].Image != "custom:1" || *stsB.Spec.Replicas != 5 {
		t.Fatalf("statefulset b: %v", err)
	}

	// A group that never joined goes at once when deleted; its id is not
	// handed out again.
	if err := k8sClient.Delete(ctx, rg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted", func() error {
		if _, err := getRG(ns, "a"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	newReplicaGroup(t, ns, "c", "sm", 1)
	eventually(t, "c gets id 3", func() error {
		rg, err := getRG(ns, "c")
		if err != nil {
			return err
		}
		if rg.Status.GroupID != 3 {
			return fmt.Errorf("group id %d, want 3", rg.Status.GroupID)
		}
		return nil
	})
	if n := len(dp.CallsTo("Join", "Leave")); n != 0 {
		t.Fatalf("%d joins/leaves without a leader", n)
	}
}

func TestReplicaGroupJoinScaleOutScaleIn(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g := startGroupSim(t, ns, "g", 3, dp)
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 3)

	rg := waitServing(t, ns, "g", 3)
	gid := uint64(rg.Status.GroupID)
	if rg.Status.Leader != "g-0" || rg.Status.ReadyReplicas != 3 || rg.Status.Shards.Count != 16 || rg.Status.Shards.Ranges != "0-15" {
		t.Fatalf("status %+v", rg.Status)
	}
	if c := condition(rg, shardkvv1.ConditionJoined); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("joined condition %+v", c)
	}
	joins := dp.CallsTo("Join")
	if len(joins) != 1 {
		t.Fatalf("joins %v", joins)
	}
	cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid)
	if cg == nil || len(cg.Servers) != 3 || cg.Servers[0].Addr != g.addr(0) || cg.Servers[0].RespAddr != fmt.Sprintf("%s:%d", PodDNS("g", 0, ns), RESPPort) {
		t.Fatalf("group in config %v", cg)
	}
	if err := hasEvent(ns, "g", "Join", "joining group"); err != nil {
		t.Fatal(err)
	}

	// Scale-out 3 -> 5: one member at a time.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](5) })
	rg = waitServing(t, ns, "g", 5)
	got := callsOf(dp, "Scale", "AddLearner", "Promote", "Join", "RemoveMember", "TransferLeader")
	want := []string{
		"Scale[g 4]", fmt.Sprintf("AddLearner[101 %s]", g.addr(3)), "Promote[101]", fmt.Sprintf("Join[[%d]]", gid),
		"Scale[g 5]", fmt.Sprintf("AddLearner[102 %s]", g.addr(4)), "Promote[102]", fmt.Sprintf("Join[[%d]]", gid),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("scale-out calls\n got %q\nwant %q", got, want)
	}
	if cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid); len(cg.Servers) != 5 {
		t.Fatalf("controller servers %v", cg.Servers)
	}
	if rg.Status.Selector == "" {
		t.Fatal("no selector")
	}

	// Scale-in 5 -> 3 with the leader at the highest ordinal.
	g.SetLeader(102)
	eventually(t, "leader g-4 seen", func() error {
		rg, err := getRG(ns, "g")
		if err != nil {
			return err
		}
		if rg.Status.Leader != "g-4" {
			return fmt.Errorf("leader %q", rg.Status.Leader)
		}
		return nil
	})
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	waitServing(t, ns, "g", 3)
	got = callsOf(dp, "Scale", "AddLearner", "Promote", "Join", "RemoveMember", "TransferLeader")
	if len(got) != 7 || !strings.HasPrefix(got[0], "TransferLeader[") || got[1] != "RemoveMember[102]" ||
		got[2] != fmt.Sprintf("Join[[%d]]", gid) || got[3] != "Scale[g 4]" || got[4] != "RemoveMember[101]" ||
		got[5] != fmt.Sprintf("Join[[%d]]", gid) || got[6] != "Scale[g 3]" {
		t.Fatalf("scale-in calls %q", got)
	}
	if l := g.Leader(); l == 101 || l == 102 {
		t.Fatalf("leader %d is a removed member", l)
	}
	if cg := configGroup(dp.Ctrler(ns, "sm").Latest(), gid); len(cg.Servers) != 3 {
		t.Fatalf("controller servers %v", cg.Servers)
	}
	// pvcRetention Retain (default): the claims stay.
	for _, ord := range []int{3, 4} {
		if err := get(context.Background(), ns, pvcName("g", ord), &corev1.PersistentVolumeClaim{}); err != nil {
			t.Fatalf("claim %d: %v", ord, err)
		}
	}
	pdb := &policyv1.PodDisruptionBudget{}
	if err := get(context.Background(), ns, "g", pdb); err != nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Fatalf("pdb %v %v", pdb.Spec.MinAvailable, err)
	}
}

func TestReplicaGroupScaleInDeletesClaimsAndScaleOutDuringScaleIn(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g := startGroupSim(t, ns, "g", 4, dp)
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 4, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.PVCRetention = "Delete" })
	waitServing(t, ns, "g", 4)

	// Scale-in to 3, and back to 4 as soon as the member is removed,
	// before (or after) the StatefulSet shrinks: either way the step in
	// flight finishes and the group gets back to 4 members, the new one
	// under a fresh id on an empty volume.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	eventually(t, "member 4 removed", func() error {
		if len(dp.CallsTo("RemoveMember")) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](4) })
	waitServing(t, ns, "g", 4)
	ms := g.Members()
	if slices.ContainsFunc(ms, func(m memberView) bool { return m.ID == 4 }) ||
		!slices.ContainsFunc(ms, func(m memberView) bool { return m.ID > 100 && m.Ordinal == 3 }) {
		t.Fatalf("members %+v: want 4 replaced by a fresh id at ordinal 3", ms)
	}
	got := callsOf(dp, "RemoveMember", "AddLearner", "Promote")
	if len(got) != 3 || got[0] != "RemoveMember[4]" || !strings.HasPrefix(got[1], "AddLearner[") || !strings.HasPrefix(got[2], "Promote[") {
		t.Fatalf("calls %q\nall: %v", got, dp.Calls())
	}
	// The removed replica's volume was deleted (pvcRetention Delete),
	// either by the shrink's cleanup or to give the pod a fresh one.
	if dels := dp.CallsTo("DeletePVC"); len(dels) == 0 || dels[0].Args[0] != pvcName("g", 3) {
		t.Fatalf("claim deletions %v", dels)
	}

	// Plain scale-in with Delete: the claim goes after its pod.
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](3) })
	waitServing(t, ns, "g", 3)
	eventually(t, "claim of g-3 deleted", func() error {
		c := &corev1.PersistentVolumeClaim{}
		if err := get(context.Background(), ns, pvcName("g", 3), c); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	got = callsOf(dp, "RemoveMember", "Scale", "DeletePVC")
	if len(got) != 3 || !strings.HasPrefix(got[0], "RemoveMember[") || got[1] != "Scale[g 3]" || got[2] != "DeletePVC["+pvcName("g", 3)+"]" {
		t.Fatalf("calls %q", got)
	}
}

func TestReplicaGroupLostDisk(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g := startGroupSim(t, ns, "g", 3, dp)
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 3)
	rg := waitServing(t, ns, "g", 3)
	gid := uint64(rg.Status.GroupID)

	// Pod g-1 loses its volume: it comes back on an empty one, and
	// --id=auto makes it a new replica waiting to join.
	dp.ResetCalls()
	ctx := context.Background()
	g.Freeze(1, true)
	c := &corev1.PersistentVolumeClaim{}
	if err := get(ctx, ns, pvcName("g", 1), c); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g-1"}}); err != nil {
		t.Fatal(err)
	}
	g.Freeze(1, false)
	eventually(t, "member 2 replaced", func() error {
		ms := g.Members()
		if slices.ContainsFunc(ms, func(m memberView) bool { return m.ID == 2 }) {
			return errors.New("2 is still a member")
		}
		if !slices.ContainsFunc(ms, func(m memberView) bool { return m.ID > 100 && m.Ordinal == 1 && !m.Learner }) {
			return fmt.Errorf("no new voter at ordinal 1: %+v", ms)
		}
		return nil
	})
	waitServing(t, ns, "g", 3)
	got := callsOf(dp, "RemoveMember", "AddLearner", "Promote", "Join")
	want := []string{"RemoveMember[2]", fmt.Sprintf("Join[[%d]]", gid), fmt.Sprintf("AddLearner[101 %s]", g.addr(1)),
		"Promote[101]", fmt.Sprintf("Join[[%d]]", gid)}
	if !slices.Equal(got, want) {
		t.Fatalf("calls\n got %q\nwant %q", got, want)
	}
}

func TestReplicaGroupRollingUpdate(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g := startGroupSim(t, ns, "g", 3, dp)
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 3)
	waitServing(t, ns, "g", 3)
	ctx := context.Background()
	sts := &appsv1.StatefulSet{}
	if err := get(ctx, ns, "g", sts); err != nil {
		t.Fatal(err)
	}
	oldRev := g.podTemplateRevision(sts)

	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Image = "registry.local/shardkv/node:v2" })
	var newRev string
	eventually(t, "every pod at the new revision", func() error {
		if err := get(ctx, ns, "g", sts); err != nil {
			return err
		}
		newRev = g.podTemplateRevision(sts)
		if newRev == oldRev {
			return errors.New("template not updated")
		}
		if img := sts.Spec.Template.Spec.Containers[0].Image; img != "registry.local/shardkv/node:v2" {
			return fmt.Errorf("image %s", img)
		}
		var pods corev1.PodList
		if err := k8sClient.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{LabelGroup: "g"}); err != nil {
			return err
		}
		if len(pods.Items) != 3 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		for _, p := range pods.Items {
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != newRev {
				return fmt.Errorf("%s at %s", p.Name, p.Labels[appsv1.ControllerRevisionHashLabelKey])
			}
		}
		return nil
	})
	waitServing(t, ns, "g", 3)
	got := callsOf(dp, "DeletePod", "TransferLeader", "RemoveMember", "AddLearner")
	want := []string{"DeletePod[g-2]", "DeletePod[g-1]", "TransferLeader[2]", "DeletePod[g-0]"}
	if !slices.Equal(got, want) {
		t.Fatalf("rolling update\n got %q\nwant %q", got, want)
	}
	if err := hasEvent(ns, "g", "RestartPod", "restarting follower g-2"); err != nil {
		t.Fatal(err)
	}
}

func TestReplicaGroupDeletion(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	cc := dp.Ctrler(ns, "sm")
	cc.SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	a := startGroupSim(t, ns, "a", 1, dp)
	b := startGroupSim(t, ns, "b", 1, dp)
	simHooks(dp, a, b)
	newReplicaGroup(t, ns, "a", "sm", 1, func(rg *shardkvv1.ReplicaGroup) { rg.Spec.PVCRetention = "Delete" })
	newReplicaGroup(t, ns, "b", "sm", 1)
	rgA := waitServing(t, ns, "a", 1)
	rgB := waitServing(t, ns, "b", 1)
	gidA, gidB := uint64(rgA.Status.GroupID), uint64(rgB.Status.GroupID)
	eventually(t, "both in the config", func() error {
		if cfg := cc.Latest(); len(cfg.Groups) != 2 {
			return fmt.Errorf("config %v", cfg)
		}
		return nil
	})
	// a holds shards while it hands them off.
	cc.SetReports(&shardkvpb.GroupReport{Gid: gidA, ConfigNum: cc.Latest().Num + 1, Shards: []*shardkvpb.ShardState{
		{Shard: 0, State: "BePulling", PeerGid: gidB}, {Shard: 1, State: "GCing"}}})

	ctx := context.Background()
	if err := k8sClient.Delete(ctx, rgA); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a leaves and drains", func() error {
		rg, err := getRG(ns, "a")
		if err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionDraining)
		if rg.Status.Phase != shardkvv1.PhaseDraining || c == nil || c.Status != metav1.ConditionTrue || c.Reason != reasonWaitingForDrain ||
			!strings.Contains(c.Message, "1 BePulling, 1 GCing") {
			return fmt.Errorf("phase %s, draining %+v", rg.Status.Phase, c)
		}
		return nil
	})
	if got := callsOf(dp, "Leave"); !slices.Equal(got, []string{fmt.Sprintf("Leave[[%d]]", gidA)}) {
		t.Fatalf("leaves %q", got)
	}
	consistently(t, 300*time.Millisecond, "a waits for its shards", func() error {
		_, err := getRG(ns, "a")
		return err
	})
	// Handed off and deleted: the report at the latest config is empty.
	cc.SetReports(&shardkvpb.GroupReport{Gid: gidA, ConfigNum: cc.Latest().Num})
	eventually(t, "a gone", func() error {
		if _, err := getRG(ns, "a"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if dels := callsOf(dp, "DeletePVC"); !slices.Equal(dels, []string{"DeletePVC[" + pvcName("a", 0) + "]"}) {
		t.Fatalf("claim deletions %q (pvcRetention Delete)", dels)
	}

	// b is now the last group: its deletion is refused.
	if err := k8sClient.Delete(ctx, rgB); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b refused", func() error {
		rg, err := getRG(ns, "b")
		if err != nil {
			return err
		}
		c := condition(rg, shardkvv1.ConditionDraining)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonLastGroupHoldsData || !strings.Contains(c.Message, "last group") {
			return fmt.Errorf("draining %+v", c)
		}
		return hasEvent(ns, "b", reasonLastGroupHoldsData, "last group")
	})
	consistently(t, 300*time.Millisecond, "b kept", func() error {
		rg, err := getRG(ns, "b")
		if err != nil {
			return err
		}
		if !slices.Contains(rg.Finalizers, Finalizer) {
			return errors.New("finalizer removed")
		}
		return nil
	})
	if got := callsOf(dp, "Leave"); len(got) != 1 {
		t.Fatalf("leaves %q: b must not leave", got)
	}
	if configGroup(cc.Latest(), gidB) == nil {
		t.Fatal("b left the config")
	}
}

func TestReplicaGroupPaused(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	dp.Ctrler(ns, "sm").SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp))
	newShardMap(t, ns, "sm")
	g := startGroupSim(t, ns, "g", 3, dp)
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 3)
	waitServing(t, ns, "g", 3)

	ctx := context.Background()
	eventually(t, "pause", func() error {
		sm := &shardkvv1.ShardMap{}
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Paused = true
		return k8sClient.Update(ctx, sm)
	})
	dp.ResetCalls()
	updateRG(t, ns, "g", func(rg *shardkvv1.ReplicaGroup) { rg.Spec.Replicas = ptr.To[int32](5) })
	eventually(t, "paused condition", func() error {
		rg, err := getRG(ns, "g")
		if err != nil {
			return err
		}
		if c := condition(rg, shardkvv1.ConditionProgressing); c == nil || c.Reason != reasonPaused || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("progressing %+v", c)
		}
		return nil
	})
	consistently(t, 300*time.Millisecond, "nothing changes", func() error {
		sts := &appsv1.StatefulSet{}
		if err := get(ctx, ns, "g", sts); err != nil {
			return err
		}
		if *sts.Spec.Replicas != 3 {
			return fmt.Errorf("replicas %d", *sts.Spec.Replicas)
		}
		if c := callsOf(dp, "Scale", "AddLearner", "Join"); len(c) > 0 {
			return fmt.Errorf("calls %q", c)
		}
		return nil
	})
	eventually(t, "unpause", func() error {
		sm := &shardkvv1.ShardMap{}
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Paused = false
		return k8sClient.Update(ctx, sm)
	})
	waitServing(t, ns, "g", 5)
}

func TestReplicaGroupDialPodIPs(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	ctrler := dp.Ctrler(ns, "sm")
	ctrler.SetShards(16)
	startManager(t, ns, setupReplicaGroup(dp, func(r *ReplicaGroupReconciler) { r.DialPodIPs = true }))
	newShardMap(t, ns, "sm")
	// The controller's pods, as the ShardMap's StatefulSet would have them.
	ctx := context.Background()
	for i := range 3 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", CtrlerName("sm"), i),
			Labels: map[string]string{LabelInstance: "sm", LabelComponent: "controller"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "node", Image: testImage}}}}
		if err := k8sClient.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status.PodIP = fmt.Sprintf("10.2.0.%d", i+1)
		if err := k8sClient.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	dp.Alias("10.2.0.1:7000", ctrler)
	g := startGroupSim(t, ns, "g", 1, dp)
	g.SetDialIPs()
	simHooks(dp, g)
	newReplicaGroup(t, ns, "g", "sm", 1)
	waitServing(t, ns, "g", 1)
	calls := dp.Calls()
	if !slices.ContainsFunc(calls, func(c fakeCall) bool { return c.Method == "Status" && c.Target == g.ipAddr(0) }) {
		t.Fatalf("no Status call to the pod IP: %v", calls)
	}
	for _, c := range calls {
		if strings.HasPrefix(c.Target, "g-") {
			t.Fatalf("dialled a DNS name in pod-IP mode: %v", c)
		}
	}
}
