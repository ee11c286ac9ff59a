package controllers

// Planner tests: a small simulated world (pods, Raft membership, the
// controller's config) that applies each planned step the way the cluster
// would, so whole sequences (scale-out, scale-in, lost disk, rolling
// update, deletion) are checked step by step without Kubernetes.

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

type simPod struct {
	exists  bool
	ready   bool
	id      uint64 // the replica id on its disk (0: not started)
	removed bool   // it applied its own removal
	rev     string
	down    bool // the admin API does not answer
}

// simWorld is one group and its surroundings.
type simWorld struct {
	t         *testing.T
	name, ns  string
	gid       uint64
	desired   int
	bootstrap int
	sts       int // -1: none
	pods      map[int]*simPod
	pvcs      map[int]uint64 // ordinal -> replica id on the volume (0: empty)
	members   []memberView
	leaderID  uint64
	commit    uint64
	term      uint64
	config    *shardkvpb.Config // nil: controller unreachable
	reports   map[uint64]*shardkvpb.GroupReport
	updateRev string
	retention bool // pvcRetention Delete
	deleting  bool
	finalizer bool
	paused    bool
	smGone    bool
	phase     string
	nextID    uint64
	// lag: new learners start behind and catch up on the next tick.
	lag bool
	// restartDelay: a restarted pod is back after this many ticks.
	restartDelay int
	restarting   map[int]int
	finalized    bool
}

// newSimGroup is a settled group of n voters (ids 1..n at ordinals
// 0..n-1), leader at ordinal 0, joined in the controller with other
// groups (other gids) beside it.
func newSimGroup(t *testing.T, n int, others ...uint64) *simWorld {
	w := &simWorld{t: t, name: "rg", ns: "ns", gid: 7, desired: n, bootstrap: n, sts: n,
		pods: map[int]*simPod{}, pvcs: map[int]uint64{}, commit: 1000, term: 3, updateRev: "rev1",
		finalizer: true, phase: "Serving", nextID: 100, lag: true, restartDelay: 1, restarting: map[int]int{}}
	for i := range n {
		w.pods[i] = &simPod{exists: true, ready: true, id: uint64(i + 1), rev: "rev1"}
		w.pvcs[i] = uint64(i + 1)
		w.members = append(w.members, memberView{ID: uint64(i + 1), Ordinal: i, Match: w.commit})
	}
	w.leaderID = 1
	w.config = &shardkvpb.Config{Num: 5, Shards: make([]uint64, 8)}
	w.config.Groups = append(w.config.Groups, &shardkvpb.Group{Gid: w.gid, Weight: 1, Servers: w.observe().servers()})
	for _, g := range others {
		w.config.Groups = append(w.config.Groups, &shardkvpb.Group{Gid: g, Weight: 1,
			Servers: []*shardkvpb.Server{{Id: 1, Addr: fmt.Sprintf("other-%d:7000", g)}}})
	}
	for i := range w.config.Shards {
		w.config.Shards[i] = w.config.Groups[i%len(w.config.Groups)].Gid
	}
	return w
}

func (w *simWorld) ordinalOfID(id uint64) int {
	for _, m := range w.members {
		if m.ID == id {
			return m.Ordinal
		}
	}
	return -1
}

func (w *simWorld) role(p *simPod) string {
	for _, m := range w.members {
		if m.ID == p.id {
			switch {
			case m.Learner:
				return "learner"
			case m.ID == w.leaderID:
				return "leader"
			}
			return "follower"
		}
	}
	if p.removed {
		return "removed"
	}
	return "joining"
}

func (w *simWorld) status(p *simPod) *shardkvpb.MemberStatus {
	st := &shardkvpb.MemberStatus{GroupId: w.gid, Id: p.id, Role: w.role(p), Term: w.term, Commit: w.commit, Applied: w.commit,
		Leader: w.leaderID}
	if st.Role == "leader" {
		for _, m := range w.members {
			addr := "elsewhere:7000"
			if m.Ordinal >= 0 {
				addr = fmt.Sprintf("%s:%d", PodDNS(w.name, m.Ordinal, w.ns), GRPCPort)
			}
			st.Members = append(st.Members, &shardkvpb.Member{Id: m.ID, Addr: addr, Learner: m.Learner, Match: m.Match})
		}
	}
	return st
}

