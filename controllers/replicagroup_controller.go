package controllers

// ReplicaGroupReconciler runs one Raft data group as a StatefulSet: it
// creates the group's objects, allocates its group id, joins it to the
// controller, changes its membership one member at a time (scale-out,
// scale-in, replacing replicas that lost their disk), rolls pods for
// template changes (followers first, the leader last), and drains the group
// before it is deleted. Each pass observes, asks the planner (nextStep,
// replicagroup_plan.go) for one step, executes it and requeues.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// ReplicaGroupReconciler reconciles ReplicaGroups.
type ReplicaGroupReconciler struct {
	client.Client
	// APIReader reads from the API server, not the cache (group id
	// allocation must not work from a stale copy). Defaults to the
	// manager's.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	// Recorder emits Events (defaults to the manager's).
	Recorder  events.EventRecorder
	DataPlane DataPlane
	// DefaultImage is the node image when spec.image is empty (the
	// operator's own image).
	DefaultImage string
	// DialPodIPs makes the operator reach replicas and controllers at
	// their pods' IPs instead of their DNS names (an operator running
	// outside the cluster).
	DialPodIPs bool
	// RequeueShort is the pause between passes while a step is in
	// progress (default 2s); RequeueIdle between status refreshes of a
	// settled group (default 30s).
	RequeueShort, RequeueIdle time.Duration
	// CallTimeout bounds each data-plane call (default 5s).
	CallTimeout time.Duration
}

// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups/finalizers,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler with mgr.
func (r *ReplicaGroupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Scheme == nil {
		r.Scheme = mgr.GetScheme()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("replicagroup-controller")
	}
	if r.DataPlane == nil {
		return errors.New("ReplicaGroupReconciler: DataPlane is required")
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("replicagroup").
		// Own status writes do not wake the reconciler; spec changes and
		// deletion (which bumps the generation) do.
		For(&shardkvv1.ReplicaGroup{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		// Pods belong to the StatefulSet; map them by label.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if name := o.GetLabels()[LabelGroup]; name != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
			}
			return nil
		})).
		// A ShardMap's pause, creation or deletion concerns its groups, and
		// so does a new config: the groups' shards changed, and a drain may
		// have finished.
		Watches(&shardkvv1.ShardMap{}, handler.EnqueueRequestsFromMapFunc(r.groupsOfShardMap),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, configChanged{}))).
		Complete(r)
}

// configChanged passes ShardMap updates whose status moved to another
// config or changed its shard states (a migration finished).
type configChanged struct{ predicate.Funcs }

func (configChanged) Update(e event.UpdateEvent) bool {
	a, okA := e.ObjectOld.(*shardkvv1.ShardMap)
	b, okB := e.ObjectNew.(*shardkvv1.ShardMap)
	if !okA || !okB {
		return false
	}
	return a.Status.ConfigNum != b.Status.ConfigNum || a.Status.MigratingShards != b.Status.MigratingShards
}

func (r *ReplicaGroupReconciler) groupsOfShardMap(ctx context.Context, o client.Object) []reconcile.Request {
	var list shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, rg := range list.Items {
		if rg.Spec.ShardMap == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&rg)})
		}
	}
	return out
}

func (r *ReplicaGroupReconciler) requeueShort() time.Duration {
	return orDefault(r.RequeueShort, 2*time.Second)
}

func (r *ReplicaGroupReconciler) requeueIdle() time.Duration {
	return orDefault(r.RequeueIdle, 30*time.Second)
}

