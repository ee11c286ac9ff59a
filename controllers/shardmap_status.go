package controllers

// The ShardMap's status: the shard table, state counts, migrations and
// conditions from the controller's view, and the conditions of the pass
// (the plan's wait and the step taken).

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

const (
	// maxTableRanges caps status.table: a consistent-hash placement can
	// scatter owners over thousands of runs, which would bloat the object.
	maxTableRanges = 1024
	// Shard states the reconciler adds to the groups' own.
	stateServing    = "Serving"
	stateUnknown    = "Unknown"
	statePending    = "Pending" // the owner has not reached the config yet
	stateUnassigned = "Unassigned"
)

// shardView is the table's view of one shard.
type shardView struct {
	gid   uint64
	state string
}

// clusterSummary is the status computed from a ClusterStatus.
type clusterSummary struct {
	groups     []shardkvv1.GroupRef
	table      []shardkvv1.ShardRange
	truncated  bool
	states     map[string]int32
	migrating  int32
	migrations []shardkvv1.Migration
	notServing int      // shards of the latest config not Serving on their owner
	behind     []uint64 // groups in the config whose report is not at the latest config
}

// groupsBehind: some group of the latest config has not reported it yet.
func groupsBehind(st *shardkvpb.ClusterStatus) bool {
	at := map[uint64]uint64{}
	for _, g := range st.GetGroups() {
		if rep := g.GetReport(); rep != nil {
			at[rep.Gid] = rep.ConfigNum
		}
	}
	for _, g := range st.GetLatest().GetGroups() {
		if at[g.Gid] < st.GetLatest().GetNum() {
			return true
		}
	}
	return false
}

// summarize computes the shard table, state counts and migrations from
// the controller's status. name maps a gid to its ReplicaGroup's name.
// prev, if known, is the config before the latest: a shard whose new
// owner has not reached the latest config yet is Pending, moving from its
// previous owner, rather than Unknown.
func summarize(st *shardkvpb.ClusterStatus, prev *shardkvpb.Config, name func(uint64) string) clusterSummary {
	cfg := st.GetLatest()
	reports := map[uint64]*shardkvpb.GroupReport{}
	byShard := map[uint64]map[uint32]*shardkvpb.ShardState{}
	for _, g := range st.GetGroups() {
		rep := g.GetReport()
		if rep == nil {
			continue
		}
		reports[rep.Gid] = rep
		m := map[uint32]*shardkvpb.ShardState{}
		for _, s := range rep.Shards {
			m[s.Shard] = s
		}
		byShard[rep.Gid] = m
	}
	out := clusterSummary{states: map[string]int32{}}

	// Groups, with their shard counts.
	owned := map[uint64]int32{}
	for _, gid := range cfg.GetShards() {
		owned[gid]++
	}
	for _, g := range cfg.GetGroups() {
		out.groups = append(out.groups, shardkvv1.GroupRef{Name: name(g.Gid), GroupID: int64(g.Gid), Shards: owned[g.Gid]})
		if rep := reports[g.Gid]; rep == nil || rep.ConfigNum < cfg.Num {
			out.behind = append(out.behind, g.Gid)
		}
	}

	// The table: each shard on its owner.
	views := make([]shardView, len(cfg.GetShards()))
	for i, gid := range cfg.GetShards() {
		v := shardView{gid: gid, state: stateUnknown}
		if gid == 0 {
			v.state = stateUnassigned
		} else if s := byShard[gid][uint32(i)]; s != nil && s.State != "" {
			v.state = s.State
		} else if rep := reports[gid]; rep == nil || rep.ConfigNum < cfg.Num {
			v.state = statePending
		}
		views[i] = v
		out.states[v.state]++
		if v.state != stateServing {
			out.notServing++
		}
	}
	for i := 0; i < len(views); {
		j := i
		for j+1 < len(views) && views[j+1] == views[i] {
			j++
		}
		if len(out.table) == maxTableRanges {
			out.truncated = true
			break
		}
		rg := shardkvv1.ShardRange{First: int32(i), Last: int32(j), GroupID: int64(views[i].gid), State: views[i].state}
		if views[i].gid != 0 {
			rg.Group = name(views[i].gid)
		}
		out.table = append(out.table, rg)
		i = j + 1
	}

	// Migrations: every shard some group holds in a state other than
	// Serving, once; the new owner's record (it has the progress) wins
	// over the old owner's.
	type move struct {
		src, dst    uint64
		keys, total uint64
		newOwner    bool
	}
	moves := map[uint32]move{}
	gids := make([]uint64, 0, len(reports))
	for gid := range reports {
		gids = append(gids, gid)
	}
	slices.Sort(gids)
	for _, gid := range gids {
		for _, s := range reports[gid].Shards {
			if s.State == stateServing || s.State == "" {
				continue
			}
			var m move
			switch s.State {
			case "Pulling", "Acking": // the new owner
				m = move{src: s.PeerGid, dst: gid, keys: s.Keys, total: s.TotalKeys, newOwner: true}
				if s.State == "Acking" && m.total < m.keys {
					m.total = m.keys // installed: the copy is complete
				}
			default: // BePulling, GCing: the old owner
				m = move{src: gid, dst: s.PeerGid}
			}
			if prev, ok := moves[s.Shard]; ok && (prev.newOwner || !m.newOwner) {
				continue
			}
			moves[s.Shard] = m
		}
	}
	// Shards whose new owner has not reached the latest config: moving
	// from their previous owner, nothing copied yet.
	if prevShards := prev.GetShards(); len(prevShards) == len(views) {
		for i, v := range views {
			from := prevShards[i]
			if _, known := moves[uint32(i)]; !known && v.state == statePending && from != 0 && from != v.gid {
				moves[uint32(i)] = move{src: from, dst: v.gid}
			}
		}
	}
	type pair struct{ src, dst uint64 }
	agg := map[pair]*shardkvv1.Migration{}
	var order []pair
	for _, m := range moves {
		k := pair{m.src, m.dst}
		a, ok := agg[k]
		if !ok {
			a = &shardkvv1.Migration{Source: name(m.src), Target: name(m.dst)}
			agg[k] = a
			order = append(order, k)
		}
		a.Shards++
		a.Keys += int64(m.keys)
		a.TotalKeys += int64(m.total)
	}
	slices.SortFunc(order, func(a, b pair) int {
		if a.src != b.src {
			return cmp.Compare(a.src, b.src)
		}
		return cmp.Compare(a.dst, b.dst)
	})
	for _, k := range order {
		a := agg[k]
		if a.TotalKeys > 0 {
			a.Progress = fmt.Sprintf("%d%%", min(100, a.Keys*100/a.TotalKeys))
		}
		out.migrations = append(out.migrations, *a)
	}
	out.migrating = int32(len(moves))
	return out
}

