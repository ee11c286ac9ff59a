package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAutoIDBootstrapLostDiskAndScaleOut runs three controller replicas
// with identical StatefulSet-style flags (--id=auto, the same --peers):
// they bootstrap with the ids --peers gives their addresses. A replica
// whose disk is wiped comes back under a fresh id, as a joiner, never
// under its old id; a replica whose address is not in --peers also joins
// with a fresh id.
func TestAutoIDBootstrapLostDiskAndScaleOut(t *testing.T) {
	needProcesses(t)
	dir := t.TempDir()
	base := freeBase(t, 8, 0)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", base+i) }
	peers := fmt.Sprintf("1=%s,2=%s,3=%s", addr(0), addr(1), addr(2))
	start := func(i int) *proc {
		return startProc(t, fmt.Sprintf("replica %d", i), dir, dir, nil, "serve", "--role=ctrler", "--id=auto",
			"--data-dir="+filepath.Join(dir, fmt.Sprint(i)), "--listen="+addr(i), "--peers="+peers, "--shards=16")
	}
	procs := map[int]*proc{}
	for i := range 3 {
		procs[i] = start(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	waitRole := func(i int, ok func(role string) bool) (id uint64, role string) {
		t.Helper()
		for ctx.Err() == nil {
			if st, err := adminStatus(ctx, addr(i)); err == nil && ok(st.Role) {
				return st.Id, st.Role
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("replica %d never reached the expected role", i)
		return 0, ""
	}
	member := func(r string) bool { return r == "leader" || r == "follower" }
	for i := range 3 {
		if id, _ := waitRole(i, member); id != uint64(i+1) {
			t.Fatalf("replica %d bootstrapped as id %d, want %d (its --peers entry)", i, id, i+1)
		}
	}
	// Wait for an election: before it, no replica has voted or acknowledged
	// anything, and a wiped replica may still bootstrap under its id.
	for elected := false; !elected; {
		for i := range 3 {
			if st, err := adminStatus(ctx, addr(i)); err == nil && st.Role == "leader" {
				elected = true
			}
		}
		if ctx.Err() != nil {
			t.Fatal("no leader elected")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Lose replica 1's disk (a follower or the leader: either way).
	procs[1].cmd.Process.Kill()
	procs[1].wait(10 * time.Second)
	if err := os.RemoveAll(filepath.Join(dir, "1")); err != nil {
		t.Fatal(err)
	}
	procs[1] = start(1)
	id, role := waitRole(1, func(r string) bool { return r != "" })
	if id == 2 || role != "joining" {
		t.Fatalf("replica with a lost disk came back as id %d role %s; want a fresh id, joining", id, role)
	}
	// A scale-out replica (address not in --peers) joins with a fresh id.
	procs[3] = start(3)
	id3, role3 := waitRole(3, func(r string) bool { return r != "" })
	if id3 <= 3 || id3 == id || role3 != "joining" {
		t.Fatalf("scale-out replica: id %d role %s; want a fresh id (not %d), joining", id3, role3, id)
	}
	// A restart keeps the identity on disk.
	procs[3].cmd.Process.Kill()
	procs[3].wait(10 * time.Second)
	procs[3] = start(3)
	if again, _ := waitRole(3, func(r string) bool { return r != "" }); again != id3 {
		t.Fatalf("restart changed the id from %d to %d", id3, again)
	}
}
