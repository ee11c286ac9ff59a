package ctrler_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/shardkv/shardkv/pkg/ctrler"
	"github.com/shardkv/shardkv/pkg/ctrler/ctrlerclient"
	"github.com/shardkv/shardkv/pkg/raftgroup"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// TestUsers: the cluster's users are set, replaced and deleted through the
// log; the version moves only when something changed; replace_managed
// swaps the operator's users and keeps the others; bad requests change
// nothing; a replica that missed the changes (restarted after the log was
// compacted past them, so it catches up from a snapshot) ends with the
// same users as the others.
func TestUsers(t *testing.T) {
	cc := newCtrlCluster(t, 3, 16, "balanced", func(c *raftgroup.Config) { c.SnapshotEntries, c.TrailingEntries = 5, 2 })
	c := cc.client(t)
	cx := ctx(t, 60*time.Second)
	set := func(req *shardkvpb.SetUsersRequest) *shardkvpb.UsersReply {
		t.Helper()
		u, err := c.SetUsers(cx, req)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	names := func(u *shardkvpb.UsersReply) string {
		var s []string
		for _, x := range u.Users {
			s = append(s, fmt.Sprintf("%s=%s/%v", x.Name, x.Spec, x.Managed))
		}
		return strings.Join(s, " ")
	}
	u := set(&shardkvpb.SetUsersRequest{Set: []*shardkvpb.User{{Name: "app", Spec: "on ~a*", Managed: true}, {Name: "ops", Spec: "on ~*"}}})
	if u.Version != 1 || names(u) != "app=on ~a*/true ops=on ~*/false" {
		t.Fatalf("after the first set: v%d %s", u.Version, names(u))
	}
	if u = set(&shardkvpb.SetUsersRequest{Set: []*shardkvpb.User{{Name: "ops", Spec: "on ~*"}}}); u.Version != 1 {
		t.Fatalf("setting the same user moved the version to %d", u.Version)
	}
	u = set(&shardkvpb.SetUsersRequest{Set: []*shardkvpb.User{{Name: "app2", Spec: "on", Managed: true}}, ReplaceManaged: true})
	if u.Version != 2 || names(u) != "app2=on/true ops=on ~*/false" {
		t.Fatalf("after replace_managed: v%d %s", u.Version, names(u))
	}
	// Bad requests: refused, nothing changes.
	for _, bad := range []*shardkvpb.SetUsersRequest{
		{Set: []*shardkvpb.User{{Name: "a b", Spec: "on"}}},
		{Set: []*shardkvpb.User{{Name: "", Spec: "on"}}},
		{Set: []*shardkvpb.User{{Name: "x", Spec: strings.Repeat("~a", ctrler.MaxUserSpecBytes)}}},
		{Set: []*shardkvpb.User{{Name: "x"}, {Name: "x"}}},
		{Set: []*shardkvpb.User{{Name: "x"}}, Delete: []string{"x"}},
		{Delete: []string{strings.Repeat("n", ctrler.MaxUserNameBytes+1)}},
	} {
		if _, err := c.SetUsers(cx, bad); !ctrlerclient.IsRefused(err) {
			t.Fatalf("SetUsers(%v): %v; want a refusal", bad, err)
		}
	}
	if got, err := c.Users(cx); err != nil || got.Version != 2 {
		t.Fatalf("after refusals: %v, %v", got, err)
	}
	// A replica misses many changes and catches up from a snapshot.
	down := cc.IDs()[0]
	if cc.Leader() == down {
		down = cc.IDs()[1]
	}
	cc.Crash(down)
	for i := range 30 {
		set(&shardkvpb.SetUsersRequest{Set: []*shardkvpb.User{{Name: fmt.Sprint("u", i), Spec: "on"}}, Delete: []string{"app2"}})
	}
	want := set(&shardkvpb.SetUsersRequest{Delete: []string{"u0"}})
	cc.Start(down)
	deadline := time.Now().Add(30 * time.Second)
	for {
		agree := true
		for _, id := range cc.IDs() {
			got, err := cc.sm(id).Users()
			agree = agree && err == nil && proto.Equal(got, want)
		}
		if agree {
			break
		}
		if time.Now().After(deadline) {
			got, _ := cc.sm(down).Users()
			t.Fatalf("replica %d has v%d %s; want v%d %s", down, got.GetVersion(), names(got), want.Version, names(want))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
