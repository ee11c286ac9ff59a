package controllers

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// createOwned creates obj with owner as its controlling owner: everything
// the operator creates is owned, so it goes with its ShardMap or
// ReplicaGroup and wakes the owner's reconciler when it changes.
func createOwned(ctx context.Context, c client.Client, scheme *runtime.Scheme, owner, obj client.Object) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return err
	}
	return c.Create(ctx, obj)
}

// contentHash identifies the content of what the operator last wrote (an
// object's spec, a pod template), so a change of the desired object is seen
// by comparing an annotation, not the object against API-server defaults.
func contentHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // API types always marshal
	}
	h := fnv.New64a()
	h.Write(b)
	return strconv.FormatUint(h.Sum64(), 36)
}

// setAnnotation sets annotation key of o to value.
func setAnnotation(o metav1.Object, key, value string) {
	a := o.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	o.SetAnnotations(a)
}

// Pieces of the objects both reconcilers build: the controller group's
// and each data group's StatefulSet, headless Service and
// PodDisruptionBudget differ in names, labels, ports and sizes only.

// dataVolume is the name of the volume claim template, mounted at /data;
// PVCs are data-<set>-<ordinal>.
const dataVolume = "data"

// portNumber is the port of each named port of a shardkv pod.
func portNumber(name string) int32 {
	switch name {
	case "grpc":
		return GRPCPort
	case "resp":
		return RESPPort
	case "resp-tls":
		return RESPTLSPort
	case "http":
		return HTTPPort
	}
	panic("unknown port " + name)
}

// containerPorts are the named ports of the node container.
func containerPorts(names ...string) []corev1.ContainerPort {
	out := make([]corev1.ContainerPort, len(names))
	for i, n := range names {
		out[i] = corev1.ContainerPort{Name: n, ContainerPort: portNumber(n), Protocol: corev1.ProtocolTCP}
	}
	return out
}

// headlessService gives each pod of selector a stable DNS name
// (<pod>.<name>.<namespace>.svc), published before the pod is ready: peers
// must resolve each other before any is.
func headlessService(name, namespace string, labels, selector map[string]string, ports ...string) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 selector,
		},
	}
	for _, n := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: n, Port: portNumber(n), TargetPort: intstr.FromString(n), Protocol: corev1.ProtocolTCP})
	}
	return svc
}

// podDisruptionBudget keeps minAvailable pods of selector up through
// voluntary disruptions (drains).
func podDisruptionBudget(name, namespace string, labels, selector map[string]string, minAvailable int32) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(minAvailable)),
			Selector:     &metav1.LabelSelector{MatchLabels: selector},
		},
	}
}

// applyPodOverrides merges a spec's podTemplate into a pod template whose
// pods selector selects: scheduling and annotations. What it leaves unset
// gets the defaults: pods preferably on different nodes (spreadAffinity)
// and spread by zone and node (spreadConstraints).
func applyPodOverrides(tmpl *corev1.PodTemplateSpec, o shardkvv1.PodOverrides, selector map[string]string) {
	if len(o.Annotations) > 0 {
		tmpl.Annotations = maps.Clone(o.Annotations)
	}
	spec := &tmpl.Spec
	spec.Affinity = o.Affinity.DeepCopy()
	if spec.Affinity == nil {
		spec.Affinity = spreadAffinity(selector)
	}
	for _, t := range o.Tolerations {
		spec.Tolerations = append(spec.Tolerations, *t.DeepCopy())
	}
	if len(o.NodeSelector) > 0 {
		spec.NodeSelector = maps.Clone(o.NodeSelector)
	}
	spec.TopologySpreadConstraints = spreadConstraints(selector)
	if len(o.TopologySpreadConstraints) > 0 {
		spec.TopologySpreadConstraints = nil
		for _, c := range o.TopologySpreadConstraints {
			c := *c.DeepCopy()
			if c.LabelSelector == nil {
				c.LabelSelector = &metav1.LabelSelector{MatchLabels: maps.Clone(selector)}
			}
			spec.TopologySpreadConstraints = append(spec.TopologySpreadConstraints, c)
		}
	}
	spec.PriorityClassName = o.PriorityClassName
}

// spreadConstraints spread the pods of selector evenly over zones, then
// nodes. ScheduleAnyway: a preference the scheduler scores, never a
// reason to leave a pod pending (a cluster of one zone or one node, or
// nodes without the zone label, still runs every pod).
func spreadConstraints(selector map[string]string) []corev1.TopologySpreadConstraint {
	var cs []corev1.TopologySpreadConstraint
	for _, key := range []string{corev1.LabelTopologyZone, corev1.LabelHostname} {
		cs = append(cs, corev1.TopologySpreadConstraint{
			MaxSkew:           1,
			TopologyKey:       key,
			WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector:     &metav1.LabelSelector{MatchLabels: maps.Clone(selector)},
		})
	}
	return cs
}

// spreadAffinity spreads the pods of selector over nodes where the cluster
// allows it (preferred, not required: a one-node cluster still runs them).
func spreadAffinity(selector map[string]string) *corev1.Affinity {
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				TopologyKey:   corev1.LabelHostname,
				LabelSelector: &metav1.LabelSelector{MatchLabels: selector},
			},
		}},
	}}
}

func storageSize(s shardkvv1.StorageSpec) resource.Quantity {
	if s.Size.IsZero() {
		return resource.MustParse("1Gi")
	}
	return s.Size
}

// dataClaimTemplate is the StatefulSet's claim template of each pod's
// /data volume (immutable once the set exists).
func dataClaimTemplate(selector map[string]string, s shardkvv1.StorageSpec) corev1.PersistentVolumeClaim {
	return corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dataVolume, Labels: selector},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: s.StorageClassName,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: storageSize(s)},
			},
		},
	}
}
