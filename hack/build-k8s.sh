#!/usr/bin/env bash
# Builds Kubernetes (and etcd) binaries from the Go module proxy into a cache
# outside the repo, because the usual download sites are unreachable here.
#
#   hack/build-k8s.sh COMPONENT...
#
# Components: kube-apiserver kube-controller-manager kube-scheduler kubelet
# kube-proxy kubectl etcd coredns crictl kube-network-policies. Binaries land in
#   ${SHARDKV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkv}/k8s-$K8S_VERSION/bin/
# and a component whose binary already exists and reports the pinned version
# is skipped. Progress goes to stderr; the last stdout line is the bin dir.
#
# How: each "module set" (kubernetes, etcd, ...) is a tiny wrapper Go module in
# the cache dir whose tools.go blank-imports the cmd packages, so `go mod tidy`
# resolves one consistent graph and `go build <pkg>` works from inside it.
# To add a component: add a case to component_spec (and to COMPONENTS), and
# if it comes from a new module, a modset_<name> function (and optionally a
# modset_files_<name> function writing extra sources into the wrapper module).
set -euo pipefail

K8S_VERSION=v1.37.2
# The etcd release kubernetes $K8S_VERSION pins in its go.mod (go.etcd.io/etcd/server/v3).
ETCD_VERSION=v3.7.0
# CoreDNS release whose go.mod uses the same client-go minor (v0.37.x).
COREDNS_VERSION=v1.15.0
# Our CoreDNS build holds only these plugins (see modset_files_coredns), in
# upstream's directive order. The list is stamped into the binary as its
# GitCommit, so a cached binary with another plugin set is rebuilt.
COREDNS_PLUGINS="bind ready errors kubernetes"
COREDNS_FLAVOR=shardkv-${COREDNS_PLUGINS// /-}
CRICTL_VERSION=v1.37.0
# The Kubernetes network SIG's NetworkPolicy enforcer (nfqueue + nftables),
# built with the k8s.io libraries of K8S_VERSION (its go.mod asks for
# v0.32.3 or later) and our own main: see modset_files_knp.
KNP_VERSION=v0.8.0
# The github.com/google/nftables release KNP_VERSION requires; built from a
# copy with one file replaced (see modset_files_knp).
KNP_NFTABLES_VERSION=v0.3.0

COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd coredns crictl kube-network-policies"

CACHE_ROOT=${SHARDKV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkv}
BASE=$CACHE_ROOT/k8s-$K8S_VERSION
BIN=$BASE/bin
GO=${GO:-go}

log() { echo "build-k8s: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  echo "usage: $0 COMPONENT..." >&2
  echo "  components: $COMPONENTS" >&2
  exit 2
}

# component_spec NAME: sets MODSET (wrapper module) and PKG (main package) for NAME.
component_spec() {
  case $1 in
    kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy | kubectl)
      MODSET=kubernetes PKG=k8s.io/kubernetes/cmd/$1 ;;
    # etcd's server module has its main package at its root.
    etcd) MODSET=etcd PKG=go.etcd.io/etcd/server/v3 ;;
    # Our own main (written by modset_files_coredns) inside the wrapper module.
    coredns) MODSET=coredns PKG=shardkv.local/k8s-build/coredns/cmd/coredns ;;
    crictl) MODSET=crictl PKG=sigs.k8s.io/cri-tools/cmd/crictl ;;
    # Our own main (written by modset_files_knp) inside the wrapper module.
    kube-network-policies) MODSET=knp PKG=shardkv.local/k8s-build/knp/cmd/kube-network-policies ;;
    *) return 1 ;;
  esac
}

# ldflags NAME: the version stamping each binary needs; without it the
# Kubernetes binaries report an unparseable version (v0.0.0-master) and
# clients/servers reject each other.
ldflags() {
  case $1 in
    etcd) echo "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION" ;;
    coredns) echo "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_FLAVOR" ;;
    # cri-tools' Makefile stamps the tag without its "v".
    crictl) echo "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION#v}" ;;
    kube-network-policies) echo "-s -w -X main.flavor=$(knp_flavor)" ;;
    *)
      local minor=${K8S_VERSION#v1.}
      minor=${minor%%.*}
      local f="" p
      # client-go carries its own copy of the version vars (kubectl's client version).
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done
      echo "-s -w$f"
      ;;
  esac
}

