#!/usr/bin/env bash
# `make demo-perf`: a verified (--check) 2-rank benchmark of every
# collective with shoal-perf, on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PERF=build/bin/shoal-perf
status=0
for op in allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv barrier; do
  echo
  echo "=== $op ==="
  if ! "$PERF" --op "$op" --np 2 -b 8 -e 64M -f 8 --iters 10 --warmup 3 --check; then
    echo "demo: $op FAILED" >&2
    status=1
  fi
done
echo
if ((status == 0)); then
  echo "demo: every collective verified on 2 ranks (#wrong = 0 everywhere)."
else
  echo "demo: some collectives failed (see above)." >&2
fi
exit $status
