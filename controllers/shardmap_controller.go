package controllers

// ShardMapReconciler runs a cluster's controller group (a StatefulSet, its
// headless Service and a PodDisruptionBudget), rolls its pods one at a time
// when their template changes, applies spec.moves to the controller's pins,
// and reports the shard table, migrations and readiness in the ShardMap's
// status. Each pass takes at most one step that changes something (create
// or update an object, delete one pod, one Move or Unpin) and records every
// wait as a condition with a reason and a message.
//
// Configs are followed from the controller's Watch stream (one goroutine
// per ShardMap, feeding reconciles through a channel source), not by
// polling. Soft state that makes no new config (the groups' reports:
// shard states and migration progress) is refreshed by a periodic requeue:
// BusyResync while the cluster is not settled, IdleResync otherwise.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

const (
	// ComponentController is the LabelComponent value of the controller
	// group's objects.
	ComponentController = "controller"
	// annotationSpecHash (on objects the ShardMap reconciler owns) is the
	// hash of the spec it last wrote, so a change is seen without
	// comparing against API-server defaults.
	annotationSpecHash = "shardkv.io/spec-hash"
	// AnnotationCtrlerBootstrap (on the controller StatefulSet) is how many
	// replicas the controller group was bootstrapped with: its --peers and
	// its size, fixed for the cluster's life.
	AnnotationCtrlerBootstrap = "shardkv.io/bootstrap-replicas"
	// stsRevisionLabel is the StatefulSet controller's pod revision label.
	stsRevisionLabel = appsv1.StatefulSetRevisionLabel
	// maxTableRanges caps status.table: a consistent-hash placement can
	// scatter owners over thousands of runs, which would bloat the object.
	maxTableRanges = 1024
	// Shard states the reconciler adds to the groups' own.
	stateServing    = "Serving"
	stateUnknown    = "Unknown"
	statePending    = "Pending" // the owner has not reached the config yet
	stateUnassigned = "Unassigned"
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
	ReasonPaused                     = "Paused"
	ReasonUpToDate                   = "UpToDate"
	ReasonApplyingMoves              = "ApplyingMoves"
	ReasonWaitingForMoves            = "WaitingForMoves"
	ReasonRollingPods                = "RollingPods"
	ReasonWaitingToRoll              = "WaitingToRoll"
	ReasonObjectsUpdated             = "ObjectsUpdated"
	ReasonConflict                   = "NameConflict"
	ReasonResizeUnsupported          = "ControllerResizeUnsupported"
	ReasonStorageImmutable           = "StorageImmutable"
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

	mu      sync.Mutex
	watches map[types.NamespacedName]*configWatch
	wake    chan event.GenericEvent
	baseCtx context.Context
}

// configWatch is the Watch stream goroutine of one ShardMap.
type configWatch struct {
	addrs  string
	cancel context.CancelFunc
}

// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=shardkv.io,resources=shardmaps/finalizers,verbs=update
// +kubebuilder:rbac:groups=shardkv.io,resources=replicagroups,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

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

func (r *ShardMapReconciler) busyResync() time.Duration {
	return orDefault(r.BusyResync, 3*time.Second)
}

func (r *ShardMapReconciler) idleResync() time.Duration {
	return orDefault(r.IdleResync, 60*time.Second)
}

func (r *ShardMapReconciler) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, orDefault(r.CallTimeout, defaultCallTimeout))
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

// smPass is what one pass learns and decides.
type smPass struct {
	sm        *shardkvv1.ShardMap
	sts       *appsv1.StatefulSet
	bootstrap int32 // the controller group's fixed size
	// acted: this pass changed something (at most one step); further
	// mutating steps wait for the next pass.
	acted bool
	// progressing is the Progressing condition to record.
	progReason, progMsg string
	progStatus          metav1.ConditionStatus
	// degraded, if set, is the Degraded condition to record.
	degReason, degMsg string
	// cluster is the controller's view (nil when it was not reached).
	cluster *shardkvpb.ClusterStatus
	// prev is the config before the latest, fetched only while some group
	// has not reached the latest: the owners its shards are moving from.
	prev  *shardkvpb.Config
	api   ControllerAPI
	dpErr error
	// settled: no migration in flight and every group applied the latest config.
	settled bool
	// stepErr is a failed data-plane step: returned after the status is
	// written, so retries back off (the queue's rate limiter).
	stepErr error
}

func (p *smPass) progress(status metav1.ConditionStatus, reason, format string, args ...any) {
	if p.progReason != "" {
		return // the first (most important) wait of the pass is recorded
	}
	p.progStatus, p.progReason, p.progMsg = status, reason, fmt.Sprintf(format, args...)
}

