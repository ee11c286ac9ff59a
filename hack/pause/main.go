// Command pause is the pod sandbox's placeholder process, for the local
// cluster's containerd (hack/build-images.sh builds it into the image
// shardkv-pause:1, which containerd's sandbox_image names).
//
// It does what the upstream pause container does: it holds the pod's
// namespaces open by doing nothing, forever. It is PID 1 of the sandbox's
// PID namespace when the pod shares one, so it
//   - reaps zombies: orphans are re-parented to it, and it waits for them on
//     every SIGCHLD;
//   - exits 0 on SIGTERM or SIGINT (as PID 1 it gets no default signal
//     handling, so it must handle them itself or be SIGKILLed after the
//     grace period).
//
// Built static (CGO_ENABLED=0), it needs nothing from the image but itself.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "pause: takes no arguments")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
		os.Exit(0)
	}
}

// reap waits for every child that has exited. Signals coalesce (several
// exits can arrive as one SIGCHLD), so it loops until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil { // 0: children left, none exited; ECHILD: no children
			return
		}
	}
}
