package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPodTrouble(t *testing.T) {
	pod := func(st corev1.ContainerStatus) *corev1.Pod {
		st.Name = nodeContainer
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "sidecar"}, st}}}
	}
	long := strings.Repeat("x", 400)
	for _, c := range []struct {
		name string
		st   corev1.ContainerStatus
		want string
	}{
		{"running", corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}, ""},
		{"creating", corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}, ""},
		{"crash loop: the last log line", corev1.ContainerStatus{
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1,
				Message: "time=x level=INFO msg=starting\nnode: data dir /data belongs to role=group group=2 id=1, not role=group group=4 id=1\n"}}},
			"CrashLoopBackOff (exit 1: node: data dir /data belongs to role=group group=2 id=1, not role=group group=4 id=1)"},
		{"image", corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: long}}},
			"ErrImagePull: " + long[:300] + "…"},
	} {
		if got := podTrouble(pod(c.st)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
