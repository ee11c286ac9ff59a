package controllers

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// TestGroupEnvRequirePass: the Redis password reaches node through its
// environment variable, from the Secret, never as an argument.
func TestGroupEnvRequirePass(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{}
	if env := groupEnv(rg); len(env) != 1 || env[0].Name != "POD_NAME" {
		t.Fatalf("env without requirePass: %+v", env)
	}
	rg.Spec.RequirePass = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "redis-auth"}, Key: "password"}
	env := groupEnv(rg)
	if len(env) != 2 || env[1].Name != "SHARDKV_REQUIREPASS" || env[1].Value != "" ||
		env[1].ValueFrom.SecretKeyRef.Name != "redis-auth" || env[1].ValueFrom.SecretKeyRef.Key != "password" {
		t.Fatalf("env with requirePass: %+v", env)
	}
	env[1].ValueFrom.SecretKeyRef.Key = "changed"
	if rg.Spec.RequirePass.Key != "password" {
		t.Error("groupEnv aliases the spec")
	}
}

func TestPDBMinAvailable(t *testing.T) {
	for _, c := range []struct{ pods, voters, want int }{
		{1, 1, 1}, {3, 3, 2}, {5, 5, 3}, {4, 4, 3}, {4, 3, 3}, {5, 3, 4}, {2, 2, 2},
	} {
		if got := pdbMinAvailable(c.pods, c.voters); got != c.want {
			t.Errorf("pdbMinAvailable(%d, %d) = %d, want %d", c.pods, c.voters, got, c.want)
		}
	}
}

// TestNodeArgsTLS: with TLS, a data-group pod serves Redis over TLS on
// 6380 (its Service and container name that port), plain text only with
// redis: Both; without TLS its flags are what they always were, in the
// same order, so an operator upgrade does not roll clusters without TLS.
func TestNodeArgsTLS(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "sm"}}
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sm"}}
	plain := strings.Join(nodeArgs(rg, sm, 1, 3), " ")
	wantPlain := "serve --role=group --group=1 --id=auto --data-dir=/data --listen=0.0.0.0:7000 --advertise=$(POD_NAME).g.ns.svc:7000 " +
		"--peers=1=g-0.g.ns.svc:7000,2=g-1.g.ns.svc:7000,3=g-2.g.ns.svc:7000 " +
		"--ctrler=sm-ctrler-0.sm-ctrler.ns.svc:7000,sm-ctrler-1.sm-ctrler.ns.svc:7000,sm-ctrler-2.sm-ctrler.ns.svc:7000 " +
		"--resp=0.0.0.0:6379 --resp-advertise=$(POD_NAME).g.ns.svc:6379 --http=0.0.0.0:8080"
	if plain != wantPlain {
		t.Errorf("plain args\n%s\nwant\n%s", plain, wantPlain)
	}
	sm.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSManaged, Redis: shardkvv1.RedisTLSOnly}
	tlsOnly := strings.Join(nodeArgs(rg, sm, 1, 3), " ")
	if strings.Contains(tlsOnly, "--resp=") || !strings.Contains(tlsOnly, "--resp-tls=0.0.0.0:6380 --resp-tls-advertise=$(POD_NAME).g.ns.svc:6380 --resp-tls-auth-clients=no") {
		t.Errorf("TLS-only args %s", tlsOnly)
	}
	if ports := desiredService(rg, sm).Spec.Ports; len(ports) != 3 || ports[1].Name != "resp-tls" || ports[1].Port != 6380 {
		t.Errorf("TLS-only Service ports %+v", ports)
	}
	sm.Spec.TLS.Redis, sm.Spec.TLS.RedisAuthClients = shardkvv1.RedisTLSAndPlain, "yes"
	both := strings.Join(nodeArgs(rg, sm, 1, 3), " ")
	if !strings.Contains(both, "--resp=0.0.0.0:6379") || !strings.Contains(both, "--resp-tls-auth-clients=yes") {
		t.Errorf("Both args %s", both)
	}
	if ports := desiredService(rg, sm).Spec.Ports; len(ports) != 4 {
		t.Errorf("Both Service ports %+v", ports)
	}
}

