package controllers

// ReplicaGroupReconciler runs one Raft data group as a StatefulSet: it
// creates the group's objects, allocates its group id, joins it to the
// controller, changes its membership one member at a time (scale-out,
// scale-in, replacing replicas that lost their disk), rolls pods for
// template changes (followers first, the leader last), and drains the group
// before it is deleted. Each pass observes (replicagroup_observe.go), asks
// the planner (nextStep, replicagroup_plan.go) for one step, executes it
// (replicagroup_execute.go), records the status (replicagroup_status.go)
// and requeues. The group's objects are kept in step with the spec before
// planning (ensure*, replicagroup_resources.go).

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

// ReplicaGroupReconciler reconciles ReplicaGroups.
type ReplicaGroupReconciler struct {
	client.Client
	// APIReader reads from the API server, not the cache (group id
	// allocation must not work from a stale copy). Defaults to the
	// manager's.
	APIReader client.Reader
	// Credentials are the operator's certificates of clusters with TLS
	// (shared with the ShardMap reconciler; made at setup if nil).
	Credentials *TLSCredentials
	Scheme      *runtime.Scheme
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

	// MaxConcurrentRolls bounds how many groups, across every cluster the
	// operator manages, roll their pods at once (rollslot.go; default 2).
	MaxConcurrentRolls int

	// The clock of a drained group's linger.
	wallClock
	// slots are the roll slots taken lately.
	slots rollSlots
}

// RBAC: exactly what the code calls (config/rbac/role.yaml; the envtest
// suite runs the reconcilers with only these rights and fails on a verb
// missing or unused, controllers/rbac_test.go). Reads of the watched kinds
// come from the cache, so list and watch are enough for them ("list":
// the informers' first list, streamed over the watch where the API server
// serves that); "get" only where the code reads past the cache
// (APIReader: ReplicaGroups, ShardMaps, StatefulSets, pods).
//
// ReplicaGroups: update adds the finalizer shardkv.io/drain, the
// bootstrap-replicas annotation and the roll slot (rollslot.go), and
// removes the finalizer once drained
// (both are changes of the object itself, not of a subresource); never
// patch. Status: update only (the group's status, and the ShardMap's
// nextGroupID when a group id is allocated). "update" on the finalizers
// subresources is not called by the code: where OwnerReferencesPermissionEnforcement
// is on, creating the StatefulSet, Service and PodDisruptionBudget with a
// controller reference (blockOwnerDeletion) to their ReplicaGroup needs it.
// StatefulSets: create, update (the pod template), patch (replicas, with
// an optimistic lock). Services and PodDisruptionBudgets: create, update.
// Pods: get (a replica's IP, --dial-pod-ips; a replacement checked against
// the API server), delete (rolling, replacing a replica). Claims: delete
// (pvcRetention: Delete, a lost disk), patch (growing one to
// spec.storage.size). Events: create, and patch when an
// Event repeats (its series).
//
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups/status,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups/finalizers,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/status,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create;update
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list;watch;create;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler with mgr.
func (r *ReplicaGroupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Credentials == nil {
		r.Credentials = &TLSCredentials{Reader: mgr.GetClient()}
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
	groups, err := replicaGroupsOf(ctx, r.Client, o.GetNamespace(), o.GetName())
	if err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range groups {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&groups[i])})
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

	claims, err := r.groupClaims(ctx, rg)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("claims: %w", err)
	}

	// The group's objects, once it has an id (recorded before the
	// StatefulSet exists, so its pods are started with it).
	var sts *appsv1.StatefulSet
	if !deleting && !paused && sm != nil && sm.DeletionTimestamp.IsZero() &&
		controllerutil.ContainsFinalizer(rg, Finalizer) && rg.Status.GroupID != 0 {
		if r.image(rg, sm) == "" {
			return r.finishStatus(ctx, rg, nil, wait("NoImage", "spec.image is empty and the operator has no default image"), nil)
		}
		if err := r.ensureService(ctx, rg, sm); err != nil {
			return ctrl.Result{}, fmt.Errorf("service: %w", err)
		}
		if len(retainedOrdinals(rg, claims)) > 0 {
			// No pod may start on a deleted group's data: the set is not
			// created (or changed) until those claims are gone
			// (planRetainedVolumes).
			sts, err = r.existingStatefulSet(ctx, rg)
		} else {
			sts, err = r.ensureStatefulSet(ctx, rg, sm)
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("statefulset: %w", err)
		}
	} else if sts, err = r.existingStatefulSet(ctx, rg); err != nil {
		return ctrl.Result{}, err
	}

	o, err := r.observe(ctx, rg, sm, sts, claims)
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
		switch {
		case st.Kind == stepGrowVolume && o.ResizeRefused != "":
			// The API server refused the grow (finishStatus tells it,
			// from StorageApplied): nothing is in flight, so this pass's
			// status is what the next pass plans, not "growing".
			st = nextStep(o)
		case err == nil:
			r.Recorder.Eventf(rg, nil, corev1.EventTypeNormal, string(st.Kind), string(st.Kind), "%s", st.Message)
		default:
			logger.Info("step failed", "step", st.String(), "err", err)
			r.Recorder.Eventf(rg, nil, corev1.EventTypeWarning, "StepFailed", string(st.Kind), "%s: %v", st.Message, err)
		}
	}
	return r.finishStatus(ctx, rg, o, st, execErr)
}

// existingStatefulSet is the group's StatefulSet (nil if there is none).
func (r *ReplicaGroupReconciler) existingStatefulSet(ctx context.Context, rg *shardkvv1.ReplicaGroup) (*appsv1.StatefulSet, error) {
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(rg), sts); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return sts, nil
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
