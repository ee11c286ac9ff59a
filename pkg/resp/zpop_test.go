package resp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testZSetBlocking: BZPOPMIN, BZPOPMAX and BZMPOP wait for a sorted set
// and are woken by another client's ZADD; a key that becomes a list does
// not end the wait; a timeout answers nil; ZMPOP pops from the first key
// that holds a sorted set (the differential test has the replies that do
// not wait).
func (e *env) testZSetBlocking(t *testing.T) {
	ctx := context.Background()
	rdb := e.cluster(nil)
	other := e.cluster(nil)
	a, b := "{zbk}a", "{zbk}b"
	if err := rdb.Del(ctx, a, b).Err(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	waiting := func(what string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		select {
		case r := <-done:
			t.Fatalf("%s of nothing returned at once: %v %v", what, r.v, r.err)
		default:
		}
	}
	woken := func(what, want string) {
		t.Helper()
		select {
		case r := <-done:
			if r.err != nil || fmt.Sprint(r.v) != want {
				t.Errorf("%s woken: %v %v, want %s", what, r.v, r.err, want)
			}
		case <-time.After(slow):
			t.Fatalf("%s not woken by a ZADD", what)
		}
	}

	// BZPOPMIN of two keys, woken by a ZADD to the second.
	go func() {
		v, err := rdb.BZPopMin(ctx, 0, a, b).Result()
		done <- result{v, err}
	}()
	waiting("BZPOPMIN")
	if err := other.ZAdd(ctx, b, redis.Z{Score: 2, Member: "two"}, redis.Z{Score: 1, Member: "one"}).Err(); err != nil {
		t.Fatal(err)
	}
	woken("BZPOPMIN", fmt.Sprint(&redis.ZWithKey{Key: b, Z: redis.Z{Score: 1, Member: "one"}}))

	// BZPOPMAX pops at once from a set that has members.
	if v, err := rdb.BZPopMax(ctx, time.Second, a, b).Result(); err != nil || v.Member != "two" || v.Score != 2 {
		t.Errorf("BZPOPMAX of a set: %v %v", v, err)
	}
	if n, err := rdb.Exists(ctx, b).Result(); err != nil || n != 0 {
		t.Errorf("the set after its last member was popped: exists %d %v", n, err)
	}

	// BZMPOP with a count; the key first becomes a list, which does not
	// end the wait.
	go func() {
		key, zs, err := rdb.BZMPop(ctx, 0, "max", 2, a).Result()
		done <- result{fmt.Sprint(key, zs), err}
	}()
	waiting("BZMPOP")
	other.LPush(ctx, a, "x")
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("BZMPOP ended by a list: %v %v", r.v, r.err)
	default:
	}
	other.Del(ctx, a)
	other.ZAdd(ctx, a, redis.Z{Score: 1, Member: "p"}, redis.Z{Score: 5, Member: "q"}, redis.Z{Score: 3, Member: "r"})
	woken("BZMPOP", fmt.Sprint(a, []redis.Z{{Score: 5, Member: "q"}, {Score: 3, Member: "r"}}))

	// A timeout: nil after about the timeout.
	start := time.Now()
	if v, err := rdb.BZPopMin(ctx, 500*time.Millisecond, b).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("BZPOPMIN 0.5 of nothing: %v %v", v, err)
	}
	if d := time.Since(start); d < 450*time.Millisecond || d > 6*time.Second {
		t.Errorf("BZPOPMIN 0.5 returned after %v", d)
	}

	// ZMPOP skips a missing key; what is left of a.
	if key, zs, err := rdb.ZMPop(ctx, "min", 5, b, a).Result(); err != nil || key != a || fmt.Sprint(zs) != fmt.Sprint([]redis.Z{{Score: 1, Member: "p"}}) {
		t.Errorf("ZMPOP: %v %v %v", key, zs, err)
	}
}
