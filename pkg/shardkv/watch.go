package shardkv

import (
	"sync"
	"sync/atomic"
)

// Key watches: a front end that blocks (BLPOP) waits for a write to its
// keys rather than polling. Apply notes the keys each write command names;
// once the transaction holding them is committed, the watchers of those
// keys are woken, and every watcher on a change of shard state (a config
// step, a shard leaving), so that a waiter whose shard moved finds out.
// Only a hint: the woken front end reads again.

type watcher struct {
	ch   chan struct{}
	once sync.Once
	keys []string
}

func (w *watcher) wake() { w.once.Do(func() { close(w.ch) }) }

type watches struct {
	n     atomic.Int32 // watchers: apply notes keys only when there are some
	mu    sync.Mutex
	byKey map[string]map[*watcher]struct{}
}

// WatchKeys returns a channel closed after a write to one of keys is
// applied here, or the group's shard state changes; stop releases it.
func (sm *StateMachine) WatchKeys(keys [][]byte) (changed <-chan struct{}, stop func()) {
	w := &watcher{ch: make(chan struct{})}
	ws := &sm.watches
	ws.mu.Lock()
	if ws.byKey == nil {
		ws.byKey = map[string]map[*watcher]struct{}{}
	}
	for _, k := range keys {
		ks := string(k)
		if ws.byKey[ks] == nil {
			ws.byKey[ks] = map[*watcher]struct{}{}
		}
		ws.byKey[ks][w] = struct{}{}
		w.keys = append(w.keys, ks)
	}
	ws.n.Add(1)
	ws.mu.Unlock()
	return w.ch, func() {
		ws.mu.Lock()
		defer ws.mu.Unlock()
		if w.keys == nil {
			return
		}
		for _, ks := range w.keys {
			delete(ws.byKey[ks], w)
			if len(ws.byKey[ks]) == 0 {
				delete(ws.byKey, ks)
			}
		}
		w.keys = nil
		ws.n.Add(-1)
	}
}

// WatchKeys: see StateMachine.WatchKeys.
func (g *Group) WatchKeys(keys [][]byte) (<-chan struct{}, func()) { return g.sm.WatchKeys(keys) }

// notify wakes the watchers of keys, or all of them.
func (ws *watches) notify(keys []string, all bool) {
	if ws.n.Load() == 0 {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if all {
		for _, set := range ws.byKey {
			for w := range set {
				w.wake()
			}
		}
		return
	}
	for _, k := range keys {
		for w := range ws.byKey[k] {
			w.wake()
		}
	}
}

// noteWrite remembers the keys op names, when someone watches.
func (a *applyCtx) noteWrite(keys ...[]byte) {
	if a.sm.watches.n.Load() == 0 {
		return
	}
	for _, k := range keys {
		if k != nil {
			a.touched = append(a.touched, string(k))
		}
	}
}
