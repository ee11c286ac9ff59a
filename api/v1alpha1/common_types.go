package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// StorageSpec is the persistent volume of each replica.
type StorageSpec struct {
	// Size of each replica's volume.
	// +kubebuilder:default="1Gi"
	// +optional
	Size resource.Quantity `json:"size,omitempty"`
	// StorageClassName of the volumes; empty uses the cluster's default class.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// PodOverrides are merged into the pods the operator creates.
type PodOverrides struct {
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Annotations added to every pod.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// TopologySpreadConstraints of the pods. Unset, the pods are spread
	// by zone and by node, as evenly as the cluster allows (maxSkew 1,
	// ScheduleAnyway: a cluster of one zone or one node still runs
	// them). Set, they replace that default; each constraint's
	// labelSelector, if unset, is the group's own pods.
	// +kubebuilder:validation:MaxItems=8
	// +optional
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// PriorityClassName of the pods, so the scheduler preempts less
	// important pods for them rather than the other way round.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// ShardRange is a run of consecutive shards with one owner and state.
type ShardRange struct {
	// First and Last shard of the run (inclusive).
	First int32 `json:"first"`
	Last  int32 `json:"last"`
	// Group is the owning ReplicaGroup's name ("" if no group owns it).
	// +optional
	Group string `json:"group,omitempty"`
	// GroupID is the owner's group id (0: none).
	// +optional
	GroupID int64 `json:"groupID,omitempty"`
	// State of the shards on their owner: Serving, Pulling, Acking, or
	// Unknown when the owner has not reported yet; PreCopying while the
	// owner serves them and the target of a planned move copies them.
	// +optional
	State string `json:"state,omitempty"`
}

// Condition types shared by both kinds.
const (
	ConditionReady       = "Ready"
	ConditionBalanced    = "Balanced"
	ConditionMigrating   = "Migrating"
	ConditionJoined      = "Joined"
	ConditionProgressing = "Progressing"
	ConditionDraining    = "Draining"
	ConditionDegraded    = "Degraded"
	// ConditionStorageApplied: every volume of the group has
	// spec.storage (False: growing, or why it cannot).
	ConditionStorageApplied = "StorageApplied"
)
