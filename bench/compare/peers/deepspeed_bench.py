"""nccl-tests style benchmark of DeepSpeed's shared-memory CPU allreduce.

A reference peer for bench/compare, with the same command line, method and
output as bench/compare/peers/torch_collective_bench.py (impl "deepspeed-shm").

What it measures: deepspeed.comm.inference_all_reduce() with DS_ACCELERATOR=cpu,
which calls torch.ops.deepspeed.inference_all_reduce_ from DeepSpeed's
ShareMemCommBuilder op (deepspeed/ops/csrc/cpu/comm/shm.cpp, JIT-built with g++
and ninja on first use, cached under $TORCH_EXTENSIONS_DIR or
~/.cache/torch_extensions). Each rank maps every other rank's POSIX shared-memory
workspace (/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>,
~66 MiB each) and busy-waits on flags there: messages < 1 MiB are reduced by
every rank over all ranks' copies ("symmetric naive"), larger ones in 32 MiB
chunks, each rank reducing its slice ("distributed naive"). torch.distributed
(gloo) only sets up the job and does the untimed barriers.

Limits of that path (it is an inference helper, not a general allreduce):
allreduce only, SUM only (the op argument is ignored), in place, float32 /
bfloat16 / float16 only (other dtypes silently fall back to torch's
all_reduce), all ranks on one host (LOCAL_SIZE must equal the world size),
the whole world only (the group argument is ignored by the shm kernel),
fewer than 2 GiB per call (sizes are int), x86 needs AVX2 for float32 and
AVX-512BW for 16-bit types (otherwise: fallback to torch's all_reduce).
This script refuses to run (exit 3) if the shm op is not what would run.
DeepSpeed never unlinks its /dev/shm segments; every rank unlinks its own
after the last barrier, and the launcher removes any left by a failed run.

Set-up, in a venv that already has the torch to use, which must not change:
the light dependencies under a constraint that pins it, deepspeed itself with
--no-deps and --no-build-isolation (its setup.py imports torch; an isolated
build would fetch another one). About 20 s here, plus ~45 s for the JIT build
of the op on the first run.

    echo torch==2.13.0 > torch-pin.txt     # the torch already installed there
    pip install -c torch-pin.txt numpy hjson py-cpuinfo ninja psutil 'pydantic>=2' \
        packaging msgpack einops tqdm
    pip install --no-deps --no-build-isolation deepspeed==0.19.8

Without RANK in the environment the script is a launcher: it JIT-builds the op
once (so ranks do not race or time out on the build), then starts --np copies
of itself with RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_SIZE / MASTER_ADDR=127.0.0.1 /
MASTER_PORT=<free port> set, forwards rank 0's output and fails if any rank
fails. With RANK set (e.g. under torchrun) it is one worker.

For each size: warmup, then timed iterations; each one is preceded by an
untimed reset of the input (the op is in place) and an untimed barrier (unless
--no-barrier): a 1-element inference_all_reduce, i.e. the implementation's own
shared-memory path, as MPI_Barrier / ccl::barrier are for the MPI and oneCCL
peers (gloo's barrier exits with tens of us of skew here, which would be
counted in the next call), and timed alone with time.perf_counter around the
synchronous call. Reported time: median per rank, max of the medians across
ranks; --budget cuts warmup/iterations as in the other peers. The last
iteration's result is checked (exact small-integer sums). One JSON object per
line per size on rank 0's stdout: impl, op, bytes, count, dtype, time_us,
algbw, busbw, wrong, iters, warmup, np. Anything DeepSpeed prints while it
loads goes to stderr.
"""

import contextlib
import glob
import os
import statistics
import subprocess
import sys
import time

from bench.compare.peers import peer_common as PC

MODULE = "bench.compare.peers.deepspeed_bench"  # python3 -m MODULE, from the repository root

OPS = ("allreduce",)
OP_ALIASES = {"all_reduce": "allreduce", "inference_all_reduce": "allreduce"}
OTHER_OPS = ("allgather", "all_gather", "all_gather_into_tensor", "broadcast", "bcast",
             "reduce_scatter", "reduce_scatter_tensor")
SHM_PREFIX = "/dev/shm/deepspeed_allreduce_buffer"


def parse_args(argv=None):
    p = PC.parser(__doc__, "deepspeed-shm", "allreduce")
    p.add_argument("--build-only", action="store_true", help="JIT-build DeepSpeed's shm op and exit")
    a = p.parse_args(argv)
    a.ops = PC.parse_ops(p, a.ops, OPS, OP_ALIASES, lambda op: op in OTHER_OPS and (
        f"{op}: DeepSpeed's shared-memory path (inference_all_reduce) is allreduce only; its other "
        f"collectives are plain torch.distributed (gloo here)"))
    PC.check_sizes(p, a)
    if a.maxbytes >= 1 << 31:
        p.error("-e must be < 2 GiB (DeepSpeed's shm allreduce counts bytes in an int)")
    return a


