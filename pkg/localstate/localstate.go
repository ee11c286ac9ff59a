// Package localstate is the file through which `node local` tells kvctl
// where the most recently started local cluster is: a leaf package, so
// kvctl reads it without linking pkg/node and every server package.
package localstate

import (
	"os"
	"path/filepath"
)

// State is what `node local` writes to Path().
type State struct {
	Ctrler  []string `json:"ctrler"`
	DataDir string   `json:"data_dir"`
	PID     int      `json:"pid"`
	// TLSDir holds an admin certificate when the cluster serves mutual
	// TLS (node local --tls).
	TLSDir string `json:"tls_dir,omitempty"`
}

// Path is ~/.shardkv/local.json (under the temp dir if there is no home).
func Path() string {
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".shardkv", "local.json")
}
