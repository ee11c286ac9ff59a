package controllers

// The ShardMap reconciler's TLS (mode Managed): observing the cluster's
// certificate Secrets for planTLS (tls.go) and writing the one Secret a
// step changes.

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// Default lifetimes (the CRD's defaults, for objects written before them).
const (
	defaultCertificateLifetime = 90 * 24 * time.Hour
	defaultCALifetime          = 5 * 365 * 24 * time.Hour
)

// tlsLabels are the labels of every TLS Secret of ShardMap sm: the
// operator's cache holds only Secrets labelled managed-by.
func tlsLabels(sm string) map[string]string {
	return map[string]string{LabelName: "shardkv", LabelInstance: sm, LabelManagedBy: ManagedBy}
}

func (r *ShardMapReconciler) tlsPropagation() time.Duration {
	return orDefault(r.TLSPropagation, DefaultTLSPropagation)
}

// observeTLS reads the cluster's TLS Secrets, and in mode CertManager its
// Certificates (nil: TLS is off).
func (r *ShardMapReconciler) observeTLS(ctx context.Context, sm *shardkvv1.ShardMap, groups map[string]*shardkvv1.ReplicaGroup) (*tlsObserved, error) {
	spec := sm.Spec.TLS
	if !sm.Spec.TLSEnabled() {
		return nil, nil
	}
	o := &tlsObserved{
		Now:         r.clock(),
		Lifetime:    defaultCertificateLifetime,
		CALifetime:  defaultCALifetime,
		Propagation: r.tlsPropagation(),
		RotateCerts: sm.Annotations[AnnotationRotateCertificates],
		RotateCA:    sm.Annotations[AnnotationRotateCA],
		Leaves:      map[string]*corev1.Secret{},
		Want:        wantLeaves(sm, groups),
		SM:          sm,
	}
	if spec.CertificateLifetime != nil && spec.CertificateLifetime.Duration > 0 {
		o.Lifetime = spec.CertificateLifetime.Duration
	}
	if spec.CALifetime != nil && spec.CALifetime.Duration > 0 {
		o.CALifetime = spec.CALifetime.Duration
	}
	get := func(name string, owner metav1.Object) (*corev1.Secret, error) {
		s := &corev1.Secret{}
		switch err := r.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: name}, s); {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		}
		if !metav1.IsControlledBy(s, owner) {
			o.Conflicts = append(o.Conflicts, name)
			return nil, nil
		}
		return s, nil
	}
	if spec.Mode == shardkvv1.TLSCertManager {
		return o, r.observeCertificates(ctx, sm, o, groups)
	}
	var err error
	if o.CA, err = get(CASecretName(sm.Name), sm); err != nil {
		return nil, err
	}
	for _, l := range o.Want {
		s, err := get(l.Secret, leafOwner(sm, groups, l))
		if err != nil {
			return nil, err
		}
		if s != nil {
			o.Leaves[l.Secret] = s
		}
	}
	return o, nil
}

// leafOwner is the object that owns leaf l's Secret (mode Managed) or
// Certificate (mode CertManager): its ReplicaGroup, or the ShardMap.
func leafOwner(sm *shardkvv1.ShardMap, groups map[string]*shardkvv1.ReplicaGroup, l tlsLeaf) client.Object {
	if l.Group != "" {
		return groups[l.Group]
	}
	return sm
}

// observeCertificates reads mode CertManager's Certificates (from the API
// server: they are few, and the cache would need list and watch on every
// Certificate of the cluster) and the Secrets cert-manager filled.
func (r *ShardMapReconciler) observeCertificates(ctx context.Context, sm *shardkvv1.ShardMap, o *tlsObserved, groups map[string]*shardkvv1.ReplicaGroup) error {
	o.CertManager = &certManagerObserved{Issuer: *sm.Spec.TLS.IssuerRef, Certs: map[string]*unstructured.Unstructured{}}
	reader := r.apiReader()
	for _, l := range o.Want {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(certificateGVK)
		switch err := reader.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: l.Secret}, u); {
		case apierrors.IsNotFound(err):
		case err != nil:
			o.CertManager.Err = err
			return nil
		case !metav1.IsControlledBy(u, leafOwner(sm, groups, l)):
			o.Conflicts = append(o.Conflicts, "Certificate "+l.Secret)
		default:
			o.CertManager.Certs[l.Secret] = u
		}
		// cert-manager's Secret: labelled by the Certificate's
		// secretTemplate, owned by no one (or the Certificate).
		s := &corev1.Secret{}
		switch err := r.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: l.Secret}, s); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if len(s.Data[corev1.TLSCertKey]) > 0 {
				o.Leaves[l.Secret] = s
			}
		}
	}
	if len(o.Leaves) < len(o.Want) {
		o.CertManager.IssuerProblem = r.issuerProblem(ctx, sm)
	}
	return nil
}

// RBAC: the Issuer of spec.tls.issuerRef is read to say why certificates
// are not issued.
//
// +kubebuilder:rbac:groups=cert-manager.io,resources=issuers,verbs=get

// issuerGVK is cert-manager's Issuer.
var issuerGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Issuer"}