// Reconcile runs one pass: observe, plan one step, execute it, record status.
func (r *ReplicaGroupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	rg := &shardkvv1.ReplicaGroup{}
	if err := r.Get(ctx, req.NamespacedName, rg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var sm *shardkvv1.ShardMap
	if rg.Spec.ShardMap != "" {
		sm = &shardkvv1.ShardMap{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: rg.Spec.ShardMap}, sm); err != nil {
			if !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			sm = nil
		}
	}
	paused := sm != nil && sm.Spec.Paused
	deleting := !rg.DeletionTimestamp.IsZero()

	// The group's objects, once it has an id (recorded before the
	// StatefulSet exists, so its pods are started with it).
	var sts *appsv1.StatefulSet
	if !deleting && !paused && sm != nil && sm.DeletionTimestamp.IsZero() &&
		controllerutil.ContainsFinalizer(rg, Finalizer) && rg.Status.GroupID != 0 {
		if r.image(rg) == "" {
			return r.finishStatus(ctx, rg, nil, wait("NoImage", "spec.image is empty and the operator has no default image"), nil)
		}
		if err := r.ensureService(ctx, rg); err != nil {
			return ctrl.Result{}, fmt.Errorf("service: %w", err)
		}
		var err error
		if sts, err = r.ensureStatefulSet(ctx, rg, sm); err != nil {
			return ctrl.Result{}, fmt.Errorf("statefulset: %w", err)
		}
	} else {
		sts = &appsv1.StatefulSet{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(rg), sts); err != nil {
			if !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			sts = nil
		}
	}

	o, err := r.observe(ctx, rg, sm, sts)
	if err != nil {
		return ctrl.Result{}, err
	}
	st := nextStep(o)
	logger.V(1).Info("planned", "step", st.String(), "reason", st.Reason, "message", st.Message)

	if sts != nil && !deleting && !paused {
		voters := len(o.voters())
		if o.Leader == nil {
			voters = int(bootstrapReplicas(rg))
			if n := countVoters(rg.Status.Members); n > 0 {
				voters = n
			}
		}
		if err := r.ensurePDB(ctx, rg, pdbMinAvailable(int(o.StsReplicas), voters)); err != nil {
			return ctrl.Result{}, fmt.Errorf("poddisruptionbudget: %w", err)
		}
	}

	var execErr error
	if st.mutates() {
		done, res, err := r.execute(ctx, rg, sm, sts, o, st)
		if done {
			return res, err
		}
		if errors.Is(err, errStale) {
			logger.V(1).Info("step skipped: observation out of date", "step", st.String())
			return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
		}
		execErr = err
		if err == nil {
			r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, string(st.Kind), string(st.Kind), "%s", st.Message)
		} else {
			logger.Info("step failed", "step", st.String(), "err", err)
			r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, "StepFailed", string(st.Kind), "%s: %v", st.Message, err)
		}
	}
	return r.finishStatus(ctx, rg, o, st, execErr)
}

func countVoters(ms []shardkvv1.Member) int {
	n := 0
	for _, m := range ms {
		if m.Role != "learner" {
			n++
		}
	}
	return n
}

