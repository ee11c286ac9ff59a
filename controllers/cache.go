package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheByObject is the operator's cache restriction (cmd/manager): of pods
// and Secrets it holds only the operator's own, labelled managed-by, not
// every one of the cluster. The Secret spec.users names is read from the
// API server instead.
func CacheByObject() map[client.Object]cache.ByObject {
	own := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:    {Label: own},
		&corev1.Secret{}: {Label: own},
	}
}
