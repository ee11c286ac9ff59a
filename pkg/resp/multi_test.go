package resp_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// testTransactions: what the differential test (70_multi.txt) cannot
// show: no other client's command runs between a transaction's commands,
// also when they take several log entries; a client blocked in BLPOP, or
// one that does not read its replies, does not hold EXEC up; WATCH sees
// another client's write.
func (e *env) testTransactions(t *testing.T) {
	n, l, b, big := "{tx}n", "{tx}l", "{tx}b", "{tx}big"
	addr := e.leaderAddr(e.owner(n))
	c := dial(t, addr)
	defer c.c.Close()
	c.do("del", n, l, b, big)

	// Three clients INCR n while transactions INCR it twice with a
	// collection read between (which ends the first write's batch, so the
	// two INCRs are two log entries): the two must still be consecutive.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		o := dial(t, addr)
		defer o.c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o.write(encode("incr", n))
				if r, err := o.tryRead(); err != nil {
					errs <- err
					return
				} else if _, ok := r.(int64); !ok {
					errs <- fmt.Errorf("INCR: %#v", r)
					return
				}
			}
		}()
	}
	bad := 0
	for i := range 40 {
		expect(t, c.do("multi"), status("OK"))
		for _, cmd := range [][]string{{"incr", n}, {"llen", l}, {"incr", n}} {
			expect(t, c.do(cmd...), status("QUEUED"))
		}
		r, ok := c.do("exec").([]any)
		if !ok || len(r) != 3 {
			t.Fatalf("EXEC %d: %#v", i, r)
		}
		first, ok1 := r[0].(int64)
		second, ok2 := r[2].(int64)
		if !ok1 || !ok2 || second != first+1 {
			bad++
			t.Errorf("EXEC %d: INCR, LLEN, INCR answered %v: another client's INCR came between", i, r)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a concurrent INCR: %v", err)
	}
	if bad > 0 {
		t.Fatalf("%d of 40 transactions were not isolated", bad)
	}

	// A client blocked in BLPOP does not hold EXEC up.
	blocked := dial(t, addr)
	defer blocked.c.Close()
	blocked.write(encode("blpop", b, "0"))
	time.Sleep(300 * time.Millisecond)
	// exec sends MULTI, cmd, EXEC on a connection of its own: EXEC's
	// reply (or the error reading it) comes on done.
	done := make(chan any, 1)
	exec := func(cmd ...string) {
		o := dial(t, addr)
		go func() {
			defer o.c.Close()
			o.write(append(append(encode("multi"), encode(cmd...)...), encode("exec")...))
			var last any
			for range 3 {
				r, err := o.tryRead()
				if err != nil {
					done <- err
					return
				}
				last = r
			}
			done <- last
		}()
	}
	exec("rpush", b, "v")
	select {
	case r := <-done:
		expect(t, r, []any{int64(1)})
	case <-time.After(slow):
		t.Fatal("EXEC waited for a client blocked in BLPOP")
	}
	expect(t, blocked.read(), []any{b, "v"})

	// A client that reads none of its replies does not hold EXEC up.
	expect(t, c.do("set", big, strings.Repeat("x", 256<<10)), status("OK"))
	lazy := dial(t, addr)
	defer lazy.c.Close()
	var gets []byte
	for range 400 {
		gets = append(gets, encode("get", big)...)
	}
	go func() { _, _ = lazy.c.Write(gets) }() // 100 MiB of replies, unread
	time.Sleep(500 * time.Millisecond)
	exec("incr", n)
	select {
	case r := <-done:
		if got, ok := r.([]any); !ok || len(got) != 1 {
			t.Errorf("EXEC beside a client that reads nothing: %#v", r)
		}
	case <-time.After(slow):
		t.Fatal("EXEC waited for a client that reads none of its replies")
	}
	lazy.c.Close()

	// WATCH: another client's write aborts EXEC (a null array); none
	// lets it run.
	o := dial(t, addr)
	defer o.c.Close()
	expect(t, c.do("watch", n), status("OK"))
	expect(t, o.do("set", n, "theirs"), status("OK"))
	expect(t, c.do("multi"), status("OK"))
	expect(t, c.do("set", n, "mine"), status("QUEUED"))
	expect(t, c.do("exec"), nil)
	expect(t, c.do("get", n), "theirs")
	expect(t, c.do("watch", n), status("OK"))
	expect(t, o.do("set", l+"x", "elsewhere"), status("OK"))
	expect(t, c.do("multi"), status("OK"))
	expect(t, c.do("set", n, "mine"), status("QUEUED"))
	expect(t, c.do("exec"), []any{status("OK")})
	expect(t, c.do("get", n), "mine")
}