// observe gathers what the planner needs.
func (r *ReplicaGroupReconciler) observe(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, sts *appsv1.StatefulSet) (*observed, error) {
	o := &observed{
		Name: rg.Name, Namespace: rg.Namespace,
		Deleting:           !rg.DeletionTimestamp.IsZero(),
		HasFinalizer:       controllerutil.ContainsFinalizer(rg, Finalizer),
		Paused:             sm != nil && sm.Spec.Paused,
		ShardMapGone:       sm == nil || !sm.DeletionTimestamp.IsZero(),
		GroupID:            uint64(rg.Status.GroupID),
		Phase:              rg.Status.Phase,
		Desired:            defaultReplicas(rg),
		Bootstrap:          bootstrapReplicas(rg),
		Weight:             defaultWeight(rg),
		StsReplicas:        -1,
		PVCRetentionDelete: rg.Spec.PVCRetention == "Delete",
		Pods:               map[int]*podView{},
		LeaderOrdinal:      -1,
	}
	if sts != nil {
		o.StsReplicas = 1
		if sts.Spec.Replicas != nil {
			o.StsReplicas = *sts.Spec.Replicas
		}
		if sts.Status.ObservedGeneration >= sts.Generation {
			o.UpdateRevision = sts.Status.UpdateRevision
		}
	}
	if !o.HasFinalizer || o.GroupID == 0 {
		return o, nil // the planner's first steps need no more
	}

	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(rg.Namespace), client.MatchingLabels{LabelGroup: rg.Name}); err != nil {
		return nil, err
	}
	podObjs := map[int]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		ord := podOrdinal(rg.Name, p.Name)
		if ord < 0 {
			continue
		}
		podObjs[ord] = p
		o.Pods[ord] = &podView{Ordinal: ord, Name: p.Name, UID: p.UID, Exists: true, Deleting: !p.DeletionTimestamp.IsZero(),
			Ready: podReady(p), Revision: p.Labels[appsv1.ControllerRevisionHashLabelKey]}
	}
	for i := range int(max(o.StsReplicas, 0)) {
		if _, ok := o.Pods[i]; !ok {
			o.Pods[i] = &podView{Ordinal: i, Name: fmt.Sprintf("%s-%d", rg.Name, i)}
		}
	}
	var pvcs corev1.PersistentVolumeClaimList
	// The StatefulSet controller labels its claims with the set's selector.
	if err := r.List(ctx, &pvcs, client.InNamespace(rg.Namespace), client.MatchingLabels{LabelGroup: rg.Name}); err != nil {
		return nil, err
	}
	for _, c := range pvcs.Items {
		if ord := pvcOrdinal(rg.Name, c.Name); ord >= 0 && c.DeletionTimestamp.IsZero() {
			o.PVCs = append(o.PVCs, ord)
			if o.PVCUIDs == nil {
				o.PVCUIDs = map[int]types.UID{}
			}
			o.PVCUIDs[ord] = c.UID
		}
	}
	slices.Sort(o.PVCs)

	// Each replica's own view, in parallel.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for ord, p := range podObjs {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		addr := r.replicaAddr(rg, ord, p)
		if addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			api, err := r.DataPlane.Replica(addr)
			if err != nil {
				return
			}
			cctx, cancel := callCtx(ctx, r.CallTimeout)
			defer cancel()
			st, err := api.Status(cctx)
			if err != nil {
				return
			}
			mu.Lock()
			o.Pods[ord].Status = st
			mu.Unlock()
		}()
	}
	wg.Wait()

	// The leader: of the pods that say they lead, the newest term.
	for ord, p := range o.Pods {
		st := p.Status
		if st == nil || st.Role != "leader" || (st.GroupId != 0 && st.GroupId != o.GroupID) {
			continue
		}
		if o.Leader == nil || st.Term > o.Leader.Term || (st.Term == o.Leader.Term && ord < o.LeaderOrdinal) {
			o.Leader, o.LeaderOrdinal = st, ord
		}
	}
	if o.Leader != nil {
		for _, m := range o.Leader.Members {
			o.Members = append(o.Members, memberView{ID: m.Id, Ordinal: ordinalOf(rg.Name, rg.Namespace, m.Addr),
				Learner: m.Learner, Match: m.Match})
		}
	}

	// The controller's latest config (and, while draining, its reports).
	if !o.ShardMapGone {
		addrs, err := r.ctrlerAddrs(ctx, sm)
		if err != nil {
			return nil, err
		}
		if len(addrs) > 0 {
			if api, err := r.DataPlane.Controller(addrs); err == nil {
				cctx, cancel := callCtx(ctx, r.CallTimeout)
				if cfg, err := api.Query(cctx, -1); err == nil {
					o.Config = cfg
				}
				cancel()
				if o.Deleting && o.Config != nil {
					cctx, cancel := callCtx(ctx, r.CallTimeout)
					if cs, err := api.Status(cctx); err == nil {
						o.Reports = map[uint64]*shardkvpb.GroupReport{}
						for _, g := range cs.Groups {
							if g.Report != nil {
								o.Reports[g.Report.Gid] = g.Report
							}
						}
						if cs.Latest != nil && cs.Latest.Num > o.Config.Num {
							o.Config = cs.Latest
						}
					}
					cancel()
				}
			}
		}
	}
	return o, nil
}

// replicaAddr is where the operator dials the replica at ordinal ("" if
// it cannot yet: no pod IP).
func (r *ReplicaGroupReconciler) replicaAddr(rg *shardkvv1.ReplicaGroup, ordinal int, p *corev1.Pod) string {
	if r.DialPodIPs {
		if p == nil || p.Status.PodIP == "" {
			return ""
		}
		return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(GRPCPort))
	}
	return fmt.Sprintf("%s:%d", PodDNS(rg.Name, ordinal, rg.Namespace), GRPCPort)
}

// ctrlerAddrs are the controller group's addresses, as DNS names or (with
// DialPodIPs) its pods' IPs.
func (r *ReplicaGroupReconciler) ctrlerAddrs(ctx context.Context, sm *shardkvv1.ShardMap) ([]string, error) {
	if !r.DialPodIPs {
		return CtrlerAddrs(sm.Name, int(smCtrlerReplicas(sm)), sm.Namespace), nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sm.Namespace), client.MatchingLabels{LabelInstance: sm.Name}); err != nil {
		return nil, err
	}
	return ctrlerPodAddrs(sm.Name, pods.Items), nil
}

