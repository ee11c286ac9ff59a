package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkSpec is who may reach the cluster's pods. The operator enforces it
// with two NetworkPolicies owned by the ShardMap: <shardmap>-ctrler for the
// controller pods and <shardmap>-data for the pods of all its
// ReplicaGroups. The cluster's own pods and the operator's reach every port
// (gRPC 7000, Redis 6379, HTTP 8080); clients reach the client ports (Redis
// and gRPC) only; metrics scrapers the HTTP port only. Anything else is
// refused, where the cluster enforces NetworkPolicies.
type NetworkSpec struct {
	// Policies: Enabled (the default) creates and updates the
	// NetworkPolicies; Disabled creates none and deletes the ones the
	// operator made.
	// +kubebuilder:validation:Enum=Enabled;Disabled
	// +kubebuilder:default=Enabled
	// +optional
	Policies NetworkPolicyMode `json:"policies,omitempty"`

	// ClientNamespaces are namespaces (by name) all of whose pods may
	// reach the client ports: Redis (6379) and gRPC (7000) of the data
	// groups and gRPC (7000) of the controller (Go clients and kvctl need
	// both; Redis clients only the data groups' Redis port). The
	// ShardMap's own namespace is not included unless listed (or allowed
	// by an entry of clients, e.g. `- podSelector: {}`).
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	ClientNamespaces []string `json:"clientNamespaces,omitempty"`

	// Clients are more sources allowed to the client ports, in a
	// NetworkPolicy rule's terms, each with the ports it may reach.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Clients []NetworkClient `json:"clients,omitempty"`

	// MetricsNamespaces are namespaces (by name) all of whose pods may
	// reach the HTTP port (8080: /metrics, /healthz, /readyz) of every
	// pod of the cluster, e.g. Prometheus's. The kubelet's probes come
	// from the node and need no entry with enforcers that let a node reach
	// its own pods (most do).
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	MetricsNamespaces []string `json:"metricsNamespaces,omitempty"`
}

// NetworkPolicyMode turns the operator's NetworkPolicies on or off.
type NetworkPolicyMode string

const (
	NetworkPoliciesEnabled  NetworkPolicyMode = "Enabled"
	NetworkPoliciesDisabled NetworkPolicyMode = "Disabled"
)

// ClientPort is a port clients may reach.
// +kubebuilder:validation:Enum=Redis;GRPC
type ClientPort string

const (
	// ClientPortRedis is the data groups' Redis port (6379).
	ClientPortRedis ClientPort = "Redis"
	// ClientPortGRPC is the gRPC port (7000) of the data groups and the
	// controller: the Go client and kvctl. It also serves the admin API,
	// which has no authentication yet.
	ClientPortGRPC ClientPort = "GRPC"
)

// NetworkClient is a source allowed to the client ports: as in a
// NetworkPolicy peer, podSelector alone selects pods of the ShardMap's
// namespace, namespaceSelector alone all pods of the namespaces it
// selects, both together the selected pods of those namespaces; ipBlock is
// a range of addresses (clients outside the cluster network), alone.
// +kubebuilder:validation:XValidation:rule="has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",message="a client needs podSelector, namespaceSelector or ipBlock"
// +kubebuilder:validation:XValidation:rule="!has(self.ipBlock) || !(has(self.podSelector) || has(self.namespaceSelector))",message="ipBlock cannot be combined with podSelector or namespaceSelector"
type NetworkClient struct {
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// +optional
	IPBlock *IPBlock `json:"ipBlock,omitempty"`
	// Ports this source may reach: Redis, GRPC, or both (the default).
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:default={"Redis","GRPC"}
	// +optional
	Ports []ClientPort `json:"ports,omitempty"`
}

// IPBlock is a range of addresses, as in a NetworkPolicy peer: cidr, less
// the ranges of except (each inside cidr).
type IPBlock struct {
	// CIDR, e.g. 192.168.1.0/24 or 2001:db8::/64.
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be a CIDR, e.g. 10.0.0.0/16"
	CIDR string `json:"cidr"`
	// Except are ranges inside cidr left out.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="self.all(c, isCIDR(c))",message="except must be CIDRs"
	// +optional
	Except []string `json:"except,omitempty"`
}
