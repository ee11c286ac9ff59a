package node_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shardkv/shardkv/pkg/shardkvpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestSIGTERMLeaderUnderRedisLoad: a leader stopped with SIGTERM while
// Redis clients write hands over leadership and lets the writes it already
// proposed finish before it closes, so no client sees "outcome unknown".
// (Rolling updates stop every leader this way.)
func TestSIGTERMLeaderUnderRedisLoad(t *testing.T) {
	needProcesses(t)
	c, resp := startRESPLocal(t, 4, "--groups=1", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	var addrs []string
	for _, a := range resp {
		addrs = append(addrs, a...)
	}
	const clients = 16
	var (
		stop    atomic.Bool
		ok      atomic.Int64
		unknown atomic.Int64
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
	)
	for w := range clients {
		rc := newClusterClient(addrs)
		defer rc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := rc.Set(ctx, fmt.Sprintf("w%02d-k%d", w, i%8), i, 0).Err()
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case isOutcomeUnknown(err):
					unknown.Add(1)
				default:
					errMu.Lock()
					errs = append(errs, fmt.Errorf("client %d: %w", w, err))
					errMu.Unlock()
					return
				}
			}
		}()
	}
	waitOK := func(n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for ok.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d writes acknowledged, want %d (%s)", ok.Load(), n, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitOK(300, "before SIGTERM")
	for round := range 2 {
		leader, _ := groupLeader(t, c.ctrl, 1, 20*time.Second)
		pid := pidListening(t, leader, 5*time.Second)
		before := ok.Load()
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if _, gone := waitGone(pid, 20*time.Second); !gone {
			t.Fatalf("round %d: leader %s (pid %d) still running 20s after SIGTERM", round, leader, pid)
		}
		waitOK(ok.Load()+300, "after the leader exited")
		t.Logf("round %d: SIGTERM to leader %s; %d writes acknowledged meanwhile, %d unknown so far", round, leader, ok.Load()-before, unknown.Load())
		// node local restarts it; let it catch up before the next round.
		time.Sleep(3 * time.Second)
	}
	stop.Store(true)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if n := unknown.Load(); n != 0 {
		t.Errorf("%d writes answered outcome unknown across leader SIGTERMs (%d acknowledged)", n, ok.Load())
	}
}

// TestSIGTERMLeaderStaysUntilRedirectsConverge: a leader stopped with
// SIGTERM (a pod deleted), or one that handed leadership over just before
// (a rolling update), keeps answering, as a follower that redirects, until
// every other group's front end names the new leader in CLUSTER SHARDS
// (CLUSTER SLOTS says the same), and a while after. Front ends learn another group's
// leader by polling the controller, so for a second or two after a handover
// they still name the old one; a client that loads that topology and finds
// the old leader's port closed gets no redirect to correct it (go-redis
// then retries the dead address until its state is a minute old), so it
// must still find the old leader there, answering MOVED.
func TestSIGTERMLeaderStaysUntilRedirectsConverge(t *testing.T) {
	needProcesses(t)
	c, resp := startRESPLocal(t, 7, "--groups=2", "--replicas=3", "--ctrler-replicas=1", "--spare-groups=0", "--shards=16")
	toRESP := c.grpcToRESP()
	others := resp[2]
	if len(others) == 0 {
		t.Fatalf("no RESP addresses of group 2: %v", resp)
	}
	var clients []*redis.Client
	for _, a := range others {
		rc := redis.NewClient(&redis.Options{Addr: a, DialTimeout: time.Second, ReadTimeout: time.Second})
		defer rc.Close()
		clients = append(clients, rc)
	}
	// master is the address others[i] names as the master of slot.
	master := func(i, slot int) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		shards, err := clients[i].ClusterShards(ctx).Result()
		if err != nil {
			return "error: " + err.Error()
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > int64(slot) || int64(slot) > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" {
						return fmt.Sprintf("%s:%d", n.IP, n.Port)
					}
				}
			}
		}
		return "none"
	}
	for round := range 2 {
		leader, _ := groupLeader(t, c.ctrl, 1, 20*time.Second)
		old := toRESP[leader]
		// A slot of group 1, as group 2's front ends see it, once they all
		// agree on group 1's leader.
		slot := -1
		deadline := time.Now().Add(20 * time.Second)
		for slot < 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: group 2's front ends never all named %s as a master", round, old)
			}
			time.Sleep(100 * time.Millisecond)
			for s := 0; s < 16384 && slot < 0; s += 64 {
				if master(0, s) == old {
					slot = s
				}
			}
			for i := range others {
				if slot >= 0 && master(i, slot) != old {
					slot = -1
				}
			}
		}
		pid := pidListening(t, leader, 5*time.Second)
		if round == 1 {
			// As an operator's rolling update does: hand leadership over,
			// then stop the old leader (a follower by then) a moment later.
			transferAway(t, leader)
			time.Sleep(300 * time.Millisecond)
		}
		sigterm := time.Now()
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// Sample every front end until the old leader's process is gone;
		// converged is when they last all started naming another master.
		var converged time.Time
		last := make([]string, len(others))
		for !processGone(pid) {
			if time.Since(sigterm) > 20*time.Second {
				t.Fatalf("round %d: leader %s (pid %d) still running 20s after SIGTERM", round, leader, pid)
			}
			all := true
			for i := range others {
				last[i] = master(i, slot)
				all = all && last[i] != old && !strings.HasPrefix(last[i], "error")
			}
			switch {
			case !all:
				converged = time.Time{}
			case converged.IsZero():
				converged = time.Now()
			}
			time.Sleep(20 * time.Millisecond)
		}
		gone := time.Now()
		t.Logf("round %d: SIGTERM to %s (RESP %s); gone after %v; other front ends named another master %v before that (last: %v)",
			round, leader, old, gone.Sub(sigterm).Round(time.Millisecond), gone.Sub(converged).Round(time.Millisecond), last)
		if converged.IsZero() {
			t.Fatalf("round %d: the old leader %s exited while group 2's front ends still named it master of slot %d: %v", round, old, slot, last)
		}
		if d := gone.Sub(converged); d < time.Second {
			t.Errorf("round %d: the old leader %s exited %v after the front ends named another master; want at least 1s for clients with the old topology to be redirected", round, old, d)
		}
		// node local restarts it; let it catch up before the next round.
		time.Sleep(3 * time.Second)
	}
}

// transferAway makes another voter of the group that leader (a gRPC
// address) leads its leader.
func transferAway(t *testing.T, leader string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := adminStatus(ctx, leader)
	if err != nil {
		t.Fatal(err)
	}
	var to uint64
	for _, m := range st.Members {
		if m.Id != st.Id && !m.Learner {
			to = m.Id
		}
	}
	cc, err := grpc.NewClient(leader, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := shardkvpb.NewAdminClient(cc).TransferLeader(ctx, &shardkvpb.TransferLeaderRequest{To: to}); err != nil {
		t.Fatalf("transfer leadership from %s to %d: %v", leader, to, err)
	}
}
