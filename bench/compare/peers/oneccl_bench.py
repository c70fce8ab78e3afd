"""nccl-tests style benchmark of Intel oneCCL collectives (CPU buffers, C++ API).

A reference peer for bench/compare, with the same command line, method and
output as bench/compare/peers/torch_collective_bench.py and bench/compare/peers/mpi_bench.c.
oneCCL's torch binding (oneccl_bind_pt) is not on PyPI (only on Intel's own
index, which is out of reach here, and built per torch release), so this drives
oneCCL directly: the C++ program below (ONECCL_CC) is
compiled once with g++ against an installed oneCCL and cached as
build/bench/oneccl_bench-<hash> (ignored by git).

Set-up (PyPI only, no torch involved; any prefix, e.g. a venv):

    pip install --no-deps oneccl-cpu==2021.16.2 oneccl-devel==2021.16.2 impi-rt==2021.16.2

(~4 s, ~520 MB; pip check then says oneccl-devel wants `oneccl`, the SYCL
build, which is not needed.) Prefer a prefix of its own: impi-rt also puts
Intel MPI's mpirun/mpiexec into <prefix>/bin, which would shadow Open MPI's
wherever that bin is on PATH. The first run compiles the program (~2 s).
oneccl-cpu >= 2021.17 cannot be used alone: its libccl.so.1 needs libccl.so.2,
which only the ~700 MB `oneccl` (SYCL) wheel ships, and 2022.x also requires
`libfabric`, which is not on PyPI. impi-rt provides libfabric and its providers
(tcp, shm); oneccl-devel the headers. The prefix is found from --ccl-root, else
$CCL_ROOT, else this interpreter's sys.prefix: it must hold include/oneapi/ccl.hpp
and lib/libccl.so.

Without RANK in the environment the script is a launcher: it builds the
program, starts --np ranks of it with RANK / WORLD_SIZE / CCL_LOCAL_RANK /
CCL_LOCAL_SIZE set and a file through which rank 0 publishes the address of
oneCCL's main KVS (ccl::create_main_kvs), forwards rank 0's output and fails
if any rank fails. With RANK and WORLD_SIZE set (one process per rank under
another launcher) it builds and execs one rank; the KVS file is then
$ONECCL_BENCH_KVS_FILE or one derived from MASTER_ADDR/MASTER_PORT in the
temp dir (all ranks must see the same file system).

Transport: oneCCL's OFI transport (CCL_ATL_TRANSPORT=ofi; its default, MPI,
needs Intel MPI's launcher). --fabric tcp (default) pins libfabric's tcp
provider to the loopback interface (FI_PROVIDER=tcp, FI_TCP_IFACE=lo), the
like-for-like comparison with gloo and mpi-tcp; --fabric shm adds libfabric's
shared-memory provider for ranks on one host (CCL_ATL_SHM=1).
Progress: by default (--progress main) CCL_WORKER_OFFLOAD=0, so the thread that
waits on a collective also drives it: one busy-polling thread per rank, as in
MPI. oneCCL's own default (--progress worker) adds a progress thread per rank
that polls too; with 2 ranks on 2 cores the four pollers take 8-30 ms per
call even on an idle machine. Like MPI's, the polling collapses when other
work shares the cores (~8 ms per call); CCL_YIELD=sched_yield trades ~50 us of
latency on an idle machine for robustness there. Variables that are already
set in the environment win over all these defaults.

Ops: allreduce (ccl::allreduce, float32 sum, out of place), allgather
(ccl::allgather, bytes = output size per rank), broadcast (ccl::broadcast,
root 0, in place), reduce_scatter (ccl::reduce_scatter, float32 sum, bytes =
input size per rank). For each size: warmup, then timed iterations, each
preceded by an untimed ccl::barrier (unless --no-barrier) and timed alone with
steady_clock around the call and its event.wait(). Reported time: median per
rank, max of the medians across ranks; --budget cuts warmup/iterations as in
the other peers. The last iteration's output is checked (exact small-integer
patterns). One JSON object per line per (op, size) on rank 0's stdout: impl,
op, bytes, count, dtype, time_us, algbw, busbw, wrong, iters, warmup, np.
oneCCL's own log lines (CCL_WARN ...), which it writes to stdout, go to stderr.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.compare.peers import peer_common as PC

MODULE = "bench.compare.peers.oneccl_bench"  # python3 -m MODULE, from the repository root

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather",
              "all_gather_into_tensor": "allgather", "bcast": "broadcast",
              "reduce_scatter_tensor": "reduce_scatter"}
SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[3]

ONECCL_CC = SCRIPT.with_suffix(".cc")   # the program: oneCCL's C++ API, timed as mpi_bench.c



def parse_args(argv=None):
    p = PC.parser(__doc__, "oneccl", ",".join(OPS))
    p.add_argument("--fabric", choices=("tcp", "shm"), default="tcp",
                   help="libfabric provider(s): tcp over loopback, or shm (+tcp) on one host")
    p.add_argument("--progress", choices=("main", "worker"), default="main",
                   help="main: the calling thread drives each collective (CCL_WORKER_OFFLOAD=0, "
                        "one busy-polling thread per rank, like MPI); worker: oneCCL's default, "
                        "a progress thread per rank (two polling threads per rank: needs spare "
                        "cores, 10-30 ms per call with 2 ranks on 2 cores)")
    p.add_argument("--ccl-root", default=None,
                   help="oneCCL prefix (include/oneapi/ccl.hpp, lib/libccl.so); "
                        "default $CCL_ROOT, else sys.prefix")
    p.add_argument("--build-dir", default=str(ROOT / "build" / "bench"),
                   help="where the compiled program is cached")
    p.add_argument("--build-only", action="store_true", help="build, print the binary's path, exit")
    a = p.parse_args(argv)
    a.ops = PC.parse_ops(p, a.ops, OPS, OP_ALIASES)
    PC.check_sizes(p, a)
    a.minbytes_n, a.maxbytes_n = a.minbytes, a.maxbytes
    return a


def ccl_root(args):
    cands = [args.ccl_root, os.environ.get("CCL_ROOT"), sys.prefix]
    for c in cands:
        if not c:
            continue
        r = Path(c)
        if (r / "include" / "oneapi" / "ccl.hpp").exists() and (r / "lib" / "libccl.so").exists():
            return r.resolve()
        if c is not sys.prefix:
            sys.exit(f"oneccl_bench: {c} has no include/oneapi/ccl.hpp + lib/libccl.so "
                     "(pip install --no-deps oneccl-cpu==2021.16.2 oneccl-devel==2021.16.2 "
                     "impi-rt==2021.16.2)")
    sys.exit("oneccl_bench: oneCCL not found: pass --ccl-root or set CCL_ROOT to a prefix "
             "with include/oneapi/ccl.hpp and lib/libccl.so (pip install --no-deps "
             "oneccl-cpu==2021.16.2 oneccl-devel==2021.16.2 impi-rt==2021.16.2)")


def build(args, root):
    """Compile ONECCL_CC against root (cached by a hash of source, flags, library)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        sys.exit("oneccl_bench: no C++ compiler (g++) found")
    lib = root / "lib" / "libccl.so"
    flags = ["-O2", "-std=c++17", f"-I{root / 'include'}"]
    libs = [f"-L{root / 'lib'}", "-lccl", f"-Wl,-rpath,{root / 'lib'}"]
    st = lib.stat()
    source = ONECCL_CC.read_text()
    key = "\0".join([source, cxx, *flags, *libs, str(st.st_size), str(int(st.st_mtime))])
    out_dir = Path(args.build_dir)
    exe = out_dir / f"oneccl_bench-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if exe.exists():
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oneccl_bench.") as td:
        src = Path(td) / "oneccl_bench.cc"
        src.write_text(source)
        tmp = out_dir / f".{exe.name}.{os.getpid()}.tmp"
        cmd = [cxx, *flags, "-o", str(tmp), str(src), *libs]
        print("oneccl_bench: building " + " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            sys.exit("oneccl_bench: build failed:\n" + r.stderr[-4000:])
        os.replace(tmp, exe)
    for old in out_dir.glob("oneccl_bench-*"):  # builds of older sources or libraries
        if old != exe:
            old.unlink(missing_ok=True)
    return exe


def rank_env(args, root, env):
    """oneCCL / libfabric settings; values already in the environment win."""
    lib = str(root / "lib")
    ld = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = lib + (":" + ld if ld else "")  # libfabric.so.1 is dlopen()ed
    defaults = {"CCL_ATL_TRANSPORT": "ofi", "CCL_PROCESS_LAUNCHER": "none",
                "OMP_NUM_THREADS": "1"}
    if (root / "lib" / "libtcp-fi.so").exists() or (root / "lib" / "libshm-fi.so").exists():
        defaults["FI_PROVIDER_PATH"] = lib  # impi-rt's providers live beside libfabric
    if args.progress == "main":
        defaults["CCL_WORKER_OFFLOAD"] = "0"
    if args.fabric == "tcp":
        defaults.update(FI_PROVIDER="tcp", FI_TCP_IFACE="lo", CCL_ATL_SHM="0")
    else:
        defaults.update(CCL_ATL_SHM="1", FI_TCP_IFACE="lo")  # tcp stays beside shm
    for k, v in defaults.items():
        env.setdefault(k, v)
    return env


def binary_args(args):
    out = ["--impl", args.impl, "-b", str(args.minbytes_n), "-e", str(args.maxbytes_n),
           "-f", repr(args.stepfactor), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--min-iters", str(args.min_iters), "--budget", repr(args.budget),
           "--ops", ",".join(args.ops)]
    return out + (["--no-barrier"] if args.no_barrier else []) + (["--touch"] if args.touch else [])


def launch(args, exe, root):
    with tempfile.TemporaryDirectory(prefix="oneccl_bench.") as td:
        kvs_file = os.path.join(td, "kvs_address")
        runs = []
        for r in range(args.np):
            env = rank_env(args, root, dict(os.environ))
            env.update(RANK=str(r), WORLD_SIZE=str(args.np), LOCAL_RANK=str(r),
                       CCL_LOCAL_RANK=str(r), CCL_LOCAL_SIZE=str(args.np),
                       ONECCL_BENCH_KVS_FILE=kvs_file)
            env.setdefault("CCL_KVS_IFACE", "lo")  # all ranks are here: keep the KVS on loopback
            runs.append(([str(exe)] + binary_args(args), env))
        return PC.run_ranks("oneccl_bench", runs, args.timeout)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    root = ccl_root(args)
    exe = build(args, root)
    if args.build_only:
        print(exe)
        return 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        env = rank_env(args, root, dict(os.environ))
        if "ONECCL_BENCH_KVS_FILE" not in env:
            tag = f"{env.get('MASTER_ADDR', 'local')}_{env.get('MASTER_PORT', '0')}"
            env["ONECCL_BENCH_KVS_FILE"] = os.path.join(
                tempfile.gettempdir(), f"oneccl_bench_kvs_{os.getuid()}_{tag}")
        env.setdefault("CCL_LOCAL_RANK", env.get("LOCAL_RANK", env["RANK"]))
        env.setdefault("CCL_LOCAL_SIZE", env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        if env["RANK"] == "0":  # a stale address from an earlier run would be read at once
            try:
                os.unlink(env["ONECCL_BENCH_KVS_FILE"])
            except FileNotFoundError:
                pass
        sys.stdout.flush()
        os.execve(str(exe), [str(exe)] + binary_args(args), env)
    return launch(args, exe, root)


if __name__ == "__main__":
    sys.exit(main())
