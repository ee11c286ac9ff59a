package controllers

// The ShardMap's status: the shard table, state counts, migrations and
// conditions from the controller's view, and the conditions of the pass
// (the plan's wait and the step taken).

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

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
	statePreCopying = "PreCopying" // a data group's state: the target of a planned move, copying
	stateUnknown    = "Unknown"
	statePending    = "Pending" // the owner has not reached the config yet
	stateUnassigned = "Unassigned"
	// reportStaleAfter: a group whose last report (they report every
	// 500 ms) is older does not report.
	reportStaleAfter = 10 * time.Second
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
	// waits are what migrations wait on, the most serious first
	// (GroupNotReporting, then WaitingForTarget), by group.
	waits []migrationWait
}

// migrationWait is one thing migrations wait on: a group (the source or
// target of moves) that does not report, or a planned move's target that
// applied the config announcing it but has not started copying.
type migrationWait struct {
	reason string // ReasonGroupNotReporting or ReasonWaitingForTarget
	group  string // the group waited on
	text   string // for the Migrating condition and the Event
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

// phaseRank orders migration phases: a migration of several shards is in
// the least advanced phase of its shards.
func phaseRank(phase string) int {
	switch phase {
	case shardkvv1.MigrationAnnounced:
		return 0
	case shardkvv1.MigrationPreCopying:
		return 1
	case shardkvv1.MigrationCuttingOver:
		return 2
	}
	return 3 // Finishing
}

// pauseText is a write pause in microseconds as a duration ("1.5ms").
func pauseText(us uint64) string {
	return (time.Duration(us) * time.Microsecond).String()
}

// summarize computes the shard table, state counts and migrations from
// the controller's status. name maps a gid to its ReplicaGroup's name.
// prev, if known, is the config before the latest: a shard whose new
// owner has not reached the latest config yet is Pending, moving from its
// previous owner, rather than Unknown.
//
// A shard is migrating from the moment the config plans its move
// (Config.moves: Announced) until neither group holds it in a state other
// than Serving. Its phase is the target's: PreCopying while the target
// copies it and the source still serves it, CuttingOver once the config
// gave it to the target (Pulling, or the target has not reached that
// config: Pending), Finishing while the two acknowledge and the source
// deletes its copy (Acking, GCing).
func summarize(st *shardkvpb.ClusterStatus, prev *shardkvpb.Config, name func(uint64) string) clusterSummary {
	cfg := st.GetLatest()
	reports := map[uint64]*shardkvpb.GroupReport{}
	ages := map[uint64]time.Duration{}
	byShard := map[uint64]map[uint32]*shardkvpb.ShardState{}
	for _, g := range st.GetGroups() {
		rep := g.GetReport()
		if rep == nil {
			continue
		}
		reports[rep.Gid] = rep
		ages[rep.Gid] = time.Duration(g.GetAgeMs()) * time.Millisecond
		m := map[uint32]*shardkvpb.ShardState{}
		for _, s := range rep.Shards {
			m[s.Shard] = s
		}
		byShard[rep.Gid] = m
	}
	out := clusterSummary{states: map[string]int32{}}

	// Groups, with their shard counts, copy rate limits and the write
	// pause of the latest move into each.
	owned := map[uint64]int32{}
	for _, gid := range cfg.GetShards() {
		owned[gid]++
	}
	for _, g := range cfg.GetGroups() {
		ref := shardkvv1.GroupRef{Name: name(g.Gid), GroupID: int64(g.Gid), Shards: owned[g.Gid], Leaving: g.Leaving}
		rep := reports[g.Gid]
		if rep == nil || rep.ConfigNum < cfg.Num {
			out.behind = append(out.behind, g.Gid)
		}
		if rep != nil {
			ref.MigrateBytesPerSec = int64(rep.MigrateBytesPerSec)
			var last *shardkvpb.ShardState
			for _, s := range rep.Shards {
				if s.WritePauseUs > 0 && (last == nil || s.ConfigNum > last.ConfigNum ||
					s.ConfigNum == last.ConfigNum && s.WritePauseUs > last.WritePauseUs) {
					last = s
				}
			}
			if last != nil {
				ref.LastWritePause = pauseText(last.WritePauseUs)
			}
		}
		out.groups = append(out.groups, ref)
	}

	// Migrations: every shard some group holds in a state other than
	// Serving, once; the new owner's record (it has the progress) wins
	// over the old owner's.
	type move struct {
		src, dst          uint64
		phase, copyPhase  string
		keys, total       uint64
		bytes, totalBytes uint64
		lag, pause        uint64
		caughtUp          bool
		newOwner          bool
	}
	planned := map[uint32]*shardkvpb.PlannedMove{}
	for _, pm := range cfg.GetMoves() {
		planned[pm.Shard] = pm
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
			case statePreCopying: // the target of a planned move, copying
				m = move{src: s.PeerGid, dst: gid, phase: shardkvv1.MigrationPreCopying, copyPhase: s.Phase,
					keys: s.Keys, total: s.TotalKeys, bytes: s.Bytes, totalBytes: s.TotalBytes,
					lag: s.LagEntries, caughtUp: s.CaughtUp, newOwner: true}
				if pm := planned[s.Shard]; m.src == 0 && pm != nil {
					m.src = pm.FromGid
				}
			case "Pulling", "Acking": // the new owner
				m = move{src: s.PeerGid, dst: gid, phase: shardkvv1.MigrationCuttingOver,
					keys: s.Keys, total: s.TotalKeys, bytes: s.Bytes, totalBytes: s.TotalBytes,
					lag: s.LagEntries, caughtUp: s.CaughtUp, newOwner: true}
				if s.State == "Acking" { // installed: the copy is complete
					m.phase, m.lag, m.caughtUp, m.pause = shardkvv1.MigrationFinishing, 0, true, s.WritePauseUs
					m.total, m.totalBytes = max(m.total, m.keys), max(m.totalBytes, m.bytes)
				}
			default: // BePulling, GCing: the old owner
				m = move{src: gid, dst: s.PeerGid, phase: shardkvv1.MigrationCuttingOver}
				if s.State == "GCing" {
					m.phase = shardkvv1.MigrationFinishing
				}
			}
			if prev, ok := moves[s.Shard]; ok && (prev.newOwner || !m.newOwner) {
				continue
			}
			moves[s.Shard] = m
		}
	}
	// Planned moves whose target has not started copying: announced.
	for _, pm := range cfg.GetMoves() {
		if _, known := moves[pm.Shard]; !known {
			moves[pm.Shard] = move{src: pm.FromGid, dst: pm.ToGid, phase: shardkvv1.MigrationAnnounced}
		}
	}

	// The table: each shard on its owner; a shard its owner serves while
	// a planned move's target copies it is PreCopying (and still served).
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
		if m, ok := moves[uint32(i)]; ok && v.state == stateServing && m.phase == shardkvv1.MigrationPreCopying && m.dst != gid {
			v.state = statePreCopying
		}
		views[i] = v
		out.states[v.state]++
		if v.state != stateServing && v.state != statePreCopying {
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

	// Shards whose new owner has not reached the latest config: moving
	// from their previous owner, nothing copied yet.
	if prevShards := prev.GetShards(); len(prevShards) == len(views) {
		for i, v := range views {
			from := prevShards[i]
			if _, known := moves[uint32(i)]; !known && v.state == statePending && from != 0 && from != v.gid {
				moves[uint32(i)] = move{src: from, dst: v.gid, phase: shardkvv1.MigrationCuttingOver}
			}
		}
	}

	// What the moves wait on: a source or target that does not report
	// (none, or none for reportStaleAfter), and planned moves whose
	// target applied the config announcing them but has not started.
	type waitKey struct {
		reason string
		gid    uint64
	}
	waitShards := map[waitKey][]uint32{}
	notReporting := func(gid uint64) bool {
		_, ok := reports[gid]
		return gid != 0 && (!ok || ages[gid] > reportStaleAfter)
	}
	for _, shard := range slices.Sorted(maps.Keys(moves)) {
		m := moves[shard]
		for _, gid := range []uint64{m.src, m.dst} {
			if notReporting(gid) {
				k := waitKey{ReasonGroupNotReporting, gid}
				waitShards[k] = append(waitShards[k], shard)
			}
		}
		if pm := planned[shard]; m.phase == shardkvv1.MigrationAnnounced && !notReporting(m.dst) && reports[m.dst].ConfigNum >= pm.SinceConfig {
			k := waitKey{ReasonWaitingForTarget, m.dst}
			waitShards[k] = append(waitShards[k], shard)
		}
	}
	waitKeys := slices.Collect(maps.Keys(waitShards))
	serious := func(reason string) int { // GroupNotReporting first
		if reason == ReasonGroupNotReporting {
			return 0
		}
		return 1
	}
	slices.SortFunc(waitKeys, func(a, b waitKey) int {
		if a.reason != b.reason {
			return cmp.Compare(serious(a.reason), serious(b.reason))
		}
		return cmp.Compare(a.gid, b.gid)
	})
	for _, k := range waitKeys {
		shards := shardList(waitShards[k])
		var text string
		if k.reason == ReasonGroupNotReporting {
			how := "has not reported"
			if _, ok := reports[k.gid]; ok {
				how = fmt.Sprintf("has not reported for over %s", reportStaleAfter)
			}
			text = fmt.Sprintf("group %s %s; moving shards waiting on it: %s", name(k.gid), how, shards)
		} else {
			text = fmt.Sprintf("group %s applied the config announcing the move of shards %s to it but has not started copying them",
				name(k.gid), shards)
		}
		out.waits = append(out.waits, migrationWait{reason: k.reason, group: name(k.gid), text: text})
	}

	type pair struct{ src, dst uint64 }
	agg := map[pair]*shardkvv1.Migration{}
	pauses := map[pair]uint64{}
	var order []pair
	for _, shard := range slices.Sorted(maps.Keys(moves)) {
		m := moves[shard]
		k := pair{m.src, m.dst}
		a, ok := agg[k]
		if !ok {
			a = &shardkvv1.Migration{Source: name(m.src), Target: name(m.dst), Phase: m.phase}
			agg[k] = a
			order = append(order, k)
		}
		a.Shards++
		a.Keys += int64(m.keys)
		a.TotalKeys += int64(m.total)
		a.Bytes += int64(m.bytes)
		a.TotalBytes += int64(m.totalBytes)
		a.LagEntries = max(a.LagEntries, int64(m.lag))
		if phaseRank(m.phase) < phaseRank(a.Phase) {
			a.Phase = m.phase
		}
		if m.phase == shardkvv1.MigrationPreCopying && m.copyPhase != "" && a.CopyPhase != copyPhaseSnapshot {
			a.CopyPhase = m.copyPhase
		}
		if m.caughtUp {
			a.CaughtUpShards++
		}
		if m.pause > pauses[k] {
			pauses[k] = m.pause
			a.LastWritePause = pauseText(m.pause)
		}
	}
	slices.SortFunc(order, func(a, b pair) int {
		if a.src != b.src {
			return cmp.Compare(a.src, b.src)
		}
		return cmp.Compare(a.dst, b.dst)
	})
	for _, k := range order {
		a := agg[k]
		switch {
		case a.TotalKeys > 0:
			a.Progress = fmt.Sprintf("%d%%", min(100, a.Keys*100/a.TotalKeys))
		case a.TotalBytes > 0:
			a.Progress = fmt.Sprintf("%d%%", min(100, a.Bytes*100/a.TotalBytes))
		}
		out.migrations = append(out.migrations, *a)
	}
	out.migrating = int32(len(moves))
	return out
}

