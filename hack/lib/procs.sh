# hack/lib/procs.sh: process and port helpers shared by the hack/ scripts
# that start throwaway clusters (redis-bench.sh, redis-suite.sh). Source it
# after defining die (message to stderr, exit 1).

# kill_under DIR: SIGKILL every process whose command line mentions DIR
# (only processes this script started live under its temp dir).
kill_under() {
  local dir=$1 p args
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    args=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    if [[ $args == *"$dir"* ]]; then
      kill -9 "${p#/proc/}" 2>/dev/null || true
    fi
  done
}

# port_free PORT: nothing accepts connections on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_base N: a base port such that base..base+N-1, +1000 and +2000 are
# free (node local's gRPC, HTTP and RESP ports), below the ephemeral range.
free_base() {
  local n=$1 base i off ok
  for _ in $(seq 100); do
    base=$(( 20000 + RANDOM % 9000 ))
    ok=1
    for off in 0 1000 2000; do
      for (( i = 0; i < n; i++ )); do
        if ! port_free $(( base + off + i )); then ok=0; break 2; fi
      done
    done
    [ "$ok" = 1 ] && { echo "$base"; return; }
  done
  die "no free port range found"
}

free_port() {
  local p
  for _ in $(seq 100); do
    p=$(( 12000 + RANDOM % 8000 ))
    port_free "$p" && { echo "$p"; return; }
  done
  die "no free port found"
}

# wait_for_line FILE TEXT SECONDS PID: wait until FILE contains TEXT.
wait_for_line() {
  local file=$1 text=$2 secs=$3 pid=$4
  for (( i = 0; i < secs * 10; i++ )); do
    grep -qF -- "$text" "$file" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

