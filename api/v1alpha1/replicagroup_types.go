package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaGroupSpec is the desired Raft data group.
type ReplicaGroupSpec struct {
	// ShardMap is the name of the cluster (in the same namespace). Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="shardMap is immutable: a group cannot move to another cluster"
	ShardMap string `json:"shardMap"`

	// Replicas of the group (Raft members). 3 or 5 tolerate 1 or 2 failures.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Weight is the group's share of shards relative to other groups.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Weight int32 `json:"weight,omitempty"`

	// Image of the node binary; defaults to the ShardMap's spec.image,
	// then the operator's own image.
	// +optional
	Image string `json:"image,omitempty"`
	// ImagePullPolicy defaults to IfNotPresent, so offline clusters work.
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// +kubebuilder:default={}
	// +optional
	Storage StorageSpec `json:"storage,omitempty"`
	// PVCRetention is what happens to a replica's volume when the replica is
	// removed by scale-in or the group is deleted.
	// +kubebuilder:default=Retain
	// +kubebuilder:validation:Enum=Retain;Delete
	// +optional
	PVCRetention string `json:"pvcRetention,omitempty"`
	// RetainedVolumes is what the operator does with a volume named for
	// one of this group's replicas that is older than the group: one kept
	// (pvcRetention: Retain) from a deleted ReplicaGroup of the same name.
	// It holds another group's data, so a pod never starts on it. Refuse
	// (the default) waits, saying which volumes, until the user deletes
	// them; Wipe deletes them first. Wipe destroys that data for good.
	// +kubebuilder:default=Refuse
	// +kubebuilder:validation:Enum=Refuse;Wipe
	// +optional
	RetainedVolumes string `json:"retainedVolumes,omitempty"`
	// +optional
	PodTemplate PodOverrides `json:"podTemplate,omitempty"`
	// RequirePass names a Secret key holding the password Redis clients must
	// AUTH with (node --requirepass); unset, the Redis port needs none.
	// Changing it rolls the pods.
	// +optional
	RequirePass *corev1.SecretKeySelector `json:"requirePass,omitempty"`
}

// Phases of a ReplicaGroup.
const (
	PhasePending  = "Pending"
	PhaseJoining  = "Joining"
	PhaseServing  = "Serving"
	PhaseDraining = "Draining"
	PhaseLeft     = "Left"
)

// ReplicaGroupStatus is the observed group.
type ReplicaGroupStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// GroupID is assigned once and never reused.
	// +optional
	GroupID int64 `json:"groupID,omitempty"`
	// +kubebuilder:validation:Enum=Pending;Joining;Serving;Draining;Left
	// +optional
	Phase string `json:"phase,omitempty"`
	// DrainedAt is when the deleted group was first seen holding no shard:
	// its pods stay from then until clients have moved away (no client
	// request for a while, or at most a bound).
	// +optional
	DrainedAt *metav1.Time `json:"drainedAt,omitempty"`
	// Replicas is the number of Raft members (the scale subresource's status).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Selector of the group's pods (for the scale subresource and HPA).
	// +optional
	Selector string `json:"selector,omitempty"`
	// Leader is the leading pod.
	// +optional
	Leader string `json:"leader,omitempty"`
	// Members of the Raft group.
	// +optional
	Members []Member `json:"members,omitempty"`
	// Shards the group owns.
	// +optional
	Shards ShardSummary `json:"shards,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Member is one Raft member of the group.
type Member struct {
	ID  int64  `json:"id"`
	Pod string `json:"pod"`
	// Role: leader, follower or learner.
	// +optional
	Role string `json:"role,omitempty"`
	// +optional
	Healthy bool `json:"healthy,omitempty"`
	// +optional
	AppliedIndex int64 `json:"appliedIndex,omitempty"`
}

// ShardSummary is a count and the ranges of shards.
type ShardSummary struct {
	// +optional
	Count int32 `json:"count,omitempty"`
	// Ranges like "0-63,128-191".
	// +optional
	Ranges string `json:"ranges,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=rg,categories=shardkv
// +kubebuilder:printcolumn:name="GID",type=integer,JSONPath=`.status.groupID`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.status.shards.count`
// +kubebuilder:printcolumn:name="Leader",type=string,JSONPath=`.status.leader`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ReplicaGroup is a Raft data group of pods.
type ReplicaGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ReplicaGroupSpec   `json:"spec,omitempty"`
	Status ReplicaGroupStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ReplicaGroupList is a list of ReplicaGroups.
type ReplicaGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicaGroup `json:"items"`
}
