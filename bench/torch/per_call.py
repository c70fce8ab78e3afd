#!/usr/bin/env python3
"""What a small collective costs through torch.distributed, and whose cost it is.

    .venv/bin/python bench/torch/per_call.py [--np 2] [--sizes 8,64,512,4096] [--iters 20000]

For each size, the time per blocking ``dist.all_reduce`` of a float32 tensor:
  torch     torch's own share: the same call on torch's no-op backend
            (``fake``, torch.testing's FakeProcessGroup, C++: it completes
            at once), one process
  shoal     through torch.distributed on shoal, --np ranks (max over ranks)
  gloo      the same on Gloo
  core      shoal-perf's time for the same allreduce (the core alone)
and shoal's adapter share: shoal - torch - core (what the backend adds between
torch's call and the core). Iterations run back to back after a warmup; the
mean per call is reported (a small call's median and mean agree closely back
to back). Without RANK set this is the launcher; with it, one rank.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def per_call(iters, sizes, group_op):
    import torch
    out = {}
    for size in sizes:
        t = torch.ones(max(1, size // 4))
        for _ in range(min(iters // 10, 2000)):
            group_op(t)
        t0 = time.perf_counter()
        for _ in range(iters):
            group_op(t)
        out[size] = (time.perf_counter() - t0) / iters * 1e6
    return out


def rank_main(a):
    import torch.distributed as dist
    if a.backend == "shoal":
        import shoal.torch  # noqa: F401 - registers the backend
    dist.init_process_group(a.backend)
    res = per_call(a.iters, a.sizes, dist.all_reduce)
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "us": res}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def fake_main(a):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.np)
    return per_call(a.iters, a.sizes, dist.all_reduce)


def launch(a, backend):
    from ports import free_port
    port = str(free_port())
    procs = []
    for r in range(a.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, __file__, "--backend", backend, "--iters", str(a.iters),
               "--sizes", ",".join(map(str, a.sizes))]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    worst = {}
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"per_call: a {backend} rank exited with {p.returncode}")
        for line in out.splitlines():
            if line.startswith("RESULT "):
                for size, us in json.loads(line[7:])["us"].items():
                    worst[int(size)] = max(worst.get(int(size), 0.0), us)
    return worst


def core(a):
    perf = ROOT / "build" / "bin" / "shoal-perf"
    cmd = [str(perf), "--op", "allreduce", "--np", str(a.np), "-b", str(min(a.sizes)), "-e", str(max(a.sizes)),
           "-f", "2", "--iters", str(a.iters), "--format", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[int(row["bytes"])] = float(row["time_us"])
    return {s: rows.get(s) for s in a.sizes}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64, 512, 4096])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--backend", default=None)
    a = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(a)
    torch_share = fake_main(a)
    rows = {"shoal": launch(a, "shoal"), "gloo": launch(a, "gloo"), "core": core(a)}
    load = os.getloadavg()[0]
    print(f"# {a.np} ranks on one host, float32 all_reduce, {a.iters} calls back to back, mean us per call; "
          f"1-min load at the end {load:.1f}")
    print("| bytes | torch (no-op backend) | core (shoal-perf) | shoal via torch | adapter share | gloo via torch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in a.sizes:
        c = rows["core"][s]
        adapter = rows["shoal"][s] - torch_share[s] - c if c is not None else float("nan")
        print(f"| {s} | {torch_share[s]:.2f} | {c if c is not None else float('nan'):.2f} | {rows['shoal'][s]:.2f} "
              f"| {adapter:.2f} | {rows['gloo'][s]:.2f} |")


if __name__ == "__main__":
    main()