// issuerProblem says why spec.tls.issuerRef's Issuer cannot sign: it does
// not exist, or is not Ready (cert-manager's reason); "" when it is Ready
// or is not a cert-manager Issuer of the ShardMap's namespace (a
// ClusterIssuer is cluster-wide, which the operator's Role may not read).
func (r *ShardMapReconciler) issuerProblem(ctx context.Context, sm *shardkvv1.ShardMap) string {
	ref := sm.Spec.TLS.IssuerRef
	if (ref.Kind != "" && ref.Kind != issuerGVK.Kind) || (ref.Group != "" && ref.Group != issuerGVK.Group) {
		return ""
	}
	reader := r.apiReader()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(issuerGVK)
	switch err := reader.Get(ctx, client.ObjectKey{Namespace: sm.Namespace, Name: ref.Name}, u); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("Issuer %s does not exist in namespace %s (spec.tls.issuerRef)", ref.Name, sm.Namespace)
	case err != nil:
		return fmt.Sprintf("cannot read Issuer %s: %v", ref.Name, err)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			if m["status"] == "True" {
				return ""
			}
			return fmt.Sprintf("Issuer %s is not ready (Ready=%v %v: %v)", ref.Name, m["status"], m["reason"], m["message"])
		}
	}
	return fmt.Sprintf("Issuer %s is not ready (no Ready condition yet: is cert-manager running?)", ref.Name)
}

// executeTLS writes the Secret step st changes.
func (r *ShardMapReconciler) executeTLS(ctx context.Context, sm *shardkvv1.ShardMap, o *smObserved, st tlsStep) (smOutcome, error) {
	t := o.TLS
	action := string(st.Kind)
	done := func(format string, args ...any) (smOutcome, error) {
		msg := fmt.Sprintf(format, args...)
		r.event(sm, corev1.EventTypeNormal, "Certificates", action, "%s (%s)", msg, st.Why)
		return objectsUpdated("%s", msg), nil
	}
	now := t.Now
	switch st.Kind {
	case tlsCreateCA:
		ca, err := mtls.NewCA(fmt.Sprintf("shardkv %s/%s CA", sm.Namespace, sm.Name), t.CALifetime)
		if err != nil {
			return smOutcome{}, err
		}
		keyPEM, err := ca.KeyPEM()
		if err != nil {
			return smOutcome{}, err
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: CASecretName(sm.Name), Namespace: sm.Namespace, Labels: tlsLabels(sm.Name),
				Annotations: map[string]string{annotationCAToken: t.RotateCA}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM(), corev1.TLSPrivateKeyKey: keyPEM, corev1.ServiceAccountRootCAKey: ca.CertPEM()},
		}
		if err := r.createSecretOwned(ctx, sm, s); err != nil {
			return r.secretWriteFailed(sm, action, err)
		}
		return done("created the cluster's CA in Secret %s, valid until %s", s.Name, ca.NotAfter().UTC().Format(time.RFC3339))

	case tlsStageCA:
		ca, err := mtls.NewCA(fmt.Sprintf("shardkv %s/%s CA %s", sm.Namespace, sm.Name, now.UTC().Format("2006-01-02")), t.CALifetime)
		if err != nil {
			return smOutcome{}, err
		}
		keyPEM, err := ca.KeyPEM()
		if err != nil {
			return smOutcome{}, err
		}
		s := t.CA.DeepCopy()
		s.Data[caNextCert], s.Data[caNextKey] = ca.CertPEM(), keyPEM
		s.Data[corev1.ServiceAccountRootCAKey] = appendBundle(unexpired(t.caBundle(), now), ca.CertPEM())
		setAnnotation(s, annotationCAPhase, caStaged)
		setAnnotation(s, annotationCAMarkedAt, "")
		setAnnotation(s, annotationCAToken, t.RotateCA)
		if err := r.Update(ctx, s); err != nil {
			return smOutcome{}, err
		}
		return done("CA rotation: a new CA is added to the trust bundle of Secret %s; it signs once every pod trusts it", s.Name)

	case tlsMarkCA:
		s := t.CA.DeepCopy()
		setAnnotation(s, annotationCAMarkedAt, now.UTC().Format(time.RFC3339))
		if err := r.Update(ctx, s); err != nil {
			return smOutcome{}, err
		}
		return done("CA rotation: waiting %s for the pods to load the change", t.Propagation)

	case tlsPromoteCA:
		s := t.CA.DeepCopy()
		if len(s.Data[caNextCert]) == 0 || len(s.Data[caNextKey]) == 0 {
			return smOutcome{}, fmt.Errorf("secret %s is in CA phase %s but holds no %s/%s", s.Name, caStaged, caNextCert, caNextKey)
		}
		s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = s.Data[caNextCert], s.Data[caNextKey]
		delete(s.Data, caNextCert)
		delete(s.Data, caNextKey)
		setAnnotation(s, annotationCAPhase, caPromoted)
		setAnnotation(s, annotationCAMarkedAt, "")
		if err := r.Update(ctx, s); err != nil {
			return smOutcome{}, err
		}
		return done("CA rotation: the new CA signs from now on; every certificate is issued again")

	case tlsTrimCA:
		s := t.CA.DeepCopy()
		s.Data[corev1.ServiceAccountRootCAKey] = unexpired(s.Data[corev1.TLSCertKey], now)
		setAnnotation(s, annotationCAPhase, "")
		setAnnotation(s, annotationCAMarkedAt, "")
		if err := r.Update(ctx, s); err != nil {
			return smOutcome{}, err
		}
		return done("CA rotation done: the old CA is dropped from the trust bundle")

	case tlsIssue:
		ca, err := mtls.ParseCA(t.CA.Data[corev1.TLSCertKey], t.CA.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			return smOutcome{}, fmt.Errorf("secret %s: %w", t.CA.Name, err)
		}
		certPEM, keyPEM, err := ca.Issue(mtls.Request{Identity: st.Leaf.Identity, Hosts: st.Leaf.Hosts, Validity: t.Lifetime, Now: now})
		if err != nil {
			return smOutcome{}, err
		}
		data := map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, corev1.ServiceAccountRootCAKey: t.caBundle()}
		if have := t.Leaves[st.Leaf.Secret]; have != nil {
			s := have.DeepCopy()
			s.Data = data
			setAnnotation(s, annotationRotation, t.RotateCerts)
			if err := r.Update(ctx, s); err != nil {
				return smOutcome{}, err
			}
			return done("issued a new certificate for %s in Secret %s", st.Leaf.Identity, s.Name)
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: st.Leaf.Secret, Namespace: sm.Namespace, Labels: tlsLabels(sm.Name),
				Annotations: map[string]string{annotationRotation: t.RotateCerts}},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		if err := r.createSecretOwned(ctx, leafOwner(sm, o.Groups, st.Leaf), s); err != nil {
			return r.secretWriteFailed(sm, action, err)
		}
		return done("issued the certificate of %s in Secret %s", st.Leaf.Identity, s.Name)

	case tlsApplyCertificate:
		want := desiredCertificate(sm, st.Leaf, t.Lifetime, t.CertManager.Issuer)
		if have := t.CertManager.Certs[st.Leaf.Secret]; have != nil {
			u := have.DeepCopy()
			u.Object["spec"] = want.Object["spec"]
			setAnnotation(u, annotationCertSpec, want.GetAnnotations()[annotationCertSpec])
			if err := r.Update(ctx, u); err != nil {
				return smOutcome{}, err
			}
			return done("updated cert-manager Certificate %s for %s", u.GetName(), st.Leaf.Identity)
		}
		if err := createOwned(ctx, r.Client, r.Scheme, leafOwner(sm, o.Groups, st.Leaf), want); err != nil {
			return smOutcome{}, err
		}
		return done("asked cert-manager for the certificate of %s (Certificate %s, issuer %s %s)", st.Leaf.Identity, want.GetName(), t.CertManager.Issuer.Kind, t.CertManager.Issuer.Name)

	case tlsUpdateBundle:
		s := t.Leaves[st.Leaf.Secret].DeepCopy()
		s.Data[corev1.ServiceAccountRootCAKey] = t.caBundle()
		if err := r.Update(ctx, s); err != nil {
			return smOutcome{}, err
		}
		return done("updated the CA bundle in Secret %s", s.Name)
	}
	return smOutcome{}, fmt.Errorf("unknown TLS step %q", st.Kind)
}

