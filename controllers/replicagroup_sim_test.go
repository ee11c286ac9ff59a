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
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

var debugSim = false

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
			Spec:       *sts.Spec.VolumeClaimTemplates[0].Spec.DeepCopy(),
		}
		if err := k8sClient.Create(ctx, claim); err != nil {
			return nil, err
		}
		// Bound at once to a volume of the size asked, as a provisioner
		// would.
		claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: claim.Spec.AccessModes,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: claim.Spec.Resources.Requests[corev1.ResourceStorage]}}
		if err := k8sClient.Status().Update(ctx, claim); err != nil {
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
