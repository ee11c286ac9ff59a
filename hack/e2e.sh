#!/usr/bin/env bash
# End-to-end tests (e2e/, build tag e2e) on a real Kubernetes cluster.
#
#   hack/e2e.sh          # `make test-e2e`
#
# With $KUBECONFIG set, they run against that cluster (kind, ...): the
# images shardkv:dev and shardkv:dev2 must already be available to its
# nodes (kind load docker-image ...). Without it, this script brings up the
# local single-node cluster (hack/local-cluster.sh), builds and loads the
# images (hack/build-images.sh), runs the tests and wipes the cluster on
# exit, whatever happened.
#
# It fails unless every scenario of e2e/e2e_test.go passed: a scenario
# that did not run, or was skipped, is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

log() { echo "e2e: $*" >&2; }
STEPS=()
step() {
  local name=$1 t0=$SECONDS
  shift
  log "$name: $*"
  local rc=0
  "$@" || rc=$?
  STEPS+=("$name=$((SECONDS - t0))s")
  log "$name done in $((SECONDS - t0))s (exit $rc)"
  return "$rc"
}

if [ -z "${KUBECONFIG:-}" ]; then
  trap 'rc=$?; hack/local-cluster.sh down --wipe || rc=1; log "steps: ${STEPS[*]:-}"; exit $rc' EXIT
  step cluster-up hack/local-cluster.sh up
  export KUBECONFIG=${SHARDKV_LOCAL_CLUSTER_DIR:-/var/lib/shardkv-local}/admin.kubeconfig
  step images hack/build-images.sh --load --tag dev shardkv
  step images2 hack/build-images.sh --load --tag dev2 shardkv
else
  trap 'log "steps: ${STEPS[*]:-}"' EXIT
  log "using the cluster of KUBECONFIG=$KUBECONFIG (images shardkv:dev and shardkv:dev2 must be on its nodes)"
fi

# The tests drive kubectl; use the one built with the cluster's version
# (hack/build-k8s.sh, cached) unless KUBECTL names one.
if [ -z "${KUBECTL:-}" ]; then
  KUBECTL=$(hack/build-k8s.sh kubectl | tail -n 1)/kubectl
  export KUBECTL
fi

out=$(mktemp -d)/e2e.log
want=$(grep -cE '^[[:space:]]*run\("' e2e/e2e_test.go)
rc=0
# shellcheck disable=SC2016 # expanded by the inner bash
step test bash -c 'go test -tags e2e -count=1 -v -timeout 60m ./e2e/ 2>&1 | tee "$0"; exit "${PIPESTATUS[0]}"' "$out" || rc=$?
passed=$(grep -cE '^[[:space:]]+--- PASS: TestE2E/' "$out" || true)
skipped=$(grep -cE -- '--- SKIP' "$out" || true)
log "scenarios: $passed of $want passed, $skipped skipped (log: $out)"
if [ "$rc" -ne 0 ]; then
  log "FAIL: go test exited $rc"
  exit "$rc"
fi
if [ "$passed" -ne "$want" ] || [ "$skipped" -ne 0 ]; then
  log "FAIL: every scenario must run and pass"
  exit 1
fi
