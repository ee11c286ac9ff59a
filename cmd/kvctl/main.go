// Command kvctl is shardkv's admin and data command-line tool; see
// docs/kvctl.md. Its logic lives in pkg/kvctl.
package main

import (
	"os"

	"github.com/shardkv/shardkv/pkg/kvctl"
)

func main() {
	os.Exit(kvctl.Run(os.Args[1:], os.Stdout, os.Stderr))
}
