// Package archtest checks the import rules of docs/architecture.md: which
// package may import which, that protocol libraries stay at the edges, and
// that the operator, the CLI and the Go client link no server internals.
package archtest

import (
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/shardkv/shardkv/"

// allowed lists, for each package, the project packages it may import
// directly. A package missing here may import nothing of the project; one
// not listed in the module fails the test, so a new package needs a rule.
var allowed = map[string][]string{
	"api/v1alpha1":            nil,
	"pkg/shardkvpb":           nil,
	"pkg/routing":             nil,
	"pkg/kvcheck":             nil,
	"pkg/localstate":          nil,
	"pkg/ctrler/placement":    nil,
	"pkg/mtls":                nil,
	"pkg/resp/acl":            nil,
	"pkg/grpcdial":            {"pkg/shardkvpb"},
	"pkg/raftgroup":           {"pkg/shardkvpb", "pkg/grpcdial", "internal/durable"},
	"pkg/raftgroup/rgtest":    {"pkg/raftgroup", "pkg/shardkvpb", "pkg/grpcdial"},
	"pkg/ctrler":              {"pkg/raftgroup", "pkg/ctrler/placement", "pkg/routing", "pkg/shardkvpb", "pkg/grpcdial"},
	"pkg/ctrler/ctrlerclient": {"pkg/grpcdial", "pkg/shardkvpb"},
	"pkg/shardkv":             {"pkg/raftgroup", "pkg/routing", "pkg/shardkvpb", "pkg/grpcdial", "pkg/ctrler/ctrlerclient"},
	"pkg/shardkv/kvtest":      {"pkg/shardkv", "pkg/raftgroup", "pkg/raftgroup/rgtest", "pkg/ctrler", "pkg/ctrler/ctrlerclient", "pkg/client", "pkg/shardkvpb", "pkg/grpcdial", "pkg/routing"},
	"pkg/resp":                {"pkg/shardkv", "pkg/routing", "pkg/shardkvpb", "pkg/mtls", "pkg/resp/acl"},
	"pkg/client":              {"pkg/ctrler/ctrlerclient", "pkg/grpcdial", "pkg/routing", "pkg/shardkvpb"},
	"pkg/workload":            {"pkg/client", "pkg/kvcheck", "pkg/routing", "pkg/shardkvpb", "pkg/grpcdial"},
	"pkg/kvctl":               {"pkg/client", "pkg/ctrler/ctrlerclient", "pkg/grpcdial", "pkg/kvcheck", "pkg/routing", "pkg/shardkvpb", "pkg/workload", "pkg/localstate", "pkg/mtls"},
	"pkg/node":                {"internal/durable", "pkg/localstate", "pkg/ctrler", "pkg/ctrler/ctrlerclient", "pkg/ctrler/placement", "pkg/grpcdial", "pkg/raftgroup", "pkg/resp", "pkg/routing", "pkg/shardkv", "pkg/shardkvpb", "pkg/mtls"},
	"controllers":             {"api/v1alpha1", "pkg/ctrler/ctrlerclient", "pkg/grpcdial", "pkg/mtls", "pkg/resp/acl", "pkg/shardkvpb"},
	"cmd/node":                {"pkg/node"},
	"cmd/kvctl":               {"pkg/kvctl"},
	"cmd/manager":             {"api/v1alpha1", "controllers"},
	"hack/imagebuild":         nil,
	"hack/pause":              nil,
	"hack/pipebench":          nil,
	"internal/archtest":       nil,
	"internal/durable":        nil,
	"internal/lazyfs":         nil, // test-only: a filesystem that forgets unsynced data
	"config/monitoring":       nil, // test-only: checks the alert rules and dashboard against the metrics
	"e2e":                     nil, // drives a cluster through kubectl and the image's kvctl only
}

// noServerInternals are packages that must not link the engine's storage
// or consensus, even indirectly: the client side and the operator.
var noServerInternals = []string{"pkg/client", "pkg/ctrler/ctrlerclient", "pkg/kvctl", "pkg/workload", "controllers", "cmd/manager", "cmd/kvctl"}

var serverInternals = []string{"go.etcd.io/raft", "github.com/dgraph-io/badger", module + "pkg/raftgroup", module + "pkg/shardkv", module + "pkg/node"}

// serverPackages are server internals matched exactly: their client-side
// subpackages (ctrlerclient, resp/acl) are fine.
var serverPackages = []string{module + "pkg/ctrler", module + "pkg/resp"}

// redisLibs may be imported only at the Redis edge.
var redisLibs = []string{"github.com/tidwall/redcon", "github.com/redis/go-redis"}
var redisEdge = []string{"pkg/resp", "pkg/workload", "pkg/kvctl", "hack/pipebench"}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list: %v", err)
		}
		p.ImportPath = strings.TrimPrefix(p.ImportPath, module)
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func hasPrefix(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func TestImportRules(t *testing.T) {
	for _, p := range list(t) {
		rules, ok := allowed[p.ImportPath]
		if !ok {
			t.Errorf("%s has no import rule: add it to allowed (and docs/architecture.md)", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			if !slices.Contains(rules, imp) {
				t.Errorf("%s imports %s, which docs/architecture.md does not allow", p.ImportPath, imp)
			}
		}
	}
}

func TestClientSideLinksNoServerInternals(t *testing.T) {
	for _, p := range list(t) {
		if !slices.Contains(noServerInternals, p.ImportPath) {
			continue
		}
		for _, d := range p.Deps {
			if hasPrefix(d, serverInternals) || slices.Contains(serverPackages, d) {
				t.Errorf("%s links %s", p.ImportPath, d)
			}
		}
	}
}

func TestRedisOnlyAtTheEdge(t *testing.T) {
	for _, p := range list(t) {
		if hasPrefix(p.ImportPath, redisEdge) {
			continue
		}
		for _, imp := range p.Imports {
			if hasPrefix(imp, redisLibs) {
				t.Errorf("%s imports %s: Redis belongs in pkg/resp", p.ImportPath, imp)
			}
		}
	}
}

// TestNoRedisInGroupOrEngine: the data group and the engine speak in neutral
// facts; MOVED, TRYAGAIN and anything Redis are pkg/resp's words. Comments
// may compare behaviour with Redis's, and test files may drive Redis clients.
func TestNoRedisInGroupOrEngine(t *testing.T) {
	word := regexp.MustCompile(`MOVED|TRYAGAIN|[Rr]edis|REDIS`)
	for _, dir := range []string{"pkg/shardkv", "pkg/raftgroup"} {
		err := filepath.WalkDir(filepath.Join("../..", dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for n, line := range strings.Split(string(b), "\n") {
				code, _, _ := strings.Cut(line, "//")
				if word.MatchString(code) {
					t.Errorf("%s:%d names Redis outside a comment: %s", path, n+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
