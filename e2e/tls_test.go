//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/shardkv/shardkv/controllers"
	"github.com/shardkv/shardkv/pkg/kvcheck"
)

// The TLS scenario's cluster: its own ShardMap in mode Managed, one
// controller and one group of 3, Redis over TLS only, and users from a
// Secret (app may touch wl-tls-redis-* only; the default user is off).
const (
	tlsSM        = "sec"
	tlsGroup     = "sec-a"
	tlsGo        = "tls-go"
	tlsRedis     = "tls-redis"
	tlsDenied    = "tls-denied"
	tlsMountPath = "/etc/shardkv/tls"
)

func (e *env) tlsCluster(t *testing.T) {
	e.applyYAML(t, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: sec-users
stringData:
  acl: |
    user app on >app-pass ~wl-%s-* +@all
    user default off
---
apiVersion: shardkv.io/v1alpha1
kind: ShardMap
metadata:
  name: %s
spec:
  shards: 16
  controller:
    replicas: 1
    storage: {size: 64Mi}
  tls:
    mode: Managed
  users: {name: sec-users, key: acl}
  network:
    clients:
    - podSelector: {}     # the workload pods of this namespace
---
apiVersion: shardkv.io/v1alpha1
kind: ReplicaGroup
metadata:
  name: %s
spec:
  shardMap: %s
  replicas: 3
  storage: {size: 64Mi}
`, tlsRedis, tlsSM, tlsGroup, tlsSM))
	t0 := time.Now()
	e.waitSettled(t, settle, tlsSM, map[string]int{tlsGroup: 3})
	t.Logf("TLS cluster: all shards Serving after %v", time.Since(t0).Round(time.Second))

	// The Secrets, and pods that serve Redis over TLS only.
	for _, s := range []string{controllers.CASecretName(tlsSM), controllers.CtrlerTLSSecretName(tlsSM), controllers.GroupTLSSecretName(tlsGroup),
		controllers.AdminTLSSecretName(tlsSM), controllers.ClientTLSSecretName(tlsSM)} {
		sec := &corev1.Secret{}
		if err := e.kube.Get(ctx(t), keyOf(e.ns, s), sec); err != nil {
			t.Fatalf("Secret %s: %v", s, err)
		}
	}
	for _, p := range e.pods(t, tlsGroup) {
		var ports []int32
		for _, cp := range p.Spec.Containers[0].Ports {
			ports = append(ports, cp.ContainerPort)
		}
		if !slices.Contains(ports, controllers.RESPTLSPort) || slices.Contains(ports, controllers.RESPPort) {
			t.Errorf("%s ports %v: want Redis over TLS (%d) only", p.Name, ports, controllers.RESPTLSPort)
		}
	}

	// Clients with the cluster's client certificate: Go over mutual TLS,
	// and Redis over TLS as user app, each on its own keys.
	seed := fmt.Sprintf("%s:%d", controllers.PodDNS(tlsGroup, 0, e.ns), controllers.RESPTLSPort)
	e.startClientPod(t, tlsGo, controllers.ClientTLSSecretName(tlsSM), "--ctrler="+e.ctrlerAddrs(tlsSM, 1))
	e.startClientPod(t, tlsRedis, controllers.ClientTLSSecretName(tlsSM), "--redis="+seed, "--redis-user=app", "--redis-password=app-pass")
	e.waitWorkload(t, tlsGo)
	e.waitWorkload(t, tlsRedis)

	// The controller's config names each replica's Redis-over-TLS address
	// and no plain one (the pods serve none): CLUSTER SLOTS and redirects
	// on the TLS port send clients to every replica, not only to the seed.
	e.eventually(t, time.Minute, "the config names the TLS Redis addresses", func() (bool, string) {
		out, err := e.kubectlErr("-n", e.ns, "exec", tlsGo, "--", "/kvctl", "--tls-dir="+tlsMountPath,
			"--ctrler="+e.ctrlerAddrs(tlsSM, 1), "--json", "query")
		if err != nil {
			return false, err.Error()
		}
		var cfg struct {
			Groups []struct {
				Servers []struct {
					ID          uint64 `json:"id"`
					RespAddr    string `json:"resp_addr"`
					RespTLSAddr string `json:"resp_tls_addr"`
				} `json:"servers"`
			} `json:"groups"`
		}
		if err := json.Unmarshal([]byte(out), &cfg); err != nil {
			return false, err.Error() + ": " + out
		}
		if len(cfg.Groups) != 1 || len(cfg.Groups[0].Servers) != 3 {
			return false, out
		}
		for _, sv := range cfg.Groups[0].Servers {
			if sv.RespAddr != "" || !strings.HasSuffix(sv.RespTLSAddr, fmt.Sprintf(":%d", controllers.RESPTLSPort)) {
				return false, fmt.Sprintf("server %d: resp %q, resp tls %q", sv.ID, sv.RespAddr, sv.RespTLSAddr)
			}
		}
		return true, ""
	})

	// The same user outside its key pattern is refused: the workload
	// stops at its first read with NOPERM.
	e.startClientPod(t, tlsDenied, controllers.ClientTLSSecretName(tlsSM), "--redis="+seed, "--redis-user=app", "--redis-password=app-pass")
	e.eventually(t, 2*time.Minute, tlsDenied+" refused", func() (bool, string) {
		p := &corev1.Pod{}
		if err := e.kube.Get(ctx(t), keyOf(e.ns, tlsDenied), p); err != nil {
			return false, err.Error()
		}
		log := e.workloadLog(t, tlsDenied)
		return p.Status.Phase == corev1.PodFailed && strings.Contains(log, "NOPERM"), fmt.Sprintf("phase %s, log: %s", p.Status.Phase, tail(log, 3))
	})
	t.Logf("%s: %s", tlsDenied, tail(e.workloadLog(t, tlsDenied), 2))

	// A CA rotation under both workloads: new CA trusted everywhere,
	// then signing every certificate, then the old one dropped. Not one
	// operation may fail.
	before := map[string]workloadStatus{}
	for _, n := range []string{tlsGo, tlsRedis} {
		st, err := e.workloadStatus(t, n)
		if err != nil {
			t.Fatal(err)
		}
		before[n] = st
	}
	logs := e.followLogs(t, controllers.CtrlerName(tlsSM), tlsGroup)
	if pods := logs.followed(); len(pods) != 4 {
		t.Fatalf("following the logs of %v, want the 4 pods of the cluster", pods)
	}
	oldCA := e.secretData(t, controllers.CASecretName(tlsSM), corev1.TLSCertKey)
	t1 := time.Now()
	e.k(t, "annotate", "shardmap/"+tlsSM, controllers.AnnotationRotateCA+"=e2e", "--overwrite")
	e.eventually(t, 10*time.Minute, "CA rotation done", func() (bool, string) {
		ca := &corev1.Secret{}
		if err := e.kube.Get(ctx(t), keyOf(e.ns, controllers.CASecretName(tlsSM)), ca); err != nil {
			return false, err.Error()
		}
		phase := ca.Annotations["shardkv.io/ca-phase"]
		return phase == "" && string(ca.Data[corev1.TLSCertKey]) != string(oldCA) &&
				strings.Count(string(ca.Data[corev1.ServiceAccountRootCAKey]), "BEGIN CERTIFICATE") == 1,
			fmt.Sprintf("phase %q, marked %s", phase, ca.Annotations["shardkv.io/ca-marked-at"])
	})
	t.Logf("CA rotation: done after %v", time.Since(t1).Round(time.Second))
	// Every pod loaded its new certificate, and the workloads go on.
	e.eventually(t, 3*time.Minute, "every pod reloaded its certificate", func() (bool, string) {
		missing := logs.missing("TLS certificate reloaded")
		return len(missing) == 0, "not yet: " + strings.Join(missing, ",")
	})
	warned := logs.stop()
	for _, n := range []string{tlsGo, tlsRedis} {
		e.workloadProgress(t, n, 20, 2*time.Minute)
		st, err := e.workloadStatus(t, n)
		if err != nil {
			t.Fatal(err)
		}
		failed := (st.Ops - st.OK) - (before[n].Ops - before[n].OK)
		t.Logf("%s during the rotation: %d ok, %d failed", n, st.OK-before[n].OK, failed)
		if failed != 0 {
			t.Errorf("%s: %d operations failed during the CA rotation (last: %s)", n, failed, st.LastErr)
			t.Logf("--- %s: its log\n%s", n, tail(e.workloadLog(t, n), 4000))
		}
	}
	if t.Failed() {
		for pod, lines := range warned {
			t.Logf("--- %s: warnings and errors during the rotation\n%s", pod, tail(strings.Join(lines, "\n"), 40))
		}
	}

	// The histories are linearizable.
	for _, n := range []string{tlsGo, tlsRedis} {
		h := e.stopWorkload(t, n)
		res, err := kvcheck.Check(h.Ops, 5*time.Minute)
		if err != nil {
			t.Fatalf("%s: check: %v", n, err)
		}
		t.Logf("%s history: %s", n, res)
		if !res.Linearizable {
			t.Errorf("%s: the history is not linearizable: %s", n, res)
		}
	}

	// Tear it down: the ShardMap and its only group deleted together go
	// without a drain (deleteShardMap).
	for _, n := range []string{tlsGo, tlsRedis, tlsDenied} {
		e.k(t, "delete", "pod", n, "--wait=false")
	}
	e.k(t, "delete", "shardmap/"+tlsSM, "replicagroup/"+tlsGroup, "--wait=true", "--timeout=2m")
}

// startClientPod runs `kvctl --tls-dir workload` with the certificate of
// Secret secret, on keys of its own (prefix: the pod's name).
func (e *env) startClientPod(t *testing.T, name, secret string, target ...string) {
	t.Helper()
	args := append([]string{"/kvctl", "--tls-dir=" + tlsMountPath, "workload"}, target...)
	args = append(args, "--clients=4", "--keys=16", "--rate=10", "--op-timeout=20s", "--prefix="+name, "--listen=:"+workloadPort)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{"app": "shardkv-e2e-workload"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), FSGroup: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440)}}}},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           e.image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         args,
				Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8090}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "tls", MountPath: tlsMountPath, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if err := e.kube.Create(ctx(t), pod); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
}

func (e *env) secretData(t *testing.T, name, key string) []byte {
	t.Helper()
	s := &corev1.Secret{}
	if err := e.kube.Get(ctx(t), keyOf(e.ns, name), s); err != nil {
		t.Fatalf("Secret %s: %v", name, err)
	}
	return s.Data[key]
}

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
