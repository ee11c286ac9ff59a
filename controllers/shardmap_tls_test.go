package controllers

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
)

func tlsShardMap(ns, name string) *shardkvv1.ShardMap {
	sm := testShardMap(ns, name, 8, 3)
	sm.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSManaged,
		CertificateLifetime: &metav1.Duration{Duration: 24 * time.Hour}, CALifetime: &metav1.Duration{Duration: 240 * time.Hour}}
	return sm
}

// tlsSnapshot is the cluster's TLS Secrets at one moment.
type tlsSnapshot struct {
	ca     *corev1.Secret
	leaves map[string]*corev1.Secret
}

func readTLS(ns, sm string, leaves ...string) (tlsSnapshot, error) {
	s := tlsSnapshot{ca: &corev1.Secret{}, leaves: map[string]*corev1.Secret{}}
	if err := get(context.Background(), ns, CASecretName(sm), s.ca); err != nil {
		return s, err
	}
	for _, n := range leaves {
		l := &corev1.Secret{}
		if err := get(context.Background(), ns, n, l); err != nil {
			return s, err
		}
		s.leaves[n] = l
	}
	return s, nil
}

// compatible checks what every pod needs at every moment: each leaf
// certificate of the cluster verifies against each leaf Secret's CA bundle
// (whichever version a pod has loaded, it can talk to every other).
func (s tlsSnapshot) compatible(at time.Time) error {
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range s.leaves {
			if !yield(n) {
				return
			}
		}
	})
	for _, a := range names {
		leaf := firstCert(s.leaves[a].Data[corev1.TLSCertKey])
		if leaf == nil {
			return fmt.Errorf("%s: no certificate", a)
		}
		for _, b := range names {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(s.leaves[b].Data[corev1.ServiceAccountRootCAKey])
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				return fmt.Errorf("the certificate in %s does not verify against the bundle in %s: %w", a, b, err)
			}
		}
	}
	return nil
}

func (s tlsSnapshot) serials() map[string]string {
	out := map[string]string{}
	for n, l := range s.leaves {
		if c := firstCert(l.Data[corev1.TLSCertKey]); c != nil {
			out[n] = c.SerialNumber.String()
		}
	}
	return out
}

