package shardkv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/shardkv/kvtest"
)

func TestJoinLeaveMovesData(t *testing.T) {
	w := kvtest.New(t, kvtest.Options{Shards: 16})
	w.StartGroup(100)
	w.StartGroup(101)
	w.StartGroup(102)
	w.Join(100)
	w.WaitSettled(20 * time.Second)
	c := w.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := map[string]string{}
	for i := range 50 {
		k := fmt.Sprintf("key-%d", i)
		if err := c.Put(ctx, k, "v"+k); err != nil {
			t.Fatal(err)
		}
		want[k] = "v" + k
	}
	check := func(step string) {
		t.Helper()
		for k, v := range want {
			got, ok, err := c.Get(ctx, k)
			if err != nil || !ok || got != v {
				t.Fatalf("%s: Get(%s) = %q %v %v, want %q", step, k, got, ok, err, v)
			}
		}
	}
	step := func(name string, f func()) {
		f()
		for k := range want {
			if err := c.Append(ctx, k, "+"); err != nil {
				t.Fatalf("%s: append %s: %v", name, k, err)
			}
			want[k] += "+"
		}
		check(name)
	}
	step("join 101", func() { w.Join(101) })
	step("join 102", func() { w.Join(102) })
	w.WaitSettled(30 * time.Second)
	step("leave 100", func() { w.Leave(100) })
	step("leave 101", func() { w.Leave(101) })
	w.WaitSettled(30 * time.Second)
	for _, id := range w.Groups[100].IDs() {
		for s := range 16 {
			if n, _ := w.SM(100, id).CountKeys(s); n != 0 {
				t.Fatalf("group 100 replica %d still holds %d keys of shard %d", id, n, s)
			}
		}
	}
}