// observe is what a reconcile pass would see.
func (w *simWorld) observe() *observed {
	o := &observed{Name: w.name, Namespace: w.ns, Deleting: w.deleting, HasFinalizer: w.finalizer, Paused: w.paused,
		ShardMapGone: w.smGone, GroupID: w.gid, Phase: w.phase, Desired: int32(w.desired), Bootstrap: int32(w.bootstrap),
		Weight: 1, StsReplicas: int32(w.sts), UpdateRevision: w.updateRev, PVCRetentionDelete: w.retention,
		Pods: map[int]*podView{}, LeaderOrdinal: -1, Reports: w.reports}
	if w.config != nil {
		o.Config = w.config
	}
	for ord, p := range w.pods {
		if !p.exists {
			continue
		}
		pv := &podView{Ordinal: ord, Name: fmt.Sprintf("%s-%d", w.name, ord), Exists: true, Ready: p.ready, Revision: p.rev}
		if !p.down && p.id != 0 {
			pv.Status = w.status(p)
		}
		o.Pods[ord] = pv
	}
	for i := range max(w.sts, 0) {
		if _, ok := o.Pods[i]; !ok {
			o.Pods[i] = &podView{Ordinal: i, Name: fmt.Sprintf("%s-%d", w.name, i)}
		}
	}
	for ord := range w.pvcs {
		o.PVCs = append(o.PVCs, ord)
	}
	slices.Sort(o.PVCs)
	for ord, pv := range o.Pods {
		if pv.Status != nil && pv.Status.Role == "leader" {
			o.Leader, o.LeaderOrdinal = pv.Status, ord
			for _, m := range pv.Status.Members {
				o.Members = append(o.Members, memberView{ID: m.Id, Ordinal: ordinalOf(w.name, w.ns, m.Addr), Learner: m.Learner, Match: m.Match})
			}
		}
	}
	return o
}

// startPod brings up pod ord as the StatefulSet would: with its volume's
// replica (stale if that one was removed) or, on an empty volume, the
// --id=auto choice: its --peers id while bootstrapping, else a fresh id.
func (w *simWorld) startPod(ord int) {
	p := &simPod{exists: true, ready: true, rev: w.updateRev}
	if id, ok := w.pvcs[ord]; ok && id != 0 {
		p.id = id
		p.removed = w.ordinalOfID(id) < 0
	} else {
		w.nextID++
		p.id = w.nextID
		w.pvcs[ord] = p.id
	}
	w.pods[ord] = p
}

// tick is time passing: learners catch up, restarted and new pods come up.
func (w *simWorld) tick() {
	for i := range w.members {
		w.members[i].Match = w.commit
	}
	for ord, n := range w.restarting {
		if n <= 1 {
			delete(w.restarting, ord)
			if ord < w.sts {
				w.startPod(ord)
			}
		} else {
			w.restarting[ord] = n - 1
		}
	}
	for i := range w.sts {
		if p := w.pods[i]; (p == nil || !p.exists) && w.restarting[i] == 0 {
			w.startPod(i)
		}
	}
}