# version_ok NAME PATH: true if the binary at PATH runs and reports the pinned version.
version_ok() {
  local out
  [ -x "$2" ] || return 1
  case $1 in
    kubectl) out=$(timeout 30 "$2" version --client 2>&1) || return 1
      grep -qF "Client Version: $K8S_VERSION" <<<"$out" ;;
    etcd) out=$(timeout 30 "$2" --version 2>&1) || return 1
      grep -qF "etcd Version: ${ETCD_VERSION#v}" <<<"$out" ;;
    # Prints "CoreDNS-1.15.0" and "linux/amd64, go1.x, <GitCommit>".
    coredns) out=$(timeout 30 "$2" -version 2>&1) || return 1
      grep -qxF "CoreDNS-${COREDNS_VERSION#v}" <<<"$out" &&
        grep -q ", $COREDNS_FLAVOR\$" <<<"$out" ;;
    crictl) out=$(timeout 30 "$2" --version 2>&1) || return 1
      grep -qxF "crictl version ${CRICTL_VERSION#v}" <<<"$out" ;;
    # Prints "kube-network-policies v0.8.0 shardkv-<hash of our sources>".
    kube-network-policies) out=$(timeout 30 "$2" -version 2>&1) || return 1
      grep -qxF "kube-network-policies $KNP_VERSION $(knp_flavor)" <<<"$out" ;;
    *) out=$(timeout 30 "$2" --version 2>&1) || return 1
      grep -qxF "Kubernetes $K8S_VERSION" <<<"$out" ;;
  esac
}

# modset_kubernetes: go.mod requirements for the kubernetes wrapper module.
# k8s.io/kubernetes requires its staging modules as v0.0.0 and points them at
# ./staging via `replace`, which is ignored outside its own repo; so we replace
# each one with its published v0.<minor>.<patch> tag, read from its go.mod.
modset_kubernetes() {
  local json gomod staging="v0.${K8S_VERSION#v1.}" mods
  # -json reports a failure in its "Error" field (on stdout), so show that.
  json=$(cd "$BASE" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1) ||
    die "cannot download k8s.io/kubernetes@$K8S_VERSION (GOPROXY=$("$GO" env GOPROXY)):" \
      "$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",*$/\1/p' <<<"$json")"
  gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' <<<"$json")
  [ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION"
  mods=$(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[^[:space:]]+)[[:space:]]+=>[[:space:]]+\./staging/.*#\2#p' "$gomod" | sort -u)
  [ -n "$mods" ] || die "found no staging replaces in $gomod"
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  local m
  for m in $mods; do echo "	$m => $m $staging"; done
  echo ")"
}

modset_etcd() {
  echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
}

modset_coredns() {
  echo "require github.com/coredns/coredns $COREDNS_VERSION"
}

# modset_files_coredns: a main that registers only COREDNS_PLUGINS. Upstream's
# main blank-imports core/plugin, which pulls in every plugin (cloud DNS
# providers, etcd, ...); coremain itself imports none. The dns server type
# takes its directive list from dnsserver.Directives at setup time, so we cut
# it down to our plugins, keeping upstream's order (zdirectives.go), which
# decides the order plugins see a query.
modset_files_coredns() {
  local p imports="" list=""
  # gofmt order for the imports; the directive order is COREDNS_PLUGINS'.
  for p in $(tr ' ' '\n' <<<"$COREDNS_PLUGINS" | sort); do
    imports+=$'\t_ "github.com/coredns/coredns/plugin/'"$p"$'"\n'
  done
  for p in $COREDNS_PLUGINS; do list+="${list:+, }\"$p\""; done
  mkdir -p cmd/coredns
  cat >cmd/coredns/main.go <<EOF
// Code generated by hack/build-k8s.sh; DO NOT EDIT.

// Command coredns is CoreDNS $COREDNS_VERSION with only these plugins: $COREDNS_PLUGINS.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

${imports})

func main() {
	// Upstream's order (core/dnsserver/zdirectives.go), restricted to ours.
	dnsserver.Directives = []string{$list}
	coremain.Run()
}
EOF
}

