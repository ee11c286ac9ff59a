package controllers

// The envtest suite shared by every test file of this package: one real
// kube-apiserver + etcd for the whole package (started in TestMain), and a
// manager per test, scoped to that test's own namespace, running whatever
// reconcilers the test sets up. Tests stay independent: a reconciler of one
// test never sees the objects of another, and each test has its own
// fakeDataPlane.
//
// Typical test:
//
//	func TestSomething(t *testing.T) {
//		ns := newNamespace(t)          // skips when envtest binaries are missing
//		dp := newFakeDataPlane()
//		startManager(t, ns, setupShardMap(dp), setupReplicaGroup(dp))
//		... create objects with k8sClient, then eventually(t, "what", func() error {...})
//	}
//
// setupShardMap is defined in shardmap_helpers_test.go, setupReplicaGroup in
// replicagroup_helpers_test.go (each a func(ctrl.Manager) error).

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

var (
	// testScheme has the core types and shardkv.io/v1alpha1.
	testScheme = runtime.NewScheme()
	// testCfg is the envtest API server's rest config (nil without envtest).
	testCfg *rest.Config
	// k8sClient is a direct (uncached) client for the tests' own reads and
	// writes: what it reads is what the API server has.
	k8sClient client.Client
	// envtestSkip is why envtest tests are skipped ("" when it runs).
	envtestSkip string
)

// Timeouts for eventually: the machine is small and shared, so be generous.
const (
	waitTimeout = 60 * time.Second
	pollEvery   = 100 * time.Millisecond
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(testScheme))
	utilruntime.Must(shardkvv1.AddToScheme(testScheme))
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// SHARDKV_TEST_VERBOSE=1 shows the reconcilers' logs (debug level).
	if os.Getenv("SHARDKV_TEST_VERBOSE") != "" {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		// `make test` sets it (from hack/setup-envtest.sh). A plain
		// `go test` without it still runs the pure unit tests.
		envtestSkip = "KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)"
		if os.Getenv("SHARDKV_REQUIRE_ENVTEST") != "" {
			fmt.Fprintln(os.Stderr, envtestSkip)
			return 1
		}
		return m.Run()
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                testScheme,
	}
	// The audit log and admission checks of the RBAC tests (rbac_test.go).
	dir, err := os.MkdirTemp("", "shardkv-envtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := configureAPIServerForRBAC(env, dir); err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest: start:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "envtest: stop:", err)
		}
	}()
	cfg.QPS, cfg.Burst = 200, 400
	testCfg = cfg
	if k8sClient, err = client.New(cfg, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintln(os.Stderr, "envtest: client:", err)
		return 1
	}
	// The reconcilers run as the operator's ServiceAccount, with only the
	// roles of config/rbac (rbac_test.go).
	if err := setupOperatorIdentity(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "envtest: the operator's ServiceAccount:", err)
		return 1
	}
	code := m.Run()
	if err := runRBACAudit(wholeSuite()); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: RBAC (controllers/rbac_test.go):", err)
		code = 1
	} else if wholeSuite() {
		fmt.Fprintln(os.Stderr, "rbac: the operator's roles (config/rbac) allow exactly the requests the suite made, and none was refused")
	}
	return code
}

// requireEnvtest skips t when the envtest API server is not running.
func requireEnvtest(t *testing.T) {
	t.Helper()
	if testCfg == nil {
		t.Skip(envtestSkip)
	}
}

var nsUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// newNamespace creates a namespace for t (named after the test, unique) and
// returns its name. It skips t when envtest is not running. envtest has no
// namespace controller, so the namespace is left behind (harmless).
func newNamespace(t *testing.T) string {
	t.Helper()
	requireEnvtest(t)
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	base := strings.Trim(nsUnsafe.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = strings.TrimRight(base[:40], "-")
	}
	name := fmt.Sprintf("%s-%x-%d", base, h.Sum32(), time.Now().UnixNano()%100000)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// startManager starts a manager for the duration of t whose cache (and so
// every reconciler it runs) sees only namespace ns, as the operator does
// with --watch-namespace. Each setup registers a reconciler with it (e.g.
// setupShardMap(dp)). It runs as the operator's ServiceAccount, whose
// ClusterRole manager-role (config/rbac/role.yaml) is bound in ns only
// (rbac_test.go). The manager stops when t ends. Leader election, metrics
// and health probes are off.
func startManager(t *testing.T, ns string, setups ...func(ctrl.Manager) error) ctrl.Manager {
	t.Helper()
	requireEnvtest(t)
	if err := bindOperator(context.Background(), ns, "manager-role"); err != nil {
		t.Fatalf("bind the operator's role: %v", err)
	}
	mgr, _ := newOperatorManager(t, ns, nil, setups...)
	return mgr
}

// newOperatorManager starts a manager as the operator's ServiceAccount
// (bound to nothing here) watching ns, with opts applied to its options
// and setups run on it; stop stops it (also done when t ends).
func newOperatorManager(t *testing.T, ns string, opts func(*ctrl.Options), setups ...func(ctrl.Manager) error) (mgr ctrl.Manager, stop func()) {
	t.Helper()
	requireEnvtest(t)
	o := ctrl.Options{
		Scheme:                 testScheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		// Every test registers controllers with the same names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if opts != nil {
		opts(&o)
	}
	mgr, err := ctrl.NewManager(operatorCfg, o)
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	for _, setup := range setups {
		if err := setup(mgr); err != nil {
			t.Fatalf("set up reconciler: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("manager: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("manager did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatalf("manager cache did not sync")
	}
	return mgr, stop
}

// eventually polls f until it returns nil, failing t with f's last error
// after waitTimeout.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	eventuallyWithin(t, waitTimeout, what, f)
}

// eventuallyWithin is eventually with its own timeout.
func eventuallyWithin(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(pollEvery)
	}
}

// consistently checks that f keeps returning nil for d.
func consistently(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(pollEvery)
	}
}

// get reads obj (ns/name) with the direct client.
func get(ctx context.Context, ns, name string, obj client.Object) error {
	return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
}

// eventsFor lists the events.k8s.io Events in ns regarding the object
// named name (any kind).
func eventsFor(ns, name string) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := k8sClient.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out, nil
}

// expectEvent waits until an Event with reason (and a note containing
// noteSub) regards the object named name in ns: the recorder writes
// Events from a goroutine of its own, so one can land after the state
// change it goes with is seen (CI once found a deleted ShardMap's
// "Deleted" Event not yet written).
func expectEvent(t *testing.T, ns, name, reason, noteSub string) {
	t.Helper()
	eventually(t, fmt.Sprintf("Event %s %q for %s", reason, noteSub, name), func() error { return hasEvent(ns, name, reason, noteSub) })
}

// hasEvent returns nil if an Event with reason (and a note containing
// noteSub) regards the object named name in ns.
func hasEvent(ns, name, reason, noteSub string) error {
	evs, err := eventsFor(ns, name)
	if err != nil {
		return err
	}
	var seen []string
	for _, e := range evs {
		if e.Reason == reason && strings.Contains(e.Note, noteSub) {
			return nil
		}
		seen = append(seen, e.Reason+": "+e.Note)
	}
	return fmt.Errorf("no event %s %q for %s; have %q", reason, noteSub, name, seen)
}
