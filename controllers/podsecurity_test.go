package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// Pod Security "restricted" (docs/security.md): every pod the operator
// creates, and the operator's own Deployment, pass the checks of the
// PodSecurity admission controller (k8s.io/pod-security-admission, the
// code the kube-apiserver runs) at level restricted, latest version.

// restrictedViolations runs the admission controller's checks at level
// restricted, latest version, on a pod; "" when it passes.
func restrictedViolations(t *testing.T, meta *metav1.ObjectMeta, spec *corev1.PodSpec) string {
	t.Helper()
	ev, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := policy.AggregateCheckResults(ev.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, meta, spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenDetail()
}

// stsPod is the pod a StatefulSet controller makes of sts: the template,
// with a PersistentVolumeClaim volume per claim template.
func stsPod(sts *appsv1.StatefulSet) (*metav1.ObjectMeta, *corev1.PodSpec) {
	meta := sts.Spec.Template.ObjectMeta.DeepCopy()
	spec := sts.Spec.Template.Spec.DeepCopy()
	for _, c := range sts.Spec.VolumeClaimTemplates {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Name + "-" + sts.Name + "-0"}}})
	}
	return meta, spec
}

// operatorStatefulSets are the StatefulSets the operator makes for a
// range of specs: the controller group's and the data groups', with every
// optional pod field the specs offer.
func operatorStatefulSets() map[string]*appsv1.StatefulSet {
	sm := testShardMap("demo", "demo", 64, 3)
	smr := &ShardMapReconciler{DefaultImage: "shardkv:test"}
	smCustom := sm.DeepCopy()
	smCustom.Spec.Controller.Image = "example/shardkv:2"
	smCustom.Spec.Controller.ImagePullPolicy = corev1.PullAlways
	smCustom.Spec.Controller.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
	smCustom.Spec.Migration.RateBytesPerSecond = 1 << 20
	smTLS := sm.DeepCopy()
	smTLS.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSManaged, Redis: shardkvv1.RedisTLSAndPlain, RedisAuthClients: "yes"}
	smTLS.Spec.HTTP.TokenSecret = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tok"}, Key: "t"}

	rgr := &ReplicaGroupReconciler{DefaultImage: "shardkv:test"}
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "demo-a"},
		Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "demo", Replicas: ptr.To[int32](3)}}
	rg.Status.GroupID = 1
	rgCustom := rg.DeepCopy()
	rgCustom.Spec.Image = "example/shardkv:2"
	rgCustom.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	rgCustom.Spec.RequirePass = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "redis-auth"}, Key: "password"}
	rgCustom.Spec.PodTemplate = shardkvv1.PodOverrides{
		NodeSelector: map[string]string{"disk": "ssd"},
		Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		Annotations:  map[string]string{"example.com/team": "storage"},
	}
	return map[string]*appsv1.StatefulSet{
		"controller group":           smr.desiredCtrlerSts(sm, 3, 3),
		"controller group, custom":   smr.desiredCtrlerSts(smCustom, 3, 3),
		"controller group, TLS":      smr.desiredCtrlerSts(smTLS, 3, 3),
		"data group, TLS":            rgr.desiredStatefulSet(rg, smTLS, 3),
		"data group":                 rgr.desiredStatefulSet(rg, sm, 3),
		"data group, custom":         rgr.desiredStatefulSet(rgCustom, smCustom, 5),
		"data group, single replica": rgr.desiredStatefulSet(rg, testShardMap("demo", "demo", 64, 1), 1),
		"data group, requirePass only": rgr.desiredStatefulSet(func() *shardkvv1.ReplicaGroup {
			r := rg.DeepCopy()
			r.Spec.RequirePass = rgCustom.Spec.RequirePass
			return r
		}(), sm, 3),
	}
}

// managerDeployments are the Deployments of config/manager/manager.yaml.
func managerDeployments(t *testing.T) []*appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*appsv1.Deployment
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(raw, &tm); err != nil {
			t.Fatal(err)
		}
		if tm.Kind != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := json.Unmarshal(raw, d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		t.Fatal("no Deployment in config/manager/manager.yaml")
	}
	return out
}

// TestPodSecurityRestricted: the pods of every StatefulSet the operator
// makes, and the manager's Deployment, pass Pod Security "restricted".
func TestPodSecurityRestricted(t *testing.T) {
	for name, sts := range operatorStatefulSets() {
		meta, spec := stsPod(sts)
		if v := restrictedViolations(t, meta, spec); v != "" {
			t.Errorf("%s (StatefulSet %s): not restricted: %s", name, sts.Name, v)
		}
	}
	for _, d := range managerDeployments(t) {
		if v := restrictedViolations(t, &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec); v != "" {
			t.Errorf("config/manager Deployment %s: not restricted: %s", d.Name, v)
		}
	}
}

// TestPodSecurityCheckerBites: the check above is live: each field that
// restricted needs, taken off one of the operator's pods, fails it.
func TestPodSecurityCheckerBites(t *testing.T) {
	sts := (&ReplicaGroupReconciler{DefaultImage: "x"}).desiredStatefulSet(
		&shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "g"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "m"}},
		testShardMap("n", "m", 8, 1), 1)
	for _, m := range []struct {
		name, want string
		mutate     func(*corev1.PodSpec)
	}{
		{"allowPrivilegeEscalation unset", "allowPrivilegeEscalation != false", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil }},
		{"capabilities not dropped", "unrestricted capabilities", func(s *corev1.PodSpec) { s.Containers[0].SecurityContext.Capabilities = nil }},
		{"runAsNonRoot unset", "runAsNonRoot != true", func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot = nil }},
		{"runAsUser 0", "runAsUser=0", func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = ptr.To[int64](0) }},
		{"no seccomp profile", "seccompProfile", func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile = nil }},
		{"a hostPath volume", "restricted volume types", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp"}}})
		}},
	} {
		meta, spec := stsPod(sts)
		if v := restrictedViolations(t, meta, spec); v != "" {
			t.Fatalf("the unmodified pod fails: %s", v)
		}
		m.mutate(spec)
		if v := restrictedViolations(t, meta, spec); !strings.Contains(v, m.want) {
			t.Errorf("%s: violations %q, want one with %q", m.name, v, m.want)
		}
	}
}

// TestPodSecurityAdmission: the real kube-apiserver's PodSecurity
// admission, in a namespace labelled to enforce restricted, admits pods
// made from the operator's StatefulSets (server-side dry run) and refuses
// a pod that is not restricted.
func TestPodSecurityAdmission(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	nsObj := &corev1.Namespace{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: ns}, nsObj); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[api.EnforceLevelLabel] = string(api.LevelRestricted)
	nsObj.Labels[api.EnforceVersionLabel] = api.VersionLatest
	if err := k8sClient.Update(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	podOf := func(name string, sts *appsv1.StatefulSet) *corev1.Pod {
		meta, spec := stsPod(sts)
		p := &corev1.Pod{ObjectMeta: *meta, Spec: *spec}
		p.Namespace, p.Name = ns, strings.ToLower(strings.NewReplacer(" ", "-", ",", "").Replace(name))
		return p
	}
	for name, sts := range operatorStatefulSets() {
		if err := k8sClient.Create(ctx, podOf(name, sts), client.DryRunAll); err != nil {
			t.Errorf("%s: the API server refused the pod: %v", name, err)
		}
	}
	bad := podOf("bad", operatorStatefulSets()["data group"])
	bad.Spec.Containers[0].SecurityContext = nil
	err := k8sClient.Create(ctx, bad, client.DryRunAll)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("a pod without its container security context: err %v, want Forbidden by PodSecurity", err)
	}
}