// copyPhaseSnapshot is the first of a pre-copy's sub-phases (then delta).
const copyPhaseSnapshot = "snapshot"

// shardList is sorted shards as "3, 5, 9", the first 10 only.
func shardList(shards []uint32) string {
	const show = 10
	var parts []string
	for i, s := range shards {
		if i == show {
			parts = append(parts, fmt.Sprintf("and %d more", len(shards)-show))
			break
		}
		parts = append(parts, strconv.Itoa(int(s)))
	}
	return strings.Join(parts, ", ")
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
//
// waits are what the migrations wait on (none when the controller was not
// reached).
func fillStatus(sm *shardkvv1.ShardMap, o *smObserved) (settled bool, waits []migrationWait) {
	st := &sm.Status
	st.ObservedGeneration = sm.Generation
	st.ControllerReadyReplicas = o.readyReplicas()

	next := max(st.NextGroupID, 1)
	for _, rg := range o.Groups {
		next = max(next, rg.Status.GroupID+1)
	}
	if o.Cluster == nil {
		st.NextGroupID = next
		return false, nil
	}
	if leader := ctrlerLeaderView(o); leader != nil {
		st.ControllerVoters = int32(len(ctrlerVoters(leader)))
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
			detail := m.Phase
			if m.CopyPhase != "" {
				detail += "/" + m.CopyPhase
			}
			if m.LagEntries > 0 {
				detail += fmt.Sprintf(", lag %d entries", m.LagEntries)
			}
			if m.LastWritePause != "" {
				detail += ", write pause " + m.LastWritePause
			}
			parts = append(parts, s+" ("+detail+")")
		}
		migrating.Status, migrating.Reason = metav1.ConditionTrue, ReasonShardsMoving
		migrating.Message = fmt.Sprintf("%d shards moving: %s", sum.migrating, strings.Join(parts, ", "))
		if len(sum.waits) > 0 {
			// The most serious wait is the reason; every wait is told.
			migrating.Reason = sum.waits[0].reason
			var texts []string
			for _, w := range sum.waits {
				texts = append(texts, w.text)
			}
			migrating.Message += waitingMarker + strings.Join(texts, "; ")
		}
	} else {
		migrating.Status, migrating.Reason, migrating.Message = metav1.ConditionFalse, ReasonNoMigrations, "no shard is moving"
	}
	for _, c := range []metav1.Condition{ready, balanced, migrating} {
		c.ObservedGeneration = sm.Generation
		meta.SetStatusCondition(&st.Conditions, c)
	}
	return settled, sum.waits
}

