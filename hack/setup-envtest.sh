#!/usr/bin/env bash
# Provides the binaries controller-runtime's envtest needs (kube-apiserver,
# etcd) without setup-envtest's downloads, which cannot reach their sites here:
# they are built from the Go module proxy by hack/build-k8s.sh and cached.
#
#   KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh) go test ./...
#   hack/setup-envtest.sh --with-kubectl   # also build a matching kubectl
#
# Progress goes to stderr; the last stdout line is the assets directory.
#
# kubectl is optional: envtest.Environment.Start only needs kube-apiserver and
# etcd. It looks for kubectl only in $KUBEBUILDER_ASSETS (not PATH), and only
# for the deprecated ControlPlane.KubeCtl()/AuthenticatedUser.Kubectl() helpers;
# pass --with-kubectl if a test uses those.
set -euo pipefail

components=(kube-apiserver etcd)
for arg in "$@"; do
  case $arg in
    --with-kubectl) components+=(kubectl) ;;
    *) echo "usage: $0 [--with-kubectl]" >&2; exit 2 ;;
  esac
done

# build-k8s.sh prints the bin dir as its last stdout line; everything else to stderr.
dir=$("$(dirname "$0")/build-k8s.sh" "${components[@]}" | tail -n 1)
for c in "${components[@]}"; do
  [ -x "$dir/$c" ] || { echo "setup-envtest: $dir/$c missing after build" >&2; exit 1; }
done
echo "$dir"