modset_crictl() {
  echo "require sigs.k8s.io/cri-tools $CRICTL_VERSION"
}

# kube-network-policies: its k8s.io libraries at K8S_VERSION's (v0.<minor>),
# so the whole local cluster is one Kubernetes release.
modset_knp() {
  local staging="v0.${K8S_VERSION#v1.}" m
  echo "require sigs.k8s.io/kube-network-policies $KNP_VERSION"
  echo
  echo "require ("
  for m in api apimachinery client-go component-base component-helpers cri-api; do
    echo "	k8s.io/$m $staging"
  done
  echo ")"
  echo
  echo "replace github.com/google/nftables => ./nftables"
}

# modset_files_knp: our main (knp_sources), and a copy of
# github.com/google/nftables $KNP_NFTABLES_VERSION from the module cache
# with one file replaced (go.mod replaces the module with it: go build
# -overlay may not replace files of the module cache). Both differ from
# upstream on purpose:
#
# - main: upstream's cmd/main.go only works in a pod (rest.InClusterConfig)
#   and stops only on SIGINT. Ours runs as a host process of
#   hack/local-cluster.sh with a kubeconfig, stops on SIGTERM too (and then
#   removes its nftables table, as upstream does on SIGINT), serves /readyz
#   (200 once its nftables table exists, i.e. its rules are in), and has
#   -cleanup (remove the table and exit) and -version. NRI stays on, as in
#   upstream's main: containerd 1.6 has no NRI socket, so the plugin only
#   logs that it cannot connect; turning it off (Config.NRIdisabled) leaves
#   a nil plugin that v0.8.0 dereferences on the first packet from an
#   address it has no pod for (a pod whose IP it has not seen yet), killing
#   the enforcer. The policy logic is upstream's
#   sigs.k8s.io/kube-network-policies/pkg/networkpolicy, unchanged.
# - expr/queue.go of github.com/google/nftables: upstream sends the nftables
#   "queue" expression, which needs nft_queue (CONFIG_NFT_QUEUE); kernels
#   built without it (this VM's: `zgrep NFT_QUEUE /proc/config.gz`) refuse
#   the whole ruleset with ENOENT. Ours sends the same verdict as the
#   xtables NFQUEUE target (revision 3) through nft_compat
#   (CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE), which works on
#   kernels with or without nft_queue.
modset_files_knp() {
  local json dir
  knp_sources
  json=$(GOFLAGS=-mod=mod "$GO" mod download -json "github.com/google/nftables@$KNP_NFTABLES_VERSION") ||
    die "cannot download github.com/google/nftables@$KNP_NFTABLES_VERSION"
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")
  [ -f "$dir/expr/queue.go" ] || die "no expr/queue.go in github.com/google/nftables@$KNP_NFTABLES_VERSION ($dir)"
  rm -rf nftables
  cp -R "$dir" nftables
  chmod -R u+w nftables
  cp patches/nftables-expr-queue.go.txt nftables/expr/queue.go
}

