"""One rank of the TensorFlow jobs (test_tf.py), through shoal.tensorflow's ops.

Usage: tf_worker.py SUITE. Suites: collectives (every op, dtypes, fusion,
tf.function, gradients, bad input), dp (data-parallel training against one
process on the global batch), mismatch (shapes that differ across ranks).
Prints one RESULT line (tests/python/harness.py).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import Checks  # noqa: E402
import shoal.tensorflow as st  # noqa: E402

st.init()
R, N = st.rank(), st.size()
DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64)


def value(r, shape=(5, 3), dtype=tf.float32):
    """Rank r's input: small integers, exact in every dtype and under every op."""
    base = np.arange(int(np.prod(shape))).reshape(shape) % 7
    return tf.constant(base + r + 1, dtype=dtype)


def eq(got, want, what):
    got = np.asarray(tf.cast(got, tf.float64)) if isinstance(got, tf.Tensor) else np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.allclose(got, want, rtol=1e-6), f"{what}: got {got.ravel()[:8]} want {want.ravel()[:8]}"


def each(fn):
    return [np.asarray(tf.cast(fn(r), tf.float64)) for r in range(N)]


# ----------------------------------------------------------------- collectives

def allreduce_ops_and_dtypes():
    for dt in DTYPES:
        xs = each(lambda r: value(r, dtype=dt))
        for op, ref in (("sum", sum(xs)), ("min", np.minimum.reduce(xs)), ("max", np.maximum.reduce(xs)),
                        ("product", np.prod(xs, axis=0))):
            eq(st.allreduce(value(R, dtype=dt), op), ref, f"allreduce {op} {dt.name}")
        want = sum(xs) / N if dt.is_floating else sum(xs) // N
        eq(st.allreduce(value(R, dtype=dt), "average"), want, f"allreduce average {dt.name}")


def allreduce_fused_in_buckets():
    shapes = [(3,), (4, 2), (1,), (0,), (6,), (2, 2)]
    dts = [tf.float32, tf.float32, tf.int64, tf.float32, tf.float32, tf.float64]
    xs = [value(R, s, d) for s, d in zip(shapes, dts)]
    for fusion in (1, 24, 64 << 20):     # one tensor per bucket, a few, all of one dtype together
        out = st.allreduce_n(xs, "sum", fusion_bytes=fusion)
        for i, (s, d) in enumerate(zip(shapes, dts)):
            assert out[i].dtype == d and tuple(out[i].shape) == s
            eq(out[i], sum(each(lambda r: value(r, s, d))), f"fused tensor {i}, fusion_bytes={fusion}")


def allgather_uneven():
    x = tf.fill([R + 1, 2, 3], float(R))
    want = np.concatenate([np.full([r + 1, 2, 3], float(r)) for r in range(N)])
    eq(st.allgather(x), want, "allgather of uneven first dimensions")
    eq(st.allgather(tf.zeros([0, 4]) if R == 0 else tf.ones([1, 4])), np.ones([N - 1, 4]), "allgather with an empty part")


def broadcast_every_root():
    for root in range(N):
        eq(st.broadcast(value(R, (4,), tf.int32), root), value(root, (4,), tf.int32), f"broadcast from {root}")


def alltoall_even_and_split():
    x = tf.constant([[100 * R + k] for k in range(2 * N)])
    out, splits = st.alltoall(x)
    eq(splits, [2] * N, "alltoall received splits")
    eq(out, [[100 * r + 2 * R + j] for r in range(N) for j in range(2)], "alltoall in equal parts")
    # rank r sends k + 1 rows to rank k
    sizes = [k + 1 for k in range(N)]
    x = tf.constant([[10 * R + k] for k in range(N) for _ in range(k + 1)])
    out, splits = st.alltoall(x, splits=sizes)
    eq(splits, [R + 1] * N, "alltoall received splits (uneven)")
    eq(out, [[10 * r + R] for r in range(N) for _ in range(R + 1)], "alltoall with splits")