func (w *simWorld) apply(st step) {
	t := w.t
	switch st.Kind {
	case stepWait:
		w.tick()
	case stepScaleStatefulSet:
		for i := int(st.Replicas); i < w.sts; i++ {
			if p := w.pods[i]; p != nil {
				p.exists = false
			}
		}
		w.sts = int(st.Replicas)
	case stepAddLearner:
		if w.pods[st.Ordinal].id != st.ID {
			t.Fatalf("%s: pod %d runs %d", st, st.Ordinal, w.pods[st.Ordinal].id)
		}
		match := w.commit
		if w.lag {
			match = 0
		}
		w.members = append(w.members, memberView{ID: st.ID, Ordinal: st.Ordinal, Learner: true, Match: match})
	case stepPromote:
		i := slices.IndexFunc(w.members, func(m memberView) bool { return m.ID == st.ID })
		if i < 0 || !w.members[i].Learner {
			t.Fatalf("%s: not a learner", st)
		}
		w.members[i].Learner = false
	case stepRemoveMember:
		if st.ID == w.leaderID {
			t.Fatalf("%s: removing the leader", st)
		}
		n := len(w.members)
		w.members = slices.DeleteFunc(w.members, func(m memberView) bool { return m.ID == st.ID })
		if len(w.members) != n-1 {
			t.Fatalf("%s: not a member", st)
		}
		for _, p := range w.pods {
			if p.id == st.ID {
				p.removed = true
			}
		}
	case stepTransferLeader:
		if w.ordinalOfID(st.ID) < 0 {
			t.Fatalf("%s: not a member", st)
		}
		w.leaderID = st.ID
		w.term++
	case stepJoin:
		g := &shardkvpb.Group{Gid: w.gid, Servers: st.Servers, Weight: 1}
		cfg := &shardkvpb.Config{Num: w.config.Num + 1, Shards: slices.Clone(w.config.Shards)}
		found := false
		for _, x := range w.config.Groups {
			if x.Gid == w.gid {
				x, found = g, true
			}
			cfg.Groups = append(cfg.Groups, x)
		}
		if !found {
			cfg.Groups = append(cfg.Groups, g)
		}
		w.config = cfg
		if w.phase == "Pending" {
			w.phase = "Serving"
		}
	case stepLeave:
		cfg := &shardkvpb.Config{Num: w.config.Num + 1, Shards: slices.Clone(w.config.Shards)}
		for _, x := range w.config.Groups {
			if x.Gid != w.gid {
				cfg.Groups = append(cfg.Groups, x)
			}
		}
		for i, g := range cfg.Shards {
			if g == w.gid {
				cfg.Shards[i] = cfg.Groups[0].Gid
			}
		}
		w.config = cfg
		w.phase = "Draining"
	case stepRestartPod:
		p := w.pods[st.Ordinal]
		p.exists = false
		w.restarting[st.Ordinal] = w.restartDelay
		if p.id == w.leaderID {
			t.Logf("restarting the leader %d", p.id)
		}
	case stepRecreateReplica:
		delete(w.pvcs, st.Ordinal)
		w.pods[st.Ordinal].exists = false
		w.restarting[st.Ordinal] = 1
	case stepDeletePVC:
		if p := w.pods[st.Ordinal]; p != nil && p.exists {
			t.Fatalf("%s: its pod exists", st)
		}
		delete(w.pvcs, st.Ordinal)
	case stepFinalize:
		w.finalized = true
		w.finalizer = false
	default:
		t.Fatalf("unexpected step %s", st)
	}
}

// run plans and applies steps until Idle (or maxSteps), checking
// invariants after each, and returns the steps taken.
func (w *simWorld) run(maxSteps int) []step {
	var out []step
	for range maxSteps {
		st := nextStep(w.observe())
		out = append(out, st)
		if st.Kind == stepIdle || st.Kind == stepFinalize {
			if st.Kind == stepFinalize {
				w.apply(st)
			}
			return out
		}
		w.apply(st)
		w.checkInvariants(st)
	}
	w.t.Fatalf("no rest after %d steps: %s", maxSteps, stepsString(out))
	return nil
}

// checkInvariants: the group keeps a quorum of live voters and a leader
// that is a member.
func (w *simWorld) checkInvariants(after step) {
	voters, live := 0, 0
	for _, m := range w.members {
		if m.Learner {
			continue
		}
		voters++
		if p := w.pods[m.Ordinal]; p != nil && p.exists && p.id == m.ID {
			live++
		}
	}
	if w.ordinalOfID(w.leaderID) < 0 {
		w.t.Fatalf("after %s: leader %d is not a member", after, w.leaderID)
	}
	if voters > 2 && live < majority(voters) {
		w.t.Fatalf("after %s: %d of %d voters live, quorum lost", after, live, voters)
	}
}

func stepsString(steps []step) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, s.String())
	}
	return strings.Join(parts, " ")
}

// actions drops the Wait steps.
func actions(steps []step) string {
	var parts []string
	for _, s := range steps {
		if s.Kind != stepWait {
			parts = append(parts, s.String())
		}
	}
	return strings.Join(parts, " ")
}

func expectSteps(t *testing.T, got []step, want string) {
	t.Helper()
	if g := actions(got); g != want {
		t.Fatalf("steps:\n got: %s\nwant: %s\n all: %s", g, want, stepsString(got))
	}
}

