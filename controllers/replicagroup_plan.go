package controllers

// The ReplicaGroup planner: a pure function from one observation of a group
// (its spec and status, StatefulSet, pods, what each replica's admin API
// says, and the controller's latest config) to the one next safe step. The
// reconciler observes, asks nextStep, executes that step, and comes back.
// Nothing is remembered between passes except what the observation shows,
// so a crash, a lost update or a changed spec between two passes only
// changes the next step, never leaves a half-done one behind.

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// maxCatchUpLag is how far (in log entries) a member's replicated index may
// trail the leader's commit index and still count as caught up: the same
// margin /readyz allows a replica's applied index.
const maxCatchUpLag = 1000

// maxSilence is how long ago the leader may have last heard from a member
// that counts as healthy: an election timeout, after which the leader
// itself gives up on a silent quorum.
const maxSilence = time.Second

// A drained group's pods stay until clients that still map its old shards
// to them have been redirected (each answers with the new owner): gone at
// once, they would be connection errors ("no such host") to those clients.
// They go once no pod has had a client request for drainQuiet (Redis
// Cluster clients such as go-redis reload their slot map on a redirect and
// at least every 10s of use), or after drainLingerMax at most.
const (
	drainQuiet     = 15 * time.Second
	drainLingerMax = 2 * time.Minute
)

// stepKind is what one pass does.
type stepKind string

const (
	// stepIdle: nothing to do; the group is where the spec wants it.
	stepIdle stepKind = "Idle"
	// stepWait: a step is in progress or blocked; Reason/Message say on what.
	stepWait stepKind = "Wait"

	stepAddFinalizer     stepKind = "AddFinalizer"
	stepAllocateGroupID  stepKind = "AllocateGroupID"
	stepScaleStatefulSet stepKind = "ScaleStatefulSet" // Replicas
	stepAddLearner       stepKind = "AddLearner"       // ID at Ordinal
	stepPromote          stepKind = "Promote"          // ID
	stepRemoveMember     stepKind = "RemoveMember"     // ID
	stepTransferLeader   stepKind = "TransferLeader"   // ID: the new leader
	stepJoin             stepKind = "Join"             // Servers
	stepLeave            stepKind = "Leave"
	stepRestartPod       stepKind = "RestartPod"      // Ordinal: delete the pod to roll it
	stepRecreateReplica  stepKind = "RecreateReplica" // Ordinal: delete PVC and pod of a removed replica
	stepDeletePVC        stepKind = "DeletePVC"       // Ordinal
	stepGrowVolume       stepKind = "GrowVolume"      // Ordinal: ask for spec.storage.size (storage.go)
	stepTakeRollSlot     stepKind = "TakeRollSlot"    // the cluster's roll slot, before the first pod restarts
	stepReleaseRollSlot  stepKind = "ReleaseRollSlot" // the roll is done
	stepFinalize         stepKind = "Finalize"        // delete PVCs per retention, drop the finalizer
)

// Reasons of Wait steps (and of the conditions they set).
const (
	reasonPaused                = "Paused"
	reasonShardMapNotFound      = "ShardMapNotFound"
	reasonCreating              = "CreatingStatefulSet"
	reasonNoLeader              = "WaitingForLeader"
	reasonWaitingForPod         = "WaitingForPod"
	reasonLearnerCatchingUp     = "LearnerCatchingUp"
	reasonWaitingForQuorum      = "WaitingForQuorum"
	reasonControllerUnreachable = "ControllerUnreachable"
	reasonWaitingForDrain       = "WaitingForDrain"
	reasonLastGroupHoldsData    = "LastGroupHoldsData"
	reasonWaitingForRollout     = "WaitingForRollout"
	reasonStaleReplica          = "StaleReplica"
	reasonLostReplica           = "ReplaceLostReplica"
	reasonScaleIn               = "ScaleIn"
	reasonScaleOut              = "ScaleOut"
	reasonRollingUpdate         = "RollingUpdate"
	reasonWaitingForRollSlot    = "WaitingForRollSlot"
	reasonJoin                  = "Join"
	reasonUpdateServers         = "UpdateServers"
	reasonLeave                 = "Leave"
	reasonDrained               = "Drained"
	reasonClusterDeleting       = "ClusterDeleting"
	reasonClusterDeleted        = "ClusterDeleted"
	reasonStranded              = "Stranded"
	reasonLingering             = "WaitingForClientsToMove"
	reasonPVCCleanup            = "DeletePVC"
	reasonBootstrap             = "Bootstrap"
	reasonRetainedVolumes       = "RetainedVolumes"
	reasonGrowVolume            = "GrowVolume"
	reasonWipeRetainedVolume    = "WipeRetainedVolume"
	reasonIdle                  = "Idle"
)

