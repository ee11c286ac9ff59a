package controllers

// ShardMapReconciler runs a cluster's controller group (a StatefulSet, its
// headless Service and a PodDisruptionBudget), rolls its pods one at a time
// when their template changes, applies spec.moves to the controller's pins,
// and reports the shard table, migrations and readiness in the ShardMap's
// status. Each pass observes (shardmap_observe.go), asks the planner
// (planShardMap, shardmap_plan.go) for at most one step that changes
// something (create or update an object, delete one pod, one Move or
// Unpin), executes it (shardmap_execute.go) and records the status
// (shardmap_status.go): every wait as a condition with a reason and a
// message, every step as an Event.
//
// Configs are followed from the controller's Watch stream
// (shardmap_watch.go), not by polling. Soft state that makes no new config
// (the groups' reports: shard states and migration progress) is refreshed
// by a periodic requeue: BusyResync while the cluster is not settled,
// IdleResync otherwise.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// Condition reasons of the ShardMap.
const (
	ReasonWaitingForControllerQuorum = "WaitingForControllerQuorum"
	ReasonControllerUnavailable      = "ControllerUnavailable"
	ReasonNoGroups                   = "NoGroups"
	ReasonShardsNotServing           = "ShardsNotServing"
	ReasonServing                    = "Serving"
	ReasonSettled                    = "Settled"
	ReasonMigrationsInFlight         = "MigrationsInFlight"
	ReasonGroupsCatchingUp           = "GroupsCatchingUp"
	ReasonShardsMoving               = "ShardsMoving"
	ReasonNoMigrations               = "NoMigrations"
	// Migrating True while moves wait on a group: it does not report
	// (none, or none for 10s), or it applied the config announcing a move
	// to it but has not started copying.
	ReasonGroupNotReporting = "GroupNotReporting"
	ReasonWaitingForTarget  = "WaitingForTarget"
	ReasonPaused            = "Paused"
	ReasonUpToDate          = "UpToDate"
	ReasonApplyingMoves     = "ApplyingMoves"
	ReasonWaitingForMoves   = "WaitingForMoves"
	ReasonRollingPods       = "RollingPods"
	ReasonWaitingToRoll     = "WaitingToRoll"
	ReasonObjectsUpdated    = "ObjectsUpdated"
	ReasonConflict          = "NameConflict"
	ReasonWaitingForTLS     = "WaitingForTLS"
	ReasonUsersInvalid      = "UsersInvalid"
	ReasonUsersUpdated      = "UsersUpdated"
)

// ShardMapReconciler reconciles ShardMaps.
type ShardMapReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	// Recorder emits Events (defaults to the manager's).
	Recorder  events.EventRecorder
	DataPlane DataPlane
	// DefaultImage is the node image when spec.controller.image is empty.
	DefaultImage string
	// DialPodIPs reaches the controller at its pods' IPs instead of their
	// DNS names (an operator running outside the cluster).
	DialPodIPs bool
	// BusyResync is the requeue period while the cluster is not settled
	// (migrations in flight, not ready: the groups' reports change without
	// a new config), default 3s, and at most 1s while shards migrate;
	// IdleResync once settled, default 60s.
	BusyResync, IdleResync time.Duration
	// CallTimeout bounds each data-plane call (default 5s).
	CallTimeout time.Duration
	// APIReader reads what the cache does not hold: the Secret of
	// spec.users (the cache has only the operator's own Secrets).
	APIReader client.Reader
	// Credentials are the operator's certificates of clusters with TLS
	// (shared with the ReplicaGroup reconciler; made at setup if nil).
	Credentials *TLSCredentials
	// TLSPropagation is how long a CA rotation lets each change reach the
	// pods (default DefaultTLSPropagation).
	TLSPropagation time.Duration
	// OperatorNamespace is the namespace of the operator's pods, which
	// the cluster's NetworkPolicies admit (default: the namespace the
	// operator runs in; none outside a cluster).
	OperatorNamespace string

	// The clock of the migrations' rate estimates and the TLS rotation.
	wallClock

	mu      sync.Mutex
	watches map[types.NamespacedName]*configWatch
	rates   map[types.NamespacedName]map[string]rateSample // shardmap_rates.go
	wake    chan event.GenericEvent
	baseCtx context.Context
}

