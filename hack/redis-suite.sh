#!/usr/bin/env bash
# hack/redis-suite.sh: runs units of Redis's own Tcl test suite against
# shardkv (`node local --groups=1`: every slot on one group, 3 replicas; the
# suite talks to its leader) and, in the same run on the same machine,
# against redis-server in cluster mode with every slot on itself
# (appendonly yes, appendfsync always), and prints the tests each passed
# per unit.
#
# Usage: hack/redis-suite.sh REDIS_DIR [UNIT...]
#
#   REDIS_DIR  a copy of the redis/redis repository at tag 7.0.15 (its
#              `runtest` and `tests/`); this repository holds no copy
#   UNIT       units as runtest's --single takes them (default: the Redis
#              data-types issue's list, unit/type/{string,incr,hash,list,
#              set,zset}, unit/expire, unit/keyspace, unit/scan,
#              unit/info-command, unit/protocol)
#
# Environment:
#   TAGS     runtest's --tags (default: every test but those that need
#            replication, DEBUG, memory limits, saving, RESET, latency
#            monitoring or CONFIG RESETSTAT, which cannot apply here)
#   TIMEOUT  runtest's --timeout per test, seconds (default 600)
#   ONLY     shardkv or redis: run against one side only
#
# Both run with --cluster-mode (one database, no SELECT; tests tagged
# cluster:skip skipped) and --ignore-encoding. A unit whose test client
# hits an exception (an unknown command, say) stops there: its remaining
# tests count as not passed. Logs stay in the temp dir printed at the end.
#
# Needs go, tclsh (Debian tcl), redis-cli and redis-server.
set -euo pipefail
shopt -s inherit_errexit

die() { echo "redis-suite: $*" >&2; exit 1; }
log() { echo "redis-suite: $*" >&2; }

[ $# -ge 1 ] || die "usage: hack/redis-suite.sh REDIS_DIR [UNIT...]"
REDIS_DIR=$(cd "$1" && pwd) || die "no directory $1"
shift
[ -x "$REDIS_DIR/runtest" ] && [ -d "$REDIS_DIR/tests/unit" ] || die "$REDIS_DIR has no runtest and tests/unit (a copy of redis/redis at tag 7.0.15)"
UNITS=("$@")
[ ${#UNITS[@]} -gt 0 ] || UNITS=(unit/type/string unit/type/incr unit/type/hash unit/type/list unit/type/set unit/type/zset
  unit/expire unit/keyspace unit/scan unit/info-command unit/protocol)
TAGS=${TAGS:-"-needs:repl -needs:debug -needs:pfdebug -needs:config-maxmemory -needs:save -needs:reset -needs:latency -needs:config-resetstat"}
TIMEOUT=${TIMEOUT:-600}
ONLY=${ONLY:-}

for tool in go tclsh redis-cli redis-server; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install tcl redis-tools redis-server)"
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/lib/procs.sh
. "$REPO/hack/lib/procs.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/redis-suite.XXXXXX")
NODE_PID=""
REDIS_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null || true
  if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
    kill -TERM "$NODE_PID" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$NODE_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  kill_under "$TMP"
  wait 2>/dev/null || true
  log "logs in $TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_units NAME PORT: every unit against 127.0.0.1:PORT; one log per unit.
run_units() {
  local name=$1 port=$2 u f
  for u in "${UNITS[@]}"; do
    f="$TMP/$name.${u//\//_}.log"
    log "$name: $u ..."
    # runtest exits non-zero when a test fails; the counts say how many.
    (cd "$REDIS_DIR" && ./runtest --host 127.0.0.1 --port "$port" --cluster-mode --ignore-encoding \
      --tags "$TAGS" --timeout "$TIMEOUT" --single "$u" --clients 1) >"$f" 2>&1 || true
  done
}

# count FILE KIND: lines of the runtest log reporting KIND (ok, err,
# exception, ignore, skip).
count() { sed 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null | grep -c "^\[$2\]: " || true; }

