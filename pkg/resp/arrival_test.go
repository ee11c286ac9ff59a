package resp

import (
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// TestArrivalStamps: the reader notes when bytes reached the host, not
// when its goroutine got to read them, so blocked clients are queued in
// the order their commands came even when their goroutines run late.
func TestArrivalStamps(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	in := &connInput{nc: sv, rc: stampArrivals(sv), stats: new(atomic.Int64)}
	if in.rc == nil {
		t.Skip("no arrival stamps on this platform")
	}
	// The kernel turns stamping on for the whole host a moment after the
	// first socket asks (a deferred static-key switch): until then reads
	// carry no stamp.
	buf := make([]byte, 64)
	for start := time.Now(); ; {
		if _, err := cl.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_, at, err := readStamped(in.rc, buf)
		if err != nil {
			t.Fatal(err)
		}
		if !at.IsZero() {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("the kernel gave no arrival stamp in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	sent := time.Now()
	if _, err := cl.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	const late = 50 * time.Millisecond
	time.Sleep(late) // the reader's goroutine runs late
	n, err := in.Read(buf)
	if err != nil || string(buf[:n]) != "PING\r\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if got := in.arrived.Sub(sent); got < -time.Millisecond || got > late/2 {
		t.Fatalf("arrival stamped %v after the write, want about 0 (the read was %v later)", got, late)
	}

	// The idle deadline still ends a read, and EOF is EOF.
	in.idle = 20 * time.Millisecond
	if _, err := in.Read(buf); err == nil {
		t.Fatal("read with nothing sent and an idle deadline returned no error")
	} else if ne, ok := err.(interface{ Timeout() bool }); !ok || !ne.Timeout() {
		t.Fatalf("idle read: %v, want a timeout", err)
	}
	in.idle = 0
	_ = sv.SetReadDeadline(time.Time{})
	cl.Close()
	if n, err := in.Read(buf); n != 0 || err == nil || err.Error() != "EOF" {
		t.Fatalf("read after close: %d, %v, want EOF", n, err)
	}
}

// TestBlockQueueOrder: clients are queued by arrival, whatever order
// their executors add them in; same instant: the older connection first.
// A client is first in line for its keys when no one ahead shares one.
func TestBlockQueueOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	mk := func(id int64, at time.Duration) *blocker {
		return &blocker{c: &conn{id: id}, it: &item{}, arrived: t0.Add(at), keys: [][]byte{[]byte("k")}}
	}
	var q blockQueue
	c := mk(3, 2*time.Millisecond)
	b := mk(2, time.Millisecond)
	a := mk(1, time.Millisecond) // same instant as b, older connection
	d := mk(4, 0)                // came first, added last
	for i, w := range []*blocker{c, b, a, d} {
		if first := q.add(w); first != (i == 0) {
			t.Fatalf("add #%d: alone on its keys = %v", i, first)
		}
	}
	// c was alone when added (its own first try); d came before it and
	// queued meanwhile, so c's try leaves the pop to a pass (firstTry).
	if q.firstInLine(c) || !q.firstInLine(d) {
		t.Fatalf("first in line: c %v, d %v; want false, true", q.firstInLine(c), q.firstInLine(d))
	}
	other := mk(5, 3*time.Millisecond)
	other.keys = [][]byte{[]byte("elsewhere")}
	q.add(other)
	if !q.firstInLine(other) {
		t.Fatal("a client on other keys is not first in line for them")
	}
	q.list = slices.DeleteFunc(q.list, func(w *blocker) bool { return w == other })
	want := []*blocker{d, a, b, c}
	for i, w := range q.list {
		if w != want[i] {
			t.Fatalf("queue position %d holds connection %d, want %d", i, w.c.id, want[i].c.id)
		}
	}
}
