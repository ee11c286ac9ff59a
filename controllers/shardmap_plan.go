package controllers

// The ShardMap planner: a pure function from one observation of a cluster
// (its spec, the controller group's objects and pods, the controller's
// view and the ReplicaGroups) to the one next change, the first thing the
// pass waits on, and what of the spec cannot be applied. The reconciler
// observes, asks planShardMap, executes the step and records the status,
// as the ReplicaGroup reconciler does with nextStep (replicagroup_plan.go).
// Nothing is remembered between passes but what the observation shows.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// stsRevisionLabel is the StatefulSet controller's pod revision label.
const stsRevisionLabel = appsv1.StatefulSetRevisionLabel

// smObserved is everything a pass knows about one ShardMap.
type smObserved struct {
	Name, Namespace string
	Paused          bool
	Moves           []shardkvv1.ShardMove
	// Replicas is spec.controller.replicas; Bootstrap the size the
	// controller group was created with (its --peers), which it keeps;
	// Size the StatefulSet's replicas (Bootstrap before there is one),
	// which a resize moves (shardmap_resize.go). Voters is the group's
	// voting members as last recorded in the status (0: not yet).
	Replicas, Bootstrap, Size, Voters int32
	Storage                           shardkvv1.StorageSpec
	// Claims are the claims of the controller pods below Size;
	// ResizeRefused the API server's refusal of a resize at this
	// generation (storage.go). ClaimUIDs are every controller claim not
	// being deleted, by ordinal (beyond Size too).
	Claims        []claimView
	ResizeRefused string
	ClaimUIDs     map[int]types.UID

	// Sts, Svc and PDB are the controller group's objects (nil: none, or
	// one this ShardMap does not own: then its *Conflict is set).
	Sts                                   *appsv1.StatefulSet
	Svc                                   *corev1.Service
	PDB                                   *policyv1.PodDisruptionBudget
	StsConflict, SvcConflict, PDBConflict bool
	// WantSts, WantSvc and WantPDB are the objects the spec asks for.
	WantSts *appsv1.StatefulSet
	WantSvc *corev1.Service
	WantPDB *policyv1.PodDisruptionBudget
	// Pods are the controller pods by ordinal (Revision: stsRevisionLabel).
	Pods map[int]*podView
	// NetPols are the cluster's NetworkPolicies this ShardMap owns, by
	// name; NetPolConflicts the names taken by policies it does not own;
	// WantNetPols those spec.network asks for (shardmap_netpol.go).
	NetPols         map[string]*networkingv1.NetworkPolicy
	NetPolConflicts []string
	WantNetPols     map[string]*networkingv1.NetworkPolicy
	// CtrlerPods is the replica each ready controller pod runs, by
	// ordinal, once the controller answered (shardmap_members.go);
	// ctrlerPodObjs the pods.
	CtrlerPods    map[int]*shardkvpb.MemberStatus
	ctrlerPodObjs map[int]*corev1.Pod

	// Cluster is the controller's view (nil: not reached; ClusterErr says
	// why). Prev is the config before the latest, fetched only while some
	// group has not reached the latest: the owners its shards move from.
	Cluster    *shardkvpb.ClusterStatus
	ClusterErr error
	Prev       *shardkvpb.Config
	// Groups are this ShardMap's ReplicaGroups by name.
	Groups map[string]*shardkvv1.ReplicaGroup

	// TLS is the cluster's certificate Secrets (nil: TLS not Managed).
	TLS *tlsObserved
	// Users: see shardmap_users.go.
	Users usersObserved
}

// readyReplicas are the ready controller pods, as the StatefulSet counts.
func (o *smObserved) readyReplicas() int32 {
	if o.Sts == nil {
		return 0
	}
	return o.Sts.Status.ReadyReplicas
}

// quorum is a majority of the controller group's voters: those last
// recorded, else the StatefulSet's size. (Not the size alone: pods a grow
// adds are not ready until they are members, which needs the controller.)
func (o *smObserved) quorum() int32 {
	n := o.Size
	if o.Voters > 0 {
		n = min(n, o.Voters)
	}
	return n/2 + 1
}

// leaderOrdinal is the ordinal of the controller leader's pod (-1: not
// known).
func (o *smObserved) leaderOrdinal() int {
	return ctrlerAddrOrdinal(o, o.Cluster.GetController().GetAddr())
}

// smStepKind is the one change a pass makes. The object kinds are also the
// actions of their Events.
type smStepKind string