// Reconcile runs one pass.
func (r *ShardMapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	sm := &shardkvv1.ShardMap{}
	if err := r.Get(ctx, req.NamespacedName, sm); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopWatch(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if !sm.DeletionTimestamp.IsZero() {
		// The owned objects go with it (owner references).
		r.stopWatch(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	orig := sm.Status.DeepCopy()
	p := &smPass{sm: sm}

	// 1. The controller group's objects.
	if err := r.ensureObjects(ctx, p); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		return ctrl.Result{}, err
	}

	// 2. The controller's view, if a quorum of its pods runs.
	r.observeController(ctx, p)

	// 3. Status from it and the ReplicaGroups.
	var rgs shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &rgs, client.InNamespace(sm.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	groups := map[string]*shardkvv1.ReplicaGroup{}
	for i := range rgs.Items {
		if rgs.Items[i].Spec.ShardMap == sm.Name {
			groups[rgs.Items[i].Name] = &rgs.Items[i]
		}
	}
	r.fillStatus(p, groups)

	// 4. Roll controller pods, then spec.moves (one step per pass).
	if !sm.Spec.Paused {
		if err := r.rollPods(ctx, p); err != nil {
			return ctrl.Result{}, err
		}
		r.applyMoves(ctx, p, groups)
	}

	// 5. Conditions and the status write.
	r.setConditions(p)
	res := ctrl.Result{RequeueAfter: r.idleResync()}
	if !p.settled || p.cluster == nil || p.progStatus == metav1.ConditionTrue {
		res.RequeueAfter = r.busyResync()
	}
	if sm.Status.MigratingShards > 0 && p.cluster != nil {
		// Shards are moving: follow their progress (groups report every
		// 500 ms) closely; it is one Status call per second.
		res.RequeueAfter = min(res.RequeueAfter, time.Second)
	}
	if p.acted {
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
	if p.stepErr != nil {
		return ctrl.Result{}, p.stepErr
	}
	logger.V(1).Info("reconciled", "config", sm.Status.ConfigNum, "ready", meta.IsStatusConditionTrue(sm.Status.Conditions, shardkvv1.ConditionReady))
	return res, nil
}

// ---------------------------------------------------------------- objects

func ctrlerSelectorLabels(sm *shardkvv1.ShardMap) map[string]string {
	return map[string]string{
		LabelName:      "shardkv",
		LabelInstance:  sm.Name,
		LabelComponent: ComponentController,
	}
}

func ctrlerLabels(sm *shardkvv1.ShardMap) map[string]string {
	l := ctrlerSelectorLabels(sm)
	l[LabelManagedBy] = ManagedBy
	return l
}

func smShards(sm *shardkvv1.ShardMap) int32 {
	if sm.Spec.Shards > 0 {
		return sm.Spec.Shards
	}
	return 256
}

func smPlacement(sm *shardkvv1.ShardMap) string {
	if sm.Spec.Placement != "" {
		return sm.Spec.Placement
	}
	return "balanced"
}

func smCtrlerReplicas(sm *shardkvv1.ShardMap) int32 {
	if sm.Spec.Controller.Replicas > 0 {
		return sm.Spec.Controller.Replicas
	}
	return 3
}

func (r *ShardMapReconciler) ctrlerImage(sm *shardkvv1.ShardMap) string {
	if sm.Spec.Controller.Image != "" {
		return sm.Spec.Controller.Image
	}
	return r.DefaultImage
}

// ctrlerArgs are the controller replicas' `node serve` flags (docs/node.md).
func ctrlerArgs(sm *shardkvv1.ShardMap, bootstrap int32) []string {
	set := CtrlerName(sm.Name)
	return []string{
		"serve",
		"--role=ctrler",
		"--id=auto",
		"--data-dir=/data",
		fmt.Sprintf("--listen=0.0.0.0:%d", GRPCPort),
		fmt.Sprintf("--advertise=$(POD_NAME).%s.%s.svc:%d", set, sm.Namespace, GRPCPort),
		"--peers=" + PeersFlag(set, int(bootstrap), sm.Namespace),
		fmt.Sprintf("--shards=%d", smShards(sm)),
		"--placement=" + smPlacement(sm),
		fmt.Sprintf("--http=0.0.0.0:%d", HTTPPort),
	}
}

// ctrlerPodTemplate is the pod of every controller replica.
func (r *ShardMapReconciler) ctrlerPodTemplate(sm *shardkvv1.ShardMap, bootstrap int32) corev1.PodTemplateSpec {
	pull := sm.Spec.Controller.ImagePullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: ctrlerLabels(sm)},
		Spec: corev1.PodSpec{
			// Spread the replicas over nodes where the cluster allows it.
			Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
					Weight: 100,
					PodAffinityTerm: corev1.PodAffinityTerm{
						TopologyKey:   corev1.LabelHostname,
						LabelSelector: &metav1.LabelSelector{MatchLabels: ctrlerSelectorLabels(sm)},
					},
				}},
			}},
			// SIGTERM: a leader hands off first; the whole stop takes < 8s.
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			EnableServiceLinks:            ptr.To(false),
			SecurityContext:               nodePodSecurityContext(),
			Containers: []corev1.Container{{
				Name:            "node",
				Image:           r.ctrlerImage(sm),
				ImagePullPolicy: pull,
				// The image has no ENTRYPOINT (Dockerfile).
				Command: []string{"/node"},
				Args:    ctrlerArgs(sm, bootstrap),
				Env:     []corev1.EnvVar{podNameEnv()},
				Ports: []corev1.ContainerPort{
					{Name: "grpc", ContainerPort: GRPCPort, Protocol: corev1.ProtocolTCP},
					{Name: "http", ContainerPort: HTTPPort, Protocol: corev1.ProtocolTCP},
				},
				// /healthz answers while the process runs. Readiness must
				// not need a leader (/readyz does): a bootstrapping group
				// has none until a quorum of pods runs.
				ReadinessProbe: httpProbe(0, 5, 2, 3),
				LivenessProbe:  httpProbe(10, 10, 5, 6),
				Resources:      *sm.Spec.Controller.Resources.DeepCopy(),
				VolumeMounts:   []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

func storageSize(s shardkvv1.StorageSpec) resource.Quantity {
	if s.Size.IsZero() {
		return resource.MustParse("1Gi")
	}
	return s.Size
}

func (r *ShardMapReconciler) desiredCtrlerSts(sm *shardkvv1.ShardMap, bootstrap int32) *appsv1.StatefulSet {
	name := CtrlerName(sm.Name)
	st := sm.Spec.Controller.Storage
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: sm.Namespace, Labels: ctrlerLabels(sm),
			Annotations: map[string]string{AnnotationCtrlerBootstrap: strconv.Itoa(int(bootstrap))},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(bootstrap),
			ServiceName:         name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// The operator rolls the pods itself, one at a time, with a
			// quorum up and the controller answering.
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Selector:       &metav1.LabelSelector{MatchLabels: ctrlerSelectorLabels(sm)},
			Template:       r.ctrlerPodTemplate(sm, bootstrap),
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: ctrlerSelectorLabels(sm)},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: st.StorageClassName,
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceStorage: storageSize(st)}},
				},
			}},
		},
	}
	sts.Annotations[annotationSpecHash] = specHash(sts.Spec)
	return sts
}

