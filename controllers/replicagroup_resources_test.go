package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// TestGroupEnvRequirePass: the Redis password reaches node through its
// environment variable, from the Secret, never as an argument.
func TestGroupEnvRequirePass(t *testing.T) {
	rg := &shardkvv1.ReplicaGroup{}
	if env := groupEnv(rg); len(env) != 1 || env[0].Name != "POD_NAME" {
		t.Fatalf("env without requirePass: %+v", env)
	}
	rg.Spec.RequirePass = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "redis-auth"}, Key: "password"}
	env := groupEnv(rg)
	if len(env) != 2 || env[1].Name != "SHARDKV_REQUIREPASS" || env[1].Value != "" ||
		env[1].ValueFrom.SecretKeyRef.Name != "redis-auth" || env[1].ValueFrom.SecretKeyRef.Key != "password" {
		t.Fatalf("env with requirePass: %+v", env)
	}
	env[1].ValueFrom.SecretKeyRef.Key = "changed"
	if rg.Spec.RequirePass.Key != "password" {
		t.Error("groupEnv aliases the spec")
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
