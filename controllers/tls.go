package controllers

// TLS of a ShardMap in mode Managed (docs/security.md): the operator is the
// cluster's CA. This file is the pure part: the Secrets a cluster needs,
// what each must hold, and the one next change (planTLS). The reconciler
// observes the Secrets (observeTLS) and writes one per pass (tls_execute.go).
//
// The CA Secret <sm>-ca holds the signing CA (tls.crt, tls.key) and the
// trust bundle every pod and client loads (ca.crt). A CA rotation never
// leaves a pod that cannot verify a peer:
//
//  1. Stage: a new CA is made (next.crt, next.key) and added to the bundle;
//     every leaf Secret is given the new bundle.
//  2. Once all leaves carry it, the time is marked; after the propagation
//     time (kubelet's refresh of mounted Secrets, then the pods' reload) the
//     new CA is promoted: it signs from now on.
//  3. Every leaf signed by the old CA is issued again; once none is left,
//     the time is marked, and after the propagation time the old CA is
//     dropped from the bundle (and from every leaf's ca.crt).

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
)

// RESPTLSPort is the Redis port over TLS (Redis's tls-port) of data-group
// pods with TLS on.
const RESPTLSPort = 6380

// TLSMountPath is where the pods mount their certificate Secret
// (tls.crt, tls.key, ca.crt).
const TLSMountPath = "/etc/shardkv/tls"

// The Secrets of a ShardMap with TLS.
func CASecretName(sm string) string        { return sm + "-ca" }
func CtrlerTLSSecretName(sm string) string { return sm + "-ctrler-tls" }
func GroupTLSSecretName(rg string) string  { return rg + "-tls" }
func AdminTLSSecretName(sm string) string  { return sm + "-admin-tls" }
func ClientTLSSecretName(sm string) string { return sm + "-client-tls" }
func tlsSecretHosts(set, ns string) []string {
	return []string{"*." + set + "." + ns + ".svc", "*." + set + "." + ns + ".svc.cluster.local", set + "." + ns + ".svc"}
}

// Keys of the CA Secret beyond a TLS Secret's.
const (
	caNextCert = "next.crt"
	caNextKey  = "next.key"
)

// Annotations of the TLS Secrets and ShardMaps.
const (
	// AnnotationRotateCertificates on a ShardMap: when its value changes,
	// every certificate is issued again (a manual renewal).
	AnnotationRotateCertificates = "shardkv.io/rotate-certificates"
	// AnnotationRotateCA on a ShardMap: when its value changes, the CA is
	// rotated (as when it is due).
	AnnotationRotateCA = "shardkv.io/rotate-ca"
	// annotationRotation on a leaf Secret: the rotate-certificates value
	// it was issued under.
	annotationRotation = "shardkv.io/rotation"
	// On the CA Secret: the rotation's phase (caStaged, caPromoted; ""
	// steady), when its wait began (RFC 3339; "" not yet), and the
	// rotate-ca value handled last.
	annotationCAPhase    = "shardkv.io/ca-phase"
	annotationCAMarkedAt = "shardkv.io/ca-marked-at"
	annotationCAToken    = "shardkv.io/ca-rotation"
)

const (
	caStaged   = "Staged"
	caPromoted = "Promoted"
)

// DefaultTLSPropagation is how long the operator lets a Secret change reach
// every pod before it relies on it: kubelet refreshes mounted Secrets on
// its sync period (1 min by default) and node re-reads them every 5 s.
const DefaultTLSPropagation = 2 * time.Minute

// tlsLeaf is one certificate Secret the cluster needs.
type tlsLeaf struct {
	Secret   string
	Identity mtls.Identity
	Hosts    []string
	// Group is the ReplicaGroup owning the Secret ("": the ShardMap).
	Group string
}