// waitingMarker starts the waits in the Migrating condition's message.
const waitingMarker = "; waiting: "

// migrationWaitEvents records an Event for each migration wait that the
// Migrating condition of before (the status as last written) did not
// tell yet: Warning GroupNotReporting, Normal WaitingForTarget, one per
// group waited on (the action names it, so that events.k8s.io does not
// merge waits on different groups into one series).
func (r *ShardMapReconciler) migrationWaitEvents(sm *shardkvv1.ShardMap, before *shardkvv1.ShardMapStatus, waits []migrationWait) {
	told := ""
	if c := meta.FindStatusCondition(before.Conditions, shardkvv1.ConditionMigrating); c != nil {
		if _, w, ok := strings.Cut(c.Message, waitingMarker); ok {
			told = w
		}
	}
	for _, w := range waits {
		if strings.Contains(told, w.text) {
			continue
		}
		typ := corev1.EventTypeNormal
		if w.reason == ReasonGroupNotReporting {
			typ = corev1.EventTypeWarning
		}
		r.event(sm, typ, w.reason, "WaitFor-"+w.group, "%s", w.text)
	}
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
	if o.Sts != nil {
		sp := planStorage("spec.controller.storage", o.Storage, o.Claims, o.ResizeRefused)
		prevStorage := meta.FindStatusCondition(sm.Status.Conditions, shardkvv1.ConditionStorageApplied)
		if sp.Status == metav1.ConditionFalse && sp.Reason != reasonStorageResizing && (prevStorage == nil || prevStorage.Reason != sp.Reason) {
			r.event(sm, corev1.EventTypeWarning, sp.Reason, "GrowVolume", "%s", sp.Message)
		}
		set(shardkvv1.ConditionStorageApplied, smCondition{sp.Status, sp.Reason, sp.Message})
	}
	if pl.Degraded.Reason != "" {
		set(shardkvv1.ConditionDegraded, pl.Degraded)
	} else {
		meta.RemoveStatusCondition(&sm.Status.Conditions, shardkvv1.ConditionDegraded)
	}
	return progress
}
