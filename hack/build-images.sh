#!/usr/bin/env bash
# hack/build-images.sh: build the project's container images without Docker
# (no daemon, no base image, no registry): static Go binaries put into a
# single-layer linux/amd64 image by hack/imagebuild, written as docker-save
# tarballs, optionally imported into the local cluster's containerd.
#
# Usage: hack/build-images.sh [--tag TAG] [--out DIR] [--load] [IMAGE...]
#
# IMAGE is one of (default: shardkv)
#   shardkv  shardkv:TAG (TAG default dev): /manager, /node and /kvctl, user
#            65532:65532, CMD ["/manager"], no entrypoint: the same binaries
#            and config as the Dockerfile's image
#   pause    shardkv-pause:1: /pause (hack/pause) as the entrypoint, user
#            65535:65535; the local cluster's containerd uses it as its
#            sandbox image. --tag does not apply to it.
#
# Options:
#   --tag TAG  the shardkv image's tag (default dev)
#   --out DIR  where the tarballs go (default
#              ${SHARDKV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkv}/images),
#              named NAME_TAG.tar, e.g. shardkv_dev.tar
#   --load     import each tarball into containerd (ctr -n k8s.io images
#              import) at $SHARDKV_CONTAINERD_SOCK (default
#              /run/shardkv-local/containerd.sock, hack/local-cluster.sh's)
#              and check that it is listed
#
# Prints each tarball's path on stdout; progress and timings go to stderr.
# The images are reproducible: the same binaries give the same digests
# (every timestamp is SOURCE_DATE_EPOCH, default 0).
set -euo pipefail
shopt -s inherit_errexit

die() { echo "build-images: $*" >&2; exit 1; }
log() { echo "build-images: $*" >&2; }
usage() { sed -n '/^# Usage:/,/^# Prints/p' "$0" | sed 's/^# \{0,1\}//'; }

TAG=dev
OUT=
LOAD=0
IMAGES=()
while [ $# -gt 0 ]; do
  case $1 in
    --tag) [ $# -ge 2 ] || die "--tag needs a value"; TAG=$2; shift 2 ;;
    --tag=*) TAG=${1#--tag=}; shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --load) LOAD=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    shardkv|pause) IMAGES+=("$1"); shift ;;
    *) die "unknown image $1 (want shardkv or pause; see --help)" ;;
  esac
done
[ ${#IMAGES[@]} -gt 0 ] || IMAGES=(shardkv)
[[ $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag $TAG: not a valid image tag"

command -v go >/dev/null || die "go not found"
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-${SHARDKV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardkv}/images}
SOCK=${SHARDKV_CONTAINERD_SOCK:-/run/shardkv-local/containerd.sock}

# Check --load's prerequisites before spending time on builds.
if [ "$LOAD" = 1 ]; then
  command -v ctr >/dev/null || die "ctr not found (apt-get install containerd)"
  [ -S "$SOCK" ] || die "no containerd socket at $SOCK: is the local cluster up? hack/local-cluster.sh up (or set SHARDKV_CONTAINERD_SOCK)"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/build-images.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# timed LABEL CMD...: run CMD, then log how long it took.
timed() {
  local label=$1 start=$EPOCHREALTIME
  shift
  "$@"
  log "$label: $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }')"
}

# gobuild OUTDIR PKG...: static linux/amd64 binaries, as the Dockerfile
# builds them.
gobuild() {
  local out=$1
  shift
  (cd "$REPO" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 \
    go build -trimpath -ldflags="-s -w" -o "$out/" "$@")
}

# The image builder itself, for the host.
buildtool() { (cd "$REPO" && go build -o "$TMP/imagebuild" ./hack/imagebuild); }
timed "build hack/imagebuild" buildtool

# load TARBALL NAME:TAG: import into containerd's k8s.io namespace (the
# CRI's) and check it is listed. containerd names a short name NAME:TAG by
# its fully qualified form, REGISTRY/library/NAME:TAG: match the suffix.
load() {
  local tarball=$1 ref=$2 line
  ctr -a "$SOCK" -n k8s.io images import "$tarball" >&2 || die "ctr images import $tarball failed"
  while IFS= read -r line; do
    if [[ $line == */library/"$ref" ]]; then
      log "loaded $line"
      return 0
    fi
  done < <(ctr -a "$SOCK" -n k8s.io images ls -q)
  die "imported $tarball, but containerd at $SOCK does not list */library/$ref"
}

for image in "${IMAGES[@]}"; do
  bin=$TMP/$image
  mkdir -p "$bin"
  case $image in
    shardkv)
      ref=shardkv:$TAG
      timed "go build ./cmd/manager ./cmd/node ./cmd/kvctl" \
        gobuild "$bin" ./cmd/manager ./cmd/node ./cmd/kvctl
      args=(--user 65532:65532 --cmd /manager
        --file "$bin/manager=/manager" --file "$bin/node=/node" --file "$bin/kvctl=/kvctl")
      ;;
    pause)
      ref=shardkv-pause:1
      timed "go build ./hack/pause" gobuild "$bin" ./hack/pause
      args=(--user 65535:65535 --entrypoint /pause --file "$bin/pause=/pause")
      ;;
  esac
  tarball=$OUT/${ref/:/_}.tar
  timed "image $ref" "$TMP/imagebuild" --tag "$ref" --out "$tarball" "${args[@]}"
  if [ "$LOAD" = 1 ]; then
    timed "load $ref" load "$tarball" "$ref"
  fi
  echo "$tarball"
done
