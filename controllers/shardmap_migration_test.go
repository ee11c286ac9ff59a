package controllers

// Live migration in the ShardMap's status (phases, progress, lag, write
// pauses, rate estimates, waits) and the copy rate limit in the data
// groups' pods: pure tests of summarize, fillStatus, the rate estimator and
// the pod template, and envtest tests of the same through the reconcilers.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// preCopyStatus is a cluster of 8 shards on a (gid 1, leaving), b (2) and
// c (3) in config 7:
//   - shards 0 and 1 move a->b (announced in config 6): b pre-copies 0 (snapshot,
//     40 of 100 keys, 4000 of 10000 bytes) and 1 (delta, caught up, 3
//     entries behind);
//   - shard 2 moves a->c (announced in config 7, which c applied): c has
//     not started;
//   - shard 5 was cut over c->b: b serves it and acknowledges (Acking, a
//     1.5ms write pause), c deletes its copy (GCing);
//   - c serves 6 and 7, moved to it earlier (write pauses 2.5ms in config
//     5, 800µs in config 6);
//   - a's last report is 30s old.
func preCopyStatus() *shardkvpb.ClusterStatus {
	g1 := smGroup(1)
	g1.Leaving = true
	return &shardkvpb.ClusterStatus{
		Latest: &shardkvpb.Config{Num: 7, Shards: []uint64{1, 1, 1, 1, 2, 2, 3, 3},
			Groups: []*shardkvpb.Group{g1, smGroup(2), smGroup(3)},
			Moves: []*shardkvpb.PlannedMove{
				{Shard: 0, FromGid: 1, ToGid: 2, SinceConfig: 6},
				{Shard: 1, FromGid: 1, ToGid: 2, SinceConfig: 6},
				{Shard: 2, FromGid: 1, ToGid: 3, SinceConfig: 7},
			}},
		Groups: []*shardkvpb.GroupStatus{
			{AgeMs: 30000, Report: &shardkvpb.GroupReport{Gid: 1, ConfigNum: 7, Shards: []*shardkvpb.ShardState{
				{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"}}}},
			{AgeMs: 200, Report: &shardkvpb.GroupReport{Gid: 2, ConfigNum: 7, MigrateBytesPerSec: 1 << 20, Shards: []*shardkvpb.ShardState{
				{Shard: 0, State: "PreCopying", PeerGid: 1, Phase: "snapshot", Keys: 40, TotalKeys: 100, Bytes: 4000, TotalBytes: 10000},
				{Shard: 1, State: "PreCopying", PeerGid: 1, Phase: "delta", CaughtUp: true, LagEntries: 3, Keys: 100, TotalKeys: 100, Bytes: 10000, TotalBytes: 10000},
				{Shard: 4, State: "Serving"},
				{Shard: 5, State: "Acking", PeerGid: 3, ConfigNum: 6, Keys: 50, Bytes: 5000, WritePauseUs: 1500}}}},
			{AgeMs: 200, Report: &shardkvpb.GroupReport{Gid: 3, ConfigNum: 7, Shards: []*shardkvpb.ShardState{
				{Shard: 5, State: "GCing", PeerGid: 2},
				{Shard: 6, State: "Serving", ConfigNum: 5, WritePauseUs: 2500},
				{Shard: 7, State: "Serving", ConfigNum: 6, WritePauseUs: 800}}}},
		},
	}
}

func TestSummarizePreCopy(t *testing.T) {
	name := func(gid uint64) string { return map[uint64]string{1: "a", 2: "b", 3: "c"}[gid] }
	s := summarize(preCopyStatus(), nil, name)

	wantMig := []shardkvv1.Migration{
		{Source: "a", Target: "b", Shards: 2, Phase: "PreCopying", CopyPhase: "snapshot", CaughtUpShards: 1,
			Keys: 140, TotalKeys: 200, Bytes: 14000, TotalBytes: 20000, Progress: "70%", LagEntries: 3},
		{Source: "a", Target: "c", Shards: 1, Phase: "Announced"},
		{Source: "c", Target: "b", Shards: 1, Phase: "Finishing", CaughtUpShards: 1,
			Keys: 50, TotalKeys: 50, Bytes: 5000, TotalBytes: 5000, Progress: "100%", LastWritePause: "1.5ms"},
	}
	if !slices.Equal(s.migrations, wantMig) {
		t.Errorf("migrations\n got %+v\nwant %+v", s.migrations, wantMig)
	}
	if s.migrating != 4 {
		t.Errorf("migrating %d, want 4 (pre-copying 0 and 1, announced 2, finishing 5)", s.migrating)
	}
	wantTable := []shardkvv1.ShardRange{
		{First: 0, Last: 1, Group: "a", GroupID: 1, State: "PreCopying"},
		{First: 2, Last: 3, Group: "a", GroupID: 1, State: "Serving"},
		{First: 4, Last: 4, Group: "b", GroupID: 2, State: "Serving"},
		{First: 5, Last: 5, Group: "b", GroupID: 2, State: "Acking"},
		{First: 6, Last: 7, Group: "c", GroupID: 3, State: "Serving"},
	}
	if !slices.Equal(s.table, wantTable) {
		t.Errorf("table\n got %+v\nwant %+v", s.table, wantTable)
	}
	if len(s.states) != 3 || s.states["PreCopying"] != 2 || s.states["Serving"] != 5 || s.states["Acking"] != 1 {
		t.Errorf("states %v", s.states)
	}
	if s.notServing != 1 {
		t.Errorf("notServing %d, want 1: a pre-copied shard is still served", s.notServing)
	}
	wantGroups := []shardkvv1.GroupRef{
		{Name: "a", GroupID: 1, Shards: 4, Leaving: true},
		{Name: "b", GroupID: 2, Shards: 2, MigrateBytesPerSec: 1 << 20, LastWritePause: "1.5ms"},
		{Name: "c", GroupID: 3, Shards: 2, LastWritePause: "800µs"}, // the latest move's, not the longest
	}
	if !slices.Equal(s.groups, wantGroups) {
		t.Errorf("groups\n got %+v\nwant %+v", s.groups, wantGroups)
	}
	wantWaits := []migrationWait{
		{ReasonGroupNotReporting, "a", "group a has not reported for over 10s; moving shards waiting on it: 0, 1, 2"},
		{ReasonWaitingForTarget, "c", "group c applied the config announcing the move of shards 2 to it but has not started copying them"},
	}
	if !slices.Equal(s.waits, wantWaits) {
		t.Errorf("waits\n got %q\nwant %q", s.waits, wantWaits)
	}

	// c has not applied config 7 yet: shard 2 is announced, not waiting
	// on c (Balanced says c is behind); a reports again: no wait at all.
	st := preCopyStatus()
	st.Groups[0].AgeMs = 100
	st.Groups[2].Report.ConfigNum = 6
	s = summarize(st, nil, name)
	if len(s.waits) != 0 || s.migrations[1].Phase != "Announced" {
		t.Errorf("waits %q, migrations %+v", s.waits, s.migrations)
	}
	// c reports nothing at all.
	st.Groups = st.Groups[:2]
	s = summarize(st, nil, name)
	if want := []migrationWait{{ReasonGroupNotReporting, "c", "group c has not reported; moving shards waiting on it: 2, 5"}}; !slices.Equal(s.waits, want) {
		t.Errorf("waits %q, want %q", s.waits, want)
	}
}

// TestFillStatusPreCopy: pre-copying shards are served, so the cluster is
// Ready, but they are migrating; the Migrating condition tells phases and
// waits.
func TestFillStatusPreCopy(t *testing.T) {
	st := preCopyStatus()
	st.Groups[0].AgeMs = 100 // a reports
	// Only the pre-copy of a->b and the announced a->c are left.
	st.Groups[1].Report.Shards = st.Groups[1].Report.Shards[:3]
	st.Groups[2].Report.Shards = st.Groups[2].Report.Shards[1:]
	st.Latest.Shards = []uint64{1, 1, 1, 1, 2, 2, 3, 3}
	st.Groups[1].Report.Shards = append(st.Groups[1].Report.Shards, &shardkvpb.ShardState{Shard: 5, State: "Serving"})
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
	o := &smObserved{Cluster: st, Groups: map[string]*shardkvv1.ReplicaGroup{
		"a": {ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: shardkvv1.ReplicaGroupStatus{GroupID: 1}},
		"b": {ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: shardkvv1.ReplicaGroupStatus{GroupID: 2}},
		"c": {ObjectMeta: metav1.ObjectMeta{Name: "c"}, Status: shardkvv1.ReplicaGroupStatus{GroupID: 3}},
	}}
	settled, waits := fillStatus(sm, o)
	if settled {
		t.Error("settled while shards pre-copy")
	}
	if sm.Status.MigratingShards != 3 || sm.Status.ShardStates["PreCopying"] != 2 {
		t.Errorf("migratingShards %d, shardStates %v", sm.Status.MigratingShards, sm.Status.ShardStates)
	}
	wantText := "group c applied the config announcing the move of shards 2 to it but has not started copying them"
	if len(waits) != 1 || waits[0].text != wantText {
		t.Errorf("waits %q", waits)
	}
	for _, err := range []error{
		condIs(sm, shardkvv1.ConditionReady, metav1.ConditionTrue, ReasonServing, "all 8 shards serving"),
		condIs(sm, shardkvv1.ConditionBalanced, metav1.ConditionFalse, ReasonMigrationsInFlight, "3 shards migrating"),
		condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonWaitingForTarget,
			"3 shards moving: a->b 2 shards 70% (PreCopying/snapshot, lag 3 entries), a->c 1 shards (Announced); waiting: "+wantText),
	} {
		if err != nil {
			t.Error(err)
		}
	}

	// c starts copying: no wait, the reason is ShardsMoving again.
	st.Groups[2].Report.Shards = append(st.Groups[2].Report.Shards,
		&shardkvpb.ShardState{Shard: 2, State: "PreCopying", PeerGid: 1, Phase: "snapshot", Bytes: 10, TotalBytes: 1000})
	if _, waits := fillStatus(sm, o); len(waits) != 0 {
		t.Errorf("waits %q", waits)
	}
	if err := condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonShardsMoving, "a->c 1 shards 1% (PreCopying/snapshot)"); err != nil {
		t.Error(err)
	}
}

func TestEstimateMigrationRates(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mig := func(bytes int64) []shardkvv1.Migration {
		return []shardkvv1.Migration{{Source: "a", Target: "b", Bytes: bytes, TotalBytes: 101000}}
	}
	var samples map[string]rateSample
	step := func(at time.Duration, bytes, wantRate int64, wantLeft string) {
		t.Helper()
		ms := mig(bytes)
		samples = estimateMigrationRates(samples, ms, t0.Add(at))
		if ms[0].BytesPerSecond != wantRate || ms[0].EstimatedTimeLeft != wantLeft {
			t.Errorf("at %s, %d bytes: rate %d left %q, want %d %q", at, bytes, ms[0].BytesPerSecond, ms[0].EstimatedTimeLeft, wantRate, wantLeft)
		}
	}
	step(0, 1000, 0, "")                     // first sight
	step(2*time.Second, 5000, 0, "")         // the window is not 5s long yet
	step(5*time.Second, 51000, 10000, "5s")  // 50000 bytes in 5s; 50000 left
	step(6*time.Second, 61000, 10000, "4s")  // the rate holds until the next window closes
	step(11*time.Second, 71000, 3333, "9s")  // (71000-51000)/6s; 30000 left
	step(12*time.Second, 21000, 3333, "24s") // a shard finished: a new window, the last rate kept
	step(17*time.Second, 101000, 16000, "")  // nothing left to copy: no estimate
	if _, ok := samples["a->b"]; !ok || len(samples) != 1 {
		t.Fatalf("samples %v", samples)
	}
	samples = estimateMigrationRates(samples, nil, t0.Add(20*time.Second))
	if len(samples) != 0 {
		t.Errorf("samples of a finished migration kept: %v", samples)
	}
}

// TestNodeArgsMigrationRate: spec.migration.rateBytesPerSecond reaches
// every data-group pod as --migrate-bytes-per-sec and changes the pod
// template's hash (so the pods roll); 0 passes no flag.
func TestNodeArgsMigrationRate(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}, Spec: shardkvv1.ReplicaGroupSpec{ShardMap: "sm"}}
	sm := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sm"}}
	r := &ReplicaGroupReconciler{DefaultImage: "shardkv:test"}
	hash := func() string {
		return r.desiredStatefulSet(rg, sm, 3).Annotations[annotationTemplateHash]
	}
	if args := nodeArgs(rg, sm, 1, 3); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--migrate-bytes-per-sec") }) {
		t.Errorf("unlimited: args %q", args)
	}
	unlimited := hash()
	sm.Spec.Migration.RateBytesPerSecond = 50 << 20
	args := nodeArgs(rg, sm, 1, 3)
	if args[0] != "serve" || args[len(args)-1] != "--migrate-bytes-per-sec=52428800" {
		t.Errorf("limited: args %q", args)
	}
	limited := hash()
	sm.Spec.Migration.RateBytesPerSecond = 10 << 20
	if limited == unlimited || hash() == limited {
		t.Errorf("template hash does not follow the rate: %s, %s, %s", unlimited, limited, hash())
	}
}

