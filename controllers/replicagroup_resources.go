package controllers

// The Kubernetes objects of a ReplicaGroup: its StatefulSet, headless
// Service and PodDisruptionBudget, built from the spec, and kept in step
// with it (ensure*: each pass, before the planner; the StatefulSet's size
// is the planner's).

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// Annotations the ReplicaGroup reconciler writes.
const (
	// AnnotationBootstrapReplicas (on the ReplicaGroup) is how many
	// replicas the group was bootstrapped with: its --peers, fixed for the
	// group's life.
	AnnotationBootstrapReplicas = "shardkv.io/bootstrap-replicas"
	// annotationTemplateHash (on the StatefulSet) is the contentHash of
	// the pod template the operator last wrote: replicas are the planner's,
	// so only the template is compared (the ShardMap's objects hash their
	// whole spec, annotationSpecHash).
	annotationTemplateHash = "shardkv.io/template-hash"
	// ComponentGroup is the LabelComponent value of data-group objects.
	ComponentGroup = "group"
	// nodeContainer is the name of the replica's container.
	nodeContainer = "node"
)

func defaultReplicas(rg *shardkvv1.ReplicaGroup) int32 {
	if rg.Spec.Replicas != nil {
		return *rg.Spec.Replicas
	}
	return 3
}

func defaultWeight(rg *shardkvv1.ReplicaGroup) uint32 {
	if rg.Spec.Weight > 0 {
		return uint32(rg.Spec.Weight)
	}
	return 1
}

// bootstrapReplicas is the group's recorded bootstrap size (the spec's
// replicas if none is recorded yet).
func bootstrapReplicas(rg *shardkvv1.ReplicaGroup) int32 {
	if v, ok := rg.Annotations[AnnotationBootstrapReplicas]; ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 1 {
			return int32(n)
		}
	}
	return defaultReplicas(rg)
}

// groupSelectorLabels select the pods of ReplicaGroup rg (immutable: the
// StatefulSet's selector).
func groupSelectorLabels(rg *shardkvv1.ReplicaGroup) map[string]string {
	return map[string]string{
		LabelName:      "shardkv",
		LabelInstance:  rg.Spec.ShardMap,
		LabelComponent: ComponentGroup,
		LabelGroup:     rg.Name,
	}
}

func groupLabels(rg *shardkvv1.ReplicaGroup) map[string]string {
	l := groupSelectorLabels(rg)
	l[LabelManagedBy] = ManagedBy
	return l
}

func groupSelector(rg *shardkvv1.ReplicaGroup) string {
	return labels.SelectorFromSet(groupSelectorLabels(rg)).String()
}

// pvcName is the claim of the replica at ordinal.
func pvcName(rg string, ordinal int) string { return fmt.Sprintf("%s-%s-%d", dataVolume, rg, ordinal) }

// pvcOrdinal is the ordinal of claim name of group rg (-1 if it is not one).
func pvcOrdinal(rg, name string) int {
	pod, ok := strings.CutPrefix(name, dataVolume+"-")
	if !ok {
		return -1
	}
	return podOrdinal(rg, pod)
}

// image is the group's node image: its own, else its cluster's, else the
// operator's default.
func (r *ReplicaGroupReconciler) image(rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) string {
	return cmp.Or(rg.Spec.Image, sm.Spec.Image, r.DefaultImage)
}

// nodeArgs are the replica's `node serve` flags (docs/node.md).
func nodeArgs(rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, gid uint64, bootstrap int) []string {
	ns := rg.Namespace
	self := fmt.Sprintf("$(POD_NAME).%s.%s.svc", rg.Name, ns)
	args := []string{
		"serve",
		"--role=group",
		fmt.Sprintf("--group=%d", gid),
		"--id=auto",
		"--data-dir=/data",
		fmt.Sprintf("--listen=0.0.0.0:%d", GRPCPort),
		fmt.Sprintf("--advertise=%s:%d", self, GRPCPort),
		"--peers=" + PeersFlag(rg.Name, bootstrap, ns),
		"--ctrler=" + strings.Join(CtrlerAddrs(sm.Name, int(smCtrlerBootstrap(sm)), ns), ","),
	}
	// Redis: plain text unless TLS is on; with it, TLS on RESPTLSPort and
	// plain text too only if spec.tls.redis is Both. (The flags keep their
	// order of old, so that clusters without TLS keep their pod template.)
	if respPorts(sm)[0] == "resp" {
		args = append(args, fmt.Sprintf("--resp=0.0.0.0:%d", RESPPort), fmt.Sprintf("--resp-advertise=%s:%d", self, RESPPort))
	}
	args = append(args, fmt.Sprintf("--http=0.0.0.0:%d", HTTPPort))
	if t := sm.Spec.TLS; sm.Spec.TLSEnabled() {
		auth := t.RedisAuthClients
		if auth == "" {
			auth = "no"
		}
		args = append(args, fmt.Sprintf("--resp-tls=0.0.0.0:%d", RESPTLSPort), fmt.Sprintf("--resp-tls-advertise=%s:%d", self, RESPTLSPort),
			"--resp-tls-auth-clients="+auth)
	}
	// The ShardMap's copy rate limit, per group. 0 (unlimited, node's
	// default) passes no flag, so the pods of clusters that set none keep
	// their template (and are not rolled by an operator upgrade).
	if n := sm.Spec.Migration.RateBytesPerSecond; n > 0 {
		args = append(args, fmt.Sprintf("--migrate-bytes-per-sec=%d", n))
	}
	return args
}