if [ "$ONLY" != redis ]; then
  log "building the node binary..."
  (cd "$REPO" && go build -o "$TMP/node" ./cmd/node) || die "go build ./cmd/node failed"
  BASE=$(free_base 4)
  mkdir -p "$TMP/home"
  HOME="$TMP/home" "$TMP/node" local --data-dir="$TMP/data" --base-port="$BASE" \
    --groups=1 --replicas=3 --ctrler-replicas=1 --spare-groups=0 >"$TMP/local.out" 2>&1 &
  NODE_PID=$!
  wait_for_line "$TMP/local.out" "Ctrl-C stops everything" 180 "$NODE_PID" || { cat "$TMP/local.out" >&2; die "node local did not start"; }
  LEADER=""
  for _ in $(seq 100); do
    for p in $(awk '$1 ~ /^group-1-/ { split($5, a, ":"); print a[2] }' "$TMP/local.out"); do
      redis-cli -p "$p" info replication 2>/dev/null | grep -q '^role:master' && LEADER=$p
    done
    [ -n "$LEADER" ] && break
    sleep 0.1
  done
  [ -n "$LEADER" ] || die "no leader of group 1 found"
  log "shardkv: node local --groups=1 --replicas=3, leader's RESP on 127.0.0.1:$LEADER"
  run_units shardkv "$LEADER"
  kill -TERM "$NODE_PID" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$NODE_PID" 2>/dev/null || break; sleep 0.1; done
  NODE_PID=""
fi

# start_redis: a fresh redis-server (cluster mode, every slot on itself) on
# RPORT; a unit's tests change its config (proto-max-bulk-len, ...), so
# each unit gets its own.
start_redis() {
  [ -n "$REDIS_PID" ] && { kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; }
  RPORT=$(free_port)
  rm -rf "$TMP/redis" && mkdir -p "$TMP/redis"
  redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$TMP/redis" --save "" --appendonly yes --appendfsync always \
    --cluster-enabled yes --cluster-config-file "$TMP/redis/nodes.conf" --daemonize no --loglevel warning >>"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$RPORT" cluster addslotsrange 0 16383 >/dev/null || die "CLUSTER ADDSLOTSRANGE failed"
  for _ in $(seq 100); do redis-cli -p "$RPORT" cluster info | grep -q '^cluster_state:ok' && break; sleep 0.1; done
}

if [ "$ONLY" != shardkv ]; then
  log "redis-server $(redis-server --version | awk '{print $3}' | sed 's/^v=//') (cluster mode, every slot; a fresh one per unit)"
  ALL_UNITS=("${UNITS[@]}")
  for u in "${ALL_UNITS[@]}"; do
    start_redis
    UNITS=("$u")
    run_units redis "$RPORT"
  done
  UNITS=("${ALL_UNITS[@]}")
fi

echo
echo "Redis $(basename "$REDIS_DIR") test suite: ./runtest --host 127.0.0.1 --port PORT --cluster-mode --ignore-encoding --tags \"$TAGS\" --timeout $TIMEOUT --single UNIT --clients 1"
printf '%-22s %12s %12s %10s %10s  %s\n' unit "redis ok" "shardkv ok" "of redis" "sk err" "shardkv stopped early"
for u in "${UNITS[@]}"; do
  r=$(count "$TMP/redis.${u//\//_}.log" ok)
  s=$(count "$TMP/shardkv.${u//\//_}.log" ok)
  e=$(count "$TMP/shardkv.${u//\//_}.log" err)
  x=$(sed 's/\x1b\[[0-9;]*m//g' "$TMP/shardkv.${u//\//_}.log" 2>/dev/null | grep -m1 '^\[exception\]' | cut -c1-90 || true)
  pct=$(awk -v s="$s" -v r="$r" 'BEGIN { if (r > 0) printf "%d%%", 100 * s / r; else print "-" }')
  printf '%-22s %12s %12s %10s %10s  %s\n' "$u" "$r" "$s" "$pct" "$e" "$x"
done