// createSecretOwned creates s owned by owner. A Secret of that name that the
// operator's cache does not show (it holds only labelled ones) is someone
// else's: that is said plainly.
func (r *ShardMapReconciler) createSecretOwned(ctx context.Context, owner client.Object, s *corev1.Secret) error {
	err := createOwned(ctx, r.Client, r.Scheme, owner, s)
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("secret %s/%s already exists and is not managed by this cluster (no %s=%s label): rename or delete it: %w",
			s.Namespace, s.Name, LabelManagedBy, ManagedBy, err)
	}
	return err
}

// secretWriteFailed: a Secret of the cluster's names that is someone
// else's is a wait the user must resolve, said in the Progressing condition
// and a Warning Event (and retried with backoff); other errors end the pass.
func (r *ShardMapReconciler) secretWriteFailed(sm *shardkvv1.ShardMap, action string, err error) (smOutcome, error) {
	if !apierrors.IsAlreadyExists(err) {
		return smOutcome{}, err
	}
	r.event(sm, corev1.EventTypeWarning, "SecretConflict", action, "%v", err)
	return smOutcome{Progress: smCondition{metav1.ConditionTrue, ReasonWaitingForTLS, err.Error()}, Err: err}, nil
}

// unexpired is the PEM bundle b without certificates expired at now.
func unexpired(b []byte, now time.Time) []byte {
	var out []byte
	for _, c := range parsePEMCerts(b) {
		if now.Before(c.NotAfter) {
			out = appendBundle(out, pemCert(c.Raw))
		}
	}
	return out
}

func appendBundle(bundle, certPEM []byte) []byte {
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	return append(bytes.Clone(bundle), certPEM...)
}