# knp_sources: the sources of ours that modset_files_knp installs.
knp_sources() {
  mkdir -p cmd/kube-network-policies patches
  cat >cmd/kube-network-policies/main.go <<EOF
// Code generated by hack/build-k8s.sh; DO NOT EDIT.

// Command kube-network-policies runs the NetworkPolicy enforcer of
// sigs.k8s.io/kube-network-policies $KNP_VERSION (pkg/networkpolicy,
// unchanged) as a host process with a kubeconfig: hack/local-cluster.sh's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

const version = "$KNP_VERSION"

// flavor identifies these sources (hack/build-k8s.sh sets it).
var flavor = "dev"

// table is upstream's default nftables table (family inet).
const table = "kube-network-policies"

func main() { os.Exit(run()) }

func run() int {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the enforcer's identity (required)")
		nodeName    = flag.String("hostname-override", "", "this node's name (default: the hostname)")
		queueID     = flag.Int("nfqueue-id", 100, "number of the nfqueue")
		failOpen    = flag.Bool("fail-open", false, "let packets through while no enforcer reads the queue")
		dnsFix      = flag.Bool("netfilter-bug-1766-fix", true, "process DNS packets on PREROUTING (a conntrack race, fixed in kernels 6.12+)")
		metricsAddr = flag.String("metrics-bind-address", "127.0.0.1:19080", "address of /metrics and /readyz (200 once the nftables rules are in)")
		cleanup     = flag.Bool("cleanup", false, "remove the enforcer's nftables table and exit")
		showVersion = flag.Bool("version", false, "print the version and exit")
	)
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Printf("kube-network-policies %s %s\n", version, flavor)
		return 0
	}
	logs.InitLogs()
	if err := logsapi.ValidateAndApply(c, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *cleanup {
		if err := deleteTable(); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
			return 1
		}
		return 0
	}
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig is required")
		return 2
	}
	if *nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		*nodeName = h
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)

	factory := informers.NewSharedInformerFactory(clientset, 0)
	ctrl, err := networkpolicy.NewController(clientset,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			FailOpen:            *failOpen,
			QueueID:             *queueID,
			NodeName:            *nodeName,
			NetfilterBug1766Fix: *dnsFix,
			NFTableName:         table,
			// NRI stays on (see hack/build-k8s.sh): without a runtime
			// socket it only logs; off, v0.8.0 panics on unknown IPs.
		})
	if err != nil {
		logger.Error(err, "cannot create the network policy controller")
		return 1
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, err := tableExists(); !ok {
			http.Error(w, fmt.Sprintf("nftables table inet %s not there yet (%v)", table, err), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: *metricsAddr, Handler: mux}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "metrics server")
			cancel()
		}
	}()

	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	factory.Start(ctx.Done())

	rc := 0
	select {
	case <-ctx.Done():
		// Run removes its table before it returns.
		err = <-done
	case err = <-done:
		// nfqueue could not be opened, or the caches never synced.
		rc = 1
	}
	if err != nil {
		logger.Error(err, "network policy controller stopped")
		rc = 1
	}
	_ = srv.Close()
	return rc
}

func tableExists() (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, err
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, t := range tables {
		if t.Name == table {
			return true, nil
		}
	}
	return false, nil
}

func deleteTable() error {
	ok, err := tableExists()
	if err != nil || !ok {
		return err
	}
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	conn.DelTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	return conn.Flush()
}
EOF
  cat >patches/nftables-expr-queue.go.txt <<'EOF'
// Code generated by hack/build-k8s.sh; DO NOT EDIT.

// This file replaces expr/queue.go of github.com/google/nftables in the
// kube-network-policies build (hack/build-k8s.sh): the queue statement is
// sent as the xtables NFQUEUE target, revision 3, through nft_compat, for
// kernels built without nft_queue. The verdict is the same: the packet
// goes to queue Num (or on, with QueueFlagBypass, when no one reads it).

package expr

import (
	"encoding/binary"

	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type QueueAttribute uint16

type QueueFlag uint16

// Possible QueueAttribute values
const (
	QueueNum   QueueAttribute = unix.NFTA_QUEUE_NUM
	QueueTotal QueueAttribute = unix.NFTA_QUEUE_TOTAL
	QueueFlags QueueAttribute = unix.NFTA_QUEUE_FLAGS

	QueueFlagBypass QueueFlag = unix.NFT_QUEUE_FLAG_BYPASS
	QueueFlagFanout QueueFlag = unix.NFT_QUEUE_FLAG_CPU_FANOUT
	QueueFlagMask   QueueFlag = unix.NFT_QUEUE_FLAG_MASK
)

type Queue struct {
	Num   uint16
	Total uint16
	Flag  QueueFlag
}

// Flags of struct xt_NFQ_info_v3 (linux/netfilter/xt_NFQUEUE.h).
const (
	nfqFlagBypass    = 0x01
	nfqFlagCPUFanout = 0x02
)

// target is e as the NFQUEUE target: struct xt_NFQ_info_v3 {u16 queuenum;
// u16 queues_total; u16 flags}, in host byte order.
func (e *Queue) target() *Target {
	if e.Total == 0 {
		e.Total = 1 // The total default value is 1
	}
	var flags uint16
	if e.Flag&QueueFlagBypass != 0 {
		flags |= nfqFlagBypass
	}
	if e.Flag&QueueFlagFanout != 0 {
		flags |= nfqFlagCPUFanout
	}
	info := make(xt.Unknown, 6)
	binary.NativeEndian.PutUint16(info[0:], e.Num)
	binary.NativeEndian.PutUint16(info[2:], e.Total)
	binary.NativeEndian.PutUint16(info[4:], flags)
	return &Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}

func (e *Queue) marshal(fam byte) ([]byte, error) {
	return e.target().marshal(fam)
}

func (e *Queue) marshalData(fam byte) ([]byte, error) {
	return e.target().marshalData(fam)
}

func (e *Queue) unmarshal(fam byte, data []byte) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_QUEUE_NUM:
			e.Num = ad.Uint16()
		case unix.NFTA_QUEUE_TOTAL:
			e.Total = ad.Uint16()
		case unix.NFTA_QUEUE_FLAGS:
			e.Flag = QueueFlag(ad.Uint16())
		}
	}
	return ad.Err()
}
EOF
}