func desiredCtrlerService(sm *shardkvv1.ShardMap) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: CtrlerName(sm.Name), Namespace: sm.Namespace, Labels: ctrlerLabels(sm)},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			// Peers must resolve each other before any is ready.
			PublishNotReadyAddresses: true,
			Selector:                 ctrlerSelectorLabels(sm),
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: GRPCPort, TargetPort: intstr.FromString("grpc"), Protocol: corev1.ProtocolTCP},
				{Name: "http", Port: HTTPPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
	svc.Annotations = map[string]string{annotationSpecHash: specHash(svc.Spec)}
	return svc
}

// desiredCtrlerPDB keeps a majority of the controller group up through
// voluntary disruptions (drains): minAvailable = n/2+1, so a 3-member group
// loses at most 1 pod at a time and a 1-member group none.
func desiredCtrlerPDB(sm *shardkvv1.ShardMap, replicas int32) *policyv1.PodDisruptionBudget {
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: CtrlerName(sm.Name), Namespace: sm.Namespace, Labels: ctrlerLabels(sm)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(replicas/2 + 1)),
			Selector:     &metav1.LabelSelector{MatchLabels: ctrlerSelectorLabels(sm)},
		},
	}
	pdb.Annotations = map[string]string{annotationSpecHash: specHash(pdb.Spec)}
	return pdb
}

// specHash identifies an object spec's content.
func specHash(spec any) string {
	b, err := json.Marshal(spec)
	if err != nil {
		panic(err) // API specs always marshal
	}
	h := fnv.New64a()
	h.Write(b)
	return strconv.FormatUint(h.Sum64(), 36)
}

// ensureObjects creates or updates the StatefulSet, Service and PDB (at
// most one write per pass) and leaves the StatefulSet in p.sts. Paused: it
// only reads.
func (r *ShardMapReconciler) ensureObjects(ctx context.Context, p *smPass) error {
	sm := p.sm
	name := CtrlerName(sm.Name)
	key := client.ObjectKey{Namespace: sm.Namespace, Name: name}

	sts := &appsv1.StatefulSet{}
	switch err := r.Get(ctx, key, sts); {
	case apierrors.IsNotFound(err):
		sts = nil
	case err != nil:
		return err
	}
	// The group's size and --peers are those it was bootstrapped with.
	p.bootstrap = smCtrlerReplicas(sm)
	if sts != nil {
		if n, err := strconv.Atoi(sts.Annotations[AnnotationCtrlerBootstrap]); err == nil && n > 0 {
			p.bootstrap = int32(n)
		}
		if !metav1.IsControlledBy(sts, sm) {
			p.degReason, p.degMsg = ReasonConflict, fmt.Sprintf("StatefulSet %s exists and is not owned by this ShardMap", name)
			p.sts = nil
			return nil
		}
		p.sts = sts
	}
	if p.bootstrap != smCtrlerReplicas(sm) {
		p.degReason, p.degMsg = ReasonResizeUnsupported, fmt.Sprintf(
			"spec.controller.replicas is %d but the controller group was created with %d; resizing the controller group is not supported yet, it keeps %d",
			smCtrlerReplicas(sm), p.bootstrap, p.bootstrap)
	}
	if sm.Spec.Paused {
		return nil
	}

	// StatefulSet.
	want := r.desiredCtrlerSts(sm, p.bootstrap)
	if sts == nil {
		if err := createOwned(ctx, r.Client, r.Scheme, sm, want); err != nil {
			return err
		}
		p.sts, p.acted = want, true
		r.event(sm, corev1.EventTypeNormal, "Created", "CreateStatefulSet", "created StatefulSet %s (%d controller replicas)", name, p.bootstrap)
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "created StatefulSet %s", name)
		return nil
	}
	if vct := sts.Spec.VolumeClaimTemplates; len(vct) == 1 && p.degReason == "" {
		have, wantClass := vct[0].Spec.Resources.Requests[corev1.ResourceStorage], sm.Spec.Controller.Storage.StorageClassName
		if size := storageSize(sm.Spec.Controller.Storage); have.Cmp(size) != 0 ||
			wantClass != nil && (vct[0].Spec.StorageClassName == nil || *vct[0].Spec.StorageClassName != *wantClass) {
			p.degReason, p.degMsg = ReasonStorageImmutable, fmt.Sprintf(
				"spec.controller.storage (%s) differs from the volumes the controller group was created with (%s), which cannot change",
				size.String(), have.String())
		}
	}
	if sts.Annotations[annotationSpecHash] != want.Annotations[annotationSpecHash] {
		// Only the mutable fields; the selector, service name, policy and
		// claim templates are fixed at creation.
		sts.Spec.Replicas = want.Spec.Replicas
		sts.Spec.Template = want.Spec.Template
		sts.Spec.UpdateStrategy = want.Spec.UpdateStrategy
		if sts.Annotations == nil {
			sts.Annotations = map[string]string{}
		}
		sts.Annotations[annotationSpecHash] = want.Annotations[annotationSpecHash]
		sts.Labels = want.Labels
		if err := r.Update(ctx, sts); err != nil {
			return err
		}
		p.sts, p.acted = sts, true
		r.event(sm, corev1.EventTypeNormal, "Updated", "UpdateStatefulSet", "updated StatefulSet %s; pods are rolled one at a time", name)
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "updated StatefulSet %s", name)
		return nil
	}

	// Service.
	wantSvc := desiredCtrlerService(sm)
	svc := &corev1.Service{}
	switch err := r.Get(ctx, key, svc); {
	case apierrors.IsNotFound(err):
		if err := createOwned(ctx, r.Client, r.Scheme, sm, wantSvc); err != nil {
			return err
		}
		p.acted = true
		r.event(sm, corev1.EventTypeNormal, "Created", "CreateService", "created headless Service %s", name)
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "created Service %s", name)
		return nil
	case err != nil:
		return err
	case !metav1.IsControlledBy(svc, sm):
		p.degReason, p.degMsg = ReasonConflict, fmt.Sprintf("Service %s exists and is not owned by this ShardMap", name)
	case svc.Annotations[annotationSpecHash] != wantSvc.Annotations[annotationSpecHash]:
		svc.Spec.Ports, svc.Spec.Selector, svc.Spec.PublishNotReadyAddresses = wantSvc.Spec.Ports, wantSvc.Spec.Selector, true
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[annotationSpecHash] = wantSvc.Annotations[annotationSpecHash]
		svc.Labels = wantSvc.Labels
		if err := r.Update(ctx, svc); err != nil {
			return err
		}
		p.acted = true
		r.event(sm, corev1.EventTypeNormal, "Updated", "UpdateService", "updated Service %s", name)
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "updated Service %s", name)
		return nil
	}

	// PodDisruptionBudget.
	wantPDB := desiredCtrlerPDB(sm, p.bootstrap)
	pdb := &policyv1.PodDisruptionBudget{}
	switch err := r.Get(ctx, key, pdb); {
	case apierrors.IsNotFound(err):
		if err := createOwned(ctx, r.Client, r.Scheme, sm, wantPDB); err != nil {
			return err
		}
		p.acted = true
		r.event(sm, corev1.EventTypeNormal, "Created", "CreatePodDisruptionBudget", "created PodDisruptionBudget %s (minAvailable %s)", name, wantPDB.Spec.MinAvailable.String())
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "created PodDisruptionBudget %s", name)
		return nil
	case err != nil:
		return err
	case !metav1.IsControlledBy(pdb, sm):
		p.degReason, p.degMsg = ReasonConflict, fmt.Sprintf("PodDisruptionBudget %s exists and is not owned by this ShardMap", name)
	case pdb.Annotations[annotationSpecHash] != wantPDB.Annotations[annotationSpecHash]:
		pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable, pdb.Spec.Selector = wantPDB.Spec.MinAvailable, nil, wantPDB.Spec.Selector
		if pdb.Annotations == nil {
			pdb.Annotations = map[string]string{}
		}
		pdb.Annotations[annotationSpecHash] = wantPDB.Annotations[annotationSpecHash]
		pdb.Labels = wantPDB.Labels
		if err := r.Update(ctx, pdb); err != nil {
			return err
		}
		p.acted = true
		r.event(sm, corev1.EventTypeNormal, "Updated", "UpdatePodDisruptionBudget", "updated PodDisruptionBudget %s", name)
		p.progress(metav1.ConditionTrue, ReasonObjectsUpdated, "updated PodDisruptionBudget %s", name)
	}
	return nil
}