// RBAC (see also ReplicaGroupReconciler's): the ShardMap itself is read
// (get: the fresh object before a group id is allocated) and updated to
// add and remove its finalizer (shardkv.io/replicagroups); its status is
// updated. "update" on shardmaps/finalizers is for
// OwnerReferencesPermissionEnforcement, where it is on, when the controller group's StatefulSet, Service and
// PodDisruptionBudget are created owned by the ShardMap (blockOwnerDeletion).
// Owned objects: create, and update when their spec hash changes; the
// controller pods are deleted one at a time to roll them.
//
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/status,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/finalizers,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create;update
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list;watch;create;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=cert-manager.io,resources=certificates,verbs=get;create;update

// SetupWithManager registers the reconciler with mgr.
func (r *ShardMapReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.DataPlane == nil {
		return errors.New("ShardMapReconciler: DataPlane is required")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Scheme == nil {
		r.Scheme = mgr.GetScheme()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("shardmap-controller")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Credentials == nil {
		r.Credentials = &TLSCredentials{Reader: r.Client}
	}
	r.watches = map[types.NamespacedName]*configWatch{}
	r.wake = make(chan event.GenericEvent, 64)
	ctx, cancel := context.WithCancel(context.Background())
	r.baseCtx = ctx
	// The Watch goroutines live until the manager stops.
	if err := mgr.Add(manager.RunnableFunc(func(stop context.Context) error {
		<-stop.Done()
		cancel()
		return nil
	})); err != nil {
		cancel()
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("shardmap").
		For(&shardkvv1.ShardMap{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		// The TLS Secrets, groups' included, by their instance label.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			l := o.GetLabels()
			if l[LabelManagedBy] != ManagedBy || l[LabelInstance] == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: l[LabelInstance]}}}
		})).
		Owns(&networkingv1.NetworkPolicy{}).
		// Controller pods belong to the StatefulSet; map them by label
		// (readiness, IPs in DialPodIPs mode, rolling).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			l := o.GetLabels()
			if l[LabelComponent] != ComponentController || l[LabelInstance] == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: l[LabelInstance]}}}
		})).
		// A group's id and name feed the status and spec.moves.
		Watches(&shardkvv1.ReplicaGroup{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			rg, ok := o.(*shardkvv1.ReplicaGroup)
			if !ok || rg.Spec.ShardMap == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: rg.Namespace, Name: rg.Spec.ShardMap}}}
		})).
		// New configs from the controller's Watch stream.
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// recordCtrlerBootstrap writes the controller group's bootstrap size on
// the ShardMap (AnnotationCtrlerBootstrap): its StatefulSet's, else the
// spec's, which the StatefulSet is about to be created with. recorded:
// the ShardMap was updated (the pass ends there).
func (r *ShardMapReconciler) recordCtrlerBootstrap(ctx context.Context, sm *shardkvv1.ShardMap) (recorded bool, err error) {
	n := smCtrlerReplicas(sm)
	sts := &appsv1.StatefulSet{}
	switch err := r.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: CtrlerName(sm.Name)}, sts); {
	case err == nil:
		if b, perr := strconv.Atoi(sts.Annotations[AnnotationCtrlerBootstrap]); perr == nil && b > 0 && metav1.IsControlledBy(sts, sm) {
			n = int32(b)
		}
	case !apierrors.IsNotFound(err):
		return false, err
	}
	want := strconv.Itoa(int(n))
	if sm.Annotations[AnnotationCtrlerBootstrap] == want {
		return false, nil
	}
	setAnnotation(sm, AnnotationCtrlerBootstrap, want)
	if err := r.Update(ctx, sm); err != nil {
		return false, fmt.Errorf("record the controller group's bootstrap size: %w", err)
	}
	return true, nil
}