const (
	smStepNone              smStepKind = ""
	smStepCreateStatefulSet smStepKind = "CreateStatefulSet"
	smStepUpdateStatefulSet smStepKind = "UpdateStatefulSet"
	smStepCreateService     smStepKind = "CreateService"
	smStepUpdateService     smStepKind = "UpdateService"
	smStepCreatePDB         smStepKind = "CreatePodDisruptionBudget"
	smStepUpdatePDB         smStepKind = "UpdatePodDisruptionBudget"
	smStepDeletePod         smStepKind = "DeletePod"        // Ordinal: roll it
	smStepMove              smStepKind = "Move"             // Shard to GID (Group)
	smStepUnpin             smStepKind = "Unpin"            // Shard (pinned to GID)
	smStepTLS               smStepKind = "TLS"              // TLS: one Secret write
	smStepSetUsers          smStepKind = "SetUsers"         // the Secret's users to the controller
	smStepGrowVolume        smStepKind = "GrowVolume"       // Ordinal: its claim to spec.controller.storage.size
	smStepScaleStatefulSet  smStepKind = "ScaleStatefulSet" // Replicas: the StatefulSet's new size
	smStepDeleteClaim       smStepKind = "DeleteClaim"      // Ordinal: the claim of a pod a shrink removed
	smStepCtrlerRecreate    smStepKind = "RecreateReplica"  // Ordinal: claim and pod of a pod that runs a removed replica
)

// smStep is one change.
type smStep struct {
	Kind smStepKind
	// DeletePod: the pod, whether it runs the controller's leader, and
	// how many pods are left to roll (it included).
	Ordinal  int
	Leader   bool
	Outdated int
	// Move, Unpin: the shard and its (new or dropped) owner.
	Shard int
	GID   uint64
	Group string
	// TLS: the certificate change.
	TLS tlsStep
	// NetworkPolicy steps: the policy's name. Controller membership
	// steps: what the step does, in words.
	Object string
	// Controller membership steps: the replica id added, promoted,
	// removed or handed the leadership (Ordinal: its pod), and the
	// Progressing reason ("": ReasonReplacingCtrlerReplica).
	Member uint64
	Reason string
	// ScaleStatefulSet: the new size.
	Replicas int32
}

func (s smStep) String() string {
	switch s.Kind {
	case smStepNone:
		return "None"
	case smStepDeletePod, smStepGrowVolume, smStepDeleteClaim, smStepCtrlerRecreate:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Ordinal)
	case smStepScaleStatefulSet:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Replicas)
	case smStepMove:
		return fmt.Sprintf("%s(%d,%d)", s.Kind, s.Shard, s.GID)
	case smStepUnpin:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Shard)
	case smStepTLS:
		if s.TLS.Leaf.Secret != "" {
			return fmt.Sprintf("%s(%s)", s.TLS.Kind, s.TLS.Leaf.Secret)
		}
		return string(s.TLS.Kind)
	case smStepCreateNetPol, smStepUpdateNetPol, smStepDeleteNetPol:
		return fmt.Sprintf("%s(%s)", s.Kind, s.Object)
	case smStepCtrlerAddLearner, smStepCtrlerPromote, smStepCtrlerRemoveMember, smStepCtrlerTransferLeader:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Member)
	}
	return string(s.Kind)
}

// smCondition is the status, reason and message of a condition.
type smCondition struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// smPlan is the planner's answer.
type smPlan struct {
	// Step is the one change of the pass (Kind smStepNone: none).
	Step smStep
	// Wait is the first thing the pass waits on (Reason "": nothing): the
	// Progressing condition, ahead of the step's own. A wait holds back
	// its own part only: pods wait to roll while spec.moves go on.
	Wait smCondition
	// Degraded is a spec change that cannot be applied, or an object of
	// the controller group's name this ShardMap does not own (Reason "":
	// none).
	Degraded smCondition
}

func (pl *smPlan) wait(reason, format string, args ...any) {
	if pl.Wait.Reason == "" {
		pl.Wait = smCondition{metav1.ConditionTrue, reason, fmt.Sprintf(format, args...)}
	}
}

func (pl *smPlan) degraded(reason, format string, args ...any) {
	pl.Degraded = smCondition{metav1.ConditionTrue, reason, fmt.Sprintf(format, args...)}
}