func TestPlanSettledGroupIsIdle(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	expectSteps(t, w.run(5), "Idle")
}

func TestPlanBootstrap(t *testing.T) {
	w := newSimGroup(t, 3)
	w.finalizer = false
	w.gid = 0
	w.phase = ""
	w.sts = -1
	w.pods = map[int]*simPod{}
	w.pvcs = map[int]uint64{}
	w.config = &shardkvpb.Config{Num: 0, Shards: make([]uint64, 8)}

	if st := nextStep(w.observe()); st.Kind != stepAddFinalizer {
		t.Fatalf("first step %s, want AddFinalizer", st)
	}
	w.finalizer = true
	if st := nextStep(w.observe()); st.Kind != stepAllocateGroupID {
		t.Fatalf("second step %s, want AllocateGroupID", st)
	}
	w.gid = 7
	w.phase = "Pending"
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonCreating {
		t.Fatalf("without a StatefulSet: %s", st)
	}
	// The StatefulSet starts 3 pods; they bootstrap ids 1..3 from --peers
	// but have not elected a leader yet.
	w.sts = 3
	for i := range 3 {
		w.pvcs[i] = uint64(i + 1)
		w.startPod(i)
	}
	w.leaderID = 0
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonNoLeader {
		t.Fatalf("before a leader: %s", st)
	}
	w.leaderID = 1
	// No quorum reachable: only the leader answers.
	w.pods[1].down, w.pods[2].down = true, true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("without a quorum: %s", st)
	}
	w.pods[1].down = false
	cfgBefore := w.config
	w.config = nil
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
		t.Fatalf("controller unreachable: %s", st)
	}
	w.config = cfgBefore
	w.pods[2].down = false
	expectSteps(t, w.run(10), "Join(1,2,3) Idle")
	if st := nextStep(w.observe()); st.Kind != stepIdle {
		t.Fatalf("after join: %s", st)
	}
}

func TestPlanScaleOut(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.desired = 5
	steps := w.run(40)
	expectSteps(t, steps,
		"ScaleStatefulSet(4) AddLearner(101@3) Promote(101) Join(1,2,3,101) "+
			"ScaleStatefulSet(5) AddLearner(102@4) Promote(102) Join(1,2,3,101,102) Idle")
	// Each learner was promoted only after catching up.
	var reasons []string
	for _, s := range steps {
		if s.Kind == stepWait {
			reasons = append(reasons, s.Reason)
		}
	}
	if !slices.Contains(reasons, reasonLearnerCatchingUp) || !slices.Contains(reasons, reasonWaitingForPod) {
		t.Fatalf("waits %v: want the new pod and the learner's catch-up waited for", reasons)
	}
}

func TestPlanScaleOutFromOne(t *testing.T) {
	w := newSimGroup(t, 1, 9)
	w.desired = 3
	w.lag = false
	expectSteps(t, w.run(40),
		"ScaleStatefulSet(2) AddLearner(101@1) Promote(101) Join(1,101) "+
			"ScaleStatefulSet(3) AddLearner(102@2) Promote(102) Join(1,101,102) Idle")
}

func TestPlanScaleInLeaderLast(t *testing.T) {
	// Leader at the highest ordinal: leadership moves before its removal.
	w := newSimGroup(t, 5, 9)
	w.leaderID = 5
	w.members[1].Match = w.commit - 10 // ordinal 1 less caught up than 2 and 3
	w.desired = 3
	expectSteps(t, w.run(40),
		"TransferLeader(1) RemoveMember(5) Join(1,2,3,4) ScaleStatefulSet(4) "+
			"RemoveMember(4) Join(1,2,3) ScaleStatefulSet(3) Idle")
	if w.leaderID != 1 {
		t.Fatalf("leader %d", w.leaderID)
	}
	// Retained volumes stay.
	if len(w.pvcs) != 5 {
		t.Fatalf("pvcs %v, want all 5 retained", w.pvcs)
	}
}

