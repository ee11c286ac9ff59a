// Command pipebench times one go-redis pipeline of N (GET, INCR, APPEND)
// triples to one slot, the mixed pipeline of the performance issue, and
// checks that every reply is what a serial run gives. hack/redis-bench.sh
// runs it against shardkv and Redis in the same run.
//
//	go run ./hack/pipebench --addrs 127.0.0.1:7003 --cluster --triples 20000 --reps 5
//
// Each repetition uses a fresh hash tag, so its keys start absent; it
// prints one line per repetition (with the commands refused as not
// executed, which a complete run has none of) and the median.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	addrs := flag.String("addrs", "127.0.0.1:6379", "server addresses, comma-separated")
	cluster := flag.Bool("cluster", false, "use a Redis Cluster client (CLUSTER SLOTS and MOVED)")
	triples := flag.Int("triples", 20000, "(GET, INCR, APPEND) triples in the pipeline")
	reps := flag.Int("reps", 5, "repetitions")
	label := flag.String("label", "", "name printed on each line")
	flag.Parse()
	if err := run(strings.Split(*addrs, ","), *cluster, *triples, *reps, *label); err != nil {
		fmt.Fprintln(os.Stderr, "pipebench:", err)
		os.Exit(1)
	}
}

func run(addrs []string, cluster bool, triples, reps int, label string) error {
	ctx := context.Background()
	// Long timeouts: the point is the pipeline's time, not go-redis's
	// 3 s default, which would resend it.
	var c redis.UniversalClient
	if cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: 5 * time.Minute, WriteTimeout: time.Minute})
	} else {
		c = redis.NewClient(&redis.Options{Addr: addrs[0], ReadTimeout: 5 * time.Minute, WriteTimeout: time.Minute})
	}
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	var took []time.Duration
	refusedAny := false
	stamp := time.Now().UnixNano()
	for r := range reps {
		tag := fmt.Sprintf("{pipebench-%d-%d}", stamp, r)
		start := time.Now()
		cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for range triples {
				p.Get(ctx, tag+"ctr")
				p.Incr(ctx, tag+"ctr")
				p.Append(ctx, tag+"log", "x")
			}
			return nil
		})
		d := time.Since(start)
		refused, err := check(cmds, triples)
		if err != nil {
			return fmt.Errorf("repetition %d: %w", r+1, err)
		}
		took = append(took, d)
		fmt.Printf("%s triples=%d took=%v refused=%d\n", label, triples, d.Round(time.Millisecond), refused)
		refusedAny = refusedAny || refused > 0
	}
	slices.Sort(took)
	note := ""
	if refusedAny {
		note = " (some repetitions had commands refused: see above)"
	}
	fmt.Printf("%s median of %d: %v%s\n", label, reps, took[len(took)/2].Round(time.Millisecond), note)
	return nil
}

// check: triple i reads i (absent for 0), INCR returns i+1, APPEND i+1,
// up to the first command refused as not executed (shardkv answers
// TRYAGAIN to the commands of a pipeline still waiting when their 2 s
// deadline nears); every command after it must be refused too. It returns
// how many were refused.
func check(cmds []redis.Cmder, triples int) (int, error) {
	if len(cmds) != 3*triples {
		return 0, fmt.Errorf("%d replies for %d commands", len(cmds), 3*triples)
	}
	refused := func(c redis.Cmder) bool {
		return c.Err() != nil && strings.HasPrefix(c.Err().Error(), "TRYAGAIN")
	}
	for j, c := range cmds {
		if !refused(c) {
			continue
		}
		for _, c := range cmds[j:] {
			if !refused(c) {
				return 0, fmt.Errorf("%v answered %v after an earlier command was refused", c.Args(), c.Err())
			}
		}
		cmds = cmds[:j]
		break
	}
	for k, c := range cmds {
		i := k / 3
		switch k % 3 {
		case 0:
			v, err := c.(*redis.StringCmd).Result()
			switch {
			case i == 0 && !errors.Is(err, redis.Nil):
				return 0, fmt.Errorf("GET 0: %q, %v; want nil", v, err)
			case i > 0 && (err != nil || v != fmt.Sprint(i)):
				return 0, fmt.Errorf("GET %d: %q, %v; want %d", i, v, err, i)
			}
		default:
			if n, err := c.(*redis.IntCmd).Result(); err != nil || n != int64(i+1) {
				return 0, fmt.Errorf("%v %d: %d, %v; want %d", c.Args()[0], i, n, err, i+1)
			}
		}
	}
	return 3*triples - len(cmds), nil
}
