package controllers

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/shardkv/shardkv/pkg/shardkvpb"
)

// dpServer is one pod of the test: a replica's admin API and a
// controller's Watch, on loopback.
type dpServer struct {
	shardkvpb.UnimplementedAdminServer
	addr    string
	configs chan *shardkvpb.Config // what Watch streams
}

type dpController struct {
	shardkvpb.UnimplementedControllerServer
	*dpServer
}

func startDPServer(t *testing.T) *dpServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dpServer{addr: ln.Addr().String(), configs: make(chan *shardkvpb.Config)}
	srv := grpc.NewServer()
	shardkvpb.RegisterAdminServer(srv, s)
	shardkvpb.RegisterControllerServer(srv, dpController{dpServer: s})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return s
}

func (s *dpServer) Status(context.Context, *shardkvpb.StatusRequest) (*shardkvpb.MemberStatus, error) {
	return &shardkvpb.MemberStatus{Addr: s.addr, Role: "leader"}, nil
}

func (s dpController) Status(context.Context, *shardkvpb.ClusterStatusRequest) (*shardkvpb.ClusterStatus, error) {
	return &shardkvpb.ClusterStatus{Latest: &shardkvpb.Config{Num: 7}}, nil
}

func (s dpController) Watch(_ *shardkvpb.WatchRequest, stream grpc.ServerStreamingServer[shardkvpb.Config]) error {
	for {
		select {
		case c := <-s.configs:
			if err := stream.Send(c); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}

// TestGRPCDataPlaneForgetsGonePods: connections to pods the reconcilers
// stop asking for are closed after a sweep or two, controller clients of
// old address sets are dropped, and a running config Watch survives.
func TestGRPCDataPlaneForgetsGonePods(t *testing.T) {
	a, b, c := startDPServer(t), startDPServer(t), startDPServer(t)
	d := NewGRPCDataPlane()
	defer d.Close()
	now := time.Unix(1000, 0)
	d.now, d.lastSweep = func() time.Time { return now }, now
	tick := func() { now = now.Add(d.idle) }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status := func(addr string) {
		t.Helper()
		api, err := d.Replica(nil, addr)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := api.Status(ctx); err != nil || st.Addr != addr {
			t.Fatalf("status of %s: %v, %v", addr, st, err)
		}
	}

	status(a.addr)
	status(b.addr)
	ctrl, err := d.Controller(nil, []string{c.addr})
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := d.Controller(nil, []string{c.addr}); again != ctrl {
		t.Fatal("a second controller client for the same addresses")
	}
	watch := ctrl.Watch(ctx, 1)
	c.configs <- &shardkvpb.Config{Num: 1}
	if conf := <-watch; conf.GetNum() != 1 {
		t.Fatalf("watch: %v", conf)
	}
	if got := d.pools[nil].Addrs(); !slices.Equal(got, sortedStrings(a.addr, b.addr, c.addr)) {
		t.Fatalf("pool: %v", got)
	}

	// b's pod is gone: only a is asked for from now on.
	tick()
	status(a.addr) // sweep 1: everything was used since the start
	if got := d.pools[nil].Addrs(); len(got) != 3 {
		t.Fatalf("pool after one sweep: %v", got)
	}
	tick()
	status(a.addr) // sweep 2: b unused for a whole period
	if got := d.pools[nil].Addrs(); !slices.Equal(got, sortedStrings(a.addr, c.addr)) {
		t.Fatalf("pool after two sweeps: %v, want a and c (c carries the Watch)", got)
	}
	if n := len(d.ctrlers); n != 0 {
		t.Fatalf("%d controller clients kept, none asked for in a period", n)
	}
	c.configs <- &shardkvpb.Config{Num: 2}
	if conf := <-watch; conf.GetNum() != 2 {
		t.Fatalf("watch after the sweeps: %v", conf)
	}

	// b comes back: dialed afresh. A new controller client serves c.
	status(b.addr)
	if again, _ := d.Controller(nil, []string{c.addr}); again == ctrl {
		t.Fatal("the dropped controller client came back")
	}
	// A client dropped from the cache still works (a reconcile holding
	// it across a sweep): it dials through the pool.
	if st, err := ctrl.Status(ctx); err != nil || st.GetLatest().GetNum() != 7 {
		t.Fatalf("status from the dropped client: %v, %v", st, err)
	}
}

func sortedStrings(s ...string) []string {
	slices.Sort(s)
	return s
}
