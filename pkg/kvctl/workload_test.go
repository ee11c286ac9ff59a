package kvctl

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardkv/shardkv/pkg/workload"
)

func TestWorkloadUsage(t *testing.T) {
	t.Setenv(EnvCtrler, "127.0.0.1:1")
	for _, args := range [][]string{
		{"workload", "--clients=0"},
		{"workload", "--keys=0"},
		{"workload", "--op-timeout=0s"},
		{"workload", "--rate=-1"},
		{"workload", "--check"},
		{"workload", "--duration=-1s"},
		{"workload", "extra"},
		{"workload", "--redis=,"},
	} {
		var out, errb bytes.Buffer
		if code := Run(args, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "usage: kvctl workload") {
			t.Errorf("kvctl %q: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// TestWorkloadFlags: the command line becomes the workload's Config and
// RunOptions (the workload itself is tested in pkg/workload, the whole
// command in TestCluster).
func TestWorkloadFlags(t *testing.T) {
	t.Setenv(EnvCtrler, "127.0.0.1:1,127.0.0.1:2")
	t.Setenv(EnvRedisPassword, "from-env")
	parse := func(args ...string) *workloadArgs {
		t.Helper()
		var out, errb bytes.Buffer
		k := &kvctl{stdout: &out, stderr: &errb}
		w, err := parseWorkload(k, args)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return w
	}

	w := parse()
	want := workload.Config{Ctrler: []string{"127.0.0.1:1", "127.0.0.1:2"}, Clients: 8, Keys: 16,
		OpTimeout: 10 * time.Second, Rate: 50}
	if !slices.Equal(w.cfg.Ctrler, want.Ctrler) || w.cfg.Redis != nil || w.cfg.RedisPassword != "" ||
		w.cfg.Clients != want.Clients || w.cfg.Keys != want.Keys || w.cfg.OpTimeout != want.OpTimeout || w.cfg.Rate != want.Rate ||
		w.run != (workload.RunOptions{Listen: ":8090", CheckTimeout: 5 * time.Minute}) || w.viz != "" {
		t.Fatalf("defaults: %+v", w)
	}
	if w.cfg.Prefix == "" {
		t.Fatal("no default prefix")
	}

	w = parse("--clients=3", "--keys=6", "--prefix=p", "--rate=0", "--op-timeout=400ms", "--duration=4s",
		"--check", "--check-timeout=1m", "--viz=/tmp/v.html", "--listen=")
	if w.cfg.Clients != 3 || w.cfg.Keys != 6 || w.cfg.Prefix != "p" || w.cfg.Rate != 0 || w.cfg.OpTimeout != 400*time.Millisecond ||
		w.run != (workload.RunOptions{Duration: 4 * time.Second, Check: true, CheckTimeout: time.Minute}) || w.viz != "/tmp/v.html" {
		t.Fatalf("flags: %+v", w)
	}

	// Redis: seeds trimmed, no controller, the password from the
	// environment unless the flag is given (even empty).
	w = parse("--redis= a:1, b:2 ,")
	if !slices.Equal(w.cfg.Redis, []string{"a:1", "b:2"}) || w.cfg.Ctrler != nil || w.cfg.RedisPassword != "from-env" {
		t.Fatalf("--redis: %+v", w.cfg)
	}
	if w = parse("--redis=a:1", "--redis-password=flag"); w.cfg.RedisPassword != "flag" {
		t.Fatalf("--redis-password: %q", w.cfg.RedisPassword)
	}
	if w = parse("--redis=a:1", "--redis-password="); w.cfg.RedisPassword != "" {
		t.Fatalf("--redis-password=: %q", w.cfg.RedisPassword)
	}
	if w = parse("--redis=a:1", "--redis-user=app"); w.cfg.RedisUser != "app" || w.cfg.RedisTLS != nil {
		t.Fatalf("--redis-user: %q (TLS %v without --tls-dir)", w.cfg.RedisUser, w.cfg.RedisTLS)
	}
}
