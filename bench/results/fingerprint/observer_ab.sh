#!/usr/bin/env bash
# Observer cost: A = defaults (recorder 1000, stall inspector 60 s), B = both off.
set -u
rounds=$1; iters=$2; out=$3
bin=${BIN:-build-obs/bin/shoal-perf}
: > "$out"
for ((i = 0; i < rounds; i++)); do
  t=$(timeout 120 "$bin" --op allreduce --np 2 -b 8 -e 8 --iters "$iters" --warmup 200 | awk '$1 == 8 {print $5}')
  echo "$i A obs-on $t" >> "$out"
  t=$(SHOAL_TRACE_BUFFER=0 SHOAL_STALL_WARN=0 timeout 120 "$bin" --op allreduce --np 2 -b 8 -e 8 --iters "$iters" --warmup 200 | awk '$1 == 8 {print $5}')
  echo "$i B obs-off $t" >> "$out"
done
