// Command node runs shardkv replicas: `node serve` runs one replica (a
// controller or data-group member); `node local` runs a whole cluster on
// this machine as child processes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardkv/shardkv/pkg/node"
)

const usage = `usage:
  node serve --role=ctrler|group --id=N --data-dir=DIR --listen=HOST:PORT [flags]
  node local [--groups=3] [--replicas=3] [--ctrler-replicas=3] [--data-dir=./data] [--base-port=7000] [--resp] [--shards=256]

Run "node serve -h" or "node local -h" for every flag. Each flag can also be
given as an environment variable: SHARDKV_ plus the flag name in upper case,
'-' as '_' (e.g. SHARDKV_DATA_DIR).
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		var o *node.Options
		if o, err = node.ParseServe(os.Args[2:], os.Stderr); err == nil {
			err = node.Serve(ctx, o, node.NewLogger(o.LogLevel, os.Stderr))
		} else if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "node serve: %v\n", err)
			os.Exit(2)
		}
	case "local":
		var o *node.LocalOptions
		if o, err = node.ParseLocal(os.Args[2:], os.Stderr); err == nil {
			err = node.RunLocal(ctx, o, os.Stdout, node.NewLogger(o.LogLevel, os.Stderr))
		} else if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "node local: %v\n", err)
			os.Exit(2)
		}
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "node: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "node: %v\n", err)
		os.Exit(1)
	}
}
