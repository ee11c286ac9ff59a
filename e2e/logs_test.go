//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
)

// logFollower keeps the logs of pods that a scenario is about to delete:
// once a pod is gone, so are its logs, and they are what explains a
// client-visible error during a roll.
type logFollower struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    map[string]*bytes.Buffer
}

// followLogs follows the logs of every current pod of the given sets.
func (e *env) followLogs(t *testing.T, sets ...string) *logFollower {
	t.Helper()
	c, cancel := context.WithCancel(context.Background())
	f := &logFollower{cancel: cancel, out: map[string]*bytes.Buffer{}}
	for _, s := range sets {
		for _, p := range e.pods(t, s) {
			buf := &bytes.Buffer{}
			f.out[p.Name] = buf
			cmd := exec.CommandContext(c, envOr("KUBECTL", "kubectl"), "-n", e.ns, "logs", "-f", "--tail=0", p.Name)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
			cmd.Stdout = &lockedWriter{mu: &f.mu, w: buf}
			if err := cmd.Start(); err != nil {
				t.Logf("following %s's log: %v", p.Name, err)
				continue
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); _ = cmd.Wait() }()
		}
	}
	return f
}

// stop ends the following and returns, per pod, the lines at WARN or
// ERROR level.
func (f *logFollower) stop() map[string][]string {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	got := map[string][]string{}
	for pod, buf := range f.out {
		for _, l := range strings.Split(buf.String(), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				got[pod] = append(got[pod], l)
			}
		}
	}
	return got
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// followed are the pods being followed.
func (f *logFollower) followed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.out))
	for pod := range f.out {
		out = append(out, pod)
	}
	slices.Sort(out)
	return out
}

// missing are the followed pods whose log has no line containing s yet.
func (f *logFollower) missing(s string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for pod, buf := range f.out {
		if !strings.Contains(buf.String(), s) {
			out = append(out, pod)
		}
	}
	slices.Sort(out)
	return out
}