def reduce_scatter_rows():
    rows = 2 * N + 1
    x = value(R, (rows, 2))
    total = sum(each(lambda r: value(r, (rows, 2))))
    counts = [rows // N + (1 if k < rows % N else 0) for k in range(N)]
    start = sum(counts[:R])
    eq(st.reduce_scatter(x, "sum"), total[start:start + counts[R]], "reduce_scatter of uneven rows")
    eq(st.reduce_scatter(x, "average"), total[start:start + counts[R]] / N, "reduce_scatter average")


def send_recv_ring():
    nxt, prv = (R + 1) % N, (R - 1) % N
    st.send(tf.fill([R + 1, 2], R), nxt, tag=7)     # returns once issued: every rank sends first
    got = st.recv(prv, tf.int32, tag=7)
    eq(got, np.full([prv + 1, 2], prv), "ring send/recv (shape travels with the tensor)")
    st.wait_sends()
    st.barrier()


def inside_tf_function():
    @tf.function
    def f(a, b):
        s = st.allreduce(a, "sum")
        g = st.allgather(b)
        bc = st.broadcast(s, root_rank=N - 1)
        rs = st.reduce_scatter(tf.tile(s[None], [N, 1]), "max")
        return s, g, bc, rs
    a, b = value(R, (3,)), tf.fill([R + 1], float(R))
    for _ in range(2):           # the second call runs the traced graph
        s, g, bc, rs = f(a, b)
        want = sum(each(lambda r: value(r, (3,))))
        eq(s, want, "tf.function allreduce")
        eq(g, np.concatenate([np.full([r + 1], float(r)) for r in range(N)]), "tf.function allgather")
        eq(bc, want, "tf.function broadcast")
        eq(rs, want[None], "tf.function reduce_scatter")


def gradients():
    v = tf.Variable(tf.cast(value(R, (3,)), tf.float64))
    c = float(R + 1)
    with tf.GradientTape(persistent=True) as tape:
        s = st.allreduce(v * c, "sum")            # s = sum_r c_r v_r
        ls = tf.reduce_sum(s * s)
        a = st.allreduce(v, "average")
        la = tf.reduce_sum(a) * c
        g = st.allgather(v[None] * c)
        lg = tf.reduce_sum(g * g)
        b = st.broadcast(v, root_rank=0)
        lb = tf.reduce_sum(b) * c
    total = sum(each(lambda r: value(r, (3,)) * (r + 1)))
    # d(sum over ranks of ls_r)/dv_R = sum_r 2 s * c_R: every rank's loss counts
    eq(tape.gradient(ls, v), N * 2 * total * c, "gradient of allreduce sum")
    eq(tape.gradient(la, v), np.full(3, sum(range(1, N + 1)) / N), "gradient of allreduce average")
    eq(tape.gradient(lg, v), N * 2 * c * c * np.asarray(v.numpy()), "gradient of allgather")
    eq(tape.gradient(lb, v), np.full(3, sum(range(1, N + 1))) if R == 0 else np.zeros(3), "gradient of broadcast")
    w = tf.Variable(tf.constant([float(R), -float(R)]))
    with tf.GradientTape() as tape:
        m = tf.reduce_sum(st.allreduce(w, "max"))
    eq(tape.gradient(m, w), [N if R == N - 1 else 0, N if R == 0 else 0], "gradient of allreduce max")


def bad_input_names_the_argument():
    def refused(fn, kind, *words):
        try:
            fn()
        except kind as e:
            text = str(e)
            missing = [w for w in (f"rank {R}",) + words if w not in text]
            assert not missing, f"the error lacks {missing}: {text}"
            return
        raise AssertionError(f"{fn} was not refused")
    refused(lambda: st.allreduce(tf.ones([2]), "median"), ValueError, "op", "median")
    refused(lambda: st.broadcast(tf.ones([2]), N), tf.errors.InvalidArgumentError, "root", str(N))
    refused(lambda: st.alltoall(tf.ones([N + 1])), tf.errors.InvalidArgumentError, "does not divide")
    refused(lambda: st.alltoall(tf.ones([2]), splits=[3] + [0] * (N - 1)), tf.errors.InvalidArgumentError,
            "splits", "sum to 3")
    refused(lambda: st.allgather(tf.constant(1.0)), tf.errors.InvalidArgumentError, "scalar")
    refused(lambda: st.send(tf.ones([1]), R), tf.errors.InvalidArgumentError, "peer")
    refused(lambda: st.allreduce(tf.constant([True]), "average"), tf.errors.InvalidArgumentError, "avg")
    # trailing dimensions that differ: found in the size exchange, on every rank, naming the other rank
    first_other = 1 if R == 0 else 0      # the first rank whose tensor differs from this one's
    refused(lambda: st.allgather(tf.ones([1, 2 + R])), tf.errors.InvalidArgumentError,
            f"rank {first_other}'s tensor")
    eq(st.allreduce(tf.ones([2]), "sum"), [N, N], "the communicator works after refusals")


# ----------------------------------------------------------------- data parallel

def model(seed=0):
    from tensorflow import keras
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def data(steps=4, per_rank=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, per_rank * N, 6)).astype(np.float32)
    y = rng.normal(size=(steps, per_rank * N, 3)).astype(np.float32)
    return x, y, per_rank


