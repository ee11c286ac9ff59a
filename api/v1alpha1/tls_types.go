package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// TLS modes (spec.tls.mode).
const (
	// TLSDisabled: plain gRPC and Redis, no authentication between pods.
	TLSDisabled = "Disabled"
	// TLSManaged: the operator runs the cluster's CA: it creates the CA
	// and every certificate in Secrets, renews them, and rotates the CA.
	TLSManaged = "Managed"
	// TLSCertManager: the operator asks cert-manager for the certificates
	// (Certificate objects signed by spec.tls.issuerRef).
	TLSCertManager = "CertManager"
)

// Redis TLS choices (spec.tls.redis).
const (
	// RedisTLSOnly: the Redis port speaks TLS only (6380).
	RedisTLSOnly = "TLS"
	// RedisTLSAndPlain: TLS on 6380 and plain text on 6379.
	RedisTLSAndPlain = "Both"
)

// TLSSpec is how the cluster's pods authenticate each other and their
// clients (docs/security.md). Every gRPC path (Raft, shard pulls, the
// controller and admin APIs, clients) is mutual TLS once it is on, and
// each side checks the other's identity.
// +kubebuilder:validation:XValidation:rule="self.mode != 'CertManager' || has(self.issuerRef)",message="tls.issuerRef is required with mode CertManager"
type TLSSpec struct {
	// Mode: Disabled, Managed (the operator's own CA) or CertManager.
	// Fixed when the cluster is created: the pods of a running cluster
	// cannot switch between plain text and TLS one at a time (a TLS pod
	// and a plain one cannot talk), so a switch is refused; see
	// docs/security.md for the procedure (a new cluster, then move the
	// data).
	// +kubebuilder:default=Disabled
	// +kubebuilder:validation:Enum=Disabled;Managed;CertManager
	// +optional
	Mode string `json:"mode,omitempty"`

	// IssuerRef is the cert-manager Issuer or ClusterIssuer that signs
	// the certificates (mode CertManager). It must put the CA in ca.crt
	// (a CA issuer does).
	// +optional
	IssuerRef *IssuerRef `json:"issuerRef,omitempty"`

	// CertificateLifetime of each pod's and client's certificate; it is
	// renewed when two thirds of it have passed.
	// +kubebuilder:default="2160h"
	// +optional
	CertificateLifetime *metav1.Duration `json:"certificateLifetime,omitempty"`

	// CALifetime of the operator's CA (mode Managed); it is rotated when
	// two thirds of it have passed, without downtime: the new CA is
	// trusted everywhere before it signs anything.
	// +kubebuilder:default="43800h"
	// +optional
	CALifetime *metav1.Duration `json:"caLifetime,omitempty"`

	// Redis: TLS (port 6380 only; plain connections are refused) or Both
	// (6380 over TLS and 6379 in plain text).
	// +kubebuilder:default=TLS
	// +kubebuilder:validation:Enum=TLS;Both
	// +optional
	Redis string `json:"redis,omitempty"`

	// RedisAuthClients is Redis's tls-auth-clients: whether Redis clients
	// must present a certificate of the cluster's CA (yes), may (optional),
	// or are not asked (no; a password or ACL user authenticates them).
	// +kubebuilder:default=no
	// +kubebuilder:validation:Enum=no;optional;yes
	// +optional
	RedisAuthClients string `json:"redisAuthClients,omitempty"`
}

// IssuerRef names a cert-manager issuer.
type IssuerRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Kind: Issuer (in the ShardMap's namespace) or ClusterIssuer.
	// +kubebuilder:default=Issuer
	// +kubebuilder:validation:Enum=Issuer;ClusterIssuer
	// +optional
	Kind string `json:"kind,omitempty"`
	// +kubebuilder:default=cert-manager.io
	// +optional
	Group string `json:"group,omitempty"`
}

// TLSEnabled reports whether the ShardMap's pods speak TLS.
func (s *ShardMapSpec) TLSEnabled() bool {
	return s.TLS != nil && s.TLS.Mode != "" && s.TLS.Mode != TLSDisabled
}