// TestShardMapTLSManaged: mode Managed creates the CA and every
// certificate with the right identities, mounts them in the controller
// pods, renews certificates two thirds into their lifetime and rotates the
// CA without a moment where two pods' Secrets do not fit together, waiting
// the propagation time before the new CA signs and before the old one is
// dropped.
func TestShardMapTLSManaged(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	clock := &fakeClock{t: time.Now()}
	const propagation = 30 * time.Second
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) {
		r.now = clock.Now
		r.TLSPropagation = propagation
	}))
	sm := tlsShardMap(ns, "sec")
	mustCreate(t, sm)
	createGroup(t, ns, "sec-a", "sec", 1)
	leaves := []string{CtrlerTLSSecretName("sec"), AdminTLSSecretName("sec"), ClientTLSSecretName("sec"), GroupTLSSecretName("sec-a")}
	want := map[string]mtls.Identity{
		leaves[0]: {Role: mtls.RoleCtrler}, leaves[1]: {Role: mtls.RoleAdmin, Name: "operator"},
		leaves[2]: {Role: mtls.RoleClient, Name: "sec"}, leaves[3]: {Role: mtls.RoleGroup, Group: 1},
	}
	var snap tlsSnapshot
	eventually(t, "the CA and the certificates", func() (err error) {
		snap, err = readTLS(ns, "sec", leaves...)
		return err
	})
	if err := snap.compatible(clock.Now()); err != nil {
		t.Fatal(err)
	}
	for n, id := range want {
		c := firstCert(snap.leaves[n].Data[corev1.TLSCertKey])
		if got, err := mtls.IdentityOf(c); err != nil || got != id {
			t.Errorf("%s names %v (%v), want %v", n, got, err, id)
		}
		if life := c.NotAfter.Sub(c.NotBefore); life < 23*time.Hour || life > 25*time.Hour {
			t.Errorf("%s: lifetime %s, want spec.tls.certificateLifetime 24h", n, life)
		}
	}
	rg := &shardkvv1.ReplicaGroup{}
	if err := get(context.Background(), ns, "sec-a", rg); err != nil {
		t.Fatal(err)
	}
	if !metav1.IsControlledBy(snap.leaves[leaves[3]], rg) {
		t.Errorf("%s is not owned by its ReplicaGroup: %v", leaves[3], snap.leaves[leaves[3]].OwnerReferences)
	}
	if _, ok := snap.ca.Data[corev1.TLSPrivateKeyKey]; !ok {
		t.Fatal("the CA Secret holds no key")
	}
	for n, l := range snap.leaves {
		if _, ok := l.Data["next.key"]; ok || len(parsePEMCerts(l.Data[corev1.ServiceAccountRootCAKey])) != 1 {
			t.Errorf("%s: want one CA in ca.crt and no CA key", n)
		}
	}

	// The controller pods mount theirs and speak TLS.
	sts := &appsv1.StatefulSet{}
	eventually(t, "controller StatefulSet", func() error { return get(context.Background(), ns, CtrlerName("sec"), sts) })
	pod := sts.Spec.Template.Spec
	if len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil || pod.Volumes[0].Secret.SecretName != leaves[0] {
		t.Errorf("controller pod volumes %+v, want the Secret %s", pod.Volumes, leaves[0])
	}
	args := strings.Join(pod.Containers[0].Args, " ")
	for _, f := range []string{"--tls-cert=/etc/shardkv/tls/tls.crt", "--tls-key=/etc/shardkv/tls/tls.key", "--tls-ca=/etc/shardkv/tls/ca.crt", "--http-open=/healthz,/readyz"} {
		if !strings.Contains(args, f) {
			t.Errorf("controller args %q lack %s", args, f)
		}
	}
	if s := pod.Containers[0].ReadinessProbe.HTTPGet.Scheme; s != corev1.URISchemeHTTPS {
		t.Errorf("readiness probe scheme %q, want HTTPS", s)
	}

	// Renewal: two thirds into the 24h lifetime, every certificate is
	// issued again by the same CA.
	before := snap.serials()
	clock.Advance(17 * time.Hour)
	eventually(t, "renewed certificates", func() error {
		s, err := readTLS(ns, "sec", leaves...)
		if err != nil {
			return err
		}
		for n, serial := range s.serials() {
			if serial == before[n] {
				return fmt.Errorf("%s not renewed yet", n)
			}
		}
		snap = s
		return nil
	})
	expectEvent(t, ns, "sec", "Certificates", "two thirds of its lifetime passed")

	// CA rotation, asked for by annotation. The clock moves 5s per
	// check; every snapshot must be compatible.
	oldCA := firstCert(snap.ca.Data[corev1.TLSCertKey])
	eventually(t, "annotate the ShardMap", func() error { // the operator updates its status meanwhile
		smNow := &shardkvv1.ShardMap{}
		if err := get(context.Background(), ns, "sec", smNow); err != nil {
			return err
		}
		setAnnotation(smNow, AnnotationRotateCA, "1")
		return k8sClient.Update(context.Background(), smNow)
	})
	var promotedAt, markedAt time.Time
	phases := []string{}
	eventuallyWithin(t, 60*time.Second, "CA rotation done", func() error {
		s, err := readTLS(ns, "sec", leaves...)
		if err != nil {
			return err
		}
		now := clock.Now()
		if err := s.compatible(now); err != nil {
			t.Fatalf("at %s (phase %q): %v", now, s.ca.Annotations[annotationCAPhase], err)
		}
		phase := s.ca.Annotations[annotationCAPhase]
		if len(phases) == 0 || phases[len(phases)-1] != phase {
			phases = append(phases, phase)
		}
		if m, err := time.Parse(time.RFC3339, s.ca.Annotations[annotationCAMarkedAt]); err == nil && phase == caStaged {
			markedAt = m
		}
		active := firstCert(s.ca.Data[corev1.TLSCertKey])
		if phase == caPromoted && promotedAt.IsZero() {
			promotedAt = now
			if !markedAt.IsZero() && now.Sub(markedAt) < propagation {
				t.Fatalf("the new CA was promoted %s after every Secret carried it, before the propagation time %s", now.Sub(markedAt), propagation)
			}
		}
		clock.Advance(5 * time.Second)
		if phase != "" || active.Equal(oldCA) {
			return fmt.Errorf("phase %q", phase)
		}
		for n, l := range s.leaves {
			if c := firstCert(l.Data[corev1.TLSCertKey]); !signedBy(c, active) {
				return fmt.Errorf("%s not signed by the new CA yet", n)
			}
			if got := len(parsePEMCerts(l.Data[corev1.ServiceAccountRootCAKey])); got != 1 {
				return fmt.Errorf("%s: %d CAs in its bundle, want the new one only", n, got)
			}
		}
		return nil
	})
	// Each phase lasts at least the propagation time on the clock, which
	// moves 5s per poll: every poll after the annotation sees them.
	if len(phases) > 0 && phases[0] == "" {
		phases = phases[1:]
	}
	if !slices.Equal(phases, []string{caStaged, caPromoted, ""}) || markedAt.IsZero() || promotedAt.IsZero() {
		t.Errorf("phases %v (marked %s, promoted %s), want Staged then Promoted then done", phases, markedAt, promotedAt)
	}
	expectEvent(t, ns, "sec", "Certificates", "the old CA is dropped")
}

