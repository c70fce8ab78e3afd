#!/usr/bin/env python3
"""GPU tensors through torch.distributed: shoal against NCCL and Gloo's CUDA path.

    .venv/bin/python bench/gpu/bench_gpu.py [--nproc N] [--out FILE]

Starts N ranks (default: one per GPU, at least 2; ranks share a GPU when there
are fewer) and, in the same run, for each backend and size: all_reduce of a
float32 CUDA tensor, algorithm and bus bandwidth (busbw = 2(W-1)/W x bytes /
time, the slowest rank's time). Beside them, the host path's bound for shoal,
which moves device data through host memory: min(pinned D2H bandwidth,
pinned H2D bandwidth, shoal's busbw for the same all_reduce of CPU tensors),
and shoal's share of it; and, for latency, the serial floor: one synchronous
copy down, shoal's all_reduce of the CPU tensor, one synchronous copy back
(pieces that overlap beat it at large sizes; at small ones it is the floor).
Then one DDP training step of an MLP (about 34M float32 parameters) per
backend. Prints a table and writes JSON to --out.

Targets (issue "GPU tensors"): at 64 MiB and above shoal reaches 80% of the
host bound and twice Gloo's CUDA path; NCCL, which never leaves the device,
is the ceiling and is shown for that.

--device fakegpu runs the same code on tests/fakegpu (shoal only), to check
the script where there is no GPU.
"""

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=0, help="ranks (default: GPUs, at least 2)")
    p.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB,256MiB")
    p.add_argument("--backends", default="shoal,nccl,gloo")
    p.add_argument("--device", default="cuda", choices=("cuda", "fakegpu"))
    p.add_argument("--seconds", type=float, default=0.5, help="time per measurement (default 0.5)")
    p.add_argument("--out", default=str(ROOT / "build" / "bench" / "gpu.json"))
    return p.parse_args()


def size_bytes(s):
    s = s.strip()
    for unit, mult in (("KiB", 1 << 10), ("MiB", MiB), ("GiB", 1 << 30)):
        if s.endswith(unit):
            return int(float(s[:-len(unit)]) * mult)
    return int(s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slowest(seconds, cpu_group):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu_group)
    return t.item()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        torch.accelerator.synchronize(device)


def timed(fn, device, cpu_group, seconds):
    """Seconds per call of fn (the slowest rank's), after a warm-up. Every rank
    makes the same number of calls (agreed from a timed trial)."""
    for _ in range(3):
        fn()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    n = torch.tensor([max(5, int(seconds / max(time.perf_counter() - start, 1e-6)))])
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=cpu_group)
    dist.barrier(group=cpu_group)
    start = time.perf_counter()
    for _ in range(int(n.item())):
        fn()
    sync(device)
    return slowest((time.perf_counter() - start) / int(n.item()), cpu_group)


def copy_costs(device, nbytes, seconds):
    """Pinned copies of nbytes, down (D2H) and back (H2D): each way's bandwidth,
    queued back to back (B/s), and the time of one copy waited for (median, s)."""
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=device.type == "cuda")
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def rate(fn):
        fn()
        sync(device)
        n, start = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - start < seconds / 4:
            fn()
            n += 1
        sync(device)
        return nbytes * n / (time.perf_counter() - start)

    def once(fn):
        times, start = [], time.perf_counter()
        while len(times) < 5 or time.perf_counter() - start < seconds / 4:
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    down = lambda: host.copy_(dev, non_blocking=True)  # noqa: E731
    back = lambda: dev.copy_(host, non_blocking=True)  # noqa: E731
    return rate(down), rate(back), once(down), once(back)