// wantLeaves are the certificate Secrets of ShardMap sm: the controller
// group's, the operator's (admin), an application's (client), and one per
// data group that has a group id, by name.
func wantLeaves(sm *shardkvv1.ShardMap, groups map[string]*shardkvv1.ReplicaGroup) []tlsLeaf {
	ns := sm.Namespace
	out := []tlsLeaf{
		{Secret: CtrlerTLSSecretName(sm.Name), Identity: mtls.Identity{Role: mtls.RoleCtrler}, Hosts: tlsSecretHosts(CtrlerName(sm.Name), ns)},
		{Secret: AdminTLSSecretName(sm.Name), Identity: mtls.Identity{Role: mtls.RoleAdmin, Name: "operator"}},
		{Secret: ClientTLSSecretName(sm.Name), Identity: mtls.Identity{Role: mtls.RoleClient, Name: sm.Name}},
	}
	names := make([]string, 0, len(groups))
	for n, rg := range groups {
		if rg.Status.GroupID > 0 && rg.DeletionTimestamp.IsZero() {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		out = append(out, tlsLeaf{Secret: GroupTLSSecretName(n), Identity: mtls.Identity{Role: mtls.RoleGroup, Group: uint64(groups[n].Status.GroupID)},
			Hosts: tlsSecretHosts(n, ns), Group: n})
	}
	return out
}

// tlsObserved is what planTLS decides from.
type tlsObserved struct {
	Now                  time.Time
	Lifetime, CALifetime time.Duration
	Propagation          time.Duration
	// RotateCerts and RotateCA are the ShardMap's rotation annotations.
	RotateCerts, RotateCA string
	// CA is the CA Secret (nil: none); Leaves the leaf Secrets by name
	// (absent: none). Conflicts are Secrets of these names the cluster
	// does not own.
	CA        *corev1.Secret
	Leaves    map[string]*corev1.Secret
	Want      []tlsLeaf
	Conflicts []string
	// CertManager is set in mode CertManager (and CA is nil); SM is the
	// ShardMap, whose name and namespace its Certificates carry.
	CertManager *certManagerObserved
	SM          *shardkvv1.ShardMap
}

// tlsStepKind is a TLS change.
type tlsStepKind string

const (
	tlsNone         tlsStepKind = ""
	tlsCreateCA     tlsStepKind = "CreateCA"
	tlsStageCA      tlsStepKind = "StageCA"
	tlsMarkCA       tlsStepKind = "MarkCA" // the phase's wait begins
	tlsPromoteCA    tlsStepKind = "PromoteCA"
	tlsTrimCA       tlsStepKind = "TrimCABundle"
	tlsIssue        tlsStepKind = "IssueCertificate"
	tlsUpdateBundle tlsStepKind = "UpdateCABundle"
	// mode CertManager: create or update the Certificate of Leaf.
	tlsApplyCertificate tlsStepKind = "ApplyCertificate"
)

// tlsStep is one TLS change: Leaf for tlsIssue and tlsUpdateBundle; Why
// says what made it due (for the Event).
type tlsStep struct {
	Kind tlsStepKind
	Leaf tlsLeaf
	Why  string
}

// parsePEMCerts are the certificates of a PEM bundle, in order.
func parsePEMCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type == "CERTIFICATE" {
			if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
				out = append(out, c)
			}
		}
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func firstCert(b []byte) *x509.Certificate {
	if cs := parsePEMCerts(b); len(cs) > 0 {
		return cs[0]
	}
	return nil
}

// due reports whether a certificate is two thirds through its validity.
func due(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return !now.Before(c.NotBefore.Add(life * 2 / 3))
}

// signedBy reports whether leaf verifies against ca.
func signedBy(leaf, ca *x509.Certificate) bool {
	return ca != nil && leaf.CheckSignatureFrom(ca) == nil
}

// caBundle is the trust bundle the CA Secret publishes, without expired
// certificates.
func (o *tlsObserved) caBundle() []byte { return o.CA.Data[corev1.ServiceAccountRootCAKey] }