// TestShardMapTLSModeImmutable: the API server refuses switching a running
// cluster between plain text and TLS, with the reason.
func TestShardMapTLSModeImmutable(t *testing.T) {
	requireEnvtest(t)
	ns := newNamespace(t)
	ctx := context.Background()
	plain := testShardMap(ns, "plain", 8, 1)
	mustCreate(t, plain)
	plain.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSManaged}
	err := k8sClient.Update(ctx, plain)
	if err == nil || !strings.Contains(err.Error(), "tls.mode cannot change on a running cluster") {
		t.Fatalf("plain -> Managed: %v, want refused", err)
	}
	sec := tlsShardMap(ns, "sec")
	mustCreate(t, sec)
	sec.Spec.TLS.Mode = shardkvv1.TLSDisabled
	if err := k8sClient.Update(ctx, sec); err == nil || !strings.Contains(err.Error(), "tls.mode cannot change") {
		t.Fatalf("Managed -> Disabled: %v, want refused", err)
	}
	cm := testShardMap(ns, "cm", 8, 1)
	cm.Spec.TLS = &shardkvv1.TLSSpec{Mode: shardkvv1.TLSCertManager}
	if err := k8sClient.Create(ctx, cm); err == nil || !strings.Contains(err.Error(), "issuerRef is required") {
		t.Fatalf("CertManager without issuerRef: %v, want refused", err)
	}
}

// TestShardMapUsers: spec.users' Secret becomes the controller's managed
// users in canonical form (passwords hashed); a change is applied; an
// invalid Secret changes nothing and says why.
func TestShardMapUsers(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupShardMap(dp))
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "users"},
		StringData: map[string]string{"acl": "user app on >s3cret ~app:* +@read +@write\n# a comment\nuser default off\n"}}
	mustCreate(t, secret)
	sm := testShardMap(ns, "acl", 8, 1)
	sm.Spec.Users = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "users"}, Key: "acl"}
	mustCreate(t, sm)
	markCtrlerReady(t, ns, "acl", 1)
	fc := dp.Ctrler(ns, "acl")
	fc.SetLeader(1)
	usersOf := func() (string, error) {
		rep, err := fc.Users(ctx)
		if err != nil {
			return "", err
		}
		var parts []string
		for _, u := range rep.Users {
			parts = append(parts, fmt.Sprintf("%s[%s]managed=%v", u.Name, u.Spec, u.Managed))
		}
		return strings.Join(parts, " "), nil
	}
	eventually(t, "the Secret's users", func() error {
		got, err := usersOf()
		if err != nil {
			return err
		}
		if !strings.Contains(got, "app[on #") || !strings.Contains(got, "default[off") || strings.Contains(got, "s3cret") {
			return fmt.Errorf("users %s", got)
		}
		return nil
	})

	// A change: app goes, ops comes.
	secret.StringData = map[string]string{"acl": "user ops on >pw ~* +@all\n"}
	if err := k8sClient.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the changed users", func() error {
		got, err := usersOf()
		if err != nil {
			return err
		}
		if !strings.HasPrefix(got, "ops[on #") || strings.Contains(got, "app[") || strings.Contains(got, "default[") {
			return fmt.Errorf("users %s", got)
		}
		return nil
	})

	// Invalid: nothing changes, Degraded says which line.
	secret.StringData = map[string]string{"acl": "user ops on >pw ~* +@all\nuser bad +frobnicate|x|y\n"}
	if err := k8sClient.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waitSM(t, ns, "acl", "Degraded UsersInvalid", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionDegraded, metav1.ConditionTrue, ReasonUsersInvalid, "line 2")
	})
	if got, _ := usersOf(); !strings.HasPrefix(got, "ops[on #") {
		t.Fatalf("users changed by an invalid Secret: %s", got)
	}
}

// TestShardMapTLSSecretConflict: a Secret of a certificate's name that is
// not the cluster's is left alone, and the ShardMap says so. The manager's
// cache holds only labelled Secrets, as cmd/manager's does, so it does not
// see theirs: its create is refused, and that is the wait.
func TestShardMapTLSSecretConflict(t *testing.T) {
	ns := newNamespace(t)
	if err := bindOperator(context.Background(), ns, "manager-role"); err != nil {
		t.Fatal(err)
	}
	newOperatorManager(t, ns, func(o *ctrl.Options) { o.Cache.ByObject = CacheByObject() }, setupShardMap(newFakeDataPlane()))
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ClientTLSSecretName("sec")}, StringData: map[string]string{"x": "theirs"}}
	mustCreate(t, theirs)
	mustCreate(t, tlsShardMap(ns, "sec"))
	waitSM(t, ns, "sec", "the conflict in Progressing", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForTLS, "already exists and is not managed by this cluster")
	})
	expectEvent(t, ns, "sec", "SecretConflict", ClientTLSSecretName("sec"))
	s := &corev1.Secret{}
	if err := get(context.Background(), ns, theirs.Name, s); err != nil || string(s.Data["x"]) != "theirs" || len(s.OwnerReferences) != 0 {
		t.Fatalf("their Secret was changed: %v %+v", err, s)
	}
}
