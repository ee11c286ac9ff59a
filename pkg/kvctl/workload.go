package kvctl

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/shardkv/shardkv/pkg/kvcheck"
	"github.com/shardkv/shardkv/pkg/mtls"
	"github.com/shardkv/shardkv/pkg/workload"
)

// EnvRedisPassword is the environment variable read for the Redis
// password of kvctl workload --redis (--redis-password overrides it).
const EnvRedisPassword = workload.EnvRedisPassword

// workloadArgs is a parsed kvctl workload command line.
type workloadArgs struct {
	cfg workload.Config
	run workload.RunOptions
	viz string // --viz
}

func parseWorkload(k *kvctl, args []string) (*workloadArgs, error) {
	fs := newFlags("workload")
	clients := fs.Int("clients", 8, "")
	keys := fs.Int("keys", 16, "")
	prefix := fs.String("prefix", "", "")
	opTimeout := fs.Duration("op-timeout", 10*time.Second, "")
	listen := fs.String("listen", ":8090", "")
	duration := fs.Duration("duration", 0, "")
	rate := fs.Float64("rate", 50, "")
	check := fs.Bool("check", false, "")
	checkTimeout := fs.Duration("check-timeout", 5*time.Minute, "")
	viz := fs.String("viz", "", "")
	redisSeeds := fs.String("redis", "", "")
	redisPass := fs.String("redis-password", "", "")
	redisUser := fs.String("redis-user", "", "")
	if _, err := k.parse(fs, args, 0, 0); err != nil {
		return nil, err
	}
	switch {
	case *clients < 1:
		return nil, usagef(nil, "--clients must be >= 1")
	case *keys < 1:
		return nil, usagef(nil, "--keys must be >= 1")
	case *opTimeout <= 0:
		return nil, usagef(nil, "--op-timeout must be positive")
	case *duration < 0:
		return nil, usagef(nil, "--duration must be >= 0 (0: until stopped)")
	case *rate < 0 || math.IsNaN(*rate):
		return nil, usagef(nil, "--rate must be >= 0 (0: unlimited)")
	case *check && *duration == 0:
		return nil, usagef(nil, "--check needs --duration")
	case *checkTimeout < 0:
		return nil, usagef(nil, "--check-timeout must be >= 0 (0: no limit)")
	}
	if *prefix == "" {
		*prefix = workload.DefaultPrefix()
	}
	w := &workloadArgs{viz: *viz,
		cfg: workload.Config{Clients: *clients, Keys: *keys, Prefix: *prefix, OpTimeout: *opTimeout, Rate: *rate},
		run: workload.RunOptions{Listen: *listen, Duration: *duration, Check: *check, CheckTimeout: *checkTimeout}}
	if *redisSeeds != "" {
		for _, a := range strings.Split(*redisSeeds, ",") {
			if a = strings.TrimSpace(a); a != "" {
				w.cfg.Redis = append(w.cfg.Redis, a)
			}
		}
		if len(w.cfg.Redis) == 0 {
			return nil, usagef(nil, "--redis needs host:port addresses")
		}
		w.cfg.RedisPassword, w.cfg.RedisUser = os.Getenv(EnvRedisPassword), *redisUser
		// With --tls-dir, the Redis connections are TLS too: the
		// replicas' certificates are checked against its CA, and its
		// certificate is presented (for --resp-tls-auth-clients).
		if k.tlsSource != nil {
			w.cfg.RedisTLS = k.tlsSource.ClientConfig(mtls.AnyGroup)
		}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "redis-password" {
				w.cfg.RedisPassword = *redisPass
			}
		})
		return w, nil
	}
	addrs, err := k.resolveCtrler()
	if err != nil {
		return nil, err
	}
	w.cfg.Ctrler, w.cfg.Dial = addrs, k.dial
	return w, nil
}

func cmdWorkload(k *kvctl, args []string) error {
	w, err := parseWorkload(k, args)
	if err != nil {
		return err
	}
	sig, stopSig := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSig()
	res, err := workload.Run(sig, w.cfg, w.run, k.stderr)
	if res != nil {
		if perr := printCheck(k, res, w.viz); perr != nil {
			return perr
		}
	}
	return err
}

// printCheck prints a check's result and, if it is not linearizable,
// writes the visualization to viz (if set).
func printCheck(k *kvctl, res *kvcheck.Result, viz string) error {
	if k.json {
		if err := k.printJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(k.stdout, "%s\n", res)
	}
	if !res.Linearizable && viz != "" {
		if err := res.VisualizePath(viz); err != nil {
			fmt.Fprintf(k.stderr, "kvctl: workload: visualization: %v\n", err)
		} else {
			fmt.Fprintf(k.stderr, "kvctl: workload: visualization written to %s\n", viz)
		}
	}
	return nil
}