# knp_flavor: "shardkv-" and a hash of our sources (knp_sources), stamped
# into the binary, so a cached binary built from other sources is rebuilt.
knp_flavor() {
  local gen h
  gen=$(mktemp -d)
  h=$(cd "$gen" && knp_sources && find . -type f | sort | xargs cat | sha256sum | cut -c1-12)
  rm -rf "$gen"
  echo "shardkv-$h"
}


# prepare_modset SET PKG...: (re)creates the wrapper module for SET in the
# cache, importing PKG..., and tidies it; skipped if the inputs are unchanged.
prepare_modset() {
  local set=$1 dir=$BASE/mod/$1 want p gen
  shift
  mkdir -p "$dir"
  want=$(
    printf 'module shardkv.local/k8s-build/%s\n\ngo 1.26.0\n\n' "$set"
    "modset_$set"
    printf '\n// tools.go:\n'
    for p in "$@"; do printf '// %s\n' "$p"; done
    # Extra sources are part of the inputs too.
    if declare -F "modset_files_$set" >/dev/null; then
      gen=$(mktemp -d)
      (cd "$gen" && "modset_files_$set" && find . -type f | sort | xargs cat) | sed 's#^#// #'
      rm -rf "$gen"
    fi
  ) || exit 1
  if [ -f "$dir/.tidied" ] && [ "$(cat "$dir/go.mod.in" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  log "preparing wrapper module $dir (go mod tidy; downloads modules on first run)"
  rm -f "$dir/.tidied" "$dir/go.sum"
  printf '%s\n' "$want" >"$dir/go.mod.in"
  sed '/^\/\/ tools.go:$/,$d' "$dir/go.mod.in" >"$dir/go.mod"
  {
    printf '//go:build tools\n\n// Blank imports keep these main packages (and their deps) in go.mod.\npackage tools\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$dir/tools.go"
  if declare -F "modset_files_$set" >/dev/null; then
    (cd "$dir" && "modset_files_$set") || die "cannot write sources for $set"
  fi
  local t0=$SECONDS
  (cd "$dir" && "$GO" mod tidy) || die "go mod tidy failed in $dir (see above)"
  touch "$dir/.tidied"
  log "wrapper module $set ready in $((SECONDS - t0))s"
}

# All main packages of a module set, so one tidy covers every component of it.
modset_packages() {
  local c MODSET PKG
  for c in $COMPONENTS; do
    component_spec "$c"
    # A package inside the wrapper module itself needs no blank import.
    [ "$MODSET" = "$1" ] && [ "${PKG#shardkv.local/}" = "$PKG" ] && echo "$PKG"
  done
  return 0
}

build_one() {
  local c=$1 out=$BIN/$1 tmp t0
  component_spec "$c"
  if version_ok "$c" "$out"; then
    log "$c: up to date ($out)"
    return 0
  fi
  # shellcheck disable=SC2046 # one package per line, no spaces
  prepare_modset "$MODSET" $(modset_packages "$MODSET")
  log "$c: building $PKG ..."
  t0=$SECONDS
  tmp=$(mktemp "$BIN/.$c.tmp.XXXXXX")
  TMPFILES+=("$tmp")
  # Static binaries (CGO_ENABLED=0), as upstream ships them; -trimpath keeps
  # the cache's paths out of the binaries.
  (cd "$BASE/mod/$MODSET" && CGO_ENABLED=0 GOWORK=off \
    "$GO" build -trimpath -ldflags "$(ldflags "$c")" -o "$tmp" "$PKG") ||
    die "$c: go build $PKG failed after $((SECONDS - t0))s (see above)"
  version_ok "$c" "$tmp" || die "$c: built binary does not report the expected version: $("$tmp" --version 2>&1 | head -3)"
  # Rename last so a half-written binary is never taken for a built one.
  mv -f "$tmp" "$out"
  log "$c: built in $((SECONDS - t0))s -> $out"
}

# build_set SET C...: builds components C... of module set SET, none up to
# date. Components with the same ldflags (the six Kubernetes ones) are
# built by one `go build`, so that each one's link runs while the others
# still compile: one after another, the two cores sat half idle through
# every link and every build's last packages.
build_set() {
  local set=$1 c MODSET PKG pkgs=() tmp t0 want
  shift
  [ $# -gt 1 ] || { build_one "$1"; return 0; }
  want=$(ldflags "$1")
  for c in "$@"; do
    [ "$(ldflags "$c")" = "$want" ] || {
      for c in "$@"; do build_one "$c"; done
      return 0
    }
  done
  # shellcheck disable=SC2046 # one package per line, no spaces
  prepare_modset "$set" $(modset_packages "$set")
  for c in "$@"; do
    component_spec "$c"
    pkgs+=("$PKG")
  done
  log "$*: building in one go build ..."
  t0=$SECONDS
  tmp=$(mktemp -d "$BIN/.$set.tmp.XXXXXX")
  TMPFILES+=("$tmp")
  # -o DIR/ names each binary after its package's last element (kubelet, ...).
  (cd "$BASE/mod/$set" && CGO_ENABLED=0 GOWORK=off \
    "$GO" build -trimpath -ldflags "$(ldflags "$1")" -o "$tmp/" "${pkgs[@]}") ||
    die "$*: go build failed after $((SECONDS - t0))s (see above)"
  for c in "$@"; do
    version_ok "$c" "$tmp/$c" || die "$c: built binary does not report the expected version: $("$tmp/$c" --version 2>&1 | head -3)"
    mv -f "$tmp/$c" "$BIN/$c"
  done
  rmdir "$tmp"
  log "$*: built in $((SECONDS - t0))s -> $BIN"
}

[ $# -gt 0 ] || usage
for c in "$@"; do
  case $c in -h | --help) usage ;; esac
  component_spec "$c" || { log "unknown component: $c"; usage; }
done
command -v "$GO" >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v "$GO" >/dev/null || die "go not found in PATH"

# Fast path without the lock, so a warm run never waits behind another build.
all_ok=1
for c in "$@"; do version_ok "$c" "$BIN/$c" || { all_ok=0; break; }; done
if [ "$all_ok" = 1 ]; then
  log "up to date: $*"
  echo "$BIN"
  exit 0
fi

mkdir -p "$BIN"
TMPFILES=()
trap 'rm -rf "${TMPFILES[@]}"' EXIT
# One build at a time per cache: concurrent runs (parallel make targets) wait.
exec 9>"$BASE/.lock"
if ! flock -n 9; then
  log "another build holds $BASE/.lock; waiting"
  flock 9
fi

# The components to build, by module set, in the order first asked for.
sets=()
declare -A todo=()
for c in "$@"; do
  if version_ok "$c" "$BIN/$c"; then
    log "$c: up to date ($BIN/$c)"
    continue
  fi
  component_spec "$c"
  [ -n "${todo[$MODSET]:-}" ] || sets+=("$MODSET")
  case " ${todo[$MODSET]:-} " in *" $c "*) ;; *) todo[$MODSET]+="$c " ;; esac
done
for set in "${sets[@]}"; do
  # shellcheck disable=SC2086 # component names have no spaces
  build_set "$set" ${todo[$set]}
done
echo "$BIN"
