//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
	"github.com/shardkv/shardkv/controllers"
)

// controllerResize grows the controller group from 3 to 5 and shrinks it
// back, under the workloads. The grow adds each new replica as a learner
// and promotes it; before the shrink the leadership is moved (kvctl) onto
// a replica that goes, so the operator must hand it back before removing
// it. No data pod restarts (their --ctrler list is the bootstrap's), the
// removed pods' volumes go, and no operation fails.
func (e *env) controllerResize(t *testing.T) {
	st0 := e.workloadSnapshot(t)
	name := controllers.CtrlerName(sm)
	groups := map[string]int{"demo-a": 3, "demo-b": 3, "demo-c": 3, "demo-e": 3}
	dataPods := map[string]string{} // name -> UID
	for g := range groups {
		for _, p := range e.pods(t, g) {
			dataPods[p.Name] = string(p.UID)
		}
	}
	resized := func(n int32) func() (bool, string) {
		return func() (bool, string) {
			m := e.shardMap(t, sm)
			prog := condStatus(m.Status.Conditions, shardkvv1.ConditionProgressing)
			msg := ""
			if c := meta.FindStatusCondition(m.Status.Conditions, shardkvv1.ConditionProgressing); c != nil {
				msg = c.Message
			}
			var sts appsv1.StatefulSet
			if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: name}, &sts); err != nil {
				return false, err.Error()
			}
			return m.Status.ControllerVoters == n && m.Status.ControllerReadyReplicas == n && *sts.Spec.Replicas == n && len(e.pods(t, name)) == int(n) && prog == "False(UpToDate)",
				fmt.Sprintf("voters %d, ready %d, StatefulSet %d, pods %d, progressing %s: %s", m.Status.ControllerVoters, m.Status.ControllerReadyReplicas,
					*sts.Spec.Replicas, len(e.pods(t, name)), prog, msg)
		}
	}

	e.k(t, "patch", "shardmap", sm, "--type=merge", "-p", `{"spec":{"controller":{"replicas":5}}}`)
	took := e.eventually(t, settle, "5 controller voters", resized(5))
	t.Logf("grown to 5 in %v", took)
	st := e.kvctlStatus(t, sm)
	byPod := map[string]uint64{}
	for _, m := range st.Controller.Members {
		if m.Learner || !m.Reachable {
			t.Errorf("controller member %d (%s) after the grow: role %s, learner %v, reachable %v", m.ID, m.Addr, m.Role, m.Learner, m.Reachable)
		}
		byPod[podOfAddr(m.Addr)] = m.ID
	}
	if len(byPod) != 5 {
		t.Fatalf("controller members %+v, want one at each of 5 pods", st.Controller.Members)
	}
	evs := e.events(t, "ShardMap", sm, e.scenarioStart)
	for _, want := range []string{"ResizingController\tresize: growing the controller StatefulSet from 3 to 5", "AddLearner\t", "Promote\t"} {
		if !containsPrefix(evs, want) {
			t.Errorf("no event %q; events:\n%s", want, strings.Join(evs, "\n"))
		}
	}
	e.workloadsProgress(t)

	// The leadership onto pod 4, which the shrink removes.
	top := name + "-4"
	if podOfAddr(st.Controller.LeaderAddr) != top {
		out := e.k(t, e.kvctl(sm, 3, "transfer-leader", fmt.Sprint(byPod[top]), "--group", "ctrler")...)
		t.Logf("kvctl transfer-leader %d (%s): %s", byPod[top], top, strings.TrimSpace(out))
	}
	e.eventually(t, settle, top+" leads", func() (bool, string) {
		l := podOfAddr(e.kvctlStatus(t, sm).Controller.LeaderAddr)
		return l == top, "leader " + l
	})

	shrinkStart := e.scenarioStart
	e.k(t, "patch", "shardmap", sm, "--type=merge", "-p", `{"spec":{"controller":{"replicas":3}}}`)
	took = e.eventually(t, settle, "3 controller voters", resized(3))
	t.Logf("shrunk to 3 in %v", took)
	st = e.kvctlStatus(t, sm)
	if l := podOfAddr(st.Controller.LeaderAddr); !slices.Contains([]string{name + "-0", name + "-1", name + "-2"}, l) || len(st.Controller.Members) != 3 {
		t.Errorf("after the shrink: leader %s, members %+v", l, st.Controller.Members)
	}
	evs = e.events(t, "ShardMap", sm, shrinkStart)
	for _, want := range []string{"TransferLeader\tresize to 3: moving the controller's leadership from " + top,
		"RemoveMember\tresize to 3: removing controller replica", "ResizingController\tresize: shrinking the controller StatefulSet from 5 to 3",
		"ResizingController\tdeleting the volume data-" + name + "-"} {
		if !containsPrefix(evs, want) {
			t.Errorf("no event %q; events:\n%s", want, strings.Join(evs, "\n"))
		}
	}
	// The removed replicas' volumes are gone: a later grow starts empty.
	e.eventually(t, settle, "the removed pods' claims gone", func() (bool, string) {
		var left []string
		for _, ord := range []int{3, 4} {
			c := fmt.Sprintf("data-%s-%d", name, ord)
			if err := e.kube.Get(ctx(t), client.ObjectKey{Namespace: e.ns, Name: c}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
				left = append(left, c)
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left)
	})
	// No data pod restarted.
	for g := range groups {
		for _, p := range e.pods(t, g) {
			if uid, ok := dataPods[p.Name]; !ok || uid != string(p.UID) {
				t.Errorf("data pod %s was replaced during the controller's resize", p.Name)
			}
		}
	}
	e.waitSettled(t, settle, sm, groups)
	e.workloadsProgress(t)
	e.checkNoWorkloadErrors(t, st0, "the controller group's resize")
}