func TestPlanScaleInTransferTarget(t *testing.T) {
	// The most caught-up voter that stays takes over.
	w := newSimGroup(t, 5, 9)
	w.leaderID = 5
	w.members[0].Match = w.commit - 5
	w.members[1].Match = w.commit - 1
	w.members[2].Match = w.commit - 2
	w.members[3].Match = w.commit // ordinal 3 leaves next: not preferred
	w.desired = 3
	st := nextStep(w.observe())
	if st.Kind != stepTransferLeader || st.ID != 2 {
		t.Fatalf("step %s, want TransferLeader(2)", st)
	}
}

func TestPlanScaleInDeletesPVCs(t *testing.T) {
	w := newSimGroup(t, 4, 9)
	w.retention = true
	w.desired = 2
	expectSteps(t, w.run(40),
		"RemoveMember(4) Join(1,2,3) ScaleStatefulSet(3) DeletePVC(3) "+
			"RemoveMember(3) Join(1,2) ScaleStatefulSet(2) DeletePVC(2) Idle")
}

func TestPlanScaleInKeepsQuorum(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.desired = 2
	w.pods[1].down = true // voter 2 does not answer
	st := nextStep(w.observe())
	if st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("step %s, want a wait for quorum (removing 3 would leave 1 healthy of 2)", st)
	}
	// A dead member being removed never costs the quorum.
	w.pods[1].down = false
	w.pods[2].down = true
	if st := nextStep(w.observe()); st.Kind != stepRemoveMember || st.ID != 3 {
		t.Fatalf("step %s, want RemoveMember(3)", st)
	}
}

func TestPlanScaleInLeaderWithoutTarget(t *testing.T) {
	w := newSimGroup(t, 2, 9)
	w.leaderID = 2
	w.desired = 1
	w.pods[0].down = true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForQuorum {
		t.Fatalf("step %s, want a wait: no voter to take over", st)
	}
}

