package controllers

// What one ReplicaGroup pass observes (observed, replicagroup_plan.go):
// the group's pods and claims from the cache, each replica's own status
// over its admin API, and the controller's latest config.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// observe gathers what the planner needs.
func (r *ReplicaGroupReconciler) observe(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, sts *appsv1.StatefulSet,
	claims []corev1.PersistentVolumeClaim) (*observed, error) {
	o := &observed{
		RetainedVolumesWipe: rg.Spec.RetainedVolumes == "Wipe",
		Now:                 r.clock(),
		Name:                rg.Name, Namespace: rg.Namespace,
		Deleting:           !rg.DeletionTimestamp.IsZero(),
		HasFinalizer:       controllerutil.ContainsFinalizer(rg, Finalizer),
		Paused:             sm != nil && sm.Spec.Paused,
		ShardMapGone:       sm == nil,
		ClusterDeleting:    sm != nil && !sm.DeletionTimestamp.IsZero(),
		GroupID:            uint64(rg.Status.GroupID),
		Phase:              rg.Status.Phase,
		Desired:            defaultReplicas(rg),
		Bootstrap:          bootstrapReplicas(rg),
		Weight:             defaultWeight(rg),
		StsReplicas:        -1,
		PVCRetentionDelete: rg.Spec.PVCRetention == "Delete",
		Pods:               map[int]*podView{},
		LeaderOrdinal:      -1,
	}
	if sm != nil {
		o.RESPPorts = respPorts(sm)
	}
	if rg.Status.DrainedAt != nil {
		o.DrainedAt = rg.Status.DrainedAt.Time
	}
	if sts != nil {
		o.StsReplicas = 1
		if sts.Spec.Replicas != nil {
			o.StsReplicas = *sts.Spec.Replicas
		}
		if sts.Status.ObservedGeneration >= sts.Generation {
			o.UpdateRevision = sts.Status.UpdateRevision
		}
	}
	if o.Deleting && o.ClusterDeleting {
		groups, err := replicaGroupsOf(ctx, r.Client, rg.Namespace, sm.Name)
		if err != nil {
			return nil, err
		}
		o.ClusterGroupsDeleting = true
		for _, g := range groups {
			o.ClusterGroupsDeleting = o.ClusterGroupsDeleting && !g.DeletionTimestamp.IsZero()
		}
	}
	if !o.HasFinalizer || o.GroupID == 0 {
		return o, nil // the planner's first steps need no more
	}
	o.RollSlot = rg.Annotations[AnnotationRolling] != ""
	o.RetainedPVCs = retainedOrdinals(rg, claims)
	o.Storage = rg.Spec.Storage
	o.ResizeRefused = refusedResize(rg.Status.Conditions, rg.Generation)
	if len(o.RetainedPVCs) == 0 {
		o.Claims = viewClaims(claims, int(max(o.StsReplicas, o.Desired)), func(name string) int { return pvcOrdinal(rg.Name, name) })
	}
	dial := true
	if sm != nil {
		creds, err := r.Credentials.For(sm)
		// Without the operator's certificate yet, the replicas and the
		// controller are not reached: the planner waits as for pods that
		// do not answer.
		o.creds, dial = creds, err == nil
	}

	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(rg.Namespace), client.MatchingLabels{LabelGroup: rg.Name}); err != nil {
		return nil, err
	}
	podObjs := map[int]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		ord := podOrdinal(rg.Name, p.Name)
		if ord < 0 {
			continue
		}
		podObjs[ord] = p
		o.Pods[ord] = &podView{Ordinal: ord, Name: p.Name, UID: p.UID, Exists: true, Deleting: !p.DeletionTimestamp.IsZero(),
			Ready: podReady(p), Revision: p.Labels[appsv1.ControllerRevisionHashLabelKey], Trouble: podTrouble(p)}
	}
	// Whether a roll may start is asked only of a group with a pod to
	// roll: it reads the cluster's groups (every group, every pass
	// otherwise).
	if !o.RollSlot && !o.Deleting && o.UpdateRevision != "" && slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool {
		return p.Labels[appsv1.ControllerRevisionHashLabelKey] != o.UpdateRevision
	}) {
		why, err := r.rollBlocked(ctx, rg, sm)
		if err != nil {
			return nil, err
		}
		o.RollBlocked = why
	}
	for i := range int(max(o.StsReplicas, 0)) {
		if _, ok := o.Pods[i]; !ok {
			o.Pods[i] = &podView{Ordinal: i, Name: fmt.Sprintf("%s-%d", rg.Name, i)}
		}
	}
	for _, c := range claims {
		if ord := pvcOrdinal(rg.Name, c.Name); ord >= 0 && c.DeletionTimestamp.IsZero() {
			o.PVCs = append(o.PVCs, ord)
			if o.PVCUIDs == nil {
				o.PVCUIDs = map[int]types.UID{}
			}
			o.PVCUIDs[ord] = c.UID
		}
	}
	slices.Sort(o.PVCs)

	// Each replica's own view, in parallel.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for ord, p := range podObjs {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		addr := r.replicaAddr(rg, ord, p)
		if addr == "" || !dial {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			api, err := r.DataPlane.Replica(o.creds, addr)
			if err != nil {
				return
			}
			cctx, cancel := callCtx(ctx, r.CallTimeout)
			defer cancel()
			st, err := api.Status(cctx)
			if err != nil {
				return
			}
			mu.Lock()
			o.Pods[ord].Status = st
			mu.Unlock()
		}()
	}
	wg.Wait()

	// The leader: of the pods that say they lead, the newest term.
	for ord, p := range o.Pods {
		st := p.Status
		if st == nil || st.Role != "leader" || (st.GroupId != 0 && st.GroupId != o.GroupID) {
			continue
		}
		if o.Leader == nil || st.Term > o.Leader.Term || (st.Term == o.Leader.Term && ord < o.LeaderOrdinal) {
			o.Leader, o.LeaderOrdinal = st, ord
		}
	}
	if o.Leader != nil {
		for _, m := range o.Leader.Members {
			o.Members = append(o.Members, memberView{ID: m.Id, Ordinal: ordinalOf(rg.Name, rg.Namespace, m.Addr),
				Learner: m.Learner, Match: m.Match, HeardMsAgo: m.HeardMsAgo})
		}
	}

	// The controller's latest config (and, while draining, its reports).
	if !o.ShardMapGone && dial {
		addrs, err := r.ctrlerAddrs(ctx, sm)
		if err != nil {
			return nil, err
		}
		if len(addrs) > 0 {
			if api, err := r.DataPlane.Controller(o.creds, addrs); err == nil {
				cctx, cancel := callCtx(ctx, r.CallTimeout)
				if cfg, err := api.Query(cctx, -1); err == nil {
					o.Config = cfg
				}
				cancel()
				if o.Deleting && o.Config != nil {
					cctx, cancel := callCtx(ctx, r.CallTimeout)
					if cs, err := api.Status(cctx); err == nil {
						o.Reports = map[uint64]*shardkvpb.GroupReport{}
						for _, g := range cs.Groups {
							if g.Report != nil {
								o.Reports[g.Report.Gid] = g.Report
							}
						}
						if cs.Latest != nil && cs.Latest.Num > o.Config.Num {
							o.Config = cs.Latest
						}
					}
					cancel()
				}
			}
		}
	}
	return o, nil
}