// fakeClock is a settable clock for the rate estimates.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestShardMapMigrationStatus: the reconciler writes the pre-copy's
// phases, progress, lag, rate and time left, the write pause, and the
// waits (condition and Events) from the controller's config and reports.
func TestShardMapMigrationStatus(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(4)
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	startManager(t, ns, setupShardMap(dp, func(r *ShardMapReconciler) { r.now = clock.Now }))
	mustCreate(t, testShardMap(ns, "demo", 4, 3))
	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)
	markCtrlerReady(t, ns, "demo", 3)

	// Config 1 gives a everything; config 2 announces the move of shards
	// 2 and 3 to b, which has applied it but copies nothing yet.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)},
		Moves: []*shardkvpb.PlannedMove{{Shard: 2, FromGid: 1, ToGid: 2, SinceConfig: 2}, {Shard: 3, FromGid: 1, ToGid: 2, SinceConfig: 2}}})
	a := &shardkvpb.GroupReport{Gid: 1, ConfigNum: 2, Shards: []*shardkvpb.ShardState{
		{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "Serving"}, {Shard: 3, State: "Serving"}}}
	b := &shardkvpb.GroupReport{Gid: 2, ConfigNum: 2}
	fc.SetReports(a, b)
	sm := waitSM(t, ns, "demo", "announced moves waiting on b", func(sm *shardkvv1.ShardMap) error {
		want := []shardkvv1.Migration{{Source: "a", Target: "b", Shards: 2, Phase: "Announced"}}
		if !slices.Equal(sm.Status.Migrations, want) || sm.Status.MigratingShards != 2 {
			return fmt.Errorf("migrations %+v (%d)", sm.Status.Migrations, sm.Status.MigratingShards)
		}
		return condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonWaitingForTarget, "group b applied the config announcing the move of shards 2, 3")
	})
	if err := condIs(sm, shardkvv1.ConditionReady, metav1.ConditionTrue, ReasonServing, ""); err != nil {
		t.Error(err)
	}
	eventually(t, "WaitingForTarget event", func() error {
		return hasEvent(ns, "demo", ReasonWaitingForTarget, "group b applied the config announcing the move of shards 2, 3")
	})

	// b pre-copies both: 3000 of 10000 bytes.
	precopy := func(bytes0, bytes1 uint64, lag uint64) *shardkvpb.GroupReport {
		return &shardkvpb.GroupReport{Gid: 2, ConfigNum: 2, MigrateBytesPerSec: 4096, Shards: []*shardkvpb.ShardState{
			{Shard: 2, State: "PreCopying", PeerGid: 1, Phase: "snapshot", Keys: bytes0 / 100, TotalKeys: 50, Bytes: bytes0, TotalBytes: 5000},
			{Shard: 3, State: "PreCopying", PeerGid: 1, Phase: "delta", CaughtUp: lag == 0, LagEntries: lag, Keys: bytes1 / 100, TotalKeys: 50, Bytes: bytes1, TotalBytes: 5000}}}
	}
	fc.SetReports(a, precopy(1000, 2000, 7))
	sm = waitSM(t, ns, "demo", "pre-copying", func(sm *shardkvv1.ShardMap) error {
		want := []shardkvv1.Migration{{Source: "a", Target: "b", Shards: 2, Phase: "PreCopying", CopyPhase: "snapshot",
			Keys: 30, TotalKeys: 100, Bytes: 3000, TotalBytes: 10000, Progress: "30%", LagEntries: 7}}
		if !slices.Equal(sm.Status.Migrations, want) {
			return fmt.Errorf("migrations\n got %+v\nwant %+v", sm.Status.Migrations, want)
		}
		return condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonShardsMoving, "a->b 2 shards 30% (PreCopying/snapshot, lag 7 entries)")
	})
	if sm.Status.ShardStates["PreCopying"] != 2 || sm.Status.Groups[1].MigrateBytesPerSec != 4096 {
		t.Errorf("shardStates %v groups %+v", sm.Status.ShardStates, sm.Status.Groups)
	}
	// 16s after the first observation of the migration (0 bytes, when it
	// was announced; the operator's clock), 8000 bytes are copied: 500
	// bytes/s, 4s left.
	fc.SetReports(a, precopy(4000, 4000, 0))
	waitSM(t, ns, "demo", "8000 bytes", func(sm *shardkvv1.ShardMap) error {
		if len(sm.Status.Migrations) != 1 || sm.Status.Migrations[0].Bytes != 8000 {
			return fmt.Errorf("migrations %+v", sm.Status.Migrations)
		}
		return nil
	})
	clock.Advance(16 * time.Second)
	sm = waitSM(t, ns, "demo", "rate and time left", func(sm *shardkvv1.ShardMap) error {
		if m := sm.Status.Migrations; len(m) != 1 || m[0].BytesPerSecond != 500 || m[0].EstimatedTimeLeft != "4s" {
			return fmt.Errorf("migrations %+v", m)
		}
		return nil
	})
	if m := sm.Status.Migrations[0]; m.CaughtUpShards != 1 || m.LagEntries != 0 || m.Progress != "80%" {
		t.Errorf("migration %+v", m)
	}

	// a stops reporting.
	fc.SetReportAge(1, 60000)
	waitSM(t, ns, "demo", "GroupNotReporting", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonGroupNotReporting,
			"group a has not reported for over 10s; moving shards waiting on it: 2, 3")
	})
	eventually(t, "GroupNotReporting event", func() error {
		return hasEvent(ns, "demo", ReasonGroupNotReporting, "group a has not reported for over 10s")
	})
	fc.SetReportAge(1, 100)

	// Config 3 cuts both over: b pulls the rest, then serves them with a
	// measured write pause, which stays after the move.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 2, 2}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)}})
	a3 := &shardkvpb.GroupReport{Gid: 1, ConfigNum: 3, Shards: []*shardkvpb.ShardState{
		{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}, {Shard: 2, State: "BePulling", PeerGid: 2}, {Shard: 3, State: "GCing", PeerGid: 2}}}
	fc.SetReports(a3, &shardkvpb.GroupReport{Gid: 2, ConfigNum: 3, Shards: []*shardkvpb.ShardState{
		{Shard: 2, State: "Pulling", PeerGid: 1, Phase: "delta", LagEntries: 2, Keys: 50, TotalKeys: 50, Bytes: 5000, TotalBytes: 5000},
		{Shard: 3, State: "Acking", PeerGid: 1, ConfigNum: 3, Keys: 50, Bytes: 5000, WritePauseUs: 2300}}})
	waitSM(t, ns, "demo", "cutting over", func(sm *shardkvv1.ShardMap) error {
		want := []shardkvv1.Migration{{Source: "a", Target: "b", Shards: 2, Phase: "CuttingOver", CaughtUpShards: 1,
			Keys: 100, TotalKeys: 100, Bytes: 10000, TotalBytes: 10000, Progress: "100%", LagEntries: 2, BytesPerSecond: 500, LastWritePause: "2.3ms"}}
		if !slices.Equal(sm.Status.Migrations, want) {
			return fmt.Errorf("migrations\n got %+v\nwant %+v", sm.Status.Migrations, want)
		}
		return condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionTrue, ReasonShardsMoving, "a->b 2 shards 100% (CuttingOver, lag 2 entries, write pause 2.3ms)")
	})
	fc.SetReports(&shardkvpb.GroupReport{Gid: 1, ConfigNum: 3, Shards: []*shardkvpb.ShardState{{Shard: 0, State: "Serving"}, {Shard: 1, State: "Serving"}}},
		&shardkvpb.GroupReport{Gid: 2, ConfigNum: 3, Shards: []*shardkvpb.ShardState{
			{Shard: 2, State: "Serving", ConfigNum: 3, WritePauseUs: 1900}, {Shard: 3, State: "Serving", ConfigNum: 3, WritePauseUs: 2300}}})
	sm = waitSM(t, ns, "demo", "settled", func(sm *shardkvv1.ShardMap) error {
		if len(sm.Status.Migrations) != 0 || sm.Status.MigratingShards != 0 {
			return fmt.Errorf("migrations %+v", sm.Status.Migrations)
		}
		return condIs(sm, shardkvv1.ConditionMigrating, metav1.ConditionFalse, ReasonNoMigrations, "")
	})
	if g := sm.Status.Groups; len(g) != 2 || g[1].LastWritePause != "2.3ms" || g[0].LastWritePause != "" {
		t.Errorf("groups %+v", g)
	}
}

