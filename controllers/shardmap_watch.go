package controllers

// Configs are followed from the controller's Watch stream, not by polling:
// one goroutine per ShardMap feeds reconciles through a channel source
// (ShardMapReconciler.wake).

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	shardkvv1 "github.com/shardkv/shardkv/api/v1alpha1"
)

// configWatch is the Watch stream goroutine of one ShardMap.
type configWatch struct {
	addrs  string
	cancel context.CancelFunc
}

// ensureWatch runs the config Watch of ShardMap nn at addrs (restarting it
// if the addresses changed). Each new config wakes a reconcile.
func (r *ShardMapReconciler) ensureWatch(nn types.NamespacedName, addrs []string, api ControllerAPI, from uint64) {
	key := strings.Join(addrs, ",")
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.watches[nn]; ok {
		if w.addrs == key {
			return
		}
		w.cancel()
	}
	ctx, cancel := context.WithCancel(r.baseCtx)
	w := &configWatch{addrs: key, cancel: cancel}
	r.watches[nn] = w
	go func() {
		defer func() {
			r.mu.Lock()
			if r.watches[nn] == w {
				delete(r.watches, nn)
			}
			r.mu.Unlock()
			cancel()
		}()
		for range api.Watch(ctx, from) {
			obj := &shardkvv1.ShardMap{ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name}}
			select {
			case r.wake <- event.GenericEvent{Object: obj}:
			case <-ctx.Done():
				return
			}
		}
	}()
}

func (r *ShardMapReconciler) stopWatch(nn types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.watches[nn]; ok {
		w.cancel()
		delete(r.watches, nn)
	}
}