// planTLS is the one next TLS change, or what the TLS setup waits for.
// Leaves come first (a missing certificate keeps pods from starting),
// then the CA rotation.
func planTLS(o *tlsObserved) (step tlsStep, wait string) {
	if o.CertManager != nil {
		return planCertManager(o, o.SM)
	}
	if len(o.Conflicts) > 0 {
		return tlsStep{}, fmt.Sprintf("Secrets %v exist and are not this cluster's: rename or delete them", o.Conflicts)
	}
	if o.CA == nil {
		return tlsStep{Kind: tlsCreateCA, Why: "the cluster has no CA"}, ""
	}
	active := firstCert(o.CA.Data[corev1.TLSCertKey])
	if active == nil {
		return tlsStep{}, fmt.Sprintf("Secret %s holds no CA certificate in tls.crt", o.CA.Name)
	}
	bundle := o.caBundle()
	phase := o.CA.Annotations[annotationCAPhase]
	for _, l := range o.Want {
		s := o.Leaves[l.Secret]
		if s == nil {
			return tlsStep{Kind: tlsIssue, Leaf: l, Why: "new"}, ""
		}
		leaf := firstCert(s.Data[corev1.TLSCertKey])
		var why string
		switch {
		case leaf == nil:
			why = "no certificate in it"
		case !signedBy(leaf, active):
			why = "signed by a CA that no longer signs"
		case !sameIdentity(leaf, l.Identity):
			why = "names another identity"
		case due(leaf, o.Now):
			why = fmt.Sprintf("two thirds of its lifetime passed (expires %s)", leaf.NotAfter.UTC().Format(time.RFC3339))
		case s.Annotations[annotationRotation] != o.RotateCerts:
			why = fmt.Sprintf("%s changed", AnnotationRotateCertificates)
		}
		if why != "" {
			return tlsStep{Kind: tlsIssue, Leaf: l, Why: why}, ""
		}
		if !bytes.Equal(s.Data[corev1.ServiceAccountRootCAKey], bundle) {
			return tlsStep{Kind: tlsUpdateBundle, Leaf: l, Why: "the CA bundle changed"}, ""
		}
	}
	// Every leaf is current, signed by the active CA and carries the
	// bundle: the CA rotation may go on.
	marked, _ := time.Parse(time.RFC3339, o.CA.Annotations[annotationCAMarkedAt])
	switch phase {
	case caStaged:
		if marked.IsZero() {
			return tlsStep{Kind: tlsMarkCA, Why: "every certificate Secret carries the new CA"}, ""
		}
		if left := marked.Add(o.Propagation).Sub(o.Now); left > 0 {
			return tlsStep{}, fmt.Sprintf("CA rotation: waiting %s for every pod to load the bundle with the new CA before it signs", left.Round(time.Second))
		}
		return tlsStep{Kind: tlsPromoteCA, Why: "every pod trusts the new CA"}, ""
	case caPromoted:
		if marked.IsZero() {
			return tlsStep{Kind: tlsMarkCA, Why: "every certificate is signed by the new CA"}, ""
		}
		if left := marked.Add(o.Propagation).Sub(o.Now); left > 0 {
			return tlsStep{}, fmt.Sprintf("CA rotation: waiting %s for every pod to load its new certificate before the old CA is dropped", left.Round(time.Second))
		}
		return tlsStep{Kind: tlsTrimCA, Why: "every pod presents a certificate of the new CA"}, ""
	}
	switch {
	case o.RotateCA != "" && o.CA.Annotations[annotationCAToken] != o.RotateCA:
		return tlsStep{Kind: tlsStageCA, Why: fmt.Sprintf("%s changed", AnnotationRotateCA)}, ""
	case due(active, o.Now):
		return tlsStep{Kind: tlsStageCA, Why: fmt.Sprintf("two thirds of the CA's lifetime passed (expires %s)", active.NotAfter.UTC().Format(time.RFC3339))}, ""
	}
	return tlsStep{}, ""
}

// sameIdentity reports whether c names id (names aside for nodes).
func sameIdentity(c *x509.Certificate, id mtls.Identity) bool {
	got, err := mtls.IdentityOf(c)
	return err == nil && got == id
}

// certManagerObserved is mode CertManager's view: the cluster's
// Certificate objects by name (the name of the Secret they fill).
type certManagerObserved struct {
	Issuer shardkvv1.IssuerRef
	Certs  map[string]*unstructured.Unstructured
	// Err: the Certificates could not be read (cert-manager not installed).
	Err error
	// IssuerProblem is what keeps the Issuer from signing, read when a
	// Secret is not issued yet ("": none seen, or not checked: a
	// ClusterIssuer or an issuer of another group).
	IssuerProblem string
}

// certificateGVK is cert-manager's Certificate.
var certificateGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}

// annotationCertSpec on a Certificate: the hash of the spec the operator
// last wrote, so a change of the desired spec is seen without comparing
// against cert-manager's defaults.
const annotationCertSpec = "shardkv.io/spec-hash"