func (r *ReplicaGroupReconciler) ctrlerAPI(ctx context.Context, sm *shardkvv1.ShardMap) (ControllerAPI, error) {
	if sm == nil {
		return nil, errors.New("the ShardMap does not exist")
	}
	addrs, err := r.ctrlerAddrs(ctx, sm)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no controller pod has an IP yet")
	}
	return r.DataPlane.Controller(addrs)
}

// execute runs one step. done means the pass is over (res, err are its
// result: the object changed under us, or it is gone); otherwise the
// status is recorded next, with err if the step failed.
func (r *ReplicaGroupReconciler) execute(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap,
	sts *appsv1.StatefulSet, o *observed, st step) (done bool, res ctrl.Result, err error) {
	switch st.Kind {
	case stepAddFinalizer:
		controllerutil.AddFinalizer(rg, Finalizer)
		if rg.Annotations == nil {
			rg.Annotations = map[string]string{}
		}
		if _, ok := rg.Annotations[AnnotationBootstrapReplicas]; !ok {
			rg.Annotations[AnnotationBootstrapReplicas] = strconv.Itoa(int(defaultReplicas(rg)))
		}
		if err := r.Update(ctx, rg); err != nil {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil

	case stepAllocateGroupID:
		return r.allocateGroupID(ctx, rg, sm)

	case stepScaleStatefulSet:
		if sts == nil {
			return false, ctrl.Result{}, errors.New("no StatefulSet")
		}
		patch := client.MergeFromWithOptions(sts.DeepCopy(), client.MergeFromWithOptimisticLock{})
		sts.Spec.Replicas = &st.Replicas
		return false, ctrl.Result{}, staleOnConflict(r.Patch(ctx, sts, patch))

	case stepAddLearner, stepPromote, stepRemoveMember, stepTransferLeader:
		lp := o.pod(o.LeaderOrdinal)
		var podObj *corev1.Pod
		if r.DialPodIPs {
			podObj = &corev1.Pod{}
			if err := r.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: lp.Name}, podObj); err != nil {
				return false, ctrl.Result{}, err
			}
		}
		addr := r.replicaAddr(rg, o.LeaderOrdinal, podObj)
		api, err := r.DataPlane.Replica(addr)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		switch st.Kind {
		case stepAddLearner:
			err = api.AddLearner(cctx, st.ID, fmt.Sprintf("%s:%d", PodDNS(rg.Name, st.Ordinal, rg.Namespace), GRPCPort))
		case stepPromote:
			err = api.Promote(cctx, st.ID)
		case stepRemoveMember:
			err = api.RemoveMember(cctx, st.ID)
		case stepTransferLeader:
			err = api.TransferLeader(cctx, st.ID)
		}
		return false, ctrl.Result{}, err

	case stepJoin:
		api, err := r.ctrlerAPI(ctx, sm)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		cfg, err := api.Join(cctx, &shardkvpb.Group{Gid: o.GroupID, Servers: st.Servers, Weight: o.Weight})
		if err != nil {
			return false, ctrl.Result{}, err
		}
		o.Config = cfg
		if rg.Status.Phase == "" || rg.Status.Phase == shardkvv1.PhasePending {
			rg.Status.Phase = shardkvv1.PhaseJoining
		}
		return false, ctrl.Result{}, nil

	case stepLeave:
		api, err := r.ctrlerAPI(ctx, sm)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		cctx, cancel := callCtx(ctx, r.CallTimeout)
		defer cancel()
		cfg, err := api.Leave(cctx, o.GroupID)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		o.Config = cfg
		rg.Status.Phase = shardkvv1.PhaseDraining
		return false, ctrl.Result{}, nil

	case stepRestartPod:
		return false, ctrl.Result{}, r.deletePod(ctx, rg, o.pod(st.Ordinal))

	case stepRecreateReplica:
		// Checked against the API server, not the cache: a pod that is
		// already going, or was replaced, is left alone (its replacement
		// may already run on a fresh volume).
		p := o.pod(st.Ordinal)
		fresh := &corev1.Pod{}
		if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: p.Name}, fresh); err != nil {
			return false, ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if fresh.UID != p.UID || !fresh.DeletionTimestamp.IsZero() {
			return false, ctrl.Result{}, errStale
		}
		// The claim first (it goes once its pod is gone), then the pod:
		// the StatefulSet brings both back, the volume empty.
		if uid, ok := o.PVCUIDs[st.Ordinal]; ok {
			if err := r.deletePVC(ctx, rg, st.Ordinal, uid); err != nil {
				return false, ctrl.Result{}, err
			}
		}
		return false, ctrl.Result{}, r.deletePod(ctx, rg, p)

	case stepDeletePVC:
		// Only if, in the API server's view, the set no longer reaches
		// the ordinal and its pod is gone.
		freshSts := &appsv1.StatefulSet{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rg), freshSts); err != nil && !apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, err
		} else if err == nil && freshSts.Spec.Replicas != nil && int(*freshSts.Spec.Replicas) > st.Ordinal {
			return false, ctrl.Result{}, errStale
		}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: rg.Namespace, Name: o.podName(st.Ordinal)}, &corev1.Pod{})
		if err == nil {
			return false, ctrl.Result{}, errStale
		} else if !apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, err
		}
		return false, ctrl.Result{}, r.deletePVC(ctx, rg, st.Ordinal, o.PVCUIDs[st.Ordinal])

	case stepFinalize:
		if o.PVCRetentionDelete {
			for _, ord := range o.PVCs {
				if err := r.deletePVC(ctx, rg, ord, o.PVCUIDs[ord]); err != nil {
					return false, ctrl.Result{}, err
				}
			}
		}
		r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, string(st.Kind), string(st.Kind), "%s", st.Message)
		// Record the end in status (best effort), then let the object go.
		if rg.Status.GroupID != 0 && rg.Status.Phase != "" && rg.Status.Phase != shardkvv1.PhasePending {
			rg.Status.Phase = shardkvv1.PhaseLeft
		}
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionTrue, st.Reason, st.Message)
		if err := r.Status().Update(ctx, rg); err != nil && !apierrors.IsNotFound(err) {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		controllerutil.RemoveFinalizer(rg, Finalizer)
		if err := r.Update(ctx, rg); err != nil && !apierrors.IsNotFound(err) {
			res, err := r.retryConflict(err)
			return true, res, err
		}
		return true, ctrl.Result{}, nil
	}
	return false, ctrl.Result{}, fmt.Errorf("unknown step %s", st.Kind)
}

