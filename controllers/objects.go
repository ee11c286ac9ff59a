package controllers

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// createOwned creates obj with owner as its controlling owner: everything
// the operator creates is owned, so it goes with its ShardMap or
// ReplicaGroup and wakes the owner's reconciler when it changes.
func createOwned(ctx context.Context, c client.Client, scheme *runtime.Scheme, owner, obj client.Object) error {
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return err
	}
	return c.Create(ctx, obj)
}

// contentHash identifies the content of what the operator last wrote (an
// object's spec, a pod template), so a change of the desired object is seen
// by comparing an annotation, not the object against API-server defaults.
func contentHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // API types always marshal
	}
	h := fnv.New64a()
	h.Write(b)
	return strconv.FormatUint(h.Sum64(), 36)
}

// setAnnotation sets annotation key of o to value.
func setAnnotation(o metav1.Object, key, value string) {
	a := o.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	o.SetAnnotations(a)
}