// replicaAddr is where the operator dials the replica at ordinal ("" if
// it cannot yet: no pod IP).
func (r *ReplicaGroupReconciler) replicaAddr(rg *shardkvv1.ReplicaGroup, ordinal int, p *corev1.Pod) string {
	return podDialAddr(r.DialPodIPs, rg.Name, ordinal, rg.Namespace, p)
}

// ctrlerAddrs are the controller group's addresses, as DNS names or (with
// DialPodIPs) its pods' IPs.
func (r *ReplicaGroupReconciler) ctrlerAddrs(ctx context.Context, sm *shardkvv1.ShardMap) ([]string, error) {
	if !r.DialPodIPs {
		return CtrlerAddrs(sm.Name, int(smCtrlerBootstrap(sm)), sm.Namespace), nil
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(sm.Namespace), client.MatchingLabels{LabelInstance: sm.Name}); err != nil {
		return nil, err
	}
	return ctrlerPodAddrs(sm.Name, pods.Items), nil
}

func (r *ReplicaGroupReconciler) ctrlerAPI(ctx context.Context, sm *shardkvv1.ShardMap) (ControllerAPI, error) {
	if sm == nil {
		return nil, errors.New("the ShardMap does not exist")
	}
	addrs, err := r.ctrlerAddrs(ctx, sm)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, errors.New("no controller pod has an IP yet")
	}
	creds, err := r.Credentials.For(sm)
	if err != nil {
		return nil, err
	}
	return r.DataPlane.Controller(creds, addrs)
}

// groupClaims are the claims the StatefulSet controller made (or would
// reuse) for the group's pods: it labels them with the set's selector.
func (r *ReplicaGroupReconciler) groupClaims(ctx context.Context, rg *shardkvv1.ReplicaGroup) ([]corev1.PersistentVolumeClaim, error) {
	var pvcs corev1.PersistentVolumeClaimList
	if err := r.List(ctx, &pvcs, client.InNamespace(rg.Namespace), client.MatchingLabels{LabelGroup: rg.Name}); err != nil {
		return nil, err
	}
	return pvcs.Items, nil
}

// retainedOrdinals are the ordinals whose claim is older than the
// ReplicaGroup itself: kept from a deleted group of the same name, whose
// data (and node.json, naming that group) a pod of this one must never
// start on. A claim this group made is always younger than it.
func retainedOrdinals(rg *shardkvv1.ReplicaGroup, claims []corev1.PersistentVolumeClaim) []int {
	var out []int
	for _, c := range claims {
		ord := pvcOrdinal(rg.Name, c.Name)
		if ord >= 0 && c.DeletionTimestamp.IsZero() && c.CreationTimestamp.Before(&rg.CreationTimestamp) {
			out = append(out, ord)
		}
	}
	slices.Sort(out)
	return out
}

// podTrouble says why a pod's node container is not running, with the
// last words of its previous run ("" if it runs or is starting normally):
// what a user needs when a group waits on pods that never answer.
func podTrouble(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name != nodeContainer {
			continue
		}
		w := c.State.Waiting
		if w == nil || w.Reason == "" || w.Reason == "ContainerCreating" || w.Reason == "PodInitializing" {
			return ""
		}
		msg := w.Reason
		if t := c.LastTerminationState.Terminated; t != nil {
			last := strings.TrimSpace(t.Message)
			if i := strings.LastIndexByte(last, '\n'); i >= 0 {
				last = last[i+1:]
			}
			msg += fmt.Sprintf(" (exit %d", t.ExitCode)
			if last != "" {
				msg += ": " + truncate(last, 300)
			}
			msg += ")"
		} else if w.Message != "" {
			msg += ": " + truncate(w.Message, 300)
		}
		return msg
	}
	return ""
}

// truncate cuts s to at most n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