@contextlib.contextmanager
def stdout_to_stderr():
    """Send fd 1 (Python prints, DeepSpeed's logger, C printf) to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def base_env(env):
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")  # the shm kernels' omp loops: one thread per rank
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


def build_op():
    """JIT-build (or load the cached) ShareMemCommBuilder op; returns the module."""
    try:
        from deepspeed.accelerator import get_accelerator
        import deepspeed.ops
    except ImportError as e:
        raise SystemExit(f"deepspeed_bench: cannot import deepspeed with {sys.executable}: {e} "
                         "(see the set-up in this script's docstring)")

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        raise SystemExit(f"deepspeed_bench: accelerator is {acc.device_name()!r}, "
                         "not cpu (set DS_ACCELERATOR=cpu)")
    builder = acc.create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        raise SystemExit("deepspeed_bench: DeepSpeed's ShareMemCommBuilder is not available "
                         "or not compatible here")
    return builder.load()


def launch(args, argv):
    env0 = base_env(dict(os.environ))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", MODULE, "--build-only"], env=env0,
                       stdout=sys.stderr, timeout=args.timeout)
    if r.returncode != 0:
        print("deepspeed_bench: building DeepSpeed's shm op failed", file=sys.stderr)
        return r.returncode
    print(f"deepspeed_bench: shm op ready ({time.monotonic() - t0:.1f} s)", file=sys.stderr,
          flush=True)
    port = PC.free_port()
    me = [sys.executable, "-m", MODULE] + list(argv)
    envs = PC.rank_envs(args.np, port, {"LOCAL_SIZE": str(args.np)})
    try:
        return PC.run_ranks("deepspeed_bench", [(me, base_env(env)) for env in envs], args.timeout)
    finally:
        for path in glob.glob(f"{SHM_PREFIX}_{os.getuid()}_127.0.0.1_{port}_*"):
            with contextlib.suppress(OSError):
                os.unlink(path)


def worker(args):
    import datetime
    import warnings

    base_env(os.environ)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # DeepSpeed's shm op is only initialised when LOCAL_SIZE == world size; without
    # it inference_all_reduce_ would still run the shm kernel, on no workspace.
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", ""))
    if os.environ["LOCAL_SIZE"] != str(world):
        raise SystemExit("deepspeed_bench: DeepSpeed's shm allreduce needs all ranks on one "
                         f"host (LOCAL_SIZE={os.environ['LOCAL_SIZE']!r}, WORLD_SIZE={world})")

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with stdout_to_stderr():
        import deepspeed
        import deepspeed.comm as dscomm
        import deepspeed.comm.comm as dscomm_impl

        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False,
                                   timeout=datetime.timedelta(seconds=600))
        cdb = dscomm_impl.cdb
        level = getattr(cdb, "shm_vector_kernel_level", 0)
        if (getattr(cdb, "shm_comm_op", None) is None or level < 1
                or not hasattr(torch.ops.deepspeed, "inference_all_reduce_")):
            print(f"deepspeed_bench: DeepSpeed's shm op is not in use (backend {type(cdb)}, "
                  f"op {getattr(cdb, 'shm_comm_op', None)}, vector level {level}); "
                  "inference_all_reduce would fall back to torch's all_reduce", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
    n = world
    barrier = not args.no_barrier
    max_count = args.maxbytes // 4 + n
    idx = torch.arange(max_count, dtype=torch.int64)
    pat_full = ((idx % 251) + 1).to(torch.float32)  # small integers: float32 sums are exact

    def max_all(v):
        t = torch.tensor([float(v)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # The untimed barrier before each iteration: a 1-element shm allreduce (no rank
    # leaves it before all have entered). gloo's barrier, whose exit is skewed by
    # tens of us of thread wake-ups here, would add that skew to the timed call.
    bar = torch.zeros(1, dtype=torch.float32)

    def shm_barrier():
        dscomm.inference_all_reduce(bar)

    def sum_all(v):
        t = torch.tensor([int(v)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return int(t.item())

    for op in args.ops:
        for nbytes in PC.sizes(args.minbytes, args.maxbytes, args.stepfactor):
            count = max(1, nbytes // 4)
            nbytes = count * 4
            src = pat_full[:count] * float(rank + 1)
            buf = src.clone()

            def once(last=False, buf=buf, src=src):
                if args.touch:
                    PC.touch(buf, buf)
                buf.copy_(src)
                if barrier:
                    shm_barrier()
                t0 = time.perf_counter()
                dscomm.inference_all_reduce(buf)
                return time.perf_counter() - t0

            times, warmup, iters = PC.timed(args, once, max_all)
            exp = pat_full[:count] * float(n * (n + 1) // 2)
            wrong = sum_all(int((buf != exp).sum().item()))
            med = max_all(statistics.median(times))
            if rank == 0:
                PC.print_row(args.impl, op, nbytes, count, med, n, wrong, iters, warmup)
            del once
    dist.barrier()  # nobody touches the shm segments after this
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    with contextlib.suppress(OSError):
        os.unlink(f"{SHM_PREFIX}_{os.getuid()}_{addr}_{port}_{rank}")
    dist.destroy_process_group()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.build_only:
        base_env(os.environ)
        with stdout_to_stderr():
            build_op()
        return 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