// step is the planner's answer: one action and why.
type step struct {
	Kind     stepKind
	Ordinal  int
	ID       uint64
	Replicas int32
	Servers  []*shardkvpb.Server
	// Reason is a CamelCase word for conditions and events; Message says
	// what is done or waited for, in a sentence.
	Reason  string
	Message string
}

func (s step) String() string {
	switch s.Kind {
	case stepScaleStatefulSet:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Replicas)
	case stepAddLearner:
		return fmt.Sprintf("%s(%d@%d)", s.Kind, s.ID, s.Ordinal)
	case stepPromote, stepRemoveMember, stepTransferLeader:
		return fmt.Sprintf("%s(%d)", s.Kind, s.ID)
	case stepRestartPod, stepRecreateReplica, stepDeletePVC, stepGrowVolume:
		return fmt.Sprintf("%s(%d)", s.Kind, s.Ordinal)
	case stepJoin:
		ids := make([]string, len(s.Servers))
		for i, sv := range s.Servers {
			ids[i] = strconv.FormatUint(sv.Id, 10)
		}
		return fmt.Sprintf("%s(%s)", s.Kind, strings.Join(ids, ","))
	case stepWait:
		return fmt.Sprintf("%s(%s)", s.Kind, s.Reason)
	}
	return string(s.Kind)
}

// mutates reports whether executing s changes anything.
func (s step) mutates() bool { return s.Kind != stepIdle && s.Kind != stepWait }

// podView is one pod of the group's StatefulSet as observed.
type podView struct {
	Ordinal  int
	Name     string
	UID      types.UID
	Exists   bool
	Deleting bool
	Ready    bool
	// Revision is the pod's controller-revision-hash label.
	Revision string
	// Trouble says why the node container is not running (podTrouble;
	// "" if it runs or is starting normally).
	Trouble string
	// Status is what the replica's admin API answered (nil: unreachable).
	Status *shardkvpb.MemberStatus
}

// present: the pod exists and is not being deleted.
func (p *podView) present() bool { return p != nil && p.Exists && !p.Deleting }

// memberView is one Raft member as the leader reports it.
type memberView struct {
	ID uint64
	// Ordinal of the pod whose address the member has; -1 if the address
	// is not one of this group's pods.
	Ordinal int
	Learner bool
	// Match is the leader's replicated index of the member.
	Match uint64
	// HeardMsAgo: since the leader last heard from the member (nil: the
	// leader predates the field).
	HeardMsAgo *uint64
}

// observed is everything a pass knows about one ReplicaGroup.
type observed struct {
	Name, Namespace string
	// creds is the operator's certificate for the cluster (nil: plain
	// text); the executor dials with it. The planner does not look at it.
	creds *mtls.Source

	Deleting     bool
	HasFinalizer bool
	Paused       bool
	// ShardMapGone: the ShardMap does not exist. ClusterDeleting: it is
	// being deleted; ClusterGroupsDeleting: so is every ReplicaGroup of
	// it (observed only while this one is being deleted).
	ShardMapGone, ClusterDeleting, ClusterGroupsDeleting bool

	GroupID uint64
	Phase   string
	// RESPPorts are the Redis ports the pods serve (respPorts): the
	// servers' addresses in the controller's config name those only.
	RESPPorts []string
	Desired   int32 // spec.replicas
	Bootstrap int32 // replicas the group was bootstrapped with
	Weight    uint32

	// StsReplicas is the StatefulSet's spec.replicas; -1: no StatefulSet.
	StsReplicas int32
	// UpdateRevision is the StatefulSet's status.updateRevision when the
	// status is current ("" otherwise: no rolling decisions).
	UpdateRevision     string
	PVCRetentionDelete bool

	// Pods by ordinal (every ordinal below StsReplicas has an entry, with
	// Exists false when there is no pod; pods beyond it are listed too).
	Pods map[int]*podView
	// PVCs are the ordinals that have a data-<rg>-<ordinal> claim (not
	// being deleted); PVCUIDs their UIDs.
	PVCs    []int
	PVCUIDs map[int]types.UID
	// RetainedPVCs are the ordinals whose claim is older than the
	// ReplicaGroup (retainedOrdinals): another group's data.
	RetainedPVCs []int
	// RetainedVolumesWipe: spec.retainedVolumes is Wipe.
	RetainedVolumesWipe bool
	// RollSlot: the group holds its cluster's roll slot (rollslot.go);
	// RollBlocked says why it may not take it now ("": it may).
	RollSlot    bool
	RollBlocked string
	// Storage is spec.storage; Claims the replicas' claims (below the set
	// and the spec); ResizeRefused the API server's refusal of a resize
	// at this generation (refusedResize).
	Storage       shardkvv1.StorageSpec
	Claims        []claimView
	ResizeRefused string

	// Leader is the leader's own status (nil: no leader found); its
	// Members are the group's membership.
	Leader        *shardkvpb.MemberStatus
	LeaderOrdinal int
	Members       []memberView

	// Config is the controller's latest config (nil: unreachable).
	Config *shardkvpb.Config
	// Reports are the group reports by gid from the controller's Status
	// (only observed while deleting; nil: not known).
	Reports map[uint64]*shardkvpb.GroupReport
	// DrainedAt is status.drainedAt (zero: not drained yet); Now is the
	// pass's time.
	DrainedAt, Now time.Time
}