// apiReader reads from the API server, not the cache (the Client when no
// APIReader was set, as in tests that build the reconciler by hand).
func (r *ShardMapReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

func (r *ShardMapReconciler) busyResync() time.Duration {
	return orDefault(r.BusyResync, 3*time.Second)
}

func (r *ShardMapReconciler) idleResync() time.Duration {
	return orDefault(r.IdleResync, 60*time.Second)
}

// event records an Event about obj. events.k8s.io merges "isomorphic"
// events (same type, reason, action, regarding and related objects) into
// one series that keeps the first note, so distinct actions must differ in
// action or related (e.g. the shard in the action, the pod as related).
func (r *ShardMapReconciler) event(obj runtime.Object, typ, reason, action, format string, args ...any) {
	r.eventRelated(obj, nil, typ, reason, action, format, args...)
}

func (r *ShardMapReconciler) eventRelated(obj, related runtime.Object, typ, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, related, typ, reason, action, format, args...)
	}
}

// Reconcile runs one pass: observe, plan one step, execute it, record status.
func (r *ShardMapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	sm := &shardkvv1.ShardMap{}
	if err := r.Get(ctx, req.NamespacedName, sm); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopWatch(req.NamespacedName)
			r.forgetRates(req.NamespacedName)
			r.Credentials.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !sm.DeletionTimestamp.IsZero() {
		return r.reconcileDeletion(ctx, sm)
	}
	if !controllerutil.ContainsFinalizer(sm, ShardMapFinalizer) {
		controllerutil.AddFinalizer(sm, ShardMapFinalizer)
		if err := r.Update(ctx, sm); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
			}
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	if recorded, err := r.recordCtrlerBootstrap(ctx, sm); err != nil || recorded {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		return ctrl.Result{RequeueAfter: time.Millisecond}, err
	}
	orig := sm.Status.DeepCopy()

	o, api, err := r.observe(ctx, sm)
	if err != nil {
		return ctrl.Result{}, err
	}
	pl := planShardMap(o)
	logger.V(1).Info("planned", "step", pl.Step.String(), "wait", pl.Wait.Reason, "message", pl.Wait.Message)
	var out smOutcome
	if pl.Step.Kind != smStepNone {
		if out, err = r.execute(ctx, sm, o, api, pl.Step); err != nil {
			if apierrors.IsConflict(err) || errors.Is(err, errStale) {
				return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
			}
			return ctrl.Result{}, err
		}
	}

	settled, waits := fillStatus(sm, o)
	if o.Cluster != nil {
		r.estimateRates(req.NamespacedName, sm.Status.Migrations)
	}
	r.migrationWaitEvents(sm, orig, waits)
	if out.Degraded.Reason != "" && pl.Degraded.Reason == "" {
		pl.Degraded = out.Degraded
	}
	progress := r.setConditions(sm, o, pl, out.Progress)
	res := ctrl.Result{RequeueAfter: r.idleResync()}
	if !settled || o.Cluster == nil || progress.Status == metav1.ConditionTrue {
		res.RequeueAfter = r.busyResync()
	}
	if sm.Status.MigratingShards > 0 && o.Cluster != nil {
		// Shards are moving: follow their progress (groups report every
		// 500 ms) closely; it is one Status call per second.
		res.RequeueAfter = min(res.RequeueAfter, time.Second)
	}
	if pl.Step.Kind != smStepNone {
		res.RequeueAfter = 100 * time.Millisecond // the next step
	}
	if !equality.Semantic.DeepEqual(orig, &sm.Status) {
		if err := r.Status().Update(ctx, sm); err != nil {
			if apierrors.IsConflict(err) {
				// The ReplicaGroup reconciler allocated a group id (or
				// the cache lagged): start over from the newer object.
				return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
			}
			return ctrl.Result{}, err
		}
	}
	if out.Err != nil {
		return ctrl.Result{}, out.Err
	}
	logger.V(1).Info("reconciled", "config", sm.Status.ConfigNum, "ready", meta.IsStatusConditionTrue(sm.Status.Conditions, shardkvv1.ConditionReady))
	return res, nil
}