// ------------------------------------------------------------ data plane

// ctrlerPods are the controller group's pods by ordinal.
func (r *ShardMapReconciler) ctrlerPods(ctx context.Context, sm *shardkvv1.ShardMap) (map[int]*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sm.Namespace), client.MatchingLabels(ctrlerSelectorLabels(sm))); err != nil {
		return nil, err
	}
	out := map[int]*corev1.Pod{}
	for i := range pods.Items {
		if ord := podOrdinal(CtrlerName(sm.Name), pods.Items[i].Name); ord >= 0 {
			out[ord] = &pods.Items[i]
		}
	}
	return out, nil
}

// ctrlerAddrs are where the operator dials the controller group: its pods'
// DNS names, or their IPs with DialPodIPs.
func (r *ShardMapReconciler) ctrlerAddrs(ctx context.Context, p *smPass) ([]string, error) {
	sm := p.sm
	if !r.DialPodIPs {
		return CtrlerAddrs(sm.Name, int(p.bootstrap), sm.Namespace), nil
	}
	pods, err := r.ctrlerPods(ctx, sm)
	if err != nil {
		return nil, err
	}
	var ords []int
	for ord, pod := range pods {
		if pod.Status.PodIP != "" && pod.DeletionTimestamp.IsZero() {
			ords = append(ords, ord)
		}
	}
	sort.Ints(ords)
	var out []string
	for _, ord := range ords {
		out = append(out, net.JoinHostPort(pods[ord].Status.PodIP, strconv.Itoa(GRPCPort)))
	}
	if len(out) == 0 {
		return nil, errors.New("no controller pod has an IP yet")
	}
	return out, nil
}