// deletePod deletes the observed pod p, only if it is still that pod.
func (r *ReplicaGroupReconciler) deletePod(ctx context.Context, rg *shardkvv1.ReplicaGroup, p *podView) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: rg.Namespace, Name: p.Name}}
	var opts []client.DeleteOption
	if p.UID != "" {
		opts = append(opts, client.Preconditions{UID: &p.UID})
	}
	return staleOnConflict(client.IgnoreNotFound(r.Delete(ctx, pod, opts...)))
}

// deletePVC deletes the claim of ordinal, only if it is still the claim
// with uid (when known).
func (r *ReplicaGroupReconciler) deletePVC(ctx context.Context, rg *shardkvv1.ReplicaGroup, ordinal int, uid types.UID) error {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: rg.Namespace, Name: pvcName(rg.Name, ordinal)}}
	var opts []client.DeleteOption
	if uid != "" {
		opts = append(opts, client.Preconditions{UID: &uid})
	}
	return staleOnConflict(client.IgnoreNotFound(r.Delete(ctx, c, opts...)))
}

// errStale: the step was not taken because what it was planned on has
// changed since (a newer pod or claim); the next pass plans again.
var errStale = errors.New("the observation is out of date")

func staleOnConflict(err error) error {
	if apierrors.IsConflict(err) {
		return errStale
	}
	return err
}

// retryConflict: an optimistic-concurrency conflict means the next pass
// starts from the newer object, soon; other errors go to the controller's
// backoff.
func (r *ReplicaGroupReconciler) retryConflict(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
	}
	return ctrl.Result{}, err
}