// majority of n voters.
func majority(n int) int { return n/2 + 1 }

func (o *observed) pod(ordinal int) *podView {
	if p, ok := o.Pods[ordinal]; ok {
		return p
	}
	return &podView{Ordinal: ordinal}
}

func (o *observed) voters() []memberView {
	var out []memberView
	for _, m := range o.Members {
		if !m.Learner {
			out = append(out, m)
		}
	}
	return out
}

func (o *observed) membersAt(ordinal int) []memberView {
	var out []memberView
	for _, m := range o.Members {
		if m.Ordinal == ordinal {
			out = append(out, m)
		}
	}
	return out
}

func (o *observed) member(id uint64) (memberView, bool) {
	for _, m := range o.Members {
		if m.ID == id {
			return m, true
		}
	}
	return memberView{}, false
}

func (o *observed) isLeader(m memberView) bool { return o.Leader != nil && m.ID == o.Leader.Id }

// caughtUp: the member's log is within maxCatchUpLag of the leader's commit.
func (o *observed) caughtUp(m memberView) bool {
	if o.Leader == nil {
		return false
	}
	if o.isLeader(m) {
		return true
	}
	return m.Match > 0 && m.Match+maxCatchUpLag >= o.Leader.Commit
}

// healthy: the member's pod runs it, answers, and is caught up.
func (o *observed) healthy(m memberView) bool {
	if m.Ordinal < 0 {
		return false
	}
	p := o.pod(m.Ordinal)
	if !p.present() || p.Status == nil || p.Status.Id != m.ID {
		return false
	}
	switch p.Status.Role {
	case "leader", "follower", "learner":
	default:
		return false
	}
	if !o.isLeader(m) && o.Leader != nil {
		// Both directions work now, not only before a restart: the member
		// follows this leader (it heard from it), and the leader heard
		// from it lately (raft keeps a restarted member's old match).
		if p.Status.Leader != o.Leader.Id || p.Status.Term != o.Leader.Term {
			return false
		}
		if m.HeardMsAgo != nil && time.Duration(*m.HeardMsAgo)*time.Millisecond > maxSilence {
			return false
		}
	}
	return o.caughtUp(m)
}

func (o *observed) healthyVoters(except uint64) int {
	n := 0
	for _, m := range o.voters() {
		if m.ID != except && o.healthy(m) {
			n++
		}
	}
	return n
}

// bestTransferTarget is the most caught-up healthy voter other than the
// leader, preferring ordinals below limit (ones that stay) and, if
// revision is set, pods already at that revision.
func (o *observed) bestTransferTarget(limit int, revision string) (memberView, bool) {
	var best memberView
	found := false
	better := func(a, b memberView) bool { // a better than b
		aStay, bStay := a.Ordinal < limit, b.Ordinal < limit
		if aStay != bStay {
			return aStay
		}
		if revision != "" {
			aNew, bNew := o.pod(a.Ordinal).Revision == revision, o.pod(b.Ordinal).Revision == revision
			if aNew != bNew {
				return aNew
			}
		}
		if a.Match != b.Match {
			return a.Match > b.Match
		}
		return a.Ordinal < b.Ordinal
	}
	for _, m := range o.voters() {
		if o.isLeader(m) || !o.healthy(m) {
			continue
		}
		if !found || better(m, best) {
			best, found = m, true
		}
	}
	return best, found
}

func (o *observed) podName(ordinal int) string { return fmt.Sprintf("%s-%d", o.Name, ordinal) }