// planShardMap is the planner. Its order: the cluster's NetworkPolicies,
// the controller group's objects (StatefulSet, Service,
// PodDisruptionBudget), then rolling its pods, then spec.moves; the first
// change found is the step.
func planShardMap(o *smObserved) smPlan {
	var pl smPlan
	name := CtrlerName(o.Name)
	if o.StsConflict {
		pl.degraded(ReasonConflict, "StatefulSet %s exists and is not owned by this ShardMap", name)
	}
	if o.Paused {
		pl.Wait = smCondition{metav1.ConditionFalse, ReasonPaused,
			"spec.paused is set: the operator changes nothing of this cluster (status is still updated)"}
		return pl
	}
	// Certificates first: the pods mount them.
	if o.TLS != nil {
		st, wait := planTLS(o.TLS)
		if st.Kind != tlsNone {
			pl.Step = smStep{Kind: smStepTLS, TLS: st}
			return pl
		}
		if wait != "" {
			pl.wait(ReasonWaitingForTLS, "%s", wait)
		}
	}
	if !o.StsConflict {
		if st, ok := planNetworkPolicies(o, &pl); ok {
			pl.Step = st
			return pl
		}
		if st := planObjects(o, &pl); st.Kind != smStepNone {
			pl.Step = st
			return pl
		}
	}
	if o.Cluster != nil {
		if st, ok := planCtrlerMembers(o, &pl); ok {
			pl.Step = st
			return pl
		}
	}
	if st, ok := planResize(o, &pl); ok {
		pl.Step = st
		return pl
	}
	if st, ok := planRoll(o, &pl); ok {
		pl.Step = st
		return pl
	}
	if st := planUsers(o, &pl); st.Kind != smStepNone {
		pl.Step = st
		return pl
	}
	pl.Step = planMoveStep(o, &pl)
	return pl
}

// planObjects is the first of the controller group's objects to create or
// update, and what of them cannot be applied.
func planObjects(o *smObserved, pl *smPlan) smStep {
	name := CtrlerName(o.Name)
	if o.Sts == nil {
		return smStep{Kind: smStepCreateStatefulSet}
	}
	// The volumes: grown to spec.controller.storage.size (storage.go);
	// what cannot be applied is said.
	sp := planStorage("spec.controller.storage", o.Storage, o.Claims, o.ResizeRefused)
	if sp.Status == metav1.ConditionFalse && sp.Reason != reasonStorageResizing && pl.Degraded.Reason == "" {
		pl.degraded(sp.Reason, "%s", sp.Message)
	}
	if o.Sts.Annotations[annotationSpecHash] != o.WantSts.Annotations[annotationSpecHash] {
		return smStep{Kind: smStepUpdateStatefulSet}
	}
	if sp.Grow != nil {
		return smStep{Kind: smStepGrowVolume, Ordinal: sp.Grow.Ordinal, Object: sp.Grow.Name}
	}
	switch {
	case o.SvcConflict:
		pl.degraded(ReasonConflict, "Service %s exists and is not owned by this ShardMap", name)
	case o.Svc == nil:
		return smStep{Kind: smStepCreateService}
	case o.Svc.Annotations[annotationSpecHash] != o.WantSvc.Annotations[annotationSpecHash]:
		return smStep{Kind: smStepUpdateService}
	}
	switch {
	case o.PDBConflict:
		pl.degraded(ReasonConflict, "PodDisruptionBudget %s exists and is not owned by this ShardMap", name)
	case o.PDB == nil:
		return smStep{Kind: smStepCreatePDB}
	case o.PDB.Annotations[annotationSpecHash] != o.WantPDB.Annotations[annotationSpecHash]:
		return smStep{Kind: smStepUpdatePDB}
	}
	return smStep{}
}