func TestPlanScaleOutDuringScaleIn(t *testing.T) {
	t.Run("back up after the removal", func(t *testing.T) {
		w := newSimGroup(t, 5, 9)
		w.desired = 3
		w.lag = false
		// First step of the scale-in runs: member 5 is removed ...
		if st := nextStep(w.observe()); st.String() != "RemoveMember(5)" {
			t.Fatalf("first step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// ... then the spec goes back up to 5 before the shrink. The pod
		// at ordinal 4 runs the removed replica 5: it gets a fresh volume
		// and joins under a new id.
		w.desired = 5
		expectSteps(t, w.run(40), "Join(1,2,3,4) RecreateReplica(4) AddLearner(101@4) Promote(101) Join(1,2,3,4,101) Idle")
	})
	t.Run("shrink finishes, then grows", func(t *testing.T) {
		w := newSimGroup(t, 5, 9)
		w.desired = 3
		w.lag = false
		w.apply(nextStep(w.observe())) // RemoveMember(5)
		w.apply(nextStep(w.observe())) // Join(1,2,3,4)
		if st := nextStep(w.observe()); st.String() != "ScaleStatefulSet(4)" {
			t.Fatalf("third step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// Up again to 5: the retained volume of ordinal 4 holds removed
		// replica 5, so it is recreated before the pod joins.
		w.desired = 5
		expectSteps(t, w.run(40), "ScaleStatefulSet(5) RecreateReplica(4) AddLearner(101@4) Promote(101) Join(1,2,3,4,101) Idle")
	})
	t.Run("down while a learner catches up", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.desired = 4
		w.apply(nextStep(w.observe())) // ScaleStatefulSet(4)
		w.apply(nextStep(w.observe())) // wait: pod 3 starts
		if st := nextStep(w.observe()); st.String() != "AddLearner(101@3)" {
			t.Fatalf("step %s", st)
		}
		w.apply(nextStep(w.observe()))
		// Spec back to 3 before the learner caught up: it is removed,
		// not promoted.
		w.desired = 3
		expectSteps(t, w.run(40), "RemoveMember(101) ScaleStatefulSet(3) Idle")
	})
}

func TestPlanLostDisk(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	// Pod 1 lost its volume: --id=auto found id 2 still a member, so it
	// runs under a fresh id and waits to be added.
	w.pvcs[1] = 0
	w.startPod(1)
	expectSteps(t, w.run(40), "RemoveMember(2) Join(1,3) AddLearner(101@1) Promote(101) Join(1,3,101) Idle")
}

func TestPlanStaleFollower(t *testing.T) {
	// A pod runs a replica the leader no longer lists, without knowing
	// it was removed.
	w := newSimGroup(t, 3, 9)
	w.members = slices.DeleteFunc(w.members, func(m memberView) bool { return m.ID == 3 })
	w.config.Groups[0].Servers = w.observe().servers()
	o := w.observe()
	o.Pods[2].Status.Role = "follower"
	if st := nextStep(o); st.String() != "RecreateReplica(2)" {
		t.Fatalf("step %s, want RecreateReplica(2)", st)
	}
	// Not while the leader has not applied all it committed: its view
	// of the membership may be behind.
	o = w.observe()
	o.Pods[2].Status.Role = "follower"
	o.Leader.Applied = o.Leader.Commit - 1
	if st := nextStep(o); st.Kind != stepWait {
		t.Fatalf("step %s, want a wait", st)
	}
}

func TestPlanRollingUpdate(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.restartDelay = 2
	steps := w.run(40)
	expectSteps(t, steps, "RestartPod(2) RestartPod(1) TransferLeader(2) RestartPod(0) Idle")
	// Each restart waited for the previous pod to come back.
	for i, s := range steps {
		if s.Kind == stepRestartPod && i+1 < len(steps) && steps[i+1].Kind != stepWait {
			t.Fatalf("step after %s is %s, want a wait: %s", s, steps[i+1], stepsString(steps))
		}
	}
	for ord, p := range w.pods {
		if p.rev != "rev2" {
			t.Fatalf("pod %d at %s", ord, p.rev)
		}
	}
}

func TestPlanRollingUpdateWaitsForHealth(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.updateRev = "rev2"
	w.pods[0].rev = "rev2"
	w.pods[1].ready = false
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForRollout {
		t.Fatalf("step %s, want a wait for pod 1", st)
	}
	w.pods[1].ready = true
	w.members[1].Match = w.commit - maxCatchUpLag - 1
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForRollout {
		t.Fatalf("step %s, want a wait for member 2 to catch up", st)
	}
}

func TestPlanRollingUpdateSingleReplica(t *testing.T) {
	w := newSimGroup(t, 1, 9)
	w.updateRev = "rev2"
	expectSteps(t, w.run(10), "RestartPod(0) Idle")
}

func TestPlanPaused(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	w.paused = true
	w.desired = 5
	w.updateRev = "rev2"
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonPaused {
		t.Fatalf("step %s, want Wait(Paused)", st)
	}
	w.deleting = true
	if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonPaused {
		t.Fatalf("deleting: step %s, want Wait(Paused)", st)
	}
}

func TestPlanDeletion(t *testing.T) {
	t.Run("leave, drain, finalize", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepLeave {
			t.Fatalf("step %s, want Leave", st)
		}
		w.apply(step{Kind: stepLeave})
		// The controller's reports are not known yet.
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
			t.Fatalf("step %s", st)
		}
		w.reports = map[uint64]*shardkvpb.GroupReport{}
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonWaitingForDrain {
			t.Fatalf("no report: step %s", st)
		}
		w.reports[w.gid] = &shardkvpb.GroupReport{Gid: w.gid, ConfigNum: w.config.Num - 1}
		if st := nextStep(w.observe()); st.Kind != stepWait || !strings.Contains(st.Message, "applied config") {
			t.Fatalf("behind: step %s %q", st, st.Message)
		}
		w.reports[w.gid] = &shardkvpb.GroupReport{Gid: w.gid, ConfigNum: w.config.Num, Shards: []*shardkvpb.ShardState{
			{Shard: 0, State: "BePulling"}, {Shard: 2, State: "GCing"}, {Shard: 4, State: "GCing"}}}
		st := nextStep(w.observe())
		if st.Kind != stepWait || st.Message != "group 7 still holds 3 shards (1 BePulling, 2 GCing)" {
			t.Fatalf("holding: step %s %q", st, st.Message)
		}
		w.reports[w.gid].Shards = nil
		if st := nextStep(w.observe()); st.Kind != stepFinalize {
			t.Fatalf("drained: step %s, want Finalize", st)
		}
	})
	t.Run("last group is refused", func(t *testing.T) {
		w := newSimGroup(t, 3)
		w.deleting = true
		st := nextStep(w.observe())
		if st.Kind != stepWait || st.Reason != reasonLastGroupHoldsData || st.mutates() {
			t.Fatalf("step %s, want the refusal", st)
		}
	})
	t.Run("never joined", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.config.Groups = w.config.Groups[1:]
		w.phase = "Pending"
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepFinalize {
			t.Fatalf("step %s, want Finalize", st)
		}
	})
	t.Run("joined but status says pending", func(t *testing.T) {
		// Join went through but the phase was not recorded: still leave.
		w := newSimGroup(t, 3, 9)
		w.phase = "Pending"
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepLeave {
			t.Fatalf("step %s, want Leave", st)
		}
	})
	t.Run("shardmap gone", func(t *testing.T) {
		w := newSimGroup(t, 3)
		w.smGone = true
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepFinalize {
			t.Fatalf("step %s, want Finalize", st)
		}
	})
	t.Run("controller unreachable", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.config = nil
		w.deleting = true
		if st := nextStep(w.observe()); st.Kind != stepWait || st.Reason != reasonControllerUnreachable {
			t.Fatalf("step %s", st)
		}
	})
	t.Run("finalizer already gone", func(t *testing.T) {
		w := newSimGroup(t, 3, 9)
		w.deleting = true
		w.finalizer = false
		if st := nextStep(w.observe()); st.Kind != stepIdle {
			t.Fatalf("step %s", st)
		}
	})
}

