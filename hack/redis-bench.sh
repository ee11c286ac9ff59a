#!/usr/bin/env bash
# hack/redis-bench.sh: redis-benchmark (SET and GET, 50 clients, pipeline 1
# and 16, random keys from a 100000-key space) against shardkv's Redis
# Cluster front end (`node local --resp`, the default 3 groups x 3 replicas,
# with `redis-benchmark --cluster`) and, in the same run on the same machine,
# against a plain redis-server with appendonly yes and appendfsync always
# (durable on every write, as every shardkv write is a Raft commit). Prints
# both results side by side.
#
# Usage: hack/redis-bench.sh            (from anywhere in the repo)
#
# Environment:
#   SECONDS_PER_RUN  target length of each run (default 15): a short
#                    calibration run measures the rate, then -n is set so
#                    the run takes about this long
#   REQUESTS         a fixed -n for every run instead (skips calibration)
#   CLIENTS          -c (default 50)
#   KEYSPACE         -r (default 100000)
#   PIPELINES        the -P values (default "1 16")
#   TESTS            the redis-benchmark tests, in order (default "set get";
#                    e.g. "hset sadd lpush lpop rpush rpop zadd spop
#                    zpopmin" for the collection types: each works on one
#                    key, so on one group's leader)
#   NODE_ARGS        extra flags for `node local` (e.g. "--shards=64")
#   TRIPLES          first time one go-redis pipeline of this many (GET, INCR,
#                    APPEND) triples to one slot on each (hack/pipebench;
#                    default 20000, 0 skips it)
#   TRIPLE_REPS      repetitions of that pipeline; the median is shown
#                    (default 5)
#
# Needs go, redis-benchmark, redis-cli (Debian redis-tools) and
# redis-server (Debian redis-server). Everything runs in a temp dir on free
# ports and is torn down on exit, also on Ctrl-C or an error.
set -euo pipefail
shopt -s inherit_errexit

SECONDS_PER_RUN=${SECONDS_PER_RUN:-15}
REQUESTS=${REQUESTS:-}
CLIENTS=${CLIENTS:-50}
KEYSPACE=${KEYSPACE:-100000}
PIPELINES=${PIPELINES:-"1 16"}
TESTS=${TESTS:-"set get"}
NODE_ARGS=${NODE_ARGS:-}
TRIPLES=${TRIPLES:-20000}
TRIPLE_REPS=${TRIPLE_REPS:-5}
GROUPS_=3
REPLICAS=3
CTRLER_REPLICAS=3

die() { echo "redis-bench: $*" >&2; exit 1; }
log() { echo "redis-bench: $*" >&2; }