// planRoll deletes one controller pod whose revision is not the
// StatefulSet's update revision (OnDelete strategy) when every pod is
// ready and the controller answers with a leader, in nextRollout's order:
// followers first, the leader last, after handing its leadership to a
// caught-up follower (preferably one already updated), so the group
// elects no leader in a hurry and the restarted pod is a follower.
func planRoll(o *smObserved, pl *smPlan) (smStep, bool) {
	sts := o.Sts
	if sts == nil || sts.Status.UpdateRevision == "" {
		return smStep{}, false
	}
	rev := sts.Status.UpdateRevision
	roll := nextRollout(int(o.Size), func(i int) bool {
		p, ok := o.Pods[i]
		return ok && p.Revision != rev
	}, o.leaderOrdinal())
	if roll.Outdated == 0 {
		return smStep{}, false
	}
	wait := func(format string, args ...any) (smStep, bool) {
		pl.wait(ReasonWaitingToRoll, "%d controller pods to update; "+format, append([]any{roll.Outdated}, args...)...)
		return smStep{}, false
	}
	switch {
	case sts.Status.ObservedGeneration < sts.Generation:
		return wait("waiting for the StatefulSet controller to see the new template")
	case sts.Status.ReadyReplicas < o.Size || len(o.Pods) < int(o.Size):
		return wait("waiting for all %d pods to be ready (%d are)", o.Size, sts.Status.ReadyReplicas)
	case o.Cluster == nil:
		return wait("waiting for the controller to answer: %v", o.ClusterErr)
	}
	for _, ord := range slices.Sorted(maps.Keys(o.Pods)) {
		if p := o.Pods[ord]; p.Deleting || !p.Ready {
			return wait("waiting for pod %s to be ready", p.Name)
		}
	}
	if roll.Leader {
		if leader := ctrlerLeaderView(o); leader != nil && len(ctrlerVoters(leader)) > 1 {
			t, tord := ctrlerTransferTarget(o, leader, int(o.Size), rev)
			if t == nil {
				return wait("no caught-up follower to take over from the leader, pod %s", o.Pods[roll.Next].Name)
			}
			return smStep{Kind: smStepCtrlerTransferLeader, Ordinal: tord, Member: t.GetId(), Reason: ReasonRollingPods,
				Object: fmt.Sprintf("rolling update: moving the controller's leadership from %s to %s (replica %d) before restarting it",
					o.Pods[roll.Next].Name, podNameAt(o, tord), t.GetId())}, true
		}
	}
	return smStep{Kind: smStepDeletePod, Ordinal: roll.Next, Leader: roll.Leader, Outdated: roll.Outdated}, true
}

// planMoveStep is the next spec.moves call, if the controller answers.
func planMoveStep(o *smObserved, pl *smPlan) smStep {
	if o.Cluster == nil {
		if len(o.Moves) > 0 {
			pl.wait(ReasonWaitingForMoves, "spec.moves wait for the controller: %v", o.ClusterErr)
		}
		return smStep{}
	}
	mv, waits := planMoves(o.Moves, o.Cluster.Latest, o.Groups)
	if mv == nil {
		if len(waits) > 0 {
			pl.wait(ReasonWaitingForMoves, "%s", strings.Join(waits, "; "))
		}
		return smStep{}
	}
	if mv.unpin {
		return smStep{Kind: smStepUnpin, Shard: mv.shard, GID: mv.gid}
	}
	return smStep{Kind: smStepMove, Shard: mv.shard, GID: mv.gid, Group: mv.group}
}

// moveStep is one Move or Unpin.
type moveStep struct {
	unpin bool
	shard int
	gid   uint64
	group string
}

// planMoves compares spec.moves with the config's pins: the first pin to
// set (Move) or to drop (Unpin), and why other pins wait.
func planMoves(moves []shardkvv1.ShardMove, cfg *shardkvpb.Config, groups map[string]*shardkvv1.ReplicaGroup) (*moveStep, []string) {
	pins := map[uint32]uint64{}
	for _, pin := range cfg.GetPins() {
		pins[pin.Shard] = pin.Gid
	}
	inConfig := map[uint64]bool{}
	for _, g := range cfg.GetGroups() {
		inConfig[g.Gid] = true
	}
	want := slices.Clone(moves)
	slices.SortFunc(want, func(a, b shardkvv1.ShardMove) int { return int(a.Shard) - int(b.Shard) })
	wanted := map[uint32]bool{}
	var waits []string
	var step *moveStep
	for _, m := range want {
		wanted[uint32(m.Shard)] = true
		rg := groups[m.Group]
		switch {
		case int(m.Shard) >= len(cfg.GetShards()):
			waits = append(waits, fmt.Sprintf("shard %d is out of range (%d shards)", m.Shard, len(cfg.GetShards())))
		case rg == nil:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s of this ShardMap does not exist", m.Shard, m.Group))
		case rg.Status.GroupID == 0:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s has no group id yet", m.Shard, m.Group))
		case !rg.DeletionTimestamp.IsZero():
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s is being deleted", m.Shard, m.Group))
		case !inConfig[uint64(rg.Status.GroupID)]:
			waits = append(waits, fmt.Sprintf("shard %d: ReplicaGroup %s (gid %d) has not joined yet", m.Shard, m.Group, rg.Status.GroupID))
		case pins[uint32(m.Shard)] != uint64(rg.Status.GroupID) && step == nil:
			step = &moveStep{shard: int(m.Shard), gid: uint64(rg.Status.GroupID), group: m.Group}
		}
	}
	if step == nil {
		for _, pin := range cfg.GetPins() {
			if !wanted[pin.Shard] {
				step = &moveStep{unpin: true, shard: int(pin.Shard), gid: pin.Gid}
				break
			}
		}
	}
	return step, waits
}