func TestPlanWeightChangeUpdatesController(t *testing.T) {
	w := newSimGroup(t, 3, 9)
	o := w.observe()
	o.Weight = 4
	if st := nextStep(o); st.Kind != stepJoin || st.Reason != reasonUpdateServers {
		t.Fatalf("step %s, want Join (update)", st)
	}
}

func TestPlanForeignMemberLeftAlone(t *testing.T) {
	// A member added by hand at an address that is not one of the pods:
	// neither promoted nor removed (it is reported as unhealthy).
	w := newSimGroup(t, 3, 9)
	w.members = append(w.members, memberView{ID: 50, Ordinal: -1, Learner: true, Match: w.commit})
	if st := nextStep(w.observe()); st.Kind != stepIdle {
		t.Fatalf("step %s, want Idle", st)
	}
}

func TestShardSummary(t *testing.T) {
	cfg := &shardkvpb.Config{Shards: []uint64{1, 1, 2, 1, 0, 1, 1, 1}}
	n, r := shardSummary(cfg, 1)
	if n != 6 || r != "0-1,3,5-7" {
		t.Fatalf("got %d %q", n, r)
	}
	if n, r := shardSummary(cfg, 3); n != 0 || r != "" {
		t.Fatalf("got %d %q", n, r)
	}
}

func TestOrdinals(t *testing.T) {
	for addr, want := range map[string]int{
		"rg-0.rg.ns.svc:7000":   0,
		"rg-12.rg.ns.svc:7000":  12,
		"rg-1.other.ns.svc:700": -1,
		"rg-x.rg.ns.svc:7000":   -1,
		"rg-01.rg.ns.svc:7000":  -1,
		"10.0.0.1:7000":         -1,
		"rg-1-0.rg.ns.svc:7000": -1,
	} {
		if got := ordinalOf("rg", "ns", addr); got != want {
			t.Errorf("ordinalOf(%q) = %d, want %d", addr, got, want)
		}
	}
	if got := pvcOrdinal("rg", "data-rg-3"); got != 3 {
		t.Errorf("pvcOrdinal = %d", got)
	}
	if got := pvcOrdinal("rg", "data-rg-1-0"); got != -1 {
		t.Errorf("pvcOrdinal of another group's claim = %d", got)
	}
}

func TestPDBMinAvailable(t *testing.T) {
	for _, c := range []struct{ pods, voters, want int }{
		{1, 1, 1}, {3, 3, 2}, {5, 5, 3}, {4, 4, 3}, {4, 3, 3}, {5, 3, 4}, {2, 2, 2},
	} {
		if got := pdbMinAvailable(c.pods, c.voters); got != c.want {
			t.Errorf("pdbMinAvailable(%d, %d) = %d, want %d", c.pods, c.voters, got, c.want)
		}
	}
}
