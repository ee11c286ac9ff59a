package controllers

// envtest test of spec.moves: one Move or Unpin per pass, in shard order,
// never repeated; a failed Move is an Event and is retried.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

func TestShardMapMoves(t *testing.T) {
	ns := newNamespace(t)
	dp := newFakeDataPlane()
	fc := dp.Ctrler(ns, "demo")
	fc.SetShards(8)
	// Shard 7 is pinned to group 1, which spec.moves does not ask for.
	fc.SetConfig(&shardkvpb.Config{Shards: []uint64{1, 1, 1, 1, 2, 2, 2, 1}, Groups: []*shardkvpb.Group{smGroup(1), smGroup(2)},
		Pins: []*shardkvpb.Pin{{Shard: 7, Gid: 1}}})
	startManager(t, ns, setupShardMap(dp))

	createGroup(t, ns, "a", "demo", 1)
	createGroup(t, ns, "b", "demo", 2)
	createGroup(t, ns, "late", "demo", 0) // no group id yet
	sm := testShardMap(ns, "demo", 8, 3)
	sm.Spec.Moves = []shardkvv1.ShardMove{{Shard: 5, Group: "a"}, {Shard: 0, Group: "b"}, {Shard: 2, Group: "late"}}
	mustCreate(t, sm)
	markCtrlerReady(t, ns, "demo", 3)

	eventually(t, "two Moves and an Unpin", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n < 3 {
			return fmt.Errorf("%d calls: %v", n, dp.CallsTo("Move", "Unpin"))
		}
		return nil
	})
	// No further call: each pass re-reads the pins, so nothing is repeated.
	consistently(t, 2*time.Second, "no repeated call", func() error {
		if n := len(dp.CallsTo("Move", "Unpin")); n != 3 {
			return fmt.Errorf("%d calls: %v", n, dp.CallsTo("Move", "Unpin"))
		}
		return nil
	})
	var got []string
	for _, c := range dp.CallsTo("Move", "Unpin") {
		got = append(got, fmt.Sprint(c.Method, c.Args))
	}
	if want := []string{"Move[0 2]", "Move[5 1]", "Unpin[7]"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v (in shard order, one per pass)", got, want)
	}
	pins := fc.Latest().Pins
	if len(pins) != 2 || pins[0].Shard != 0 || pins[0].Gid != 2 || pins[1].Shard != 5 || pins[1].Gid != 1 {
		t.Errorf("pins %v", pins)
	}
	for _, want := range [][2]string{{"Moved", "pinned shard 0 to b (gid 2)"}, {"Moved", "pinned shard 5 to a (gid 1)"}, {"Unpinned", "unpinned shard 7"}} {
		eventually(t, "event "+want[1], func() error { return hasEvent(ns, "demo", want[0], want[1]) })
	}
	waitSM(t, ns, "demo", "the move to late waits", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForMoves, "ReplicaGroup late has no group id yet")
	})

	// A failing Move is an Event and a condition; it is retried.
	fc.FailWith("Move", errors.New("not leader"))
	eventually(t, "spec.moves change", func() error {
		var cur shardkvv1.ShardMap
		if err := get(context.Background(), ns, "demo", &cur); err != nil {
			return err
		}
		cur.Spec.Moves = []shardkvv1.ShardMove{{Shard: 5, Group: "a"}, {Shard: 0, Group: "b"}, {Shard: 1, Group: "b"}}
		return k8sClient.Update(context.Background(), &cur)
	})
	eventually(t, "MoveFailed event", func() error { return hasEvent(ns, "demo", "MoveFailed", "move shard 1 to b (gid 2): not leader") })
	// Its retries are one Event, patched into a series, not an Event each.
	eventually(t, "MoveFailed counted as a series", func() error {
		evs, err := eventsFor(ns, "demo")
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range evs {
			if e.Reason == "MoveFailed" {
				if e.Series != nil && e.Series.Count >= 2 {
					return nil
				}
				seen = append(seen, fmt.Sprintf("series %+v", e.Series))
			}
		}
		return fmt.Errorf("MoveFailed Events: %v", seen)
	})
	fc.FailWith("Move", nil)
	waitSM(t, ns, "demo", "moves applied", func(sm *shardkvv1.ShardMap) error {
		return condIs(sm, shardkvv1.ConditionProgressing, metav1.ConditionFalse, ReasonUpToDate, "")
	})
	if pins := fc.Latest().Pins; len(pins) != 3 || pins[1].Shard != 1 || pins[1].Gid != 2 {
		t.Errorf("pins %v", pins)
	}
}