for tool in go redis-benchmark redis-cli redis-server; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install redis-tools redis-server; Go from go.dev)"
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/lib/procs.sh
. "$REPO/hack/lib/procs.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/redis-bench.XXXXXX")
NODE_PID=""
REDIS_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill "$REDIS_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$REDIS_PID" 2>/dev/null || true
  fi
  if [ -n "$NODE_PID" ] && kill -0 "$NODE_PID" 2>/dev/null; then
    log "stopping node local (pid $NODE_PID)..."
    kill -TERM "$NODE_PID" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$NODE_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  kill_under "$TMP"
  wait 2>/dev/null || true
  if [ "$rc" -ne 0 ] && [ -n "${KEEP_ON_ERROR:-}" ]; then
    log "kept $TMP"
  else
    rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_ready PORT CLUSTER(0/1): a SET works (and with CLUSTER, CLUSTER INFO
# says cluster_state:ok).
wait_ready() {
  local port=$1 cluster=$2
  for _ in $(seq 300); do
    if [ "$cluster" = 1 ]; then
      if redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' &&
         [ "$(redis-cli -c -p "$port" set redis-bench:probe 1 2>/dev/null | tail -1)" = OK ]; then
        return 0
      fi
    elif [ "$(redis-cli -p "$port" set redis-bench:probe 1 2>/dev/null)" = OK ]; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# run_bench PORT CLUSTER(0/1) TEST PIPELINE N: one redis-benchmark run; prints
# "requests rps p50 p99" (latencies in ms).
run_bench() {
  local port=$1 cluster=$2 test=$3 pipeline=$4 n=$5 out row
  local args=(-h 127.0.0.1 -p "$port" -t "$test" -c "$CLIENTS" -P "$pipeline" -n "$n" -r "$KEYSPACE" --csv)
  [ "$cluster" = 1 ] && args=(--cluster "${args[@]}")
  local try
  # A leader change under load can make redis-benchmark --cluster give up
  # (it does not follow every redirect); such a run is retried, and said so.
  for try in 1 2 3; do
    row=""
    if out=$(redis-benchmark "${args[@]}" 2>&1); then
      # --csv: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
      row=$(printf '%s\n' "$out" | tr -d '"' | awk -F, -v t="${test^^}" '$1 == t { print $2, $5, $7 }' | tail -1)
      if [ -n "$row" ] && ! printf '%s\n' "$out" | grep -q 'Error from server'; then
        echo "$n $row"
        return 0
      fi
    fi
    log "redis-benchmark ${args[*]} failed (try $try of 3):"
    printf '%s\n' "$out" | tail -5 | sed 's/^/redis-bench:     /' >&2
    sleep 2
  done
  die "redis-benchmark ${args[*]} failed 3 times"
}

# bench PORT CLUSTER TEST PIPELINE: calibrate -n for ~SECONDS_PER_RUN, run.
bench() {
  local port=$1 cluster=$2 test=$3 pipeline=$4 n rps cal
  n=$REQUESTS
  if [ -z "$n" ]; then
    cal=$(run_bench "$port" "$cluster" "$test" "$pipeline" $(( 4000 * pipeline ))) || exit 1
    read -r _ rps _ _ <<<"$cal"
    n=$(awk -v r="$rps" -v s="$SECONDS_PER_RUN" -v c="$CLIENTS" 'BEGIN { n = int(r * s); if (n < 10 * c) n = 10 * c; print n }')
  fi
  log "  $test -P $pipeline -n $n ..."
  run_bench "$port" "$cluster" "$test" "$pipeline" "$n"
}

declare -A RESULT # RESULT[target,test,pipeline] = "requests rps p50 p99"

bench_all() {
  local target=$1 port=$2 cluster=$3 p t
  for p in $PIPELINES; do
    for t in $TESTS; do # SET first, so GET reads existing keys
      RESULT[$target,$t,$p]=$(bench "$port" "$cluster" "$t" "$p") || exit 1
    done
  done
}

# --- shardkv: node local --resp ---
log "building the node binary..."
(cd "$REPO" && go build -o "$TMP/node" ./cmd/node) || die "go build ./cmd/node failed"
(cd "$REPO" && go build -o "$TMP/pipebench" ./hack/pipebench) || die "go build ./hack/pipebench failed"

declare -A TRIPLE # TRIPLE[target] = median time of the mixed pipeline

# triples TARGET PORT CLUSTER(0/1): time the mixed pipeline.
triples() {
  local target=$1 port=$2 cluster=$3 out
  [ "$TRIPLES" -gt 0 ] || return 0
  log "  pipeline of $TRIPLES (GET, INCR, APPEND) triples to one slot, $TRIPLE_REPS times ..."
  local args=(--addrs "127.0.0.1:$port" --triples "$TRIPLES" --reps "$TRIPLE_REPS")
  [ "$cluster" = 1 ] && args+=(--cluster)
  out=$("$TMP/pipebench" "${args[@]}" 2>&1) || die "pipebench ${args[*]} failed:"$'\n'"$out"
  printf '%s\n' "$out" | sed 's/^/redis-bench:     /' >&2
  TRIPLE[$target]=$(printf '%s\n' "$out" | sed -n 's/.*median of [0-9]*: //p')
}

PROCS=$(( CTRLER_REPLICAS + GROUPS_ * REPLICAS ))
BASE=$(free_base "$PROCS")
mkdir -p "$TMP/home"
log "starting node local --resp ($GROUPS_ groups x $REPLICAS replicas, $CTRLER_REPLICAS controller replicas) on base port $BASE in $TMP..."
# shellcheck disable=SC2086 # NODE_ARGS is a list of flags
HOME="$TMP/home" "$TMP/node" local --resp --data-dir="$TMP/data" --base-port="$BASE" \
  --groups="$GROUPS_" --replicas="$REPLICAS" --ctrler-replicas="$CTRLER_REPLICAS" --spare-groups=0 $NODE_ARGS \
  >"$TMP/local.out" 2>&1 &
NODE_PID=$!
if ! wait_for_line "$TMP/local.out" "Ctrl-C stops everything" 180 "$NODE_PID"; then
  cat "$TMP/local.out" >&2
  for f in "$TMP"/data/logs/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -20 "$f" >&2; }; done
  die "node local did not start serving"
fi
RESP_PORT=$(awk '$1 == "group-1-1" { split($5, a, ":"); print a[2] }' "$TMP/local.out")
[ -n "$RESP_PORT" ] || die "no RESP address for group-1-1 in:"$'\n'"$(cat "$TMP/local.out")"
wait_ready "$RESP_PORT" 1 || die "shardkv's RESP port $RESP_PORT is not ready (CLUSTER INFO / SET)"
SHARDS=$(grep -o '[0-9]* shards' "$TMP/local.out" | head -1)
log "shardkv is serving RESP on 127.0.0.1:$RESP_PORT ($SHARDS); running redis-benchmark --cluster"
triples shardkv "$RESP_PORT" 1 # first: on the fresh cluster, as on Redis
bench_all shardkv "$RESP_PORT" 1

log "stopping node local..."
kill -TERM "$NODE_PID" 2>/dev/null || true
for _ in $(seq 200); do kill -0 "$NODE_PID" 2>/dev/null || break; sleep 0.1; done
kill_under "$TMP/data"
NODE_PID=""

# --- redis-server, appendonly yes, appendfsync always ---
REDIS_PORT=$(free_port)
mkdir -p "$TMP/redis"
log "starting redis-server --appendonly yes --appendfsync always on port $REDIS_PORT..."
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$TMP/redis" --save "" \
  --appendonly yes --appendfsync always --daemonize no --loglevel warning >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
wait_ready "$REDIS_PORT" 0 || { cat "$TMP/redis.log" >&2; die "redis-server did not start"; }
triples redis "$REDIS_PORT" 0
bench_all redis "$REDIS_PORT" 0

# --- the table ---
echo
echo "redis-benchmark, $CLIENTS clients, random keys from $KEYSPACE (-r), ~${SECONDS_PER_RUN}s per run unless REQUESTS is set;"
echo "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//'))"
echo "shardkv:      node local --resp, $GROUPS_ groups x $REPLICAS replicas, $CTRLER_REPLICAS controller replicas, $SHARDS; redis-benchmark --cluster"
echo "redis-server: $(redis-server --version | awk '{print $3}' | sed 's/^v=//'), appendonly yes, appendfsync always, one process"
echo "latencies in ms"
echo
printf '%-7s %-3s | %10s %10s %8s %8s | %10s %10s %8s %8s\n' "" "" "shardkv" "" "" "" "redis" "" "" ""
printf '%-7s %-3s | %10s %10s %8s %8s | %10s %10s %8s %8s\n' TEST "-P" requests "req/s" p50 p99 requests "req/s" p50 p99
for p in $PIPELINES; do
  for t in $TESTS; do
    read -r sn sr s50 s99 <<<"${RESULT[shardkv,$t,$p]}"
    read -r rn rr r50 r99 <<<"${RESULT[redis,$t,$p]}"
    printf '%-7s %-3s | %10s %10s %8s %8s | %10s %10s %8s %8s\n' "${t^^}" "$p" "$sn" "$sr" "$s50" "$s99" "$rn" "$rr" "$r50" "$r99"
  done
done
if [ "$TRIPLES" -gt 0 ]; then
  echo
  echo "one go-redis pipeline of $TRIPLES (GET, INCR, APPEND) triples to one slot, median of $TRIPLE_REPS:"
  echo "  shardkv ${TRIPLE[shardkv]}   redis ${TRIPLE[redis]}"
fi
