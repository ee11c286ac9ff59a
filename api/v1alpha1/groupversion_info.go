// Package v1alpha1 holds the shardkv.io/v1alpha1 API: ShardMap (a cluster:
// its controller group and shard table) and ReplicaGroup (one Raft data
// group of pods).
//
// +kubebuilder:object:generate=true
// +groupName=shardkv.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "shardkv.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
