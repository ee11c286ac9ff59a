package controllers

// The Kubernetes objects of a ShardMap's controller group: its
// StatefulSet, headless Service and PodDisruptionBudget, built from the
// spec. Each carries the contentHash of its spec (annotationSpecHash), so
// the planner sees a change without comparing against API-server defaults.

import (
	"cmp"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

const (
	// ComponentController is the LabelComponent value of the controller
	// group's objects.
	ComponentController = "controller"
	// annotationSpecHash (on objects the ShardMap reconciler owns) is the
	// contentHash of the spec it last wrote.
	annotationSpecHash = "shardkv.io/spec-hash"
	// AnnotationCtrlerBootstrap (on the controller StatefulSet, and on the
	// ShardMap) is how many replicas the controller group was bootstrapped
	// with: its --peers, and the data pods' --ctrler list, fixed for the
	// cluster's life whatever its size becomes. (Clients find replicas
	// beyond the list through the leader hints of those in it.) On the
	// ShardMap it lets the ReplicaGroup reconciler write --ctrler without
	// reading the controller's StatefulSet.
	AnnotationCtrlerBootstrap = "shardkv.io/bootstrap-replicas"
)

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

// smCtrlerBootstrap is the controller group's bootstrap size as the
// ShardMap records it (AnnotationCtrlerBootstrap); until it is recorded,
// spec.controller.replicas, which it is created with.
func smCtrlerBootstrap(sm *shardkvv1.ShardMap) int32 {
	if n, err := strconv.Atoi(sm.Annotations[AnnotationCtrlerBootstrap]); err == nil && n > 0 {
		return int32(n)
	}
	return smCtrlerReplicas(sm)
}

func (r *ShardMapReconciler) ctrlerImage(sm *shardkvv1.ShardMap) string {
	return cmp.Or(sm.Spec.Controller.Image, sm.Spec.Image, r.DefaultImage)
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
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: ctrlerLabels(sm)},
		Spec: corev1.PodSpec{
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
				Ports:   containerPorts("grpc", "http"),
				// Ready is Raft health (/readyz), as for data pods: a
				// member that hears its leader, caught up, in an
				// initialised cluster. So the PodDisruptionBudget counts
				// only such replicas, and a roll moves on only once the
				// restarted pod is caught up. Pods start in parallel and
				// the Service publishes pods that are not ready, so a
				// bootstrapping group still forms its quorum.
				ReadinessProbe:  httpProbe("/readyz", 0, 2, 2, 3),
				LivenessProbe:   httpProbe("/healthz", 10, 10, 5, 6),
				Resources:       *sm.Spec.Controller.Resources.DeepCopy(),
				VolumeMounts:    []corev1.VolumeMount{{Name: dataVolume, MountPath: "/data"}},
				SecurityContext: nodeContainerSecurityContext(),
				// A node that exits on an error says why as its last log
				// line: the pod's status shows it (the operator quotes it).
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	addSecurity(&tmpl.Spec, sm, CtrlerTLSSecretName(sm.Name))
	applyPodOverrides(&tmpl, sm.Spec.Controller.PodTemplate, ctrlerSelectorLabels(sm))
	return tmpl
}

// desiredCtrlerSts is the controller StatefulSet of a group bootstrapped
// with bootstrap replicas, at size replicas (a resize moves it one planned
// step at a time: shardmap_resize.go).
func (r *ShardMapReconciler) desiredCtrlerSts(sm *shardkvv1.ShardMap, bootstrap, replicas int32) *appsv1.StatefulSet {
	name := CtrlerName(sm.Name)
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: sm.Namespace, Labels: ctrlerLabels(sm),
			Annotations: map[string]string{AnnotationCtrlerBootstrap: strconv.Itoa(int(bootstrap))},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			ServiceName:         name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// The operator rolls the pods itself, one at a time, with a
			// quorum up and the controller answering.
			UpdateStrategy:       appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Selector:             &metav1.LabelSelector{MatchLabels: ctrlerSelectorLabels(sm)},
			Template:             r.ctrlerPodTemplate(sm, bootstrap),
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{dataClaimTemplate(ctrlerSelectorLabels(sm), sm.Spec.Controller.Storage)},
		},
	}
	sts.Annotations[annotationSpecHash] = contentHash(sts.Spec)
	return sts
}

func desiredCtrlerService(sm *shardkvv1.ShardMap) *corev1.Service {
	svc := headlessService(CtrlerName(sm.Name), sm.Namespace, ctrlerLabels(sm), ctrlerSelectorLabels(sm), "grpc", "http")
	svc.Annotations = map[string]string{annotationSpecHash: contentHash(svc.Spec)}
	return svc
}

// desiredCtrlerPDB keeps a majority of the controller group up through
// voluntary disruptions (drains): minAvailable = n/2+1, so a 3-member group
// loses at most 1 pod at a time and a 1-member group none.
func desiredCtrlerPDB(sm *shardkvv1.ShardMap, replicas int32) *policyv1.PodDisruptionBudget {
	pdb := podDisruptionBudget(CtrlerName(sm.Name), sm.Namespace, ctrlerLabels(sm), ctrlerSelectorLabels(sm), replicas/2+1)
	pdb.Annotations = map[string]string{annotationSpecHash: contentHash(pdb.Spec)}
	return pdb
}
