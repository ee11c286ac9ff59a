package controllers

// Which data groups may roll their pods now. A template change (a new
// image, resources, TLS, ...) is written to every StatefulSet at once, but
// pods restart only when the operator deletes them (OnDelete), and a group
// starts doing so only with the roll slot of its cluster:
//
//   - after the controller group has rolled (every controller pod at its
//     StatefulSet's revision and ready), so a new controller serves the
//     new data nodes;
//   - one group of a cluster at a time, so a roll never takes a replica
//     of two groups down together;
//   - at most MaxConcurrentRolls groups across the clusters the operator
//     manages, so an operator upgrade that changes every cluster's pods
//     does not roll them all at once.
//
// The slot is the annotation AnnotationRolling on the group, set when its
// roll starts and removed when its last pod is updated, so it survives an
// operator restart. A group holding it finishes its roll whatever the
// others do.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// AnnotationRolling (on a ReplicaGroup) holds the pod template revision
// the group is rolling its pods to: it holds its cluster's roll slot.
const AnnotationRolling = "shardkv.io/rolling"

// defaultMaxConcurrentRolls is MaxConcurrentRolls when it is not set.
const defaultMaxConcurrentRolls = 2

// slotBridge is how long a slot taken is counted from memory: longer than
// the cache takes to show the annotation written, so the next pass (of
// another group) cannot miss it.
const slotBridge = 10 * time.Second

// rollSlots remembers the slots this operator took lately (rollSlots.taken).
type rollSlots struct {
	mu    sync.Mutex
	taken map[types.NamespacedName]time.Time
}

func (s *rollSlots) take(key types.NamespacedName, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken == nil {
		s.taken = map[types.NamespacedName]time.Time{}
	}
	s.taken[key] = now
}

func (s *rollSlots) release(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.taken, key)
}

// recent are the groups whose slot was taken within slotBridge of now.
func (s *rollSlots) recent(now time.Time) []types.NamespacedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []types.NamespacedName
	for k, at := range s.taken {
		if now.Sub(at) < slotBridge {
			out = append(out, k)
		}
	}
	return out
}

// ctrlerRolled says why the cluster's controller group has not finished
// rolling ("": it has, or it has no StatefulSet).
func ctrlerRolled(sts *appsv1.StatefulSet) string {
	if sts == nil {
		return ""
	}
	want := int32(1)
	if sts.Spec.Replicas != nil {
		want = *sts.Spec.Replicas
	}
	st := sts.Status
	if st.ObservedGeneration < sts.Generation || st.UpdatedReplicas < want || st.ReadyReplicas < want {
		return fmt.Sprintf("the controller group rolls first: %d of its %d pods updated, %d ready", st.UpdatedReplicas, want, st.ReadyReplicas)
	}
	return ""
}

// slotHolders are the groups holding a roll slot among groups, with those
// taken lately from memory (recent), deduplicated, except self.
func slotHolders(groups []shardkvv1.ReplicaGroup, recent []types.NamespacedName, self types.NamespacedName) []types.NamespacedName {
	var out []types.NamespacedName
	for _, g := range groups {
		if g.Annotations[AnnotationRolling] != "" && g.DeletionTimestamp.IsZero() {
			out = append(out, client.ObjectKeyFromObject(&g))
		}
	}
	out = append(out, recent...)
	out = slices.DeleteFunc(out, func(k types.NamespacedName) bool { return k == self })
	slices.SortFunc(out, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// rollBlocked says why group rg of ShardMap sm may not take a roll slot
// now ("": it may). It reads the cache; the slot is taken with the API
// server's view of the cluster's groups (takeRollSlot).
func (r *ReplicaGroupReconciler) rollBlocked(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap) (string, error) {
	if sm == nil {
		return "", nil
	}
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: sm.Namespace, Name: CtrlerName(sm.Name)}, sts); client.IgnoreNotFound(err) != nil {
		return "", err
	} else if err == nil {
		if why := ctrlerRolled(sts); why != "" {
			return why, nil
		}
	}
	self := client.ObjectKeyFromObject(rg)
	recent := r.slots.recent(r.clock())
	cluster, err := replicaGroupsOf(ctx, r.Client, rg.Namespace, sm.Name)
	if err != nil {
		return "", err
	}
	var mine []types.NamespacedName
	for _, k := range recent {
		if k.Namespace == rg.Namespace && slices.ContainsFunc(cluster, func(g shardkvv1.ReplicaGroup) bool { return g.Name == k.Name }) {
			mine = append(mine, k)
		}
	}
	if h := slotHolders(cluster, mine, self); len(h) > 0 {
		return fmt.Sprintf("group %s is rolling (one group of a cluster at a time)", h[0].Name), nil
	}
	var all shardkvv1.ReplicaGroupList
	if err := r.List(ctx, &all); err != nil {
		return "", err
	}
	if h, limit := slotHolders(all.Items, recent, self), r.maxConcurrentRolls(); len(h) >= limit {
		names := make([]string, len(h))
		for i, k := range h {
			names[i] = k.String()
		}
		return fmt.Sprintf("%d groups are rolling across clusters (%s), the operator's limit (--max-concurrent-rolls=%d)",
			len(h), strings.Join(names, ", "), limit), nil
	}
	return "", nil
}

// takeRollSlot marks rg as rolling to revision rev, after checking with
// the API server (not the cache) that no other group of its cluster is.
// It returns errStale if one is.
func (r *ReplicaGroupReconciler) takeRollSlot(ctx context.Context, rg *shardkvv1.ReplicaGroup, sm *shardkvv1.ShardMap, rev string) error {
	var list shardkvv1.ReplicaGroupList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(rg.Namespace)); err != nil {
		return err
	}
	var cluster []shardkvv1.ReplicaGroup
	for _, g := range list.Items {
		if g.Spec.ShardMap == sm.Name {
			cluster = append(cluster, g)
		}
	}
	if len(slotHolders(cluster, nil, client.ObjectKeyFromObject(rg))) > 0 {
		return errStale
	}
	setAnnotation(rg, AnnotationRolling, rev)
	if err := r.Update(ctx, rg); err != nil {
		return err
	}
	r.slots.take(client.ObjectKeyFromObject(rg), r.clock())
	return nil
}

// releaseRollSlot drops rg's roll slot: its roll is done.
func (r *ReplicaGroupReconciler) releaseRollSlot(ctx context.Context, rg *shardkvv1.ReplicaGroup) error {
	delete(rg.Annotations, AnnotationRolling)
	if err := r.Update(ctx, rg); err != nil {
		return err
	}
	r.slots.release(client.ObjectKeyFromObject(rg))
	return nil
}

func (r *ReplicaGroupReconciler) maxConcurrentRolls() int {
	if r.MaxConcurrentRolls > 0 {
		return r.MaxConcurrentRolls
	}
	return defaultMaxConcurrentRolls
}