func (o *observed) servers() []*shardkvpb.Server {
	var out []*shardkvpb.Server
	for _, m := range o.voters() {
		if m.Ordinal < 0 {
			continue
		}
		dns := PodDNS(o.Name, m.Ordinal, o.Namespace)
		sv := &shardkvpb.Server{Id: m.ID, Addr: podGRPCAddr(o.Name, m.Ordinal, o.Namespace)}
		// Redis clients are shown, in CLUSTER SLOTS and redirects, the
		// address of the port they came in on: a port the pods do not
		// serve must not be named, and a TLS port must be.
		if slices.Contains(o.RESPPorts, "resp") {
			sv.RespAddr = fmt.Sprintf("%s:%d", dns, RESPPort)
		}
		if slices.Contains(o.RESPPorts, "resp-tls") {
			sv.RespTlsAddr = fmt.Sprintf("%s:%d", dns, RESPTLSPort)
		}
		out = append(out, sv)
	}
	slices.SortFunc(out, func(a, b *shardkvpb.Server) int { return cmpU64(a.Id, b.Id) })
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// configGroup is gid's group in cfg (nil: not in it).
func configGroup(cfg *shardkvpb.Config, gid uint64) *shardkvpb.Group {
	for _, g := range cfg.GetGroups() {
		if g.Gid == gid {
			return g
		}
	}
	return nil
}

func sameServers(a, b []*shardkvpb.Server) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	byID := func(x, y *shardkvpb.Server) int { return cmpU64(x.Id, y.Id) }
	slices.SortFunc(a, byID)
	slices.SortFunc(b, byID)
	for i := range a {
		if a[i].Id != b[i].Id || a[i].Addr != b[i].Addr || a[i].RespAddr != b[i].RespAddr || a[i].RespTlsAddr != b[i].RespTlsAddr {
			return false
		}
	}
	return true
}

