package controllers

// The operator's RBAC against the real kube-apiserver of the envtest
// suite (docs/security.md):
//
//   - Every manager of the suite (startManager) runs as the operator's
//     ServiceAccount, with a real token, bound in its namespace to exactly
//     the ClusterRole manager-role of config/rbac/role.yaml (generated from
//     the +kubebuilder:rbac markers): a verb the role lacks is refused by
//     the API server, and the reconcilers' tests fail.
//   - The API server writes an audit log of every request the
//     ServiceAccount makes. After the suite, runRBACAudit fails if any was
//     refused, and, when the whole suite ran (no -run or -skip), if a rule
//     of the operator's roles (manager-role, the leader election Role, the
//     metrics auth ClusterRole) allows a verb that no request used.
//   - The API server enforces OwnerReferencesPermissionEnforcement, as
//     some clusters do: creating an object owned by a ShardMap or
//     ReplicaGroup with blockOwnerDeletion needs "update" on the owner's
//     finalizers subresource, a check the audit log does not show.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// The operator's ServiceAccount as config/default names it.
const (
	operatorNS = "shardkv-system"
	operatorSA = "shardkv-controller-manager"
	// operatorUser is its user name in the API server.
	operatorUser = "system:serviceaccount:" + operatorNS + ":" + operatorSA
)

var (
	// operatorCfg is testCfg with the operator ServiceAccount's token
	// instead of the admin's certificate (nil without envtest).
	operatorCfg *rest.Config
	// auditLog is the API server's audit log of operatorUser's requests.
	auditLog string
)