// TestHTTPTokenPods: spec.http.tokenSecret mounts the token's key as a file
// node re-reads (--http-token-file) and opens the probes' paths and
// spec.http.openPaths only; without it and without TLS the flags and
// volumes are absent (the template stays as it was).
func TestHTTPTokenPods(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "sm"}}
	rg.Status.GroupID = 1
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sm"}}
	r := &ReplicaGroupReconciler{DefaultImage: "x"}
	plain := r.podTemplate(rg, sm, 1, 3).Spec
	if len(plain.Volumes) != 0 {
		t.Fatalf("plain pod: volumes %v", plain.Volumes)
	}
	for _, a := range plain.Containers[0].Args {
		if strings.HasPrefix(a, "--http-open") || strings.HasPrefix(a, "--http-token-file") {
			t.Fatalf("plain pod has %s", a)
		}
	}
	sm.Spec.HTTP = shardkvv1.HTTPSpec{TokenSecret: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tok"}, Key: "t"},
		OpenPaths: []string{"/metrics", "/readyz"}}
	for name, pod := range map[string]corev1.PodSpec{"group": r.podTemplate(rg, sm, 1, 3).Spec,
		"controller": (&ShardMapReconciler{DefaultImage: "x"}).ctrlerPodTemplate(sm, 3).Spec} {
		args := strings.Join(pod.Containers[0].Args, " ") + " "
		if !strings.Contains(args, "--http-token-file=/etc/shardkv/http/token ") || !strings.Contains(args, "--http-open=/healthz,/readyz,/metrics ") {
			t.Errorf("%s args %s", name, args)
		}
		if len(pod.Volumes) != 1 || pod.Volumes[0].Secret.SecretName != "tok" || pod.Volumes[0].Secret.Items[0] != (corev1.KeyToPath{Key: "t", Path: "token"}) {
			t.Errorf("%s volumes %+v", name, pod.Volumes)
		}
		if s := pod.Containers[0].ReadinessProbe.HTTPGet.Scheme; s == corev1.URISchemeHTTPS {
			t.Errorf("%s: HTTPS probe without TLS", name)
		}
	}
}

// TestPodScheduling: both kinds' pods are spread by zone and node unless
// their spec says otherwise, and take its priority class and scheduling
// knobs (the controller pods through spec.controller.podTemplate).
func TestPodScheduling(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "sm"}}
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sm"}}
	r, sr := &ReplicaGroupReconciler{DefaultImage: "x"}, &ShardMapReconciler{DefaultImage: "x"}
	pods := func() map[string]corev1.PodTemplateSpec {
		return map[string]corev1.PodTemplateSpec{"group": r.podTemplate(rg, sm, 1, 3), "controller": sr.ctrlerPodTemplate(sm, 3)}
	}
	selectors := map[string]map[string]string{"group": groupSelectorLabels(rg), "controller": ctrlerSelectorLabels(sm)}
	for name, pod := range pods() {
		cs := pod.Spec.TopologySpreadConstraints
		if len(cs) != 2 || cs[0].TopologyKey != corev1.LabelTopologyZone || cs[1].TopologyKey != corev1.LabelHostname {
			t.Fatalf("%s: default spread %+v, want zone then hostname", name, cs)
		}
		for _, c := range cs {
			if c.WhenUnsatisfiable != corev1.ScheduleAnyway || c.MaxSkew != 1 || !maps.Equal(c.LabelSelector.MatchLabels, selectors[name]) {
				t.Errorf("%s: default constraint %+v: want maxSkew 1, ScheduleAnyway, its own pods", name, c)
			}
		}
		if pod.Spec.Affinity == nil || pod.Spec.PriorityClassName != "" || pod.Spec.NodeSelector != nil || pod.Annotations != nil {
			t.Errorf("%s: defaults: affinity %v, priority %q, nodeSelector %v, annotations %v", name, pod.Spec.Affinity, pod.Spec.PriorityClassName, pod.Spec.NodeSelector, pod.Annotations)
		}
	}
	over := shardkvv1.PodOverrides{
		PriorityClassName: "kv-critical",
		NodeSelector:      map[string]string{"disk": "ssd"},
		Tolerations:       []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		Annotations:       map[string]string{"team": "kv"},
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: corev1.DoNotSchedule}},
	}
	rg.Spec.PodTemplate, sm.Spec.Controller.PodTemplate = over, over
	for name, pod := range pods() {
		cs := pod.Spec.TopologySpreadConstraints
		if len(cs) != 1 || cs[0].TopologyKey != "rack" || cs[0].WhenUnsatisfiable != corev1.DoNotSchedule || !maps.Equal(cs[0].LabelSelector.MatchLabels, selectors[name]) {
			t.Errorf("%s: spread %+v, want the spec's one constraint over its own pods", name, cs)
		}
		if pod.Spec.PriorityClassName != "kv-critical" || pod.Spec.NodeSelector["disk"] != "ssd" || len(pod.Spec.Tolerations) != 1 || pod.Annotations["team"] != "kv" {
			t.Errorf("%s: overrides not applied: %+v", name, pod.Spec)
		}
	}
	if over.TopologySpreadConstraints[0].LabelSelector != nil {
		t.Error("the spec's constraint was changed in place")
	}
}