// groupNamer names gids by the ReplicaGroups' status.groupID ("gid-<n>"
// for a gid no ReplicaGroup of this ShardMap holds).
func groupNamer(groups map[string]*shardkvv1.ReplicaGroup) func(uint64) string {
	names := map[uint64]string{}
	for _, rg := range groups {
		if rg.Status.GroupID > 0 {
			names[uint64(rg.Status.GroupID)] = rg.Name
		}
	}
	return func(gid uint64) string {
		if n, ok := names[gid]; ok {
			return n
		}
		return fmt.Sprintf("gid-%d", gid)
	}
}

// fillStatus records what the controller reported (the last known values
// stay when it was not reached) and advances nextGroupID. settled: no
// migration in flight and every group applied the latest config.
func fillStatus(sm *shardkvv1.ShardMap, o *smObserved) (settled bool) {
	st := &sm.Status
	st.ObservedGeneration = sm.Generation
	st.ControllerReadyReplicas = o.readyReplicas()

	next := max(st.NextGroupID, 1)
	for _, rg := range o.Groups {
		next = max(next, rg.Status.GroupID+1)
	}
	if o.Cluster == nil {
		st.NextGroupID = next
		return false
	}
	cfg := o.Cluster.Latest
	for _, g := range cfg.Groups {
		next = max(next, int64(g.Gid)+1)
	}
	st.NextGroupID = next

	groups := o.Groups
	sum := summarize(o.Cluster, o.Prev, groupNamer(groups))
	st.ConfigNum = int64(cfg.Num)
	st.Groups = sum.groups
	st.GroupCount = int32(len(sum.groups))
	st.Table = sum.table
	st.ShardStates = sum.states
	st.MigratingShards = sum.migrating
	st.Migrations = sum.migrations
	settled = sum.migrating == 0 && len(sum.behind) == 0 && len(cfg.Groups) > 0

	ready := metav1.Condition{Type: shardkvv1.ConditionReady}
	balanced := metav1.Condition{Type: shardkvv1.ConditionBalanced}
	migrating := metav1.Condition{Type: shardkvv1.ConditionMigrating}
	switch {
	case len(cfg.Groups) == 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonNoGroups, fmt.Sprintf("config %d: no ReplicaGroup has joined yet", cfg.Num)
		balanced.Status, balanced.Reason, balanced.Message = metav1.ConditionFalse, ReasonNoGroups, "no group to place shards on"
	case sum.notServing > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonShardsNotServing
		ready.Message = fmt.Sprintf("config %d: %d of %d shards not serving on their owner (%s)", cfg.Num, sum.notServing, len(cfg.Shards), statesText(sum.states))
	default:
		ready.Status, ready.Reason = metav1.ConditionTrue, ReasonServing
		ready.Message = fmt.Sprintf("config %d: all %d shards serving on %d groups", cfg.Num, len(cfg.Shards), len(cfg.Groups))
	}
	if sum.truncated {
		ready.Message += fmt.Sprintf("; status.table shows the first %d runs only", maxTableRanges)
	}
	if len(cfg.Groups) > 0 {
		behind := ""
		if len(sum.behind) > 0 {
			var names []string
			for _, gid := range sum.behind {
				names = append(names, groupNamer(groups)(gid))
			}
			behind = fmt.Sprintf("groups %s have not applied config %d yet", strings.Join(names, ", "), cfg.Num)
		}
		switch {
		case sum.migrating > 0:
			balanced.Status, balanced.Reason = metav1.ConditionFalse, ReasonMigrationsInFlight
			balanced.Message = fmt.Sprintf("%d shards migrating", sum.migrating)
			if behind != "" {
				balanced.Message += "; " + behind
			}
		case behind != "":
			balanced.Status, balanced.Reason = metav1.ConditionFalse, ReasonGroupsCatchingUp
			balanced.Message = behind
		default:
			balanced.Status, balanced.Reason = metav1.ConditionTrue, ReasonSettled
			balanced.Message = fmt.Sprintf("no migration in flight; every group applied config %d", cfg.Num)
		}
	}
	if sum.migrating > 0 {
		var parts []string
		for _, m := range sum.migrations {
			s := fmt.Sprintf("%s->%s %d shards", m.Source, m.Target, m.Shards)
			if m.Progress != "" {
				s += " " + m.Progress
			}
			parts = append(parts, s)
		}
		migrating.Status, migrating.Reason = metav1.ConditionTrue, ReasonShardsMoving
		migrating.Message = fmt.Sprintf("%d shards moving: %s", sum.migrating, strings.Join(parts, ", "))
	} else {
		migrating.Status, migrating.Reason, migrating.Message = metav1.ConditionFalse, ReasonNoMigrations, "no shard is moving"
	}
	for _, c := range []metav1.Condition{ready, balanced, migrating} {
		c.ObservedGeneration = sm.Generation
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return settled
}

func statesText(m map[string]int32) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// setConditions records the conditions that do not come from the
// controller's view: readiness when it was not reached, Progressing (the
// plan's wait, else the step taken, else UpToDate) and Degraded. It returns
// the Progressing condition.
func (r *ShardMapReconciler) setConditions(sm *shardkvv1.ShardMap, o *smObserved, pl smPlan, done smCondition) smCondition {
	set := func(typ string, c smCondition) {
		meta.SetStatusCondition(&sm.Status.Conditions, metav1.Condition{
			Type: typ, Status: c.Status, Reason: c.Reason, Message: c.Message, ObservedGeneration: sm.Generation})
	}
	if o.Cluster == nil {
		reason := ReasonControllerUnavailable
		if o.readyReplicas() < o.quorum() {
			reason = ReasonWaitingForControllerQuorum
		}
		msg := o.ClusterErr.Error()
		set(shardkvv1.ConditionReady, smCondition{metav1.ConditionFalse, reason, msg})
		set(shardkvv1.ConditionBalanced, smCondition{metav1.ConditionUnknown, reason, "the controller was not reached: " + msg})
		set(shardkvv1.ConditionMigrating, smCondition{metav1.ConditionUnknown, reason, "the controller was not reached: " + msg})
	}
	progress := pl.Wait
	if progress.Reason == "" {
		progress = done
	}
	if progress.Reason == "" {
		progress = smCondition{metav1.ConditionFalse, ReasonUpToDate, "the controller group and spec.moves are applied"}
	}
	prev := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionProgressing)
	wasPaused := prev != nil && prev.Reason == ReasonPaused
	if sm.Spec.Paused && !wasPaused {
		r.event(sm, corev1.EventTypeNormal, "Paused", "Pause", "spec.paused is set: no changes to the cluster until it is cleared")
	} else if !sm.Spec.Paused && wasPaused {
		r.event(sm, corev1.EventTypeNormal, "Resumed", "Resume", "spec.paused was cleared: reconciling again")
	}
	set(shardkvv1.ConditionProgressing, progress)
	if pl.Degraded.Reason != "" {
		set(shardkvv1.ConditionDegraded, pl.Degraded)
	} else {
		meta.RemoveStatusCondition(&sm.Status.Conditions, shardkvv1.ConditionDegraded)
	}
	return progress
}
