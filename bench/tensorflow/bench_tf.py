#!/usr/bin/env python3
"""TensorFlow on shoal: the allreduce op's overhead, and a training step
against tf.distribute's MultiWorkerMirroredStrategy, in one run.

    .venv/bin/python bench/tensorflow/bench_tf.py [--np 2] [--iters 30] [--width 1024] [--batch 64]

1. allreduce of float32 tensors from 64 KiB to 64 MiB: shoal-perf (the C++
   core, blocking calls: the path the op's kernel takes, running the
   collective in its own thread) against shoal.tensorflow.allreduce called
   eagerly (the TF op: eager dispatch, the output's allocation, the kernel,
   the completion), median time per call over --iters after a barrier; the
   op's overhead is their ratio.
2. a training step of an MLP (4 Dense layers of --width, float32) on --batch
   samples per rank: forward, backward and the averaging of the gradients
   over the ranks, inside tf.function, with shoal's DistributedGradientTape
   (fused: one allreduce per 64 MiB bucket) and with
   MultiWorkerMirroredStrategy's CPU collectives (ring over gRPC, its
   all_reduce of the gradient list), median step time over --iters. The
   optimizer update, the same for both, is left out.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def args_():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--mode", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def spawn(a, mode, extra_env=None):
    port = free_ports(1)[0]
    procs = []
    for r in range(a.np):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.np),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=str(ROOT / "python"))
        env.update((extra_env or (lambda r: {}))(r))
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--mode", mode], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"bench_tf: a rank of '{mode}' failed:\n" + "\n".join(outs))
    return next(json.loads(line[7:]) for line in outs[0].splitlines() if line.startswith("RESULT "))


def op_rank(a):
    import tensorflow as tf
    import shoal.tensorflow as st
    st.init()
    out = {}
    for size in SIZES:
        x = tf.ones([size // 4], tf.float32)
        for _ in range(3):
            st.allreduce(x, "sum")
        times = []
        for _ in range(a.iters):
            st.barrier()
            t0 = time.perf_counter()
            st.allreduce(x, "sum")
            times.append(time.perf_counter() - t0)
        out[size] = statistics.median(times)
    return out


def mlp(a):
    import keras
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((a.width,))] + [keras.layers.Dense(a.width, activation="relu")
                                                          for _ in range(3)] + [keras.layers.Dense(10)])


def timed_steps(a, step, x, y, barrier):
    for _ in range(3):
        step(x, y)
    times = []
    for _ in range(a.iters):
        barrier()
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def shoal_step_rank(a):
    import tensorflow as tf
    import shoal.tensorflow as st
    st.init()
    model = mlp(a)
    x = tf.random.normal([a.batch, a.width], seed=st.rank())
    y = tf.random.normal([a.batch, 10], seed=st.rank())

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        return st.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    return timed_steps(a, step, x, y, st.barrier)


def mwms_step_rank(a):
    import tensorflow as tf
    opts = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    with strategy.scope():
        model = mlp(a)
    rank = int(os.environ["RANK"])
    x = tf.random.normal([a.batch, a.width], seed=rank)
    y = tf.random.normal([a.batch, 10], seed=rank)

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        return strategy.run(replica, args=(x, y))

    @tf.function
    def barrier_fn():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(1.0)))
    return timed_steps(a, step, x, y, barrier_fn)


def main():
    a = args_()
    if a.mode:
        res = {"op": op_rank, "shoal_step": shoal_step_rank, "mwms_step": mwms_step_rank}[a.mode](a)
        if int(os.environ["RANK"]) == 0:
            print("RESULT " + json.dumps(res), flush=True)
        return
    perf = subprocess.run([str(ROOT / "build" / "bin" / "shoal-perf"), "--np", str(a.np), "--op", "allreduce",
                           "-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "4", "--iters", str(a.iters),
                           "--format", "json"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in perf.stdout.splitlines() if line.startswith("{")]
    if len(rows) == 1 and "results" in rows[0]:
        rows = rows[0]["results"]
    core = {int(r["bytes"]): float(r["time_us"]) * 1e-6 for r in rows if "bytes" in r}
    op = {int(k): v for k, v in spawn(a, "op").items()}
    print(f"allreduce, float32, {a.np} ranks on one host (median time per call, us):")
    print(f"  {'bytes':>10} {'shoal-perf':>11} {'TF op':>9} {'op / core':>10}")
    for s in SIZES:
        c = core.get(s)
        print(f"  {s:>10} {c * 1e6 if c else float('nan'):11.1f} {op[s] * 1e6:9.1f} "
              f"{op[s] / c if c else float('nan'):10.2f}")
    w0, w1 = free_ports(2)
    workers = [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"][:a.np] if a.np == 2 else \
        [f"127.0.0.1:{p}" for p in free_ports(a.np)]

    def tf_config(r):
        return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": r}})}
    shoal_t = spawn(a, "shoal_step")
    mwms_t = spawn(a, "mwms_step", tf_config)
    params = 3 * (a.width * a.width + a.width) + a.width * 10 + 10
    print(f"training step (MLP, {params / 1e6:.1f} M parameters, batch {a.batch} per rank, forward + backward + "
          f"gradient average), {a.np} ranks, median:")
    print(f"  shoal DistributedGradientTape          : {shoal_t * 1e3:8.2f} ms")
    print(f"  MultiWorkerMirroredStrategy (RING/gRPC): {mwms_t * 1e3:8.2f} ms  ({mwms_t / shoal_t:.2f}x shoal's)")


if __name__ == "__main__":
    main()