// TestMigrationRateRollsGroups: setting spec.migration.rateBytesPerSecond
// puts --migrate-bytes-per-sec in the data groups' pod template (a new
// template hash, which rolls their pods); a negative rate is refused.
func TestMigrationRateRollsGroups(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	startManager(t, ns, setupReplicaGroup(dp))
	ctx := context.Background()
	newShardMap(t, ns, "sm")
	newReplicaGroup(t, ns, "a", "sm", 3)
	sts := &appsv1.StatefulSet{}
	flag := func() string {
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--migrate-bytes-per-sec") {
				return a
			}
		}
		return ""
	}
	eventually(t, "StatefulSet a", func() error { return get(ctx, ns, "a", sts) })
	if f := flag(); f != "" {
		t.Fatalf("unlimited: %s", f)
	}
	hash := sts.Annotations[annotationTemplateHash]

	// (The ReplicaGroup reconciler writes the ShardMap's status: retry
	// conflicts.)
	setRate := func(n int64) error {
		sm := &shardkvv1.ShardMap{}
		if err := get(ctx, ns, "sm", sm); err != nil {
			return err
		}
		sm.Spec.Migration.RateBytesPerSecond = n
		return k8sClient.Update(ctx, sm)
	}
	eventually(t, "rateBytesPerSecond -1 refused", func() error {
		err := setRate(-1)
		if err == nil {
			t.Fatal("rateBytesPerSecond -1 accepted")
		}
		if !strings.Contains(err.Error(), "should be greater than or equal to 0") {
			return err
		}
		return nil
	})
	eventually(t, "rateBytesPerSecond 8Mi", func() error { return setRate(8 << 20) })
	eventually(t, "the flag in the pod template", func() error {
		if err := get(ctx, ns, "a", sts); err != nil {
			return err
		}
		if f := flag(); f != "--migrate-bytes-per-sec=8388608" {
			return fmt.Errorf("flag %q", f)
		}
		if sts.Annotations[annotationTemplateHash] == hash {
			return errors.New("template hash unchanged")
		}
		return nil
	})
}
