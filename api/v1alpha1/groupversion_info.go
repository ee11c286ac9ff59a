// Package v1alpha1 holds the shardkv.io/v1alpha1 API: ShardMap (a cluster:
// its controller group and shard table) and ReplicaGroup (one Raft data
// group of pods).
//
// +kubebuilder:object:generate=true
// +groupName=shardkv.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "shardkv.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ShardMap{}, &ShardMapList{}, &ReplicaGroup{}, &ReplicaGroupList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
