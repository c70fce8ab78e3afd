#!/bin/bash
cd /work/main
out=bench/results/shm-path/results.txt
{
echo "# SHOAL_SHM=copy (ring, two copies) vs SHOAL_SHM=cma (single copy from 64 KiB), allreduce float32"
echo "# machine: $(nproc) vCPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB, $(uname -r); git $(git rev-parse --short HEAD)"
echo "# command per row: SHOAL_SHM=<mode> build/bin/shoal-perf --np <n> -b 8K -e 128M -f 4 --iters 20 --warmup 3"
echo "# columns: bytes time_us busbw(GB/s); two rounds, modes alternating"
for np in 2 4; do  # then the mid-size rounds, see results.txt
 for round in 1 2; do for m in copy 1; do
  echo -n "np=$np round=$round SHOAL_SHM=$m: "
  SHOAL_SHM=$m ./build/bin/shoal-perf --np $np -b 8K -e 128M -f 4 --iters 20 --warmup 3 | grep -v "^#" | awk '{printf "%s %s %s | ", $1, $5, $7}'; echo
done; done; done
} > $out 2>&1