// ignoreConflict turns an optimistic-concurrency conflict into nil: the
// caller requeues and the next pass starts from the newer object.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// allocateGroupID takes the ShardMap's next group id (an optimistic update
// of its status: a conflict means another group took it, try again) and
// records it in the group's status before anything runs with it. An id
// reserved but not recorded (the second update failed) is skipped, never
// handed out twice.
func (r *ReplicaGroupReconciler) allocateGroupID(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) (bool, ctrl.Result, error) {
	retry := ctrl.Result{RequeueAfter: 100 * time.Millisecond}
	fresh := &shardkvv1.ReplicaGroup{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rg), fresh); err != nil {
		return true, ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if fresh.Status.GroupID != 0 {
		return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil // the cache was behind
	}
	freshSM := &shardkvv1.ShardMap{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(sm), freshSM); err != nil {
		return true, ctrl.Result{}, err
	}
	gid := max(freshSM.Status.NextGroupID, 1)
	// Never below an id a group of this cluster has (in case the
	// ShardMap's counter was lost).
	var list shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &list, client.InNamespace(rg.Namespace)); err != nil {
		return true, ctrl.Result{}, err
	}
	for _, other := range list.Items {
		if other.Spec.ShardMap == sm.Name && other.Status.GroupID >= gid {
			gid = other.Status.GroupID + 1
		}
	}
	freshSM.Status.NextGroupID = gid + 1
	if err := r.Status().Update(ctx, freshSM); err != nil {
		if apierrors.IsConflict(err) {
			return true, retry, nil
		}
		return true, ctrl.Result{}, err
	}
	fresh.Status.GroupID = gid
	fresh.Status.Phase = shardkvv1.PhasePending
	fresh.Status.Selector = groupSelector(fresh)
	if err := r.Status().Update(ctx, fresh); err != nil {
		if apierrors.IsConflict(err) {
			return true, retry, nil
		}
		return true, ctrl.Result{}, err
	}
	r.Recorder.Eventf(fresh, nil, corev1.EventTypeNormal, string(stepAllocateGroupID), string(stepAllocateGroupID),
		"group id %d allocated from ShardMap %s", gid, sm.Name)
	return true, ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

func (r *ReplicaGroupReconciler) ensureService(ctx context.Context, rg *shardkvv1.ReplicaGroup) error {
	want := desiredService(rg)
	have := &corev1.Service{}
	err := r.Get(ctx, client.ObjectKeyFromObject(want), have)
	if apierrors.IsNotFound(err) {
		return client.IgnoreAlreadyExists(createOwned(ctx, r.Client, r.Scheme, rg, want))
	}
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Spec.Ports, want.Spec.Ports) &&
		equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) &&
		have.Spec.PublishNotReadyAddresses && equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	have.Spec.Ports, have.Spec.Selector, have.Spec.PublishNotReadyAddresses = want.Spec.Ports, want.Spec.Selector, true
	have.Labels = want.Labels
	return ignoreConflict(r.Update(ctx, have))
}

// ensureStatefulSet creates the StatefulSet (with the bootstrap size) or
// updates its pod template when the spec changed. Replicas are the
// planner's business.
func (r *ReplicaGroupReconciler) ensureStatefulSet(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) (*appsv1.StatefulSet, error) {
	have := &appsv1.StatefulSet{}
	err := r.Get(ctx, client.ObjectKeyFromObject(rg), have)
	if apierrors.IsNotFound(err) {
		// First creation: the bootstrap members. Recreated (someone
		// deleted it): as many pods as the members recorded need.
		replicas := bootstrapReplicas(rg)
		for _, m := range rg.Status.Members {
			if ord := podOrdinal(rg.Name, m.Pod); ord >= 0 && int32(ord+1) > replicas {
				replicas = int32(ord + 1)
			}
		}
		want := r.desiredStatefulSet(rg, sm, replicas)
		if err := createOwned(ctx, r.Client, r.Scheme, rg, want); err != nil {
			return nil, err // AlreadyExists: the cache is behind; retry
		}
		r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, "CreateStatefulSet", "CreateStatefulSet",
			"created StatefulSet %s with %d bootstrap replicas (group %d)", want.Name, replicas, rg.Status.GroupID)
		return want, nil
	}
	if err != nil {
		return nil, err
	}
	want := r.desiredStatefulSet(rg, sm, 0)
	hash := want.Annotations[annotationTemplateHash]
	if have.Annotations[annotationTemplateHash] == hash {
		return have, nil
	}
	setAnnotation(have, annotationTemplateHash, hash)
	have.Spec.Template = want.Spec.Template
	have.Labels = want.Labels
	if err := r.Update(ctx, have); err != nil {
		return nil, err
	}
	r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, "UpdateStatefulSet", "UpdateStatefulSet",
		"updated the pod template of StatefulSet %s; pods are restarted one at a time, the leader last", have.Name)
	return have, nil
}

