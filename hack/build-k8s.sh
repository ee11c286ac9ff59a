#!/usr/bin/env bash
# Builds Kubernetes (and etcd) binaries from the Go module proxy into a cache
# outside the repo, because the usual download sites are unreachable here.
#
#   hack/build-k8s.sh COMPONENT...
#
# Components: kube-apiserver kube-controller-manager kube-scheduler kubelet
# kube-proxy kubectl etcd coredns crictl. Binaries land in
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

COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd coredns crictl"

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
trap 'rm -f "${TMPFILES[@]}"' EXIT
# One build at a time per cache: concurrent runs (parallel make targets) wait.
exec 9>"$BASE/.lock"
if ! flock -n 9; then
  log "another build holds $BASE/.lock; waiting"
  flock 9
fi

for c in "$@"; do build_one "$c"; done
echo "$BIN"