def single_process_reference(steps, lr=0.1):
    from tensorflow import keras
    x, y, _ = data(steps)
    m, opt = model(), keras.optimizers.SGD(lr)
    for i in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(x[i]) - y[i]) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
    return [v.numpy() for v in m.trainable_variables]


def dp_gradient_tape():
    from tensorflow import keras
    steps = 4
    x, y, per = data(steps)
    m, opt = model(seed=R), keras.optimizers.SGD(0.1)       # different starts: the broadcast must fix them
    ref_start = [v.numpy() for v in model().trainable_variables]

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((m(xb) - yb) ** 2)
        tape = st.DistributedGradientTape(tape)
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))
        return loss
    st.broadcast_variables(m.variables, root_rank=0)
    if R == 0:
        for v, w in zip(m.trainable_variables, ref_start):
            eq(v, w, "rank 0 starts from the reference")
    for i in range(steps):
        step(x[i, R * per:(R + 1) * per], y[i, R * per:(R + 1) * per])
    for v, w in zip(m.trainable_variables, single_process_reference(steps)):
        np.testing.assert_allclose(v.numpy(), w, rtol=2e-4, atol=2e-5, err_msg=f"rank {R}: {v.name}")


def dp_keras_fit():
    from tensorflow import keras
    steps = 4
    x, y, per = data(steps)
    m = model(seed=R)
    m.compile(optimizer=st.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    xs = x[:, R * per:(R + 1) * per].reshape(-1, 6)
    ys = y[:, R * per:(R + 1) * per].reshape(-1, 3)
    st.broadcast_variables(m.variables, root_rank=0)
    m.fit(xs, ys, batch_size=per, epochs=1, shuffle=False, verbose=0)
    for v, w in zip(m.trainable_variables, single_process_reference(steps)):
        np.testing.assert_allclose(v.numpy(), w, rtol=2e-4, atol=2e-5, err_msg=f"rank {R}: {v.name}")


def sparse_gradients_are_gathered():
    from tensorflow import keras
    keras.utils.set_random_seed(0)
    emb = keras.layers.Embedding(10, 2)
    emb.build((None,))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(tf.constant([R, R + 1])))
    g = st.DistributedGradientTape(tape).gradient(loss, emb.trainable_variables)[0]
    dense = tf.convert_to_tensor(g).numpy()
    want = np.zeros((10, 2))
    for r in range(N):
        want[r] += 1.0 / N
        want[r + 1] += 1.0 / N
    eq(dense, want, "averaged embedding gradient")


# ----------------------------------------------------------------- mismatch

def mismatched_shapes_fail_on_every_rank():
    try:
        st.allreduce(tf.ones([R + 1]), "sum")
    except tf.errors.OpError as e:
        assert f"rank {R}" in str(e) and "mismatch" in str(e), str(e)
        return
    raise AssertionError("an allreduce of different sizes on the ranks completed")


SUITES = {
    "collectives": [allreduce_ops_and_dtypes, allreduce_fused_in_buckets, allgather_uneven, broadcast_every_root,
                    alltoall_even_and_split, reduce_scatter_rows, send_recv_ring, inside_tf_function, gradients,
                    bad_input_names_the_argument],
    "dp": [dp_gradient_tape, dp_keras_fit, sparse_gradients_are_gathered],
    "mismatch": [mismatched_shapes_fail_on_every_rank],
}


def main():
    c = Checks()
    for fn in SUITES[sys.argv[1]]:
        c.run(fn.__name__, fn)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