func (r *ReplicaGroupReconciler) ensurePDB(ctx context.Context, rg *shardkvv1.ReplicaGroup, minAvailable int) error {
	want := desiredPDB(rg, minAvailable)
	have := &policyv1.PodDisruptionBudget{}
	err := r.Get(ctx, client.ObjectKeyFromObject(want), have)
	if apierrors.IsNotFound(err) {
		return client.IgnoreAlreadyExists(createOwned(ctx, r.Client, r.Scheme, rg, want))
	}
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Spec.MinAvailable, want.Spec.MinAvailable) &&
		equality.Semantic.DeepEqual(have.Spec.Selector, want.Spec.Selector) {
		return nil
	}
	have.Spec.MinAvailable, have.Spec.Selector = want.Spec.MinAvailable, want.Spec.Selector
	return ignoreConflict(r.Update(ctx, have))
}

func setCondition(rg *shardkvv1.ReplicaGroup, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&rg.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: rg.Generation,
	})
}

// finishStatus records what the pass saw and did, and picks the requeue.
func (r *ReplicaGroupReconciler) finishStatus(ctx context.Context, rg *shardkvv1.ReplicaGroup, o *observed, st step, execErr error) (ctrl.Result, error) {
	before := rg.Status.DeepCopy()
	prevDraining := ""
	if c := meta.FindStatusCondition(rg.Status.Conditions, shardkvv1.ConditionDraining); c != nil {
		prevDraining = c.Reason
	}
	r.computeStatus(rg, o, st, execErr)

	// The refusal to drain the last group is told once, when it starts.
	if st.Reason == reasonLastGroupHoldsData && prevDraining != reasonLastGroupHoldsData {
		r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, reasonLastGroupHoldsData, "Drain", "%s", st.Message)
	}
	if !equality.Semantic.DeepEqual(before, &rg.Status) {
		if err := r.Status().Update(ctx, rg); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
			}
			return ctrl.Result{}, err
		}
	}
	switch {
	case execErr != nil:
		return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
	case st.Kind == stepIdle:
		return ctrl.Result{RequeueAfter: r.requeueIdle()}, nil
	case st.Kind == stepWait && (st.Reason == reasonPaused || st.Reason == reasonShardMapNotFound || st.Reason == "NoImage"):
		return ctrl.Result{RequeueAfter: r.requeueIdle()}, nil
	case st.Kind == stepWait && st.Reason == reasonLastGroupHoldsData:
		// Another group joining (not watched) lifts the refusal.
		return ctrl.Result{RequeueAfter: max(r.requeueShort(), r.requeueIdle()/6)}, nil
	}
	return ctrl.Result{RequeueAfter: r.requeueShort()}, nil
}

