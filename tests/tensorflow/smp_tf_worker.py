"""One rank of the TensorFlow model-parallel jobs (test_tf.py): Keras models
through shoal.tensorflow.modelparallel (smp), trained against the same model
in one process on the whole batch.

Usage: smp_tf_worker.py SUITE. Suites: pipeline (2 partitions: automatic and
manual placement, both schedules, eager and inside tf.function, shared
layers, residual glue, tf.GradientTape, checkpoints), hybrid (2 partitions x
2 replicas: 'ddp' and the Horovod-style API), bad_input. Prints one RESULT
line (tests/python/harness.py).
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from tensorflow import keras  # noqa: E402  (Keras 2: the bare `import keras` is not the public API)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import Checks  # noqa: E402
import shoal.tensorflow.modelparallel as smp  # noqa: E402

R = int(os.environ["RANK"])
L = keras.layers


# ----------------------------------------------------------------- models (forward shared by both twins)

def mlp_layers(self, manual=False):
    if manual:
        with smp.partition(0):
            self.d1 = L.Dense(16, activation="tanh")
            self.d2 = L.Dense(16, activation="relu")
        with smp.partition(1):
            self.d3 = L.Dense(8)
        self.d4 = L.Dense(3)              # default_partition (1 in the manual config)
    else:
        self.d1, self.d2 = L.Dense(16, activation="tanh"), L.Dense(16, activation="relu")
        self.d3, self.d4 = L.Dense(8), L.Dense(3)


def mlp_call(self, x, training=None):
    h = self.d1(tf.cast(x, tf.float32) * 0.5)       # glue on the inputs: computed on every rank
    return self.d4(self.d3(self.d2(h)) * 2.0)


def residual_call(self, x, training=None):
    h = self.d1(x)
    return self.d4(self.d3(h + self.d2(h)))          # h + d2(h): d1 and d2 must share a partition


def shared_call(self, x, training=None):
    h = self.d1(x)
    h = self.d2(h)
    return self.d4(self.d2(h) + 0.0)                 # d2 twice: placed once, the calls go 0 -> 1 -> 0?


def manual_call(self, x, training=None):
    with smp.partition(0):
        h = self.d2(self.d1(x))
    with smp.partition(1):
        h = self.d3(h)
    return self.d4(h)


def twins(call, manual=False):
    """(DistributedModel subclass, plain Keras model class) with one forward."""
    def init(self):
        keras.Model.__init__(self) if not isinstance(self, smp.DistributedModel) else \
            smp.DistributedModel.__init__(self)
        mlp_layers(self, manual)
    attrs = {"__init__": init, "call": call}
    return type("Net", (smp.DistributedModel,), attrs), type("Plain", (keras.Model,), attrs)


def data(steps, batch, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(steps, batch, 6)).astype("float32"),
            rng.normal(size=(steps, batch, 3)).astype("float32"))


def reference(Plain, steps, batch, lr=0.1):
    x, y = data(steps, batch)
    keras.utils.set_random_seed(0)
    m, opt = Plain(), keras.optimizers.SGD(lr)
    losses, preds = [], []
    for i in range(steps):
        with tf.GradientTape() as tape:
            pred = m(x[i])
            loss = tf.reduce_mean((pred - y[i]) ** 2)
        preds.append(pred.numpy())
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        losses.append(float(loss))
    REF_MODEL[0] = m
    return losses, [v.numpy() for v in m.trainable_variables], preds


REF_MODEL = [None]


def close(got, want, what, tol=2e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.allclose(got, want, rtol=tol, atol=tol), \
        f"{what}: max difference {np.abs(got - want).max():.3g}\n got {got.ravel()[:6]}\nwant {want.ravel()[:6]}"


def train(call, cfg, *, manual=False, graph=False, grads="get_gradients", steps=3, batch=8, dp=1):
    """Trains through smp (this rank's replica gets batch // dp rows of the global batch)
    and checks losses and this partition's variables against the plain model."""
    smp.init(cfg)
    Net, Plain = twins(call, manual)
    ref_losses, ref_vars, ref_preds = reference(Plain, steps, batch)
    x, y = data(steps, batch)
    keras.utils.set_random_seed(0)
    model, opt = Net(), keras.optimizers.SGD(0.1)
    per = batch // dp

    @smp.step
    def get_grads(xb, yb):
        pred = model(xb, training=True)
        loss = tf.reduce_mean((pred - yb) ** 2)
        if grads == "tape":
            return tape_grads(loss), loss, pred
        if grads == "compute_gradients":
            return [g for g, _ in opt.compute_gradients(loss, model.trainable_variables)], loss, pred
        return opt.get_gradients(loss, model.trainable_variables), loss, pred

    def tape_grads(loss):
        return _TAPE[0].gradient(loss, model.trainable_variables)

    def train_step(xb, yb):
        g, loss, pred = get_grads(xb, yb)
        g = [t.accumulate() for t in g]
        if dp > 1 and cfg.get("horovod"):
            if os.environ.get("SHOAL_TEST_HOROVOD"):     # Horovod itself (under mpirun: smp.init set it up)
                import horovod.tensorflow as hvd
                assert (hvd.rank(), hvd.size()) == (smp.dp_rank(), smp.dp_size()), "Horovod on the dp group"
            else:
                import smdistributed.dataparallel.tensorflow as hvd
            g = [hvd.allreduce(t) for t in g]
        opt.apply_gradients(zip(g, model.trainable_variables))
        return loss.reduce_mean(), pred.merge()
    if graph:
        train_step = tf.function(train_step)
    d = smp.dp_rank()
    losses = []
    for i in range(steps):
        xb, yb = x[i, d * per:(d + 1) * per], y[i, d * per:(d + 1) * per]
        if grads == "tape":
            with tf.GradientTape() as tape:
                _TAPE[0] = tape
                loss, pred = train_step(xb, yb)
        else:
            loss, pred = train_step(xb, yb)
        close(pred, ref_preds[i][d * per:(d + 1) * per], f"step {i}: predictions merged in the batch's order")
        losses.append(float(loss))
    if dp == 1:
        close(losses, ref_losses, "losses")
        # another input shape and training=False: a second plan, the same placement and variables
        x_eval = data(1, 2 * cfg["microbatches"], seed=5)[0][0]

        @smp.step
        def evaluate(xb):
            return model(xb, training=False)
        close(evaluate(x_eval).merge(), REF_MODEL[0](x_eval), "evaluation with a second plan")
        plans = list(model._smp_plans.values())
        assert len(plans) == 2 and plans[0].unit_part == plans[1].unit_part, "the placement changed"
    local, full = model.trainable_variables, model.full_trainable_variables()
    assert 0 < len(local) < len(full), "each partition holds a part of the variables"
    for v in local:
        i = next(i for i, w in enumerate(full) if w is v)
        close(v.numpy(), ref_vars[i], f"variable {i} ({getattr(v, 'path', v.name)}, rank {R})")
    return model, opt, ref_vars


_TAPE = [None]


def checkpoint_round_trip():
    model, opt, ref_vars = train(mlp_call, {"partitions": 2, "microbatches": 2})
    d = os.environ["SHOAL_TEST_CKPT"]
    mgr = smp.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=opt), d)
    mgr.save()
    # each partition's checkpoint loads into the plain model, whole and current
    _, Plain = twins(mlp_call)
    plain = Plain()
    plain(tf.zeros([1, 6]))
    tf.train.Checkpoint(model=plain).restore(tf.train.latest_checkpoint(os.path.join(d, f"mp_rank_{smp.pp_rank()}"))
                                              ).expect_partial()
    for i, v in enumerate(plain.trainable_variables):
        close(v.numpy(), ref_vars[i], f"checkpoint: variable {i}")


