package shardkv_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/client"
	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestConcurrentMultiPutsOneShard: one client sends 10 MultiPuts of 500
// keys of one shard at once (3 rounds), 5000 writes of one session in
// flight, more than a session remembers results for (MaxDonePerSession). Regression test
// for two bugs: such an entry's transaction grew past badger's limit (every
// replica stopped on a fatal apply error), and trimming the session skipped
// writes that had not arrived yet while reporting them done (a MultiPut
// returned nil with keys missing). Now every MultiPut either wrote all its
// keys or fails with ErrOutcomeUnknown, and the group stays up.
func TestConcurrentMultiPutsOneShard(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const batches, perBatch, rounds = 10, 500, 3
	value := strings.Repeat("v", 100)
	errs := make([]error, batches*rounds)
	var wg sync.WaitGroup
	for g := range batches {
		wg.Go(func() {
			for r := range rounds {
				b := r*batches + g
				kvs := map[string]string{}
				for i := range perBatch {
					kvs[fmt.Sprintf("{one}b%d-%d", b, i)] = value // one hash tag: one shard
				}
				errs[b] = c.MultiPut(ctx, kvs)
			}
		})
	}
	wg.Wait()
	for _, id := range w.Groups[100].IDs() {
		if err := w.Groups[100].Replica(id).Err(); err != nil {
			t.Fatalf("replica %d stopped: %v", id, err)
		}
	}
	ok := 0
	rc := w.Client()
	for b, err := range errs {
		if err != nil {
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("batch %d: %v, want success or ErrOutcomeUnknown", b, err)
			}
			t.Logf("batch %d: %v", b, err)
			continue
		}
		ok++
		keys := make([]string, perBatch)
		for i := range keys {
			keys[i] = fmt.Sprintf("{one}b%d-%d", b, i)
		}
		got, err := rc.MultiGet(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != perBatch {
			t.Errorf("batch %d: MultiPut returned nil but %d of its %d keys exist", b, len(got), perBatch)
		}
	}
	t.Logf("%d of %d batches succeeded", ok, len(errs))
	if ok == 0 {
		t.Errorf("no batch succeeded")
	}
}