// computeStatus fills rg.Status from the observation and the step.
func (r *ReplicaGroupReconciler) computeStatus(rg *shardkvv1.ReplicaGroup, o *observed, st step, execErr error) {
	s := &rg.Status
	s.ObservedGeneration = rg.Generation
	s.Selector = groupSelector(rg)
	if o == nil {
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, st.Reason, st.Message)
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, st.Reason, st.Message)
		return
	}

	// Members, leader, readiness.
	if o.Leader != nil {
		s.Leader = o.podName(o.LeaderOrdinal)
		var members []shardkvv1.Member
		for _, m := range o.Members {
			mem := shardkvv1.Member{ID: int64(m.ID), Healthy: o.healthy(m)}
			if m.Ordinal >= 0 {
				mem.Pod = o.podName(m.Ordinal)
			}
			switch {
			case m.Learner:
				mem.Role = "learner"
			case o.isLeader(m):
				mem.Role = "leader"
			default:
				mem.Role = "follower"
			}
			if m.Ordinal >= 0 {
				if p := o.pod(m.Ordinal); p.Status != nil && p.Status.Id == m.ID {
					mem.AppliedIndex = int64(p.Status.Applied)
					if p.Status.Role == "candidate" {
						mem.Role = "candidate"
					}
				}
			}
			members = append(members, mem)
		}
		slices.SortFunc(members, func(a, b shardkvv1.Member) int { return cmp.Compare(a.ID, b.ID) })
		s.Members = members
		s.Replicas = int32(len(o.voters()))
	} else {
		s.Leader = ""
		for i := range s.Members {
			s.Members[i].Healthy = false
		}
	}
	ready := int32(0)
	for i := range int(max(o.StsReplicas, 0)) {
		if p := o.pod(i); p.Exists && !p.Deleting && p.Ready {
			ready++
		}
	}
	s.ReadyReplicas = ready

	// Phase and shards, from the controller's latest config.
	joined := false
	if o.Config != nil && o.GroupID != 0 {
		joined = configGroup(o.Config, o.GroupID) != nil
		s.Shards.Count, s.Shards.Ranges = shardSummary(o.Config, o.GroupID)
		switch {
		case o.Deleting:
			if !joined && s.Phase != "" && s.Phase != shardkvv1.PhasePending {
				s.Phase = shardkvv1.PhaseDraining
			}
		case joined:
			s.Phase = shardkvv1.PhaseServing
		case s.Phase == "" || s.Phase == shardkvv1.PhaseServing:
			s.Phase = shardkvv1.PhasePending
		}
		if joined {
			setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionTrue, "InConfig",
				fmt.Sprintf("group %d is in config %d with %d shards", o.GroupID, o.Config.Num, s.Shards.Count))
		} else {
			setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionFalse, "NotInConfig",
				fmt.Sprintf("group %d is not in config %d", o.GroupID, o.Config.Num))
		}
	} else if meta.FindStatusCondition(s.Conditions, shardkvv1.ConditionJoined) == nil {
		setCondition(rg, shardkvv1.ConditionJoined, metav1.ConditionUnknown, reasonControllerUnreachable, "the controller's config is not known")
	}
	if s.Phase == "" && o.GroupID != 0 {
		s.Phase = shardkvv1.PhasePending
	}

	// Progressing: the step in flight, or what it waits for.
	switch {
	case execErr != nil:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionTrue, "StepFailed",
			fmt.Sprintf("%s: %v (will retry)", st.Message, execErr))
	case st.Kind == stepIdle:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, reasonIdle, st.Message)
	case st.Reason == reasonPaused || st.Reason == reasonLastGroupHoldsData:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionProgressing, metav1.ConditionTrue, st.Reason, st.Message)
	}

	// Draining.
	switch {
	case !o.Deleting:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionFalse, "NotDeleting", "the group is not being deleted")
	case st.Reason == reasonLastGroupHoldsData || st.Reason == reasonPaused:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionDraining, metav1.ConditionTrue, st.Reason, st.Message)
	}

	// Degraded: what is wrong with the group itself.
	var unhealthy []string
	for _, m := range s.Members {
		if !m.Healthy && m.Role != "learner" { // a learner catching up is progress, not damage
			unhealthy = append(unhealthy, fmt.Sprintf("%d (%s)", m.ID, m.Pod))
		}
	}
	switch {
	case o.GroupID == 0 || o.StsReplicas < 0:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionFalse, "NotStarted", "the group's pods are not created yet")
	case o.Leader == nil:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonNoLeader, "no replica reports itself the group's leader")
	case len(unhealthy) > 0:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, "MembersUnhealthy",
			fmt.Sprintf("members not answering or not caught up: %v", unhealthy))
	case o.Config == nil && !o.ShardMapGone:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionTrue, reasonControllerUnreachable, "cannot reach the controller group")
	default:
		setCondition(rg, shardkvv1.ConditionDegraded, metav1.ConditionFalse, "Healthy", "every member answers and is caught up")
	}

	// Ready: serving, every member healthy, at the spec's size, at rest.
	switch {
	case o.Deleting:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "Deleting", "the group is being deleted")
	case !joined:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "NotJoined", st.Message)
	case o.Leader == nil || len(unhealthy) > 0:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, "Degraded", "not every member is healthy")
	case st.Kind != stepIdle:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionFalse, st.Reason, st.Message)
	default:
		setCondition(rg, shardkvv1.ConditionReady, metav1.ConditionTrue, "Serving",
			fmt.Sprintf("%d members serve %d shards", s.Replicas, s.Shards.Count))
	}
}