// desiredCertificate is the cert-manager Certificate of leaf l: the same
// identity (URI SAN), hosts and usages as mode Managed issues, renewed a
// third of its lifetime before it expires, with a new key each time, and
// the Secret labelled so that the operator's cache holds it.
func desiredCertificate(sm *shardkvv1.ShardMap, l tlsLeaf, lifetime time.Duration, issuer shardkvv1.IssuerRef) *unstructured.Unstructured {
	kind, group := issuer.Kind, issuer.Group
	if kind == "" {
		kind = "Issuer"
	}
	if group == "" {
		group = "cert-manager.io"
	}
	labels := map[string]any{}
	for k, v := range tlsLabels(sm.Name) {
		labels[k] = v
	}
	spec := map[string]any{
		"secretName":     l.Secret,
		"secretTemplate": map[string]any{"labels": labels},
		"uris":           []any{l.Identity.URI().String()},
		"duration":       lifetime.String(),
		"renewBefore":    (lifetime / 3).String(),
		"usages":         []any{"digital signature", "server auth", "client auth"},
		"privateKey":     map[string]any{"algorithm": "ECDSA", "size": int64(256), "rotationPolicy": "Always"},
		"issuerRef":      map[string]any{"name": issuer.Name, "kind": kind, "group": group},
	}
	// The identity is the URI SAN; the common name only tells people
	// which certificate it is, and cert-manager refuses one longer than
	// X.509's 64 characters (a client/<ShardMap> of a long name).
	if cn := "shardkv " + l.Identity.String(); len(cn) <= maxCommonName {
		spec["commonName"] = cn
	}
	if len(l.Hosts) > 0 {
		hosts := make([]any, len(l.Hosts))
		for i, h := range l.Hosts {
			hosts[i] = h
		}
		spec["dnsNames"] = hosts
	}
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(certificateGVK)
	u.SetNamespace(sm.Namespace)
	u.SetName(l.Secret)
	u.SetLabels(tlsLabels(sm.Name))
	u.SetAnnotations(map[string]string{annotationCertSpec: contentHash(spec)})
	return u
}

// maxCommonName is X.509's upper bound of a common name (RFC 5280
// ub-common-name), which cert-manager's webhook enforces.
const maxCommonName = 64

// planCertManager is mode CertManager's one next change: a Certificate to
// create or update; else what waits for cert-manager.
func planCertManager(o *tlsObserved, sm *shardkvv1.ShardMap) (tlsStep, string) {
	cm := o.CertManager
	if cm.Err != nil {
		return tlsStep{}, fmt.Sprintf("cannot read cert-manager Certificates (is cert-manager installed?): %v", cm.Err)
	}
	if len(o.Conflicts) > 0 {
		return tlsStep{}, fmt.Sprintf("objects %v exist and are not this cluster's: rename or delete them", o.Conflicts)
	}
	var waits, unissued []string
	for _, l := range o.Want {
		want := desiredCertificate(sm, l, o.Lifetime, cm.Issuer)
		have := cm.Certs[l.Secret]
		switch {
		case have == nil:
			return tlsStep{Kind: tlsApplyCertificate, Leaf: l, Why: "new"}, ""
		case have.GetAnnotations()[annotationCertSpec] != want.GetAnnotations()[annotationCertSpec]:
			return tlsStep{Kind: tlsApplyCertificate, Leaf: l, Why: "its spec changed"}, ""
		}
		if o.Leaves[l.Secret] == nil {
			waits = append(waits, fmt.Sprintf("Secret %s (Certificate %s: %s)", l.Secret, l.Secret, certificateReadiness(have)))
			unissued = append(unissued, l.Secret)
		}
	}
	switch {
	case len(waits) > 0 && cm.IssuerProblem != "":
		// The cause, not each Certificate's "Issuing" state.
		return tlsStep{}, fmt.Sprintf("waiting for cert-manager to issue Secrets %s: %s", strings.Join(unissued, ", "), cm.IssuerProblem)
	case len(waits) > 0:
		return tlsStep{}, "waiting for cert-manager to issue " + strings.Join(waits, "; ")
	}
	return tlsStep{}, ""
}

// certificateReadiness is a Certificate's Ready condition, as text.
func certificateReadiness(u *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Ready" {
			return fmt.Sprintf("Ready=%v %v: %v", m["status"], m["reason"], m["message"])
		}
	}
	return "no Ready condition yet"
}
