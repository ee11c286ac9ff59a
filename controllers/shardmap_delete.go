package controllers

// Deleting a ShardMap. Its ReplicaGroups drain through its controller
// group, so the ShardMap (and with it the controller group, which its
// owner references keep until the ShardMap itself is gone) stays until
// they are gone (ShardMapFinalizer). It deletes no ReplicaGroup itself:
// the user says which data goes. A ReplicaGroup deleted while others of
// the cluster stay drains into them as usual; once every ReplicaGroup of
// a deleted ShardMap is being deleted, the cluster's data goes with it
// and each finalizes without a drain (planDeletion).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// ReasonWaitingForReplicaGroups (Progressing): the ShardMap is being
// deleted and ReplicaGroups of it remain.
const ReasonWaitingForReplicaGroups = "WaitingForReplicaGroups"

// replicaGroupsOf are the ReplicaGroups of ShardMap name in namespace ns,
// by name.
func replicaGroupsOf(ctx context.Context, c client.Reader, ns, name string) ([]shardkvv1.ReplicaGroup, error) {
	var list shardkvv1.ReplicaGroupList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []shardkvv1.ReplicaGroup
	for _, rg := range list.Items {
		if rg.Spec.ShardMap == name {
			out = append(out, rg)
		}
	}
	slices.SortFunc(out, func(a, b shardkvv1.ReplicaGroup) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// deletionWait is what a deleted ShardMap waits for, given its remaining
// ReplicaGroups ("": nothing, it can go).
func deletionWait(groups []shardkvv1.ReplicaGroup) string {
	if len(groups) == 0 {
		return ""
	}
	var names, kept []string
	for _, rg := range groups {
		names = append(names, rg.Name)
		if rg.DeletionTimestamp.IsZero() {
			kept = append(kept, rg.Name)
		}
	}
	if len(kept) > 0 {
		return fmt.Sprintf("the ShardMap is being deleted but ReplicaGroups %s are not: its controller group stays until they are gone. "+
			"Delete them too (kubectl delete replicagroup %s): a group drains into the cluster's other groups while some stay; "+
			"once all are being deleted, the cluster's data is deleted with them",
			strings.Join(kept, ", "), strings.Join(kept, " "))
	}
	return fmt.Sprintf("the ShardMap is being deleted: waiting for ReplicaGroups %s to go", strings.Join(names, ", "))
}

// reconcileDeletion keeps a deleted ShardMap until its ReplicaGroups are
// gone, saying so, then lets it go.
func (r *ShardMapReconciler) reconcileDeletion(ctx context.Context, sm *shardkvv1.ShardMap) (ctrl.Result, error) {
	key := types.NamespacedName{Namespace: sm.Namespace, Name: sm.Name}
	if !controllerutil.ContainsFinalizer(sm, ShardMapFinalizer) {
		r.stopWatch(key)
		r.forgetRates(key)
		return ctrl.Result{}, nil
	}
	groups, err := replicaGroupsOf(ctx, r.Client, sm.Namespace, sm.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	msg := deletionWait(groups)
	if msg == "" {
		controllerutil.RemoveFinalizer(sm, ShardMapFinalizer)
		if err := r.Update(ctx, sm); err != nil && !apierrors.IsNotFound(err) {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
			}
			return ctrl.Result{}, err
		}
		r.event(sm, corev1.EventTypeNormal, "Deleted", "Delete", "no ReplicaGroup of the ShardMap is left: the controller group goes with it (its volumes stay)")
		r.stopWatch(key)
		r.forgetRates(key)
		return ctrl.Result{}, nil
	}
	before := sm.Status.DeepCopy()
	prev := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionProgressing)
	if prev == nil || prev.Reason != ReasonWaitingForReplicaGroups {
		r.event(sm, corev1.EventTypeWarning, ReasonWaitingForReplicaGroups, "Delete", "%s", msg)
	}
	for _, c := range []metav1.Condition{
		{Type: shardkvv1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: ReasonWaitingForReplicaGroups, Message: msg},
		{Type: shardkvv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Deleting", Message: msg},
	} {
		c.ObservedGeneration = sm.Generation
		meta.SetStatusCondition(&sm.Status.Conditions, c)
	}
	if !equality.Semantic.DeepEqual(before, &sm.Status) {
		if err := r.Status().Update(ctx, sm); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
	}
	// ReplicaGroups are watched; this is a backstop.
	return ctrl.Result{RequeueAfter: r.busyResync()}, nil
}