// observeController reads ClusterStatus when a quorum of controller pods
// runs, and makes sure the config Watch runs.
func (r *ShardMapReconciler) observeController(ctx context.Context, p *smPass) {
	sm := p.sm
	ready := int32(0)
	if p.sts != nil {
		ready = p.sts.Status.ReadyReplicas
	}
	sm.Status.ControllerReadyReplicas = ready
	if need := p.bootstrap/2 + 1; ready < need {
		p.dpErr = fmt.Errorf("%d/%d controller pods ready (%d needed for a quorum)", ready, p.bootstrap, need)
		return
	}
	addrs, err := r.ctrlerAddrs(ctx, p)
	if err != nil {
		p.dpErr = err
		return
	}
	api, err := r.DataPlane.Controller(addrs)
	if err != nil {
		p.dpErr = err
		return
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	st, err := api.Status(cctx)
	if err != nil {
		p.dpErr = err
		return
	}
	if st.GetLatest() == nil {
		p.dpErr = errors.New("the controller returned no config")
		return
	}
	if st.GetController().GetLeader() == 0 {
		p.dpErr = errors.New("the controller group has no leader")
		return
	}
	p.cluster, p.api = st, api
	if n := st.Latest.GetNum(); n > 1 && groupsBehind(st) {
		// Best effort: without it, shards whose new owner has not reported
		// yet show as Pending with no source.
		if prev, err := api.Query(cctx, int64(n-1)); err == nil {
			p.prev = prev
		}
	}
	r.ensureWatch(client.ObjectKeyFromObject(sm), addrs, api, st.Latest.Num+1)
}

// ensureWatch runs the config Watch of ShardMap nn at addrs (restarting it
// if the addresses changed). Each new config wakes a reconcile.
func (r *ShardMapReconciler) ensureWatch(nn types.NamespacedName, addrs []string, api ControllerAPI, from uint64) {
	key := strings.Join(addrs, ",")
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.watches[nn]; ok {
		if w.addrs == key {
			return
		}
		w.cancel()
	}
	ctx, cancel := context.WithCancel(r.baseCtx)
	w := &configWatch{addrs: key, cancel: cancel}
	r.watches[nn] = w
	go func() {
		defer func() {
			r.mu.Lock()
			if r.watches[nn] == w {
				delete(r.watches, nn)
			}
			r.mu.Unlock()
			cancel()
		}()
		for range api.Watch(ctx, from) {
			obj := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
			select {
			case r.wake <- event.GenericEvent{Object: obj}:
			case <-ctx.Done():
				return
			}
		}
	}()
}

func (r *ShardMapReconciler) stopWatch(nn types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.watches[nn]; ok {
		w.cancel()
		delete(r.watches, nn)
	}
}

// ---------------------------------------------------------------- status

// shardView is the table's view of one shard.
type shardView struct {
	gid   uint64
	state string
}

// clusterSummary is the status computed from a ClusterStatus.
type clusterSummary struct {
	groups     []shardkvv1.GroupRef
	table      []shardkvv1.ShardRange
	truncated  bool
	states     map[string]int32
	migrating  int32
	migrations []shardkvv1.Migration
	notServing int      // shards of the latest config not Serving on their owner
	behind     []uint64 // groups in the config whose report is not at the latest config
}

// groupsBehind: some group of the latest config has not reported it yet.
func groupsBehind(st *shardkvpb.ClusterStatus) bool {
	at := map[uint64]uint64{}
	for _, g := range st.GetGroups() {
		if rep := g.GetReport(); rep != nil {
			at[rep.Gid] = rep.ConfigNum
		}
	}
	for _, g := range st.GetLatest().GetGroups() {
		if at[g.Gid] < st.GetLatest().GetNum() {
			return true
		}
	}
	return false
}

// summarize computes the shard table, state counts and migrations from
// the controller's status. name maps a gid to its ReplicaGroup's name.
// prev, if known, is the config before the latest: a shard whose new
// owner has not reached the latest config yet is Pending, moving from its
// previous owner, rather than Unknown.
func summarize(st *shardkvpb.ClusterStatus, prev *shardkvpb.Config, name func(uint64) string) clusterSummary {
	cfg := st.GetLatest()
	reports := map[uint64]*shardkvpb.GroupReport{}
	byShard := map[uint64]map[uint32]*shardkvpb.ShardState{}
	for _, g := range st.GetGroups() {
		rep := g.GetReport()
		if rep == nil {
			continue
		}
		reports[rep.Gid] = rep
		m := map[uint32]*shardkvpb.ShardState{}
		for _, s := range rep.Shards {
			m[s.Shard] = s
		}
		byShard[rep.Gid] = m
	}
	out := clusterSummary{states: map[string]int32{}}

	// Groups, with their shard counts.
	owned := map[uint64]int32{}
	for _, gid := range cfg.GetShards() {
		owned[gid]++
	}
	for _, g := range cfg.GetGroups() {
		out.groups = append(out.groups, shardkvv1.GroupRef{Name: name(g.Gid), GroupID: int64(g.Gid), Shards: owned[g.Gid]})
		if rep := reports[g.Gid]; rep == nil || rep.ConfigNum < cfg.Num {
			out.behind = append(out.behind, g.Gid)
		}
	}

	// The table: each shard on its owner.
	views := make([]shardView, len(cfg.GetShards()))
	for i, gid := range cfg.GetShards() {
		v := shardView{gid: gid, state: stateUnknown}
		if gid == 0 {
			v.state = stateUnassigned
		} else if s := byShard[gid][uint32(i)]; s != nil && s.State != "" {
			v.state = s.State
		} else if rep := reports[gid]; rep == nil || rep.ConfigNum < cfg.Num {
			v.state = statePending
		}
		views[i] = v
		out.states[v.state]++
		if v.state != stateServing {
			out.notServing++
		}
	}
	for i := 0; i < len(views); {
		j := i
		for j+1 < len(views) && views[j+1] == views[i] {
			j++
		}
		if len(out.table) == maxTableRanges {
			out.truncated = true
			break
		}
		rg := shardkvv1.ShardRange{First: int32(i), Last: int32(j), GroupID: int64(views[i].gid), State: views[i].state}
		if views[i].gid != 0 {
			rg.Group = name(views[i].gid)
		}
		out.table = append(out.table, rg)
		i = j + 1
	}

	// Migrations: every shard some group holds in a state other than
	// Serving, once; the new owner's record (it has the progress) wins
	// over the old owner's.
	type move struct {
		src, dst    uint64
		keys, total uint64
		newOwner    bool
	}
	moves := map[uint32]move{}
	gids := make([]uint64, 0, len(reports))
	for gid := range reports {
		gids = append(gids, gid)
	}
	slices.Sort(gids)
	for _, gid := range gids {
		for _, s := range reports[gid].Shards {
			if s.State == stateServing || s.State == "" {
				continue
			}
			var m move
			switch s.State {
			case "Pulling", "Acking": // the new owner
				m = move{src: s.PeerGid, dst: gid, keys: s.Keys, total: s.TotalKeys, newOwner: true}
				if s.State == "Acking" && m.total < m.keys {
					m.total = m.keys // installed: the copy is complete
				}
			default: // BePulling, GCing: the old owner
				m = move{src: gid, dst: s.PeerGid}
			}
			if prev, ok := moves[s.Shard]; ok && (prev.newOwner || !m.newOwner) {
				continue
			}
			moves[s.Shard] = m
		}
	}
	// Shards whose new owner has not reached the latest config: moving
	// from their previous owner, nothing copied yet.
	if prevShards := prev.GetShards(); len(prevShards) == len(views) {
		for i, v := range views {
			from := prevShards[i]
			if _, known := moves[uint32(i)]; !known && v.state == statePending && from != 0 && from != v.gid {
				moves[uint32(i)] = move{src: from, dst: v.gid}
			}
		}
	}
	type pair struct{ src, dst uint64 }
	agg := map[pair]*shardkvv1.Migration{}
	var order []pair
	for _, m := range moves {
		k := pair{m.src, m.dst}
		a, ok := agg[k]
		if !ok {
			a = &shardkvv1.Migration{Source: name(m.src), Target: name(m.dst)}
			agg[k] = a
			order = append(order, k)
		}
		a.Shards++
		a.Keys += int64(m.keys)
		a.TotalKeys += int64(m.total)
	}
	slices.SortFunc(order, func(a, b pair) int {
		if a.src != b.src {
			return cmp.Compare(a.src, b.src)
		}
		return cmp.Compare(a.dst, b.dst)
	})
	for _, k := range order {
		a := agg[k]
		if a.TotalKeys > 0 {
			a.Progress = fmt.Sprintf("%d%%", min(100, a.Keys*100/a.TotalKeys))
		}
		out.migrations = append(out.migrations, *a)
	}
	out.migrating = int32(len(moves))
	return out
}

// groupNamer names gids by the ReplicaGroups' status.groupID ("gid-<n>"
// for a gid no ReplicaGroup of this ShardMap holds).
func groupNamer(groups map[string]*shardkvv1.ReplicaGroup) func(uint64) string {
	names := map[uint64]string{}
	for _, rg := range groups {
		if rg.Status.GroupID > 0 {
			names[uint64(rg.Status.GroupID)] = rg.Name
		}
	}
	return func(gid uint64) string {
		if n, ok := names[gid]; ok {
			return n
		}
		return fmt.Sprintf("gid-%d", gid)
	}
}

// fillStatus records what the controller reported (the last known values
// stay when it was not reached) and advances nextGroupID.
func (r *ShardMapReconciler) fillStatus(p *smPass, groups map[string]*shardkvv1.ReplicaGroup) {
	sm := p.sm
	st := &sm.Status
	st.ObservedGeneration = sm.Generation

	next := max(st.NextGroupID, 1)
	for _, rg := range groups {
		next = max(next, rg.Status.GroupID+1)
	}
	if p.cluster == nil {
		st.NextGroupID = next
		return
	}
	cfg := p.cluster.Latest
	for _, g := range cfg.Groups {
		next = max(next, int64(g.Gid)+1)
	}
	st.NextGroupID = next

	sum := summarize(p.cluster, p.prev, groupNamer(groups))
	st.ConfigNum = int64(cfg.Num)
	st.Groups = sum.groups
	st.GroupCount = int32(len(sum.groups))
	st.Table = sum.table
	st.ShardStates = sum.states
	st.MigratingShards = sum.migrating
	st.Migrations = sum.migrations
	p.settled = sum.migrating == 0 && len(sum.behind) == 0 && len(cfg.Groups) > 0

	ready := metav1.Condition{Type: shardkvv1.ConditionReady}
	balanced := metav1.Condition{Type: shardkvv1.ConditionBalanced}
	migrating := metav1.Condition{Type: shardkvv1.ConditionMigrating}
	switch {
	case len(cfg.Groups) == 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonNoGroups, fmt.Sprintf("config %d: no ReplicaGroup has joined yet", cfg.Num)
		balanced.Status, balanced.Reason, balanced.Message = metav1.ConditionFalse, ReasonNoGroups, "no group to place shards on"
	case sum.notServing > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonShardsNotServing
		ready.Message = fmt.Sprintf("config %d: %d of %d shards not serving on their owner (%s)", cfg.Num, sum.notServing, len(cfg.Shards), statesText(sum.states))
	default:
		ready.Status, ready.Reason = metav1.ConditionTrue, ReasonServing
		ready.Message = fmt.Sprintf("config %d: all %d shards serving on %d groups", cfg.Num, len(cfg.Shards), len(cfg.Groups))
	}
	if sum.truncated {
		ready.Message += fmt.Sprintf("; status.table shows the first %d runs only", maxTableRanges)
	}
	if len(cfg.Groups) > 0 {
		behind := ""
		if len(sum.behind) > 0 {
			var names []string
			for _, gid := range sum.behind {
				names = append(names, groupNamer(groups)(gid))
			}
			behind = fmt.Sprintf("groups %s have not applied config %d yet", strings.Join(names, ", "), cfg.Num)
		}
		switch {
		case sum.migrating > 0:
			balanced.Status, balanced.Reason = metav1.ConditionFalse, ReasonMigrationsInFlight
			balanced.Message = fmt.Sprintf("%d shards migrating", sum.migrating)
			if behind != "" {
				balanced.Message += "; " + behind
			}
		case behind != "":
			balanced.Status, balanced.Reason = metav1.ConditionFalse, ReasonGroupsCatchingUp
			balanced.Message = behind
		default:
			balanced.Status, balanced.Reason = metav1.ConditionTrue, ReasonSettled
			balanced.Message = fmt.Sprintf("no migration in flight; every group applied config %d", cfg.Num)
		}
	}
	if sum.migrating > 0 {
		var parts []string
		for _, m := range sum.migrations {
			s := fmt.Sprintf("%s->%s %d shards", m.Source, m.Target, m.Shards)
			if m.Progress != "" {
				s += " " + m.Progress
			}
			parts = append(parts, s)
		}
		migrating.Status, migrating.Reason = metav1.ConditionTrue, ReasonShardsMoving
		migrating.Message = fmt.Sprintf("%d shards moving: %s", sum.migrating, strings.Join(parts, ", "))
	} else {
		migrating.Status, migrating.Reason, migrating.Message = metav1.ConditionFalse, ReasonNoMigrations, "no shard is moving"
	}
	for _, c := range []metav1.Condition{ready, balanced, migrating} {
		c.ObservedGeneration = sm.Generation
		meta.SetStatusCondition(&st.Conditions, c)
	}
}

func statesText(m map[string]int32) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// setConditions records the conditions that do not come from the
// controller's view: readiness when it was not reached, Progressing,
// Degraded.
func (r *ShardMapReconciler) setConditions(p *smPass) {
	sm := p.sm
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&sm.Status.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: sm.Generation})
	}
	if p.cluster == nil {
		reason := ReasonControllerUnavailable
		if p.sts == nil || p.sts.Status.ReadyReplicas < p.bootstrap/2+1 {
			reason = ReasonWaitingForControllerQuorum
		}
		msg := p.dpErr.Error()
		set(shardkvv1.ConditionReady, metav1.ConditionFalse, reason, msg)
		set(shardkvv1.ConditionBalanced, metav1.ConditionUnknown, reason, "the controller was not reached: "+msg)
		set(shardkvv1.ConditionMigrating, metav1.ConditionUnknown, reason, "the controller was not reached: "+msg)
	}
	if sm.Spec.Paused {
		p.progReason = "" // paused overrides any other wait
		p.progress(metav1.ConditionFalse, ReasonPaused, "spec.paused is set: the operator changes nothing of this cluster (status is still updated)")
	}
	if p.progReason == "" {
		p.progress(metav1.ConditionFalse, ReasonUpToDate, "the controller group and spec.moves are applied")
	}
	prev := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionProgressing)
	wasPaused := prev != nil && prev.Reason == ReasonPaused
	if sm.Spec.Paused && !wasPaused {
		r.event(sm, corev1.EventTypeNormal, "Paused", "Pause", "spec.paused is set: no changes to the cluster until it is cleared")
	} else if !sm.Spec.Paused && wasPaused {
		r.event(sm, corev1.EventTypeNormal, "Resumed", "Resume", "spec.paused was cleared: reconciling again")
	}
	set(shardkvv1.ConditionProgressing, p.progStatus, p.progReason, p.progMsg)
	if p.degReason != "" {
		set(shardkvv1.ConditionDegraded, metav1.ConditionTrue, p.degReason, p.degMsg)
	} else {
		meta.RemoveStatusCondition(&sm.Status.Conditions, shardkvv1.ConditionDegraded)
	}
}

