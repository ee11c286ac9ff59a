package shardkv_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

// TestScanPassesElementsAndSessions: a scan of shards that hold a hash
// (its elements sort before the value records) and client sessions (they
// sort after) returns every key and ends. Before, the elements made it
// skip the shard's keys, and a session made it seek back onto itself for
// ever.
func TestScanPassesElementsAndSessions(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 4})
	w.StartGroup(100)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := []string{"{x}a", "{x}h", "{y}b", "{y}s"}
	for _, k := range []string{"{x}a", "{y}b"} {
		if err := c.Put(ctx, k, "v"); err != nil { // writes a session too
			t.Fatal(err)
		}
	}
	if _, err := c.HSet(ctx, "{x}h", "f", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SAdd(ctx, "{y}s", "m"); err != nil {
		t.Fatal(err)
	}
	// Replica 1 may be a follower that has not applied the last write yet
	// (a scan reads local state): scan again until it has, for a while.
	g := w.Group(100, 1)
	scan := func() []string {
		done := make(chan []string, 1)
		go func() {
			var got []string
			var after []byte
			for first := true; first || after != nil; first = false {
				keys, next, err := g.Scan(after, 1, nil)
				if err != nil {
					t.Error(err)
					break
				}
				for _, k := range keys {
					got = append(got, string(k))
				}
				after = next
			}
			done <- got
		}()
		select {
		case got := <-done:
			slices.Sort(got)
			return got
		case <-time.After(10 * time.Second):
			t.Fatal("the scan did not end in 10 s")
			return nil
		}
	}
	got := scan()
	for end := time.Now().Add(5 * time.Second); !slices.Equal(got, want) && time.Now().Before(end); got = scan() {
		time.Sleep(50 * time.Millisecond)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("scan found %v, want %v", got, want)
	}
}
