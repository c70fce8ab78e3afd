#!/usr/bin/env bash
# A/B/A/B: fingerprint check on (A, the tree) vs off (B, the tree + fp-off.patch).
# Usage: ab.sh ROUNDS ITERS TRANSPORT(shm|tcp) OUT
set -u
rounds=$1; iters=$2; tr=$3; out=$4
A=${A:-build-obs/bin/shoal-perf}
B=${B:-/tmp/shoal-fpoff/build/bin/shoal-perf}
shm=1; [[ $tr == tcp ]] && shm=0
: > "$out"
for ((i = 0; i < rounds; i++)); do
  for v in A B; do
    bin=$A; [[ $v == B ]] && bin=$B
    t=$(SHOAL_SHM=$shm timeout 120 "$bin" --op allreduce --np 2 -b 8 -e 8 --iters "$iters" --warmup 200 | awk '$1 == 8 {print $5}')
    echo "$i $v $tr $t" >> "$out"
  done
done