// ---------------------------------------------------------------- rolling

// rollPods deletes one controller pod whose revision is not the
// StatefulSet's update revision (OnDelete strategy), when every pod is
// ready and the controller answers with a leader: followers first, the
// leader last (a leader hands off on SIGTERM).
func (r *ShardMapReconciler) rollPods(ctx context.Context, p *smPass) error {
	sts := p.sts
	if p.acted || sts == nil || sts.Status.UpdateRevision == "" {
		return nil
	}
	pods, err := r.ctrlerPods(ctx, p.sm)
	if err != nil {
		return err
	}
	var stale []int
	for ord, pod := range pods {
		if ord < int(p.bootstrap) && pod.Labels[stsRevisionLabel] != sts.Status.UpdateRevision {
			stale = append(stale, ord)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	sort.Sort(sort.Reverse(sort.IntSlice(stale)))
	wait := func(format string, args ...any) {
		p.progress(metav1.ConditionTrue, ReasonWaitingToRoll, "%d controller pods to update; "+format, append([]any{len(stale)}, args...)...)
	}
	switch {
	case sts.Status.ObservedGeneration < sts.Generation:
		wait("waiting for the StatefulSet controller to see the new template")
		return nil
	case sts.Status.ReadyReplicas < p.bootstrap || len(pods) < int(p.bootstrap):
		wait("waiting for all %d pods to be ready (%d are)", p.bootstrap, sts.Status.ReadyReplicas)
		return nil
	case p.cluster == nil:
		wait("waiting for the controller to answer: %v", p.dpErr)
		return nil
	}
	for _, pod := range pods {
		if !pod.DeletionTimestamp.IsZero() || !podReady(pod) {
			wait("waiting for pod %s to be ready", pod.Name)
			return nil
		}
	}
	// The leader last.
	leader := -1
	if host, _, ok := strings.Cut(p.cluster.GetController().GetAddr(), "."); ok {
		leader = podOrdinal(CtrlerName(p.sm.Name), host)
	}
	victim := stale[0]
	for _, ord := range stale {
		if ord != leader {
			victim = ord
			break
		}
	}
	pod := pods[victim]
	if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	p.acted = true
	role := "follower"
	if victim == leader {
		role = "leader"
	}
	r.eventRelated(p.sm, pod, corev1.EventTypeNormal, "RollingPod", "DeletePod", "deleting controller pod %s (%s) to update it from revision %s to %s",
		pod.Name, role, pod.Labels[stsRevisionLabel], sts.Status.UpdateRevision)
	p.progress(metav1.ConditionTrue, ReasonRollingPods, "updating controller pod %s (%d of %d left)", pod.Name, len(stale), p.bootstrap)
	return nil
}

// ------------------------------------------------------------------ moves

// moveStep is one Move or Unpin.
type moveStep struct {
	unpin bool
	shard int
	gid   uint64
	group string
}

// planMoves compares spec.moves with the config's pins: the first pin to
// set (Move) or to drop (Unpin), and why other pins wait.
func planMoves(moves []shardkvv1.ShardMove, cfg *shardkvpb.Config, groups map[string]*shardkvv1.ReplicaGroup) (*moveStep, []string) {
	pins := map[uint32]uint64{}
	for _, pin := range cfg.GetPins() {
		pins[pin.Shard] = pin.Gid
	}
	inConfig := map[uint64]bool{}
	for _, g := range cfg.GetGroups() {
		inConfig[g.Gid] = true
	}
	want := slices.Clone(moves)
	slices.SortFunc(want, func(a, b shardkvv1.ShardMove) int { return int(a.Shard) - int(b.Shard) })
	wanted := map[uint32]bool{}
	var waits []string
	var step *moveStep
	for _, m := range want {
		wanted[uint32(m.Shard)] = true
		rg := groups[m.Group]
		switch {
		case int(m.Shard) >= len(cfg.GetShards()):
			waits = append(waits, fmt.Sprintf("shard %d is out of range (%d shards)", m.Shard, len(cfg.GetShards())))
		case rg == nil:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s of this ShardMap does not exist", m.Shard, m.Group))
		case rg.Status.GroupID == 0:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s has no group id yet", m.Shard, m.Group))
		case !rg.DeletionTimestamp.IsZero():
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s is being deleted", m.Shard, m.Group))
		case !inConfig[uint64(rg.Status.GroupID)]:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s (gid %d) has not joined yet", m.Shard, m.Group, rg.Status.GroupID))
		case pins[uint32(m.Shard)] != uint64(rg.Status.GroupID) && step == nil:
			step = &moveStep{shard: int(m.Shard), gid: uint64(rg.Status.GroupID), group: m.Group}
		}
	}
	if step == nil {
		for _, pin := range cfg.GetPins() {
			if !wanted[pin.Shard] {
				step = &moveStep{unpin: true, shard: int(pin.Shard), gid: pin.Gid}
				break
			}
		}
	}
	return step, waits
}

// applyMoves takes the next spec.moves step, if this pass took none yet
// and the controller answers.
func (r *ShardMapReconciler) applyMoves(ctx context.Context, p *smPass, groups map[string]*shardkvv1.ReplicaGroup) {
	if p.cluster == nil {
		if len(p.sm.Spec.Moves) > 0 {
			p.progress(metav1.ConditionTrue, ReasonWaitingForMoves, "spec.moves wait for the controller: %v", p.dpErr)
		}
		return
	}
	step, waits := planMoves(p.sm.Spec.Moves, p.cluster.Latest, groups)
	if step == nil {
		if len(waits) > 0 {
			p.progress(metav1.ConditionTrue, ReasonWaitingForMoves, "%s", strings.Join(waits, "; "))
		}
		return
	}
	if p.acted {
		p.progress(metav1.ConditionTrue, ReasonApplyingMoves, "spec.moves: next is shard %d", step.shard)
		return
	}
	api := p.api
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	p.acted = true
	name := groupNamer(groups)
	if step.unpin {
		cfg, err := api.Unpin(cctx, step.shard)
		if err != nil {
			r.event(p.sm, corev1.EventTypeWarning, "UnpinFailed", fmt.Sprintf("UnpinShard%d", step.shard), "unpin shard %d: %v", step.shard, err)
			p.progress(metav1.ConditionTrue, ReasonApplyingMoves, "unpin shard %d failed: %v", step.shard, err)
			p.stepErr = fmt.Errorf("unpin shard %d: %w", step.shard, err)
			return
		}
		r.event(p.sm, corev1.EventTypeNormal, "Unpinned", fmt.Sprintf("UnpinShard%d", step.shard), "unpinned shard %d (was pinned to %s; not in spec.moves): config %d", step.shard, name(step.gid), cfg.GetNum())
		p.progress(metav1.ConditionTrue, ReasonApplyingMoves, "unpinned shard %d: config %d", step.shard, cfg.GetNum())
		return
	}
	cfg, err := api.Move(cctx, step.shard, step.gid)
	if err != nil {
		r.event(p.sm, corev1.EventTypeWarning, "MoveFailed", fmt.Sprintf("MoveShard%d", step.shard), "move shard %d to %s (gid %d): %v", step.shard, step.group, step.gid, err)
		p.progress(metav1.ConditionTrue, ReasonApplyingMoves, "move of shard %d to %s failed: %v", step.shard, step.group, err)
		p.stepErr = fmt.Errorf("move shard %d to %s: %w", step.shard, step.group, err)
		return
	}
	r.event(p.sm, corev1.EventTypeNormal, "Moved", fmt.Sprintf("MoveShard%d", step.shard), "pinned shard %d to %s (gid %d): config %d", step.shard, step.group, step.gid, cfg.GetNum())
	p.progress(metav1.ConditionTrue, ReasonApplyingMoves, "pinned shard %d to %s: config %d", step.shard, step.group, cfg.GetNum())
}
