//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardkv/shardkv/controllers"
)

// The solo cluster's second group, solo-b, is created (by
// DeleteLastGroupRefused) with spec.requirePass: its Redis port asks for
// the password of Secret solo-auth. The solo ShardMap admits its own
// namespace's pods to the client ports, so the probes below can reach it.
const (
	soloAuthSecret = "solo-auth"
	soloPassword   = "e2e-solo-pass"
)

// soloBYAML is solo-b (one replica, pvcRetention: Delete, requirePass) and
// its password's Secret.
func soloBYAML() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: %s
stringData:
  password: %s
---
apiVersion: shardkv.io/v1alpha1
kind: ReplicaGroup
metadata:
  name: solo-b
spec:
  shardMap: %s
  replicas: 1
  storage: {size: 64Mi}
  pvcRetention: Delete
  requirePass: {name: %s, key: password}
`, soloAuthSecret, soloPassword, solo, soloAuthSecret)
}

// requirePass: solo-b's pod gets the password from the Secret through its
// environment (never its args); a Redis client that does not AUTH is
// refused (NOAUTH), one with a wrong password too (WRONGPASS), and one
// with the password is served.
func (e *env) requirePass(t *testing.T) {
	const g = "solo-b"
	t0 := time.Now()
	pods := e.pods(t, g)
	if len(pods) != 1 {
		t.Fatalf("%s has %d pods", g, len(pods))
	}
	var node *corev1.Container
	for i, c := range pods[0].Spec.Containers {
		if c.Name == "node" {
			node = &pods[0].Spec.Containers[i]
		}
	}
	if node == nil {
		t.Fatalf("%s: no node container", pods[0].Name)
	}
	var fromSecret bool
	for _, ev := range node.Env {
		if ev.Name == "SHARDKV_REQUIREPASS" && ev.ValueFrom != nil && ev.ValueFrom.SecretKeyRef != nil &&
			ev.ValueFrom.SecretKeyRef.Name == soloAuthSecret && ev.ValueFrom.SecretKeyRef.Key == "password" {
			fromSecret = true
		}
	}
	if !fromSecret {
		t.Errorf("%s: no SHARDKV_REQUIREPASS from Secret %s in %v", pods[0].Name, soloAuthSecret, node.Env)
	}
	if args := strings.Join(append(node.Command, node.Args...), " "); strings.Contains(args, soloPassword) {
		t.Errorf("%s: the password is in the container's command line: %s", pods[0].Name, args)
	}

	seed := fmt.Sprintf("--redis=%s:%d", controllers.PodDNS(g, 0, e.ns), controllers.RESPPort)
	load := []string{"--clients=2", "--keys=8", "--rate=10", "--op-timeout=5s"}
	probes := map[string][]string{
		"auth-ok":    append([]string{seed, "--redis-password=" + soloPassword}, load...),
		"auth-none":  append([]string{seed}, load...),
		"auth-wrong": append([]string{seed, "--redis-password=not-" + soloPassword}, load...),
	}
	for name, args := range probes {
		e.startWorkloadIn(t, e.ns, name, args...)
		t.Cleanup(func() { _, _ = e.kubectlErr("-n", e.ns, "delete", "pod", name, "--wait=false") })
	}
	e.waitProbe(t, e.ns, "auth-ok")
	for name, want := range map[string]string{"auth-none": "NOAUTH", "auth-wrong": "WRONGPASS"} {
		e.eventually(t, 2*time.Minute, name+" refused with "+want, func() (bool, string) {
			p := &corev1.Pod{}
			if err := e.kube.Get(ctx(t), keyOf(e.ns, name), p); err != nil {
				return false, err.Error()
			}
			log := e.workloadLog(t, name)
			return p.Status.Phase == corev1.PodFailed && strings.Contains(log, want), fmt.Sprintf("phase %s, log: %s", p.Status.Phase, tail(log, 3))
		})
		t.Logf("%s: %s", name, tail(e.workloadLog(t, name), 1))
	}
	st, err := e.workloadStatusIn(t, e.ns, "auth-ok")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ops != st.OK {
		t.Errorf("auth-ok: %d of %d operations failed (last: %s)", st.Ops-st.OK, st.Ops, st.LastErr)
	}
	t.Logf("auth-ok: %s; requirePass checked in %v", st, time.Since(t0).Round(time.Second))
}