// respPorts are the Redis ports of the ShardMap's data-group pods, by name.
func respPorts(sm *shardkvv1.ShardMap) []string {
	switch {
	case !sm.Spec.TLSEnabled():
		return []string{"resp"}
	case sm.Spec.TLS.Redis == shardkvv1.RedisTLSAndPlain:
		return []string{"resp", "resp-tls"}
	}
	return []string{"resp-tls"}
}

// podTemplate is the pod of every replica.
func (r *ReplicaGroupReconciler) podTemplate(rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, gid uint64, bootstrap int) corev1.PodTemplateSpec {
	pull := rg.Spec.ImagePullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: groupLabels(rg)},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			EnableServiceLinks:            ptr.To(false),
			SecurityContext:               nodePodSecurityContext(),
			Containers: []corev1.Container{{
				Name:            nodeContainer,
				Image:           r.image(rg, sm),
				ImagePullPolicy: pull,
				// The image has no ENTRYPOINT (Dockerfile).
				Command: []string{"/node"},
				Args:    nodeArgs(rg, sm, gid, bootstrap),
				Env:     groupEnv(rg),
				Ports:   containerPorts(slices.Concat([]string{"grpc"}, respPorts(sm), []string{"http"})...),
				// Ready is Raft health (/readyz): a member that hears its
				// leader, applied to within 1000 entries of the leader's
				// commit, and knows the latest config. So a joining,
				// lagging or cut-off replica is not counted by the
				// PodDisruptionBudget, and a roll waits for each pod to be
				// caught up. The Service publishes pods that are not ready
				// (a group without quorum still resolves its peers), and
				// liveness is only "the process answers" (/healthz).
				ReadinessProbe:  httpProbe("/readyz", 0, 2, 2, 3),
				LivenessProbe:   httpProbe("/healthz", 10, 10, 2, 6),
				Resources:       *rg.Spec.Resources.DeepCopy(),
				VolumeMounts:    []corev1.VolumeMount{{Name: dataVolume, MountPath: "/data"}},
				SecurityContext: nodeContainerSecurityContext(),
				// A node that exits on an error says why as its last log
				// line: the pod's status shows it (the operator quotes it).
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	addSecurity(&tmpl.Spec, sm, GroupTLSSecretName(rg.Name))
	applyPodOverrides(&tmpl, rg.Spec.PodTemplate, groupSelectorLabels(rg))
	return tmpl
}

// desiredStatefulSet is the group's StatefulSet with replicas pods.
func (r *ReplicaGroupReconciler) desiredStatefulSet(rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, replicas int32) *appsv1.StatefulSet {
	tmpl := r.podTemplate(rg, sm, uint64(rg.Status.GroupID), int(bootstrapReplicas(rg)))
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: rg.Name, Namespace: rg.Namespace, Labels: groupLabels(rg),
			Annotations: map[string]string{annotationTemplateHash: contentHash(&tmpl)},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			Selector:            &metav1.LabelSelector{MatchLabels: groupSelectorLabels(rg)},
			ServiceName:         rg.Name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// The operator restarts pods itself, leader last.
			UpdateStrategy:       appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template:             tmpl,
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{dataClaimTemplate(groupSelectorLabels(rg), rg.Spec.Storage)},
			// Claims stay when the set shrinks or goes: the operator
			// deletes them itself per spec.pvcRetention, once it is safe.
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
				WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			},
		},
	}
}

// desiredService is the group's headless Service (pod DNS names).
func desiredService(rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) *corev1.Service {
	return headlessService(rg.Name, rg.Namespace, groupLabels(rg), groupSelectorLabels(rg), slices.Concat([]string{"grpc"}, respPorts(sm), []string{"http"})...)
}

// pdbMinAvailable keeps a quorum of voters through voluntary disruptions:
// of pods pods, at most (voters-1)/2 may be down (a majority of voters
// stays up even if every disrupted pod is a voter). With pods == voters
// this is a majority.
func pdbMinAvailable(pods, voters int) int {
	if voters < 1 {
		voters = 1
	}
	return max(1, pods-(voters-1)/2)
}

// desiredPDB is the group's PodDisruptionBudget.
func desiredPDB(rg *shardkvv1.ReplicaGroup, minAvailable int) *policyv1.PodDisruptionBudget {
	return podDisruptionBudget(rg.Name, rg.Namespace, groupLabels(rg), groupSelectorLabels(rg), int32(minAvailable))
}

// groupEnv is the node container's environment: its pod name, and the
// Redis password from the Secret spec.requirePass names (node reads
// SHARDKV_REQUIREPASS, so the password is never in the pod's args).
func groupEnv(rg *shardkvv1.ReplicaGroup) []corev1.EnvVar {
	env := []corev1.EnvVar{podNameEnv()}
	if sel := rg.Spec.RequirePass; sel != nil {
		env = append(env, corev1.EnvVar{Name: "SHARDKV_REQUIREPASS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: sel.DeepCopy()}})
	}
	return env
}

func (r *ReplicaGroupReconciler) ensureService(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) error {
	want := desiredService(rg, sm)
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