func wait(reason, format string, args ...any) step {
	return step{Kind: stepWait, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// nextStep is the planner: the one next step for the observed group.
func nextStep(o *observed) step {
	if o.Deleting {
		return planDeletion(o)
	}
	if o.Paused {
		return wait(reasonPaused, "the ShardMap is paused: no changes are made")
	}
	if !o.HasFinalizer {
		return step{Kind: stepAddFinalizer, Reason: reasonBootstrap, Message: "adding the drain finalizer"}
	}
	if o.ShardMapGone {
		return wait(reasonShardMapNotFound, "the ShardMap does not exist")
	}
	if o.ClusterDeleting {
		return wait(reasonClusterDeleting, "the ShardMap is being deleted and waits for its ReplicaGroups to go: nothing changes in this group until it is deleted too")
	}
	if o.GroupID == 0 {
		return step{Kind: stepAllocateGroupID, Reason: reasonBootstrap, Message: "allocating a group id"}
	}
	if len(o.RetainedPVCs) > 0 {
		return planRetainedVolumes(o)
	}
	if o.StsReplicas < 0 {
		return wait(reasonCreating, "creating the StatefulSet")
	}
	S := int(o.StsReplicas)
	D := int(o.Desired)

	// Claims of replicas beyond the set and the spec (scale-in finished)
	// go when their pod has gone, if the spec says so. Safe at any time.
	// Beyond the spec too: a set shrunk by hand (kubectl scale) still
	// holds the group's only copy of its data in the claims it no longer
	// reaches.
	if o.PVCRetentionDelete {
		for _, ord := range o.PVCs {
			if ord >= S && ord >= D && !o.pod(ord).Exists {
				return step{Kind: stepDeletePVC, Ordinal: ord, Reason: reasonPVCCleanup,
					Message: fmt.Sprintf("deleting the volume of removed replica %s (pvcRetention: Delete)", o.podName(ord))}
			}
		}
	}

	// Volumes grow when spec.storage.size grows: safe at any time, and
	// needs no leader (a group stopped by full disks needs it most).
	if sp := planStorage("spec.storage", o.Storage, o.Claims, o.ResizeRefused); sp.Grow != nil {
		size := storageSize(o.Storage)
		return step{Kind: stepGrowVolume, Ordinal: sp.Grow.Ordinal, Reason: reasonGrowVolume,
			Message: fmt.Sprintf("growing volume %s from %s to %s", sp.Grow.Name, sp.Grow.Request.String(), size.String())}
	}

	if o.Leader == nil {
		answering := 0
		var trouble []string
		for i := range S {
			p := o.pod(i)
			if p.Status != nil && p.Status.Id != 0 {
				answering++
			} else if p.Trouble != "" {
				trouble = append(trouble, p.Name+": "+p.Trouble)
			}
		}
		msg := fmt.Sprintf("waiting for the group to elect a leader (%d of %d pods answer)", answering, S)
		if len(trouble) > 0 {
			msg += "; " + strings.Join(trouble, "; ")
		}
		return wait(reasonNoLeader, "%s", msg)
	}
	voters := o.voters()

	// 1. Members whose pod now runs another replica id (its disk was lost
	// or replaced): the old id is dead for good. Removing a dead voter
	// never costs the quorum.
	for _, m := range o.Members {
		if m.Ordinal < 0 || o.isLeader(m) {
			continue
		}
		if p := o.pod(m.Ordinal); p.Exists && p.Status != nil && p.Status.Id != 0 && p.Status.Id != m.ID {
			return step{Kind: stepRemoveMember, ID: m.ID, Ordinal: m.Ordinal, Reason: reasonLostReplica,
				Message: fmt.Sprintf("pod %s now runs replica %d (its disk was lost or replaced): removing its old member %d",
					p.Name, p.Status.Id, m.ID)}
		}
	}

	// 2. Members beyond the set or the spec: remove, highest ordinal
	// first, the leader after handing leadership away.
	limit := min(S, D)
	var excess []memberView
	for _, m := range o.Members {
		if m.Ordinal >= limit && (m.Ordinal >= S || m.Ordinal == S-1 || m.Learner) {
			excess = append(excess, m)
		}
	}
	slices.SortFunc(excess, func(a, b memberView) int { return b.Ordinal - a.Ordinal })
	if len(excess) > 0 {
		m := excess[0]
		if o.isLeader(m) {
			t, ok := o.bestTransferTarget(limit, "")
			if !ok {
				return wait(reasonWaitingForQuorum, "scale-in: member %d (%s) leads and no other voter is healthy to take over",
					m.ID, o.podName(m.Ordinal))
			}
			return step{Kind: stepTransferLeader, ID: t.ID, Ordinal: t.Ordinal, Reason: reasonScaleIn,
				Message: fmt.Sprintf("scale-in: moving leadership from %d (%s) to %d (%s) before removing it",
					m.ID, o.podName(m.Ordinal), t.ID, o.podName(t.Ordinal))}
		}
		if !m.Learner {
			if h := o.healthyVoters(m.ID); h < majority(len(voters)-1) {
				return wait(reasonWaitingForQuorum, "scale-in: removing member %d would leave %d healthy of %d voters, below a majority",
					m.ID, h, len(voters)-1)
			}
		}
		return step{Kind: stepRemoveMember, ID: m.ID, Ordinal: m.Ordinal, Reason: reasonScaleIn,
			Message: fmt.Sprintf("scale-in: removing member %d (%s)", m.ID, o.podName(m.Ordinal))}
	}

	// 3. A learner in flight: promote it once caught up.
	for _, m := range o.Members {
		if !m.Learner || m.Ordinal < 0 {
			continue
		}
		if !o.caughtUp(m) {
			return wait(reasonLearnerCatchingUp, "learner %d (%s) is catching up: replicated %d of %d",
				m.ID, o.podName(m.Ordinal), m.Match, o.Leader.Commit)
		}
		if !o.healthy(m) {
			return wait(reasonWaitingForPod, "learner %d (%s) is caught up but its pod does not answer", m.ID, o.podName(m.Ordinal))
		}
		// After the promotion a majority of the voters, it included,
		// must be healthy.
		if h, need := o.healthyVoters(0)+1, majority(len(voters)+1); h < need {
			return wait(reasonWaitingForQuorum, "promoting learner %d waits: %d of %d voters would be healthy, %d needed",
				m.ID, h, len(voters)+1, need)
		}
		return step{Kind: stepPromote, ID: m.ID, Ordinal: m.Ordinal, Reason: reasonScaleOut,
			Message: fmt.Sprintf("promoting learner %d (%s) to voter", m.ID, o.podName(m.Ordinal))}
	}

	// Keep the controller's server list (and weight) in step with the
	// voters after every membership change, before the next one.
	if g := configGroup(o.Config, o.GroupID); g != nil {
		if servers := o.servers(); !sameServers(g.Servers, servers) || g.Weight != o.Weight {
			return step{Kind: stepJoin, Servers: servers, Reason: reasonUpdateServers,
				Message: fmt.Sprintf("updating group %d in the controller: %d servers, weight %d", o.GroupID, len(servers), o.Weight)}
		}
	}

	// 4. A pod of the set that runs a removed replica: its volume can
	// never serve again (ids are never reused); give it a fresh one.
	for i := range limit {
		p := o.pod(i)
		if !p.present() || p.Status == nil || len(o.membersAt(i)) > 0 {
			continue
		}
		if stale(o, p) {
			return step{Kind: stepRecreateReplica, Ordinal: i, Reason: reasonStaleReplica,
				Message: fmt.Sprintf("pod %s runs replica %d, which was removed from the group: recreating it with an empty volume",
					p.Name, p.Status.Id)}
		}
	}

	// 5. Scale-in: the highest pod's member is gone (step 2); shrink.
	if S > D {
		return step{Kind: stepScaleStatefulSet, Replicas: int32(S - 1), Reason: reasonScaleIn,
			Message: fmt.Sprintf("scale-in: shrinking the StatefulSet to %d", S-1)}
	}

	// 6. Pods of the set without a member: add the one that waits to join.
	for i := range S {
		if len(o.membersAt(i)) > 0 {
			continue
		}
		p := o.pod(i)
		switch {
		case !p.present():
			return wait(reasonWaitingForPod, "waiting for pod %s to be created", o.podName(i))
		case p.Status == nil || p.Status.Id == 0:
			return wait(reasonWaitingForPod, "waiting for pod %s to answer its admin API", p.Name)
		case p.Status.Role == "joining":
			return step{Kind: stepAddLearner, ID: p.Status.Id, Ordinal: i, Reason: reasonScaleOut,
				Message: fmt.Sprintf("adding replica %d (%s) as a learner", p.Status.Id, p.Name)}
		default:
			return wait(reasonWaitingForPod, "pod %s runs replica %d as %q, not a member: waiting for it to ask to join",
				p.Name, p.Status.Id, p.Status.Role)
		}
	}

	// 7. Join the controller once the group has a quorum. (A group that
	// joined goes on with its membership while the controller is away.)
	if o.Config == nil {
		if o.Phase != shardkvv1.PhaseServing && o.Phase != shardkvv1.PhaseJoining {
			return wait(reasonControllerUnreachable, "cannot reach the controller group to join it")
		}
	} else if configGroup(o.Config, o.GroupID) == nil {
		if h, need := o.healthyVoters(0), majority(max(len(voters), int(o.Bootstrap))); h < need {
			return wait(reasonWaitingForQuorum, "joining waits for a quorum: %d healthy voters, %d needed", h, need)
		}
		servers := o.servers()
		return step{Kind: stepJoin, Servers: servers, Reason: reasonJoin,
			Message: fmt.Sprintf("joining group %d with %d servers", o.GroupID, len(servers))}
	}

	// 8. Scale-out: one more pod; step 6 adds it once it asks to join.
	if S < D {
		return step{Kind: stepScaleStatefulSet, Replicas: int32(S + 1), Reason: reasonScaleOut,
			Message: fmt.Sprintf("scale-out: growing the StatefulSet to %d", S+1)}
	}

	// 9. Rolling update (nextRollout): followers first, one at a time, each
	// back and caught up before the next; the leader last, after a transfer.
	if o.UpdateRevision != "" {
		roll := nextRollout(S, func(i int) bool {
			p := o.pod(i)
			return p.Exists && p.Revision != o.UpdateRevision
		}, o.LeaderOrdinal)
		if roll.Outdated > 0 {
			for i := range S {
				p := o.pod(i)
				ms := o.membersAt(i)
				switch {
				case !p.present():
					return wait(reasonWaitingForRollout, "rolling update: waiting for pod %s to come back", o.podName(i))
				case !p.Ready:
					return wait(reasonWaitingForRollout, "rolling update: waiting for pod %s to be ready", p.Name)
				case len(ms) != 1 || !o.healthy(ms[0]):
					return wait(reasonWaitingForRollout, "rolling update: waiting for pod %s to be healthy and caught up", p.Name)
				}
			}
			if !o.RollSlot {
				if o.RollBlocked != "" {
					return wait(reasonWaitingForRollSlot, "rolling update of %d pods waits: %s", roll.Outdated, o.RollBlocked)
				}
				return step{Kind: stepTakeRollSlot, Reason: reasonRollingUpdate,
					Message: fmt.Sprintf("rolling update: %d pods to restart, followers first, the leader last", roll.Outdated)}
			}
			if !roll.Leader {
				return step{Kind: stepRestartPod, Ordinal: roll.Next, Reason: reasonRollingUpdate,
					Message: fmt.Sprintf("rolling update: restarting follower %s", o.podName(roll.Next))}
			}
			if len(voters) > 1 {
				t, ok := o.bestTransferTarget(S, o.UpdateRevision)
				if !ok {
					return wait(reasonWaitingForRollout, "rolling update: no healthy voter to take over from leader %s", o.podName(o.LeaderOrdinal))
				}
				return step{Kind: stepTransferLeader, ID: t.ID, Ordinal: t.Ordinal, Reason: reasonRollingUpdate,
					Message: fmt.Sprintf("rolling update: moving leadership from %s to %s before restarting it",
						o.podName(o.LeaderOrdinal), o.podName(t.Ordinal))}
			}
			return step{Kind: stepRestartPod, Ordinal: o.LeaderOrdinal, Reason: reasonRollingUpdate,
				Message: fmt.Sprintf("rolling update: restarting %s, the only replica", o.podName(o.LeaderOrdinal))}
		}
	}
	if o.RollSlot && o.UpdateRevision != "" {
		// The next group rolls only once this one is whole again.
		for i := range S {
			p := o.pod(i)
			ms := o.membersAt(i)
			if !p.present() || !p.Ready || len(ms) != 1 || !o.healthy(ms[0]) {
				return wait(reasonWaitingForRollout, "rolling update: waiting for pod %s to be back, ready and caught up", o.podName(i))
			}
		}
		return step{Kind: stepReleaseRollSlot, Reason: reasonRollingUpdate, Message: "rolling update done: every pod runs the new template and is caught up"}
	}
	// 10. Nothing to do, but a scale-in's pods are still terminating, or a
	// member is not healthy yet (a pod coming back, a replica catching
	// up): keep watching closely. The group is not at rest (Ready) until
	// the removed pods are gone.
	for _, i := range slices.Sorted(maps.Keys(o.Pods)) {
		if p := o.Pods[i]; i >= S && p.Exists {
			return wait(reasonWaitingForPod, "scale-in: waiting for pod %s, no longer a member, to terminate", p.Name)
		}
	}
	for _, m := range o.Members {
		if m.Ordinal >= 0 && m.Ordinal < S && !o.healthy(m) {
			return wait(reasonWaitingForPod, "waiting for member %d (%s) to answer and catch up", m.ID, o.podName(m.Ordinal))
		}
	}
	return step{Kind: stepIdle, Reason: reasonIdle, Message: "the group is as specified"}
}

// stale reports whether pod p (at an ordinal with no member) runs a replica
// that was removed from the group: it says so itself, or it claims an id
// the leader no longer lists while the leader has applied everything it
// committed and is at least as new (so its membership is not behind).
func stale(o *observed, p *podView) bool {
	st := p.Status
	if st.Id == 0 || (st.GroupId != 0 && st.GroupId != o.GroupID) {
		return false
	}
	if st.Role == "removed" {
		return true
	}
	if _, member := o.member(st.Id); member {
		return false
	}
	switch st.Role {
	case "follower", "learner", "candidate":
		return o.Leader.Applied >= o.Leader.Commit && st.Term <= o.Leader.Term
	}
	return false
}

// planDeletion: leave the controller, wait until every shard has moved
// away and been deleted here, then let the object go. The last group that
// holds data is never drained.
func planDeletion(o *observed) step {
	if !o.HasFinalizer {
		return step{Kind: stepIdle, Reason: reasonIdle, Message: "deleted"}
	}
	if o.Paused {
		return wait(reasonPaused, "the ShardMap is paused: the group is not drained")
	}
	if o.ShardMapGone {
		// Only if its finalizer was removed by hand, or the group named a
		// ShardMap that never existed.
		return step{Kind: stepFinalize, Reason: reasonDrained, Message: "the ShardMap is gone: nothing to drain"}
	}
	if o.ClusterDeleting && o.ClusterGroupsDeleting {
		return step{Kind: stepFinalize, Reason: reasonClusterDeleted,
			Message: "the ShardMap and all its ReplicaGroups are being deleted: the cluster's data is deleted with them, nothing to drain into"}
	}
	if o.GroupID == 0 {
		return step{Kind: stepFinalize, Reason: reasonDrained, Message: "the group never got an id: nothing to drain"}
	}
	if o.Config == nil {
		return wait(reasonControllerUnreachable, "cannot reach the controller group to drain group %d", o.GroupID)
	}
	if g := configGroup(o.Config, o.GroupID); g != nil {
		if g.Leaving {
			// Left already: its shards' moves are planned (pre-copy, then
			// cut-over), and it goes from the config with the last one.
			// Another Leave would change nothing.
			n, _ := shardSummary(o.Config, o.GroupID)
			return wait(reasonWaitingForDrain, "group %d is leaving: %d of its shards are still to be copied and cut over to the other groups",
				o.GroupID, n)
		}
		if len(o.Config.Groups) == 1 {
			return wait(reasonLastGroupHoldsData,
				"group %d is the last group of the cluster and holds its data: it is not drained (its shards would have nowhere to go); add another ReplicaGroup first, or delete the ShardMap",
				o.GroupID)
		}
		return step{Kind: stepLeave, Reason: reasonLeave,
			Message: fmt.Sprintf("leaving: group %d's shards move to the other groups", o.GroupID)}
	}
	// Out of the config: it never joined, or it left (by this deletion,
	// or out of band). Only the group's own report says whether it still
	// holds shards; status.phase may be stale or lost.
	if o.Reports == nil {
		return wait(reasonControllerUnreachable, "cannot read the controller's group reports to see group %d drain", o.GroupID)
	}
	r := o.Reports[o.GroupID]
	if r == nil {
		switch {
		case o.Leader != nil:
			return wait(reasonWaitingForDrain, "waiting for group %d's leader to report its shards to the controller", o.GroupID)
		case len(o.ownPVCs()) == 0:
			return step{Kind: stepFinalize, Reason: reasonDrained,
				Message: fmt.Sprintf("group %d has no volume of its own: it never stored anything", o.GroupID)}
		}
		return wait(reasonWaitingForDrain,
			"group %d is not in the config, no replica of it answers and the controller has no report from it: it may still hold shards others need. Bring its pods back, or remove the finalizer to abandon its data",
			o.GroupID)
	}
	if r.ConfigNum < o.Config.Num {
		return wait(reasonWaitingForDrain, "group %d has applied config %d of %d", o.GroupID, r.ConfigNum, o.Config.Num)
	}
	if len(r.Shards) > 0 {
		states := map[string]int{}
		for _, s := range r.Shards {
			states[s.State]++
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(states)) {
			parts = append(parts, fmt.Sprintf("%d %s", states[k], k))
		}
		return wait(reasonWaitingForDrain, "group %d still holds %d shards (%s)", o.GroupID, len(r.Shards), strings.Join(parts, ", "))
	}
	return planLinger(o)
}

// planLinger: the group holds nothing; its pods stay until clients have
// moved away (drainQuiet, drainLingerMax), then it is finalized.
func planLinger(o *observed) step {
	if o.DrainedAt.IsZero() {
		// The wait records status.drainedAt.
		return wait(reasonLingering, "group %d has handed off and deleted every shard: its pods stay until clients have moved away", o.GroupID)
	}
	lingered := o.Now.Sub(o.DrainedAt)
	var busy []string
	for _, i := range slices.Sorted(maps.Keys(o.Pods)) {
		p := o.Pods[i]
		if p.Status == nil || p.Status.ClientIdleMs == nil {
			continue
		}
		if idle := time.Duration(*p.Status.ClientIdleMs) * time.Millisecond; idle < drainQuiet {
			busy = append(busy, fmt.Sprintf("%s %s ago", p.Name, idle.Round(100*time.Millisecond)))
		}
	}
	if len(busy) > 0 && lingered < drainLingerMax {
		return wait(reasonLingering, "group %d is drained; its pods stay until clients have moved away (no client request for %s, at most %s more): last client request at %s",
			o.GroupID, drainQuiet, (drainLingerMax - lingered).Round(time.Second), strings.Join(busy, ", "))
	}
	msg := fmt.Sprintf("group %d has handed off and deleted every shard; clients moved away", o.GroupID)
	if len(busy) > 0 {
		msg = fmt.Sprintf("group %d has handed off and deleted every shard; its pods still had clients after %s (%s), which now go to the other groups",
			o.GroupID, drainLingerMax, strings.Join(busy, ", "))
	}
	return step{Kind: stepFinalize, Reason: reasonDrained, Message: msg}
}

// ownPVCs are the group's claims that are its own (not retained from a
// deleted group of the same name).
func (o *observed) ownPVCs() []int {
	var out []int
	for _, ord := range o.PVCs {
		if !slices.Contains(o.RetainedPVCs, ord) {
			out = append(out, ord)
		}
	}
	return out
}

// planRetainedVolumes: claims older than the ReplicaGroup hold a deleted
// group's data (its node.json names that group, so a pod would only
// crash-loop on them). Refuse until the user deletes them, or, with
// spec.retainedVolumes: Wipe, delete them (and a pod on one) one at a time.
func planRetainedVolumes(o *observed) step {
	names := make([]string, len(o.RetainedPVCs))
	for i, ord := range o.RetainedPVCs {
		names[i] = pvcName(o.Name, ord)
	}
	if !o.RetainedVolumesWipe {
		return wait(reasonRetainedVolumes,
			"volumes %s are older than this ReplicaGroup: kept from a deleted group of the same name, they hold its data, and group %d must not start on them; delete them (kubectl delete pvc %s), or set spec.retainedVolumes: Wipe to have the operator delete them",
			strings.Join(names, ", "), o.GroupID, strings.Join(names, " "))
	}
	ord := o.RetainedPVCs[0]
	p := o.pod(ord)
	switch {
	case p.Exists && p.Deleting:
		return wait(reasonWipeRetainedVolume, "waiting for pod %s to terminate before deleting retained volume %s", p.Name, names[0])
	case p.Exists:
		return step{Kind: stepRecreateReplica, Ordinal: ord, Reason: reasonWipeRetainedVolume,
			Message: fmt.Sprintf("deleting retained volume %s, which holds a deleted group's data, and pod %s on it (spec.retainedVolumes: Wipe)", names[0], p.Name)}
	case ord < int(o.StsReplicas):
		return wait(reasonWipeRetainedVolume, "waiting for pod %s, which the StatefulSet starts on retained volume %s, to delete both", o.podName(ord), names[0])
	}
	return step{Kind: stepDeletePVC, Ordinal: ord, Reason: reasonWipeRetainedVolume,
		Message: fmt.Sprintf("deleting retained volume %s, which holds a deleted group's data (spec.retainedVolumes: Wipe)", names[0])}
}