// auditPolicy logs the operator's requests (metadata only) and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["` + operatorUser + `"]
- level: None
`

// configureAPIServerForRBAC sets the audit log and the owner-reference
// admission check on the suite's API server, before it starts.
func configureAPIServerForRBAC(env *envtest.Environment, dir string) error {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return err
	}
	auditLog = filepath.Join(dir, "audit.log")
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("audit-policy-file", policy)
	args.Set("audit-log-path", auditLog)
	args.Set("audit-log-mode", "blocking")
	args.Set("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
	return nil
}

// setupOperatorIdentity makes the operator's ServiceAccount and its
// roles from config/rbac (ClusterRoles; startManager binds manager-role in
// each test's namespace), and operatorCfg with the account's token.
func setupOperatorIdentity(ctx context.Context, cfg *rest.Config) error {
	if err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNS}}); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: operatorSA}}
	if err := k8sClient.Create(ctx, sa); err != nil {
		return err
	}
	for _, f := range []string{"role.yaml", "metrics_auth_role.yaml", "metrics_reader_role.yaml", "leader_election_role.yaml"} {
		rules, name, err := configRole(f)
		if err != nil {
			return err
		}
		if err := k8sClient.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}); err != nil {
			return err
		}
	}
	// The metrics auth role is cluster-wide (TokenReviews and
	// SubjectAccessReviews are not namespaced), as config/rbac binds it.
	if err := k8sClient.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-auth-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-auth-role"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNS, Name: operatorSA}},
	}); err != nil {
		return err
	}
	token, err := serviceAccountToken(ctx, cfg, operatorNS, operatorSA)
	if err != nil {
		return err
	}
	operatorCfg = tokenConfig(cfg, token)
	return nil
}

// tokenConfig is cfg authenticating with token instead of its
// certificate.
func tokenConfig(cfg *rest.Config, token string) *rest.Config {
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = token
	c.QPS, c.Burst = cfg.QPS, cfg.Burst
	return c
}

// serviceAccountToken is a fresh token of ServiceAccount ns/name (a
// TokenRequest, as the kubelet gets for a pod).
func serviceAccountToken(ctx context.Context, cfg *rest.Config, ns, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// configRole reads the rules and name of the (Cluster)Role in
// config/rbac/file.
func configRole(file string) ([]rbacv1.PolicyRule, string, error) {
	b, err := os.ReadFile(filepath.Join("..", "config", "rbac", file))
	if err != nil {
		return nil, "", err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var r rbacv1.ClusterRole // a Role has the same fields
		if err := dec.Decode(&r); err == io.EOF {
			return nil, "", fmt.Errorf("config/rbac/%s: no Role or ClusterRole", file)
		} else if err != nil {
			return nil, "", fmt.Errorf("config/rbac/%s: %w", file, err)
		}
		if r.Kind == "Role" || r.Kind == "ClusterRole" {
			return r.Rules, r.Name, nil
		}
	}
}

// bindOperator binds the operator's ServiceAccount to ClusterRole role in
// namespace ns (a RoleBinding: the rights hold in ns only).
func bindOperator(ctx context.Context, ns, role string) error {
	err := k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shardkv-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: operatorNS, Name: operatorSA}},
	})
	if err := client.IgnoreAlreadyExists(err); err != nil {
		return err
	}
	return waitBound(ctx, ns, role)
}

// waitBound waits until the API server's authorizer allows the operator
// the first rule of role in ns. It sees a new RoleBinding through an
// informer, a moment after the binding is stored: a manager started at once
// had its first Lease get refused (403), which client-go retries but the
// audit check rightly counts (a CI run under -race failed so).
func waitBound(ctx context.Context, ns, role string) error {
	cr := &rbacv1.ClusterRole{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: role}, cr); err != nil {
		return err
	}
	if len(cr.Rules) == 0 || len(cr.Rules[0].Verbs) == 0 || len(cr.Rules[0].Resources) == 0 {
		return nil
	}
	r := cr.Rules[0]
	group := ""
	if len(r.APIGroups) > 0 {
		group = r.APIGroups[0]
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + operatorNS + ":" + operatorSA,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + operatorNS, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: r.Verbs[0], Group: group, Resource: r.Resources[0]},
		}}
		if err := k8sClient.Create(ctx, sar); err != nil {
			return err
		}
		if sar.Status.Allowed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("role %s bound in %s is not in effect after %v: %s", role, ns, waitTimeout, sar.Status.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probeUserAgent marks the requests of tests that probe the operator's
// rights (and expect refusals): runRBACAudit leaves them out.
const probeUserAgent = "shardkv-rbac-probe"

// auditEvent is what runRBACAudit reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

// permission is one verb on one resource ("pods", "shardmaps/status") of
// an API group ("" is core).
type permission struct{ group, resource, verb string }

func (p permission) String() string {
	g := p.group
	if g == "" {
		g = "core"
	}
	return fmt.Sprintf("%s %s/%s", p.verb, g, p.resource)
}

// notInAuditLog are the permissions of the roles that the audit log
// cannot show in use, each with why the operator needs it.
var notInAuditLog = map[permission]string{
	{"shardkv.io", "shardmaps/finalizers", "update"}: "the controller group's StatefulSet, Service and PodDisruptionBudget are " +
		"created with a controller ownerReference to the ShardMap with blockOwnerDeletion, which " +
		"OwnerReferencesPermissionEnforcement allows only to who may update the owner's finalizers",
	{"shardkv.io", "replicagroups/finalizers", "update"}: "the same for a data group's objects and its ReplicaGroup",
}

// roleFiles are the roles config/rbac gives the operator's ServiceAccount.
var roleFiles = []string{"role.yaml", "leader_election_role.yaml", "metrics_auth_role.yaml"}

// pvcResizeRefusal is the admission check PersistentVolumeClaimResize's
// answer to growing a claim whose StorageClass cannot expand: a 403 about
// the class, not the operator's rights (TestReplicaGroupGrowsVolumes).
const pvcResizeRefusal = "only dynamically provisioned pvc can be resized"

// runRBACAudit checks the audit log of the operator's requests: none was
// refused, and when full (the whole suite ran), every permission of the
// operator's roles was used by some request.
func runRBACAudit(full bool) error {
	f, err := os.Open(auditLog)
	if err != nil {
		return err
	}
	defer f.Close()
	used := map[permission]int{}
	var refused []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		if ev.User.Username != operatorUser || ev.UserAgent == probeUserAgent || seen[ev.AuditID] {
			continue
		}
		seen[ev.AuditID] = true
		if ev.Annotations["authorization.k8s.io/decision"] == "forbid" {
			refused = append(refused, fmt.Sprintf("%s %s (%s)", ev.Verb, ev.RequestURI, ev.Annotations["authorization.k8s.io/reason"]))
			continue
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code == 403 && !strings.Contains(ev.ResponseStatus.Message, pvcResizeRefusal) {
			// Authorized, then refused by an admission check of the
			// requester's rights (OwnerReferencesPermissionEnforcement).
			refused = append(refused, fmt.Sprintf("%s %s (refused at admission)", ev.Verb, ev.RequestURI))
			continue
		}
		if ev.ObjectRef == nil {
			continue // discovery (/api, /apis): system:discovery
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		used[permission{ev.ObjectRef.APIGroup, res, ev.Verb}]++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var errs []error
	if len(refused) > 0 {
		slices.Sort(refused)
		refused = slices.Compact(refused)
		errs = append(errs, fmt.Errorf("the API server refused %d requests of the operator: its roles lack what the code needs (add +kubebuilder:rbac markers, make manifests):\n  %s",
			len(refused), strings.Join(refused, "\n  ")))
	}
	if full {
		for _, file := range roleFiles {
			rules, name, err := configRole(file)
			if err != nil {
				return err
			}
			var unused []string
			for _, r := range rules {
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							p := permission{g, res, v}
							// An informer lists first; where the API server
							// streams that list over the watch (WatchList, as
							// this one does) the log shows only the watch.
							listOfWatch := v == "list" && used[permission{g, res, "watch"}] > 0
							if used[p] == 0 && notInAuditLog[p] == "" && !listOfWatch {
								unused = append(unused, p.String())
							}
						}
					}
				}
			}
			if len(unused) > 0 {
				errs = append(errs, fmt.Errorf("config/rbac/%s (%s) allows what no request of the operator used in the whole suite: %s",
					file, name, strings.Join(unused, ", ")))
			}
		}
	}
	if os.Getenv("SHARDKV_TEST_RBAC_VERBOSE") != "" {
		var all []string
		for p, n := range used {
			all = append(all, fmt.Sprintf("%s: %d", p, n))
		}
		slices.Sort(all)
		fmt.Fprintf(os.Stderr, "rbac: the operator's requests in the audit log:\n  %s\n", strings.Join(all, "\n  "))
	}
	return errors.Join(errs...)
}

// wholeSuite reports whether every test of the package ran: no -run or
// -skip filter.
func wholeSuite() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// TestLeaderElectionRBAC: a manager with leader election, as the operator
// runs it (--leader-elect), elected with only the leader election Role of
// config/rbac in its namespace; on stop it releases the Lease. The audit
// check above then holds that Role to what this used.
func TestLeaderElectionRBAC(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	if err := bindOperator(ctx, ns, "leader-election-role"); err != nil {
		t.Fatal(err)
	}
	mgr, stop := newOperatorManager(t, ns, func(o *ctrl.Options) {
		o.LeaderElection = true
		o.LeaderElectionID = LeaderElectionID
		o.LeaderElectionNamespace = ns
		o.LeaderElectionReleaseOnCancel = true
	})
	select {
	case <-mgr.Elected():
	case <-time.After(waitTimeout):
		t.Fatal("the manager was not elected")
	}
	lease := &coordinationv1.Lease{}
	if err := get(ctx, ns, LeaderElectionID, lease); err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("Lease %s: %v %+v", LeaderElectionID, err, lease.Spec)
	}
	// The "became leader" Event (core/v1, as client-go's leader election
	// records it).
	eventually(t, "the LeaderElection Event", func() error {
		var evs corev1.EventList
		if err := k8sClient.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "LeaderElection" {
				return nil
			}
		}
		return fmt.Errorf("no LeaderElection Event among %d", len(evs.Items))
	})
	stop()
	eventually(t, "the Lease released", func() error {
		if err := get(ctx, ns, LeaderElectionID, lease); err != nil {
			return err
		}
		if h := ptr.Deref(lease.Spec.HolderIdentity, ""); h != "" {
			return fmt.Errorf("still held by %q", h)
		}
		return nil
	})
}

// TestOperatorIdentityIsNotAdmin: the suite's managers really run as the
// operator's ServiceAccount with nothing but its roles: it may not read a
// ConfigMap or delete a Secret (it reads and writes Secrets for TLS and
// users, never deletes one: owner references do), nor touch objects
// outside a namespace it was bound in.
func TestOperatorIdentityIsNotAdmin(t *testing.T) {
	ns := newNamespace(t)
	other := newNamespace(t)
	ctx := context.Background()
	if err := bindOperator(ctx, ns, "manager-role"); err != nil {
		t.Fatal(err)
	}
	probe := rest.CopyConfig(operatorCfg)
	probe.UserAgent = probeUserAgent // left out of the audit check
	c, err := client.New(probe, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &corev1.PodList{}, client.InNamespace(ns)); err != nil {
		t.Errorf("list pods in its namespace: %v", err)
	}
	if err := c.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("list configmaps: %v, want Forbidden", err)
	}
	if err := c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "any"}}); !apierrors.IsForbidden(err) {
		t.Errorf("delete a secret: %v, want Forbidden", err)
	}
	if err := c.List(ctx, &corev1.PodList{}, client.InNamespace(other)); !apierrors.IsForbidden(err) {
		t.Errorf("list pods in a namespace it is not bound in: %v, want Forbidden", err)
	}
}

// kustomize renders a directory of config/ with the kubectl next to the
// envtest binaries (hack/setup-envtest.sh --with-kubectl; `make test`
// builds it), and returns its objects as JSON documents.
func kustomize(t *testing.T, dir string) []json.RawMessage {
	t.Helper()
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if os.Getenv("SHARDKV_REQUIRE_ENVTEST") != "" {
			t.Fatalf("no kubectl in KUBEBUILDER_ASSETS (hack/setup-envtest.sh --with-kubectl): %v", err)
		}
		t.Skipf("no kubectl in KUBEBUILDER_ASSETS: run hack/setup-envtest.sh --with-kubectl")
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "config", dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/%s: %v", dir, err)
	}
	var docs []json.RawMessage
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err == io.EOF {
			return docs
		} else if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, raw)
	}
}

// TestNamespacedOverlay: config/namespaced gives the operator a Role with
// the rules of config/rbac/role.yaml in its own namespace (and no cluster
// rights but the metrics endpoint's), has it watch that namespace, and
// with exactly that Role and RoleBinding, applied to the API server, the
// ShardMap reconciler runs a ShardMap there.
func TestNamespacedOverlay(t *testing.T) {
	requireEnvtest(t)
	wantRules, _, err := configRole("role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	var args []string
	var env []corev1.EnvVar
	for _, raw := range kustomize(t, "namespaced") {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(raw, &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case "ClusterRole", "ClusterRoleBinding":
			var o metav1.PartialObjectMetadata
			_ = json.Unmarshal(raw, &o)
			if !strings.Contains(o.Name, "metrics") {
				t.Errorf("config/namespaced has cluster-wide %s %s", tm.Kind, o.Name)
			}
		case "Role":
			var r rbacv1.Role
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			if r.Name == "shardkv-manager-role" {
				role = &r
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			if err := json.Unmarshal(raw, &b); err != nil {
				t.Fatal(err)
			}
			if b.RoleRef.Name == "shardkv-manager-role" {
				binding = &b
			}
		case "Deployment":
			var d struct {
				Spec struct {
					Template corev1.PodTemplateSpec `json:"template"`
				} `json:"spec"`
			}
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			args, env = d.Spec.Template.Spec.Containers[0].Args, d.Spec.Template.Spec.Containers[0].Env
		}
	}
	if role == nil || binding == nil {
		t.Fatalf("config/namespaced: Role shardkv-manager-role %v, its RoleBinding %v", role != nil, binding != nil)
	}
	if role.Namespace != operatorNS || binding.Namespace != operatorNS || binding.RoleRef.Kind != "Role" {
		t.Errorf("Role in %q, RoleBinding in %q to a %s; want both in %s, to a Role", role.Namespace, binding.Namespace, binding.RoleRef.Kind, operatorNS)
	}
	if !equalJSON(role.Rules, wantRules) {
		t.Errorf("the Role's rules differ from config/rbac/role.yaml:\n%+v\n%+v", role.Rules, wantRules)
	}
	if !slices.Contains(args, "--watch-namespace=$(POD_NAMESPACE)") ||
		!slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
			return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
		}) {
		t.Errorf("the manager does not watch its own namespace: args %q env %+v", args, env)
	}

	// The Role and RoleBinding as rendered, in the operator's namespace of
	// the suite (the one the ServiceAccount is in), and nothing else.
	ctx := context.Background()
	role.ResourceVersion, binding.ResourceVersion = "", ""
	mustCreate(t, role)
	mustCreate(t, binding)
	t.Cleanup(func() {
		_ = k8sClient.Delete(ctx, role)
		_ = k8sClient.Delete(ctx, binding)
	})
	dp := newFakeDataPlane()
	newOperatorManager(t, operatorNS, nil, setupShardMap(dp))
	mustCreate(t, testShardMap(operatorNS, "ns-scoped", 8, 1))
	t.Cleanup(func() {
		_ = k8sClient.Delete(ctx, &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: "ns-scoped"}})
	})
	waitSM(t, operatorNS, "ns-scoped", "the ShardMap's status written", func(sm *shardkvv1.ShardMap) error {
		for _, o := range []client.Object{&appsv1.StatefulSet{}, &corev1.Service{}, &policyv1.PodDisruptionBudget{}} {
			if err := get(ctx, operatorNS, CtrlerName("ns-scoped"), o); err != nil {
				return err
			}
		}
		if len(sm.Status.Conditions) == 0 {
			return errors.New("no conditions yet")
		}
		return nil
	})
}

func equalJSON(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
