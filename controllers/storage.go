package controllers

// Growing the volumes of a running group when spec.storage.size grows.
// A StatefulSet's claim templates are immutable, so the operator grows
// each replica's claim itself, one per pass, the way `kubectl edit pvc`
// would: the API server admits it only where the claim's StorageClass
// allows expansion (allowVolumeExpansion), and the volume's driver grows
// it (online, or at the pod's next start for drivers that need that:
// FileSystemResizePending). A claim made after the change (scale-out)
// comes from the old template and is grown the same way. What cannot be
// applied (shrinking, another class, a class that cannot expand) is said
// in the StorageApplied condition and changes nothing.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// Reasons of the StorageApplied condition.
const (
	reasonStorageApplied        = "Applied"
	reasonStorageResizing       = "Resizing"
	reasonStorageResizeRefused  = "ResizeRefused"
	reasonStorageShrink         = "ShrinkNotSupported"
	reasonStorageClassImmutable = "StorageClassImmutable"
)

// claimView is one replica's data claim as observed.
type claimView struct {
	Name    string
	Ordinal int
	// Request is the size asked for; Capacity the volume's size so far
	// (zero until bound).
	Request, Capacity resource.Quantity
	Class             string
	Bound             bool
	// Resizing names the claim's resize condition in progress, if any
	// (Resizing, FileSystemResizePending, ControllerResizeError, ...).
	Resizing string
}

// claimAt is the claim of ordinal among claims (nil: none).
func claimAt(claims []claimView, ordinal int) *claimView {
	for i := range claims {
		if claims[i].Ordinal == ordinal {
			return &claims[i]
		}
	}
	return nil
}

// viewClaims are the claims of ordinals below n (the replicas the spec or
// the set has), by ordinal; ordinal maps a claim's name to its ordinal
// (-1: not one of the group's).
func viewClaims(claims []corev1.PersistentVolumeClaim, n int, ordinal func(string) int) []claimView {
	var out []claimView
	for _, c := range claims {
		ord := ordinal(c.Name)
		if ord < 0 || ord >= n || !c.DeletionTimestamp.IsZero() {
			continue
		}
		v := claimView{Name: c.Name, Ordinal: ord, Request: c.Spec.Resources.Requests[corev1.ResourceStorage],
			Capacity: c.Status.Capacity[corev1.ResourceStorage], Bound: c.Status.Phase == corev1.ClaimBound}
		if c.Spec.StorageClassName != nil {
			v.Class = *c.Spec.StorageClassName
		}
		for _, cond := range c.Status.Conditions {
			if cond.Status == corev1.ConditionTrue {
				v.Resizing = string(cond.Type)
				if cond.Message != "" {
					v.Resizing += ": " + cond.Message
				}
			}
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b claimView) int { return a.Ordinal - b.Ordinal })
	return out
}

// storagePlan is what the claims need to match the spec: the claim to grow
// next (nil: none), and the StorageApplied condition.
type storagePlan struct {
	Grow            *claimView
	Status          metav1.ConditionStatus
	Reason, Message string
}

// planStorage plans for want, the spec's field (its path in messages).
// refused is the API server's refusal of a resize at this generation ("":
// none), so a refused resize is not tried again until the spec changes.
func planStorage(field string, want shardkvv1.StorageSpec, claims []claimView, refused string) storagePlan {
	size := storageSize(want)
	var shrink, class, grow, growing []string
	var next *claimView
	for i := range claims {
		c := &claims[i]
		switch {
		case want.StorageClassName != nil && *want.StorageClassName != c.Class:
			class = append(class, fmt.Sprintf("%s (%q)", c.Name, c.Class))
		case c.Request.Cmp(size) > 0:
			shrink = append(shrink, fmt.Sprintf("%s (%s)", c.Name, c.Request.String()))
		case c.Request.Cmp(size) < 0:
			// Only a bound claim's request can change (the API server
			// refuses it on a pending one): the others wait their turn.
			grow = append(grow, c.Name)
			if next == nil && c.Bound {
				next = c
			}
		case !c.Capacity.IsZero() && c.Capacity.Cmp(c.Request) < 0:
			s := fmt.Sprintf("%s from %s", c.Name, c.Capacity.String())
			if c.Resizing != "" {
				s += " (" + c.Resizing + ")"
			}
			growing = append(growing, s)
		}
	}
	switch {
	case len(class) > 0:
		return storagePlan{Status: metav1.ConditionFalse, Reason: reasonStorageClassImmutable, Message: fmt.Sprintf(
			"%s.storageClassName is %q but volumes %s have another class, which cannot change on a volume: they stay as they are",
			field, *want.StorageClassName, strings.Join(class, ", "))}
	case len(shrink) > 0:
		return storagePlan{Status: metav1.ConditionFalse, Reason: reasonStorageShrink, Message: fmt.Sprintf(
			"%s.size %s is below the size of volumes %s, and a volume cannot shrink: they stay as they are",
			field, size.String(), strings.Join(shrink, ", "))}
	case len(grow) > 0 && refused != "":
		return storagePlan{Status: metav1.ConditionFalse, Reason: reasonStorageResizeRefused, Message: refused}
	case len(grow) > 0 && next == nil:
		return storagePlan{Status: metav1.ConditionFalse, Reason: reasonStorageResizing, Message: fmt.Sprintf(
			"waiting for volumes %s to be bound before growing them to %s", strings.Join(grow, ", "), size.String())}
	case len(grow) > 0:
		return storagePlan{Grow: next, Status: metav1.ConditionFalse, Reason: reasonStorageResizing, Message: fmt.Sprintf(
			"growing %d volumes to %s, one at a time: %s", len(grow), size.String(), strings.Join(grow, ", "))}
	case len(growing) > 0:
		return storagePlan{Status: metav1.ConditionFalse, Reason: reasonStorageResizing, Message: fmt.Sprintf(
			"waiting for the volume driver to grow %s to %s", strings.Join(growing, ", "), size.String())}
	}
	return storagePlan{Status: metav1.ConditionTrue, Reason: reasonStorageApplied, Message: fmt.Sprintf(
		"all %d volumes are %s", len(claims), size.String())}
}

// refusedResize is the message of a StorageApplied condition that says the
// API server refused a resize at generation gen, or "".
func refusedResize(conds []metav1.Condition, gen int64) string {
	for _, c := range conds {
		if c.Type == shardkvv1.ConditionStorageApplied && c.Reason == reasonStorageResizeRefused && c.ObservedGeneration == gen {
			return c.Message
		}
	}
	return ""
}

// growClaim asks for the claim c at size. A refusal by the API server (the
// claim's StorageClass does not allow expansion, or the claim is not
// bound) is returned as refused, the sentence to show, with no error.
func growClaim(ctx context.Context, cl client.Client, namespace string, c claimView, size resource.Quantity) (refused string, err error) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: c.Name}}
	patch := fmt.Appendf(nil, `{"spec":{"resources":{"requests":{"storage":%q}}}}`, size.String())
	err = cl.Patch(ctx, pvc, client.RawPatch("application/merge-patch+json", patch))
	if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
		return fmt.Sprintf("growing volume %s from %s to %s was refused by the API server (is the StorageClass's allowVolumeExpansion true?): %v",
			c.Name, c.Request.String(), size.String(), err), nil
	}
	if err != nil {
		return "", fmt.Errorf("grow claim %s: %w", c.Name, err)
	}
	return "", nil
}