SUITES = {}


def pipeline():
    c = Checks()
    base = {"partitions": 2, "microbatches": 4}
    c.run("auto, interleaved, eager", train, mlp_call, {**base, "pipeline": "interleaved"})
    c.run("auto, simple, eager", train, mlp_call, {**base, "pipeline": "simple"})
    c.run("auto, interleaved, inside tf.function", train, mlp_call, base, graph=True)
    c.run("manual (contexts in call), simple", train, manual_call,
          {**base, "auto_partition": False, "default_partition": 1, "pipeline": "simple"})
    c.run("manual (contexts in __init__), inside tf.function", train, mlp_call,
          {**base, "auto_partition": False, "default_partition": 1}, manual=True, graph=True)
    c.run("residual glue: the cut keeps d1 and d2 together", train, residual_call, base)
    c.run("a layer called twice", train, shared_call, base)
    c.run("tf.GradientTape inside the step", train, mlp_call, base, grads="tape")
    c.run("optimizer.compute_gradients", train, mlp_call, base, grads="compute_gradients")
    c.run("checkpoint: every partition's loads into the plain model", checkpoint_round_trip)
    return c.report()


def hybrid():
    c = Checks()
    base = {"partitions": 2, "microbatches": 2}
    c.run("2 x 2, ddp, interleaved", train, mlp_call, {**base, "ddp": True}, dp=2)
    c.run("2 x 2, horovod API, inside tf.function", train, mlp_call, {**base, "horovod": True}, dp=2, graph=True)
    return c.report()


def bad_input():
    c = Checks()

    def refused(fn, kind, *words):
        try:
            fn()
        except kind as e:
            missing = [w for w in words if w not in str(e)]
            assert not missing, f"the error lacks {missing}: {e}"
            return
        raise AssertionError("not refused")
    c.run("unknown config key", refused, lambda: smp.init({"partitions": 2, "microbatchs": 2}),
          smp.SMPConfigError, "microbatchs", "did you mean 'microbatches'")
    c.run("partitions that do not divide the world", refused, lambda: smp.init({"partitions": 3}),
          smp.SMPConfigError, "does not divide")
    smp.init({"partitions": 2, "microbatches": 3})
    c.run("partition index out of range", refused, lambda: smp.partition(2).__enter__(),
          smp.SMPValidationError, "only 2 partitions")
    Net, _ = twins(mlp_call)
    model = Net()
    c.run("model called outside a step", refused, lambda: model(tf.zeros([3, 6])), smp.SMPValidationError,
          "inside an @smp.step")

    @smp.step
    def fwd(x):
        return model(x)
    c.run("a batch that does not split", refused, lambda: fwd(tf.zeros([4, 6])), smp.SMPValidationError,
          "a batch of 4 does not split into 3 microbatches", f"rank {R}")
    out = fwd(tf.ones([6, 6]))                        # the library still works on every rank
    c.run("forward-only step after the refusals", lambda: close(out.merge().shape, [6, 3], "shape"))
    return c.report()


if __name__ == "__main__":
    sys.exit({"pipeline": pipeline, "hybrid": hybrid, "bad_input": bad_input}[sys.argv[1]]())
