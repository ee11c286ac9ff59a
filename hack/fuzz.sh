#!/usr/bin/env bash
# hack/fuzz.sh [DURATION] [TARGET...]: runs each Go fuzz target for DURATION
# (default 30s), one after another; a crash fails the run and go test writes
# the input under the package's testdata/fuzz/<Target>/ (commit it: it
# becomes a regression input that every `go test` runs). CI runs a bounded
# sample of each target on every run; long campaigns are run by hand, e.g.
#   hack/fuzz.sh 30m FuzzRESPReader
# With no TARGET, every Fuzz* function under pkg/ is run. A run whose only
# failure is Go 1.26's fuzzing deadline race (see deadline_race) passes,
# and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
dur=${1:-30s}
shift || true

# target list: "pkg Func" lines.
targets=$(grep -rlE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' --include='*_test.go' pkg | sort |
  while read -r file; do
    for fn in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | cut -d' ' -f2); do
      echo "./$(dirname "$file") $fn"
    done
  done)
if [ "$#" -gt 0 ]; then
  want=" $* "
  targets=$(echo "$targets" | while read -r pkg fn; do case "$want" in *" $fn "*) echo "$pkg $fn";; esac; done)
fi
[ -n "$targets" ] || { echo "fuzz: no targets" >&2; exit 1; }

# deadline_race OUT PKG FN BEFORE: whether a failed run is Go's fuzzing
# coordinator racing its own -fuzztime deadline (golang/go#75804, fixed in
# Go 1.27): the only failure is a bare "context deadline exceeded" and no
# failing input was written. On a loaded machine a worker still inside a
# slow input when the time is up makes the run fail so. Any other failure,
# or a new input under testdata, is a finding.
deadline_race() {
  local out=$1 pkg=$2 fn=$3 before=$4
  [ "$(grep -c -- '--- FAIL' "$out")" = 1 ] || return 1
  grep -A1 -- "--- FAIL: $fn " "$out" | tail -n 1 | grep -qx '    context deadline exceeded' || return 1
  ! grep -qE 'Failing input written|panic:|fuzz: minimizing' "$out" || return 1
  [ "$(corpus "$pkg" "$fn")" = "$before" ]
}

# progress OUT: the last progress line's execs, elapsed time and rate.
progress() {
  local last el ex m sec
  last=$(grep -E 'fuzz: elapsed' "$1" | tail -n 1 || true)
  el=$(sed -nE 's/.*elapsed: ([0-9hms]+),.*/\1/p' <<<"$last")
  ex=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
  m=$(sed -nE 's/^([0-9]+)m.*/\1/p' <<<"$el")
  sec=$(sed -nE 's/^([0-9]+m)?([0-9]+)s$/\2/p' <<<"$el")
  sec=$(( ${m:-0} * 60 + ${sec:-0} ))
  if [ -n "$ex" ] && [ "$sec" -gt 0 ]; then
    echo "$ex execs in ${sec}s ($((ex / sec)) execs/s on average)"
  else
    echo "execs unknown (no progress line)"
  fi
}

# corpus PKG FN: the inputs under the target's testdata.
corpus() { ls "$1/testdata/fuzz/$2" 2>/dev/null || true; }

rc=0
while read -r pkg fn; do
  t0=$SECONDS
  echo "fuzz: $fn ($pkg) for $dur"
  out=$(mktemp)
  before=$(corpus "$pkg" "$fn")
  if go test -run='^$' -fuzz="^${fn}\$" -fuzztime="$dur" "$pkg" >"$out" 2>&1; then
    echo "fuzz: $fn ok in $((SECONDS - t0))s: $(progress "$out")"
  elif deadline_race "$out" "$pkg" "$fn" "$before" && go test -count=1 -run="^${fn}\$" "$pkg" >/dev/null 2>&1; then
    # Not a finding: the committed inputs replay clean, and no new one was
    # written. Said, so that it shows.
    echo "fuzz: $fn ok in $((SECONDS - t0))s: $(progress "$out"); the run ended in Go's fuzzing deadline race (golang/go#75804: 'context deadline exceeded', no failing input written); its committed inputs replay clean"
  else
    echo "fuzz: $fn FAILED after $((SECONDS - t0))s:" >&2
    tail -n 40 "$out" >&2
    rc=1
  fi
  rm -f "$out"
done <<<"$targets"
exit "$rc"
