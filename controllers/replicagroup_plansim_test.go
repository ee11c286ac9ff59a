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
	"time"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

type simPod struct {
	exists  bool
	ready   bool
	id      uint64 // the replica id on its disk (0: not started)
	removed bool   // it applied its own removal
	rev     string
	down    bool // the admin API does not answer
	// lonely: just restarted, it has not heard from the leader yet;
	// heardMs: the leader's "heard from it" age, if the leader reports one.
	lonely  bool
	heardMs *uint64
	// idleMs: since its last client request (nil: none).
	idleMs *uint64
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
	// retained: ordinals whose volume is older than the group (a deleted
	// group's); wipe: spec.retainedVolumes is Wipe.
	retained map[int]bool
	wipe     bool
	// now is the observation's time; drainedAt status.drainedAt.
	now, drainedAt time.Time
	members        []memberView
	leaderID       uint64
	commit         uint64
	term           uint64
	config         *shardkvpb.Config // nil: controller unreachable
	reports        map[uint64]*shardkvpb.GroupReport
	updateRev      string
	retention      bool // pvcRetention Delete
	deleting       bool
	finalizer      bool
	paused         bool
	smGone         bool
	// The ShardMap is being deleted; so is every group of it.
	clusterDeleting, clusterGroupsDeleting bool
	// rollSlot: the group holds its cluster's roll slot; rollBlocked: why
	// it may not take it.
	rollSlot    bool
	rollBlocked string
	phase       string
	nextID      uint64
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
		finalizer: true, phase: "Serving", nextID: 100, lag: true, restartDelay: 1, restarting: map[int]int{},
		now: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
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
		Leader: w.leaderID, ClientIdleMs: p.idleMs}
	if p.lonely {
		st.Leader = 0
	}
	if st.Role == "leader" {
		for _, m := range w.members {
			addr := "elsewhere:7000"
			var heard *uint64
			if m.Ordinal >= 0 {
				addr = fmt.Sprintf("%s:%d", PodDNS(w.name, m.Ordinal, w.ns), GRPCPort)
				if mp := w.pods[m.Ordinal]; mp != nil {
					heard = mp.heardMs
				}
			}
			st.Members = append(st.Members, &shardkvpb.Member{Id: m.ID, Addr: addr, Learner: m.Learner, Match: m.Match, HeardMsAgo: heard})
		}
	}
	return st
}

// observe is what a reconcile pass would see.
func (w *simWorld) observe() *observed {
	o := &observed{Name: w.name, Namespace: w.ns, Deleting: w.deleting, HasFinalizer: w.finalizer, Paused: w.paused,
		ShardMapGone: w.smGone, ClusterDeleting: w.clusterDeleting, ClusterGroupsDeleting: w.clusterGroupsDeleting, GroupID: w.gid, Phase: w.phase, Desired: int32(w.desired), Bootstrap: int32(w.bootstrap),
		Weight: 1, StsReplicas: int32(w.sts), UpdateRevision: w.updateRev, PVCRetentionDelete: w.retention,
		Pods: map[int]*podView{}, LeaderOrdinal: -1, Reports: w.reports, RollSlot: w.rollSlot, RollBlocked: w.rollBlocked}
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
	for _, ord := range o.PVCs {
		if w.retained[ord] {
			o.RetainedPVCs = append(o.RetainedPVCs, ord)
		}
	}
	o.RetainedVolumesWipe = w.wipe
	o.Now, o.DrainedAt = w.now, w.drainedAt
	for ord, pv := range o.Pods {
		if pv.Status != nil && pv.Status.Role == "leader" {
			o.Leader, o.LeaderOrdinal = pv.Status, ord
			for _, m := range pv.Status.Members {
				o.Members = append(o.Members, memberView{ID: m.Id, Ordinal: ordinalOf(w.name, w.ns, m.Addr), Learner: m.Learner, Match: m.Match, HeardMsAgo: m.HeardMsAgo})
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
		if st.Reason == reasonLingering && w.drainedAt.IsZero() {
			w.drainedAt = w.now // what computeStatus records
		}
		w.tick()
	case stepTakeRollSlot:
		w.rollSlot = true
	case stepReleaseRollSlot:
		w.rollSlot = false
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
		delete(w.retained, st.Ordinal)
		w.pods[st.Ordinal].exists = false
		w.restarting[st.Ordinal] = 1
	case stepDeletePVC:
		if p := w.pods[st.Ordinal]; p != nil && p.exists {
			t.Fatalf("%s: its pod exists", st)
		}
		delete(w.pvcs, st.Ordinal)
		delete(w.retained, st.Ordinal)
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
