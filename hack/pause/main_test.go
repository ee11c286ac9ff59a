package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the tests run this binary as the pause program.
func TestMain(m *testing.M) {
	if os.Getenv("PAUSE_TEST_RUN_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestExitsZeroOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "PAUSE_TEST_RUN_MAIN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let it install its handlers, and check it does not exit by itself.
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Fatalf("pause exited by itself: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%v: %v, want exit 0", sig, err)
			}
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: still running after 5s", sig)
		}
	}
}

func TestReap(t *testing.T) {
	var pids []int
	for range 3 {
		// The test binary itself, running no test: a child that exits at
		// once, on any machine.
		p, err := os.StartProcess(os.Args[0], []string{os.Args[0], "-test.run=^$"}, &os.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p.Pid)
	}
	// Wait until they can all be reaped, then reap them in one go, as after
	// coalesced SIGCHLDs. "Z" in /proc is not enough: a multi-threaded
	// child's leader shows Z while its other threads are still exiting, and
	// wait4 skips it until they are gone (CI once saw reap leave such a
	// child). waitid with WNOWAIT asks exactly "is it reapable?" without
	// reaping it.
	for _, pid := range pids {
		deadline := time.Now().Add(5 * time.Second)
		for !reapable(t, pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d: state %q, never reapable", pid, procState(pid))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	reap()
	for _, pid := range pids {
		if s := procState(pid); s != "" {
			t.Errorf("pid %d still there (state %q) after reap", pid, s)
		}
	}
	reap() // no children: returns at once
}

// reapable reports whether child pid has exited and can be waited for,
// leaving it a zombie.
func reapable(t *testing.T, pid int) bool {
	t.Helper()
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, syscall.EINTR) {
		return false
	}
	if err != nil {
		t.Fatalf("waitid %d: %v", pid, err)
	}
	// With WNOHANG, waitid leaves info zeroed when no child was waitable.
	return info.Signo == int32(syscall.SIGCHLD)
}

// procState is the state letter of /proc/PID/stat, "" if there is none.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	// pid (comm) STATE ...
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+3 <= len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}