def mlp(device):
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def rank_main(rank, world, port, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    sys.path.insert(0, str(ROOT / "python"))
    if args.device == "fakegpu":
        sys.path.insert(0, str(ROOT / "tests" / "python"))
        import fakegpu
        fakegpu.load()
        device = torch.device("fakegpu", 0)
    else:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    import shoal.torch  # noqa: F401

    dist.init_process_group("gloo")
    cpu = dist.new_group(backend="gloo")
    groups = {b: dist.new_group(backend=b) for b in args.backends}
    W = world
    result = {"world": W, "device": str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "fakegpu",
              "allreduce": [], "ddp": {}}
    for nbytes in args.sizes:
        row = {"bytes": nbytes}
        for b, g in groups.items():
            t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            sec = timed(lambda: dist.all_reduce(t, group=g), device, cpu, args.seconds)
            row[b] = {"us": sec * 1e6, "busbw_GBs": 2 * (W - 1) / W * nbytes / sec / 1e9}
        if "shoal" in groups:
            h = torch.ones(nbytes // 4, dtype=torch.float32)
            sec = timed(lambda: dist.all_reduce(h, group=groups["shoal"]), device, cpu, args.seconds)
            d2h, h2d, down, up = copy_costs(device, nbytes, args.seconds)
            cpu_busbw = 2 * (W - 1) / W * nbytes / sec
            row["host_bound"] = {"d2h_GBs": d2h / 1e9, "h2d_GBs": h2d / 1e9, "shoal_cpu_busbw_GBs": cpu_busbw / 1e9,
                                 "bound_GBs": min(d2h, h2d, cpu_busbw) / 1e9}
            row["serial_floor"] = {"d2h_us": down * 1e6, "shoal_cpu_us": sec * 1e6, "h2d_us": up * 1e6,
                                   "floor_us": (down + sec + up) * 1e6}
        if "gloo" in groups:
            h = torch.ones(nbytes // 4, dtype=torch.float32)
            sec = timed(lambda: dist.all_reduce(h, group=groups["gloo"]), device, cpu, args.seconds)
            row["gloo_cpu_us"] = sec * 1e6
        result["allreduce"].append(row)
    for b, g in groups.items():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            mlp(device), process_group=g, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(32, 2048, device=device)

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        result["ddp"][b] = {"ms_per_step": timed(step, device, cpu, args.seconds * 2) * 1e3}
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def report(res):
    backends = [b for b in ("shoal", "nccl", "gloo") if b in res["allreduce"][0]]
    print(f"all_reduce float32, {res['world']} ranks on {res['device']}: busbw GB/s")
    head = "| bytes | " + " | ".join(backends) + " | host bound | shoal / bound | shoal / gloo |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in res["allreduce"]:
        cells = [f"{row[b]['busbw_GBs']:.2f}" for b in backends]
        hb = row.get("host_bound", {}).get("bound_GBs")
        share = f"{row['shoal']['busbw_GBs'] / hb:.0%}" if hb and "shoal" in row else "-"
        vs_gloo = f"{row['shoal']['busbw_GBs'] / row['gloo']['busbw_GBs']:.1f}x" if "gloo" in row and "shoal" in row else "-"
        bound = f"{hb:.2f}" if hb else "-"
        print(f"| {row['bytes']} | " + " | ".join(cells) + f" | {bound} | {share} | {vs_gloo} |")
    if "serial_floor" in res["allreduce"][0]:
        print("all_reduce time, us: each backend, and shoal's serial floor (copy down + CPU all_reduce + copy back)")
        head = ("| bytes | " + " | ".join(backends) + " | copy down | shoal CPU | gloo CPU | copy back | floor"
                " | shoal / floor |")
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in res["allreduce"]:
            f = row["serial_floor"]
            gloo_cpu = f"{row['gloo_cpu_us']:.0f}" if "gloo_cpu_us" in row else "-"
            print(f"| {row['bytes']} | " + " | ".join(f"{row[b]['us']:.0f}" for b in backends) +
                  f" | {f['d2h_us']:.0f} | {f['shoal_cpu_us']:.0f} | {gloo_cpu} | {f['h2d_us']:.0f}"
                  f" | {f['floor_us']:.0f} | {row['shoal']['us'] / f['floor_us']:.2f} |")
    print("DDP step (34M-parameter MLP, batch 32): " +
          ", ".join(f"{b} {v['ms_per_step']:.1f} ms" for b, v in res["ddp"].items()))


def main():
    args = parse_args()
    args.sizes = [size_bytes(s) for s in args.sizes.split(",")]
    args.backends = [b for b in args.backends.split(",") if b]
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench_gpu: no CUDA device (torch.cuda.is_available() is False); "
                             "--device fakegpu runs the script on the test accelerator")
        world = args.nproc or max(2, torch.cuda.device_count())
        if "nccl" in args.backends and torch.cuda.device_count() < world:
            # NCCL refuses two ranks on one device ("Duplicate GPU detected").
            print(f"bench_gpu: nccl left out: {world} ranks on {torch.cuda.device_count()} GPU(s), "
                  "and NCCL takes one GPU per rank")
            args.backends.remove("nccl")
    else:
        args.backends = ["shoal"]
        world = args.nproc or 2
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(rank_main, args=(world, free_port(), args, queue), nprocs=world, start_method="spawn")
    res = queue.get()
    report(res)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"bench_gpu: results in {out}")


if __name__ == "__main__":
    main()
