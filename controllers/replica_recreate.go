package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recreateReplica gives pod p of StatefulSet set, which runs a replica
// its group removed, an empty volume (ids are never reused, so that disk
// can never serve again). Pod and claim are read from the API server, not
// the cache, which may not list a claim made just before its pod: a pod
// already going, or replaced, is left alone (errStale), as its replacement
// may already run on a fresh volume. While the pod is the one observed,
// its claim is the one it runs on. The claim is deleted first (it goes
// once its pod is gone), then the pod; the StatefulSet brings both back.
func recreateReplica(ctx context.Context, c client.Client, reader client.Reader, ns, set string, p *podView) error {
	pod := &corev1.Pod{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: p.Name}, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pod.UID != p.UID || !pod.DeletionTimestamp.IsZero() {
		return errStale
	}
	claim := &corev1.PersistentVolumeClaim{}
	switch err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: pvcName(set, p.Ordinal)}, claim); {
	case err == nil && claim.DeletionTimestamp.IsZero():
		if err := staleOnConflict(client.IgnoreNotFound(c.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}))); err != nil {
			return err
		}
	case client.IgnoreNotFound(err) != nil:
		return err
	}
	return staleOnConflict(client.IgnoreNotFound(c.Delete(ctx, pod, client.Preconditions{UID: &p.UID})))
}
