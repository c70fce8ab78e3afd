#!/usr/bin/env bash
# Times every algorithm of a collective, forced with --algo, over sizes and
# world sizes: the measurements behind the thresholds in
# src/collectives/select.cc (see docs/algorithms.md).
#   bench/probes/algo_sweep.sh [out_dir] ["2 4 8"]   (default bench/out/algo-sweep, 2 and 4 ranks;
#   give bench/results/algo-sweep to replace the curated baseline)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-bench/out/algo-sweep}
PERF=build/bin/shoal-perf
mkdir -p "$OUT"
md="$OUT/results.md"
{
  echo "# Algorithm sweep (median time_us, slowest rank; lower is better)"
  echo
  echo "- date: $(date -Iseconds); host: $(hostname); $(nproc) cores; $(lscpu | sed -n 's/^Model name: *//p')"
  echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- command: shoal-perf --op OP --np N -b 8 -e 64M -f 8 --iters 10 --warmup 3 --algo A, three times; best median per size"
  echo "- ranks beyond 2 share the 2 cores (oversubscribed): use the ratios between algorithms, not the times"
} > "$md"
sweep() {  # op np algos...
  local op=$1 np=$2; shift 2
  echo >> "$md"; echo "## $op, $np ranks" >> "$md"; echo >> "$md"
  local header="| bytes |" sep="|---:|"
  declare -A col
  local sizes=""
  for a in "$@"; do
    header+=" $a |"; sep+="---:|"
    # Best of three runs per size: on a shared 2-core machine a run can land
    # in a slow scheduling regime as a whole.
    while read -r bytes t; do
      col["$a,$bytes"]=$t
      [[ " $sizes " == *" $bytes "* ]] || sizes+=" $bytes"
    done < <(for rep in 1 2 3; do
               "$PERF" --op "$op" --np "$np" -b 8 -e 64M -f 8 --iters 10 --warmup 3 --algo "$a" --format json
             done | python3 -c '
import sys, json
best = {}
for r in map(json.loads, sys.stdin):
    best[r["bytes"]] = min(best.get(r["bytes"], float("inf")), r["time_us"])
for b in sorted(best): print(b, round(best[b], 1))')
  done
  echo "$header" >> "$md"; echo "$sep" >> "$md"
  for b in $sizes; do
    local row="| $b |"
    for a in "$@"; do row+=" ${col[$a,$b]:--} |"; done
    echo "$row" >> "$md"
  done
}
for np in ${2:-2 4}; do
  sweep allreduce $np recursive_doubling rabenseifner ring
  sweep broadcast $np binomial scatter_allgather chain
  sweep allgather $np ring bruck
  sweep reduce $np binomial scatter_gather
done
for np in 4; do
  sweep gather $np linear binomial
  sweep scatter $np linear binomial
done
echo "wrote $md"
