//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/shardkv/shardkv/controllers"
	"github.com/shardkv/shardkv/pkg/kvcheck"
)

// The workload is `kvctl workload` in a pod of the project's image, as an
// application runs: the controller's pod DNS names resolve only inside the
// cluster. The test reaches its HTTP API through the apiserver's pod proxy,
// which works on any cluster.
const workloadPort = "8090"

type workloadStatus struct {
	Running bool   `json:"running"`
	Ops     int64  `json:"ops"`
	OK      int64  `json:"ok"`
	Unknown int64  `json:"unknown"`
	LastErr string `json:"lastError"`
}

func (s workloadStatus) String() string {
	return fmt.Sprintf("ops=%d ok=%d unknown=%d lastError=%q", s.Ops, s.OK, s.Unknown, s.LastErr)
}

// The two workloads: Go clients (exactly-once sessions, through the
// controller) and Redis Cluster clients (go-redis, through the groups'
// Redis ports, following MOVED and TRYAGAIN).
const (
	workload      = "workload"
	redisWorkload = "workload-redis"
)

var workloads = []string{workload, redisWorkload}

// startWorkloads starts both and waits until each succeeds.
func (e *env) startWorkloads(t *testing.T, sm string, groups []string) {
	t.Helper()
	e.startWorkload(t, workload, "--ctrler="+e.ctrlerAddrs(sm, 3))
	var seeds []string
	for _, g := range groups {
		seeds = append(seeds, fmt.Sprintf("%s:%d", controllers.PodDNS(g, 0, e.ns), controllers.RESPPort))
	}
	e.startWorkload(t, redisWorkload, "--redis="+strings.Join(seeds, ","))
	for _, name := range workloads {
		e.waitWorkload(t, name)
	}
}

// workloadsProgress: both workloads keep completing operations.
func (e *env) workloadsProgress(t *testing.T) {
	t.Helper()
	for _, name := range workloads {
		e.workloadProgress(t, name, 20, 2*time.Minute)
	}
}

func (e *env) startWorkload(t *testing.T, name, target string) {
	t.Helper()
	e.startWorkloadIn(t, e.ns, name, target, "--clients=6", "--keys=24", "--rate=10", "--op-timeout=20s")
}

// startWorkloadIn starts workload pod name in namespace ns with the
// arguments of kvctl workload args (its target and load).
func (e *env) startWorkloadIn(t *testing.T, ns, name string, args ...string) {
	t.Helper()
	// Each workload's keys are its own: a history starts from empty keys.
	prefix := name
	if ns != e.ns {
		prefix = ns + "-" + name
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "shardkv-e2e-workload"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           e.image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command: append(append([]string{"/kvctl", "workload"}, args...),
					"--prefix="+prefix, "--listen=:"+workloadPort),
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8090}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if err := e.kube.Create(ctx(t), pod); err != nil {
		t.Fatalf("create workload pod: %v", err)
	}
}

func (e *env) waitWorkload(t *testing.T, name string) {
	t.Helper()
	e.eventually(t, 2*time.Minute, name+" running and succeeding", func() (bool, string) {
		st, err := e.workloadStatus(t, name)
		if err != nil {
			return false, err.Error()
		}
		return st.OK >= 20, st.String()
	})
}

func (e *env) workloadGet(t *testing.T, name, path string) ([]byte, error) {
	t.Helper()
	return e.workloadGetIn(t, e.ns, name, path)
}

func (e *env) workloadGetIn(t *testing.T, ns, name, path string) ([]byte, error) {
	t.Helper()
	return e.cs.CoreV1().Pods(ns).ProxyGet("http", name, workloadPort, path, nil).DoRaw(ctx(t))
}

func (e *env) workloadStatus(t *testing.T, name string) (workloadStatus, error) {
	t.Helper()
	return e.workloadStatusIn(t, e.ns, name)
}

func (e *env) workloadStatusIn(t *testing.T, ns, name string) (workloadStatus, error) {
	t.Helper()
	var st workloadStatus
	b, err := e.workloadGetIn(t, ns, name, "status")
	if err != nil {
		return st, fmt.Errorf("workload status: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("workload status %q: %w", b, err)
	}
	return st, nil
}

// workloadProgress fails unless the workload completes at least min more
// operations within timeout: the cluster serves clients.
func (e *env) workloadProgress(t *testing.T, name string, min int64, timeout time.Duration) {
	t.Helper()
	st0, err := e.workloadStatus(t, name)
	if err != nil {
		t.Fatal(err)
	}
	e.eventually(t, timeout, fmt.Sprintf("%s completes %d more operations", name, min), func() (bool, string) {
		st, err := e.workloadStatus(t, name)
		if err != nil {
			return false, err.Error()
		}
		return st.OK-st0.OK >= min, st.String()
	})
}

// stopWorkload stops the clients and returns the history.
func (e *env) stopWorkload(t *testing.T, name string) kvcheck.History {
	t.Helper()
	b, err := e.workloadGet(t, name, "stop")
	if err != nil {
		t.Fatalf("stop workload: %v", err)
	}
	var h kvcheck.History
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("workload history: %v (%.200s)", err, b)
	}
	return h
}

// workloadLog returns the workload pod's log (its progress lines).
func (e *env) workloadLog(t *testing.T, name string) string {
	out, err := e.kubectlErr("-n", e.ns, "logs", name, "--tail=40")
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(out)
}

// workloadSnapshot is every workload's status now.
func (e *env) workloadSnapshot(t *testing.T) map[string]workloadStatus {
	t.Helper()
	out := map[string]workloadStatus{}
	for _, name := range workloads {
		st, err := e.workloadStatus(t, name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = st
	}
	return out
}

// checkNoWorkloadErrors fails if any workload saw an operation fail (an
// unknown outcome) since the snapshot st0, taken before what.
func (e *env) checkNoWorkloadErrors(t *testing.T, st0 map[string]workloadStatus, what string) {
	t.Helper()
	for name, st1 := range e.workloadSnapshot(t) {
		d := st1.Unknown - st0[name].Unknown
		t.Logf("%s during %s: %d ok, %d unknown outcomes", name, what, st1.OK-st0[name].OK, d)
		if d != 0 {
			t.Errorf("%s: %s caused %d client-visible errors (last: %s)", name, what, d, st1.LastErr)
		}
	}
}
