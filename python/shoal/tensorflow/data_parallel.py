"""Data parallelism for TensorFlow 2 and Keras: gradients averaged across ranks
with fused collectives, and variables broadcast from one rank.

    import shoal.tensorflow as st
    st.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = st.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over the ranks
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        st.broadcast_variables(model.variables, root_rank=0)
        st.broadcast_variables(opt.variables, root_rank=0)
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import tensorflow as tf

from . import ops


def reduce_gradients(grads: List, op: str = "average", group: Optional[ops.Group] = None,
                     fusion_bytes: int = 64 << 20, sparse_as_dense: bool = False) -> List:
    """Reduces a list of gradients (None stays None): dense ones in fused
    buckets, one collective per bucket; IndexedSlices (embedding gradients)
    by gathering their rows and indices from every rank (or as dense
    tensors with sparse_as_dense)."""
    out = list(grads)
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                out[i] = g = tf.convert_to_tensor(g)
            else:
                values = ops.allgather(g.values, group)
                if ops._op(op) == "avg":
                    values = values / tf.cast(ops.group_size(group), values.dtype)
                elif ops._op(op) != "sum":
                    raise ValueError(f"shoal.tensorflow (rank {ops.rank()}): sparse gradients reduce with sum or "
                                     f"average only, not {op!r} (pass sparse_as_dense=True)")
                out[i] = tf.IndexedSlices(values, ops.allgather(g.indices, group), g.dense_shape)
                continue
        dense.append(i)
    reduced = ops.allreduce_n([out[i] for i in dense], op, group, fusion_bytes)
    for i, r in zip(dense, reduced):
        out[i] = r
    return out


class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns the gradients reduced
    (averaged by default) across the ranks of `group`."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression=None, sparse_as_dense: bool = False, op: str = "average",
                 group: Optional[ops.Group] = None, fusion_bytes: int = 64 << 20):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape: gradtape must be a tf.GradientTape, got "
                            f"{type(gradtape).__name__}")
        if compression not in (None, "none") and getattr(compression, "name", "none") != "none":
            raise ValueError(f"DistributedGradientTape: compression {compression!r} is not supported "
                             f"(shoal sends gradients uncompressed)")
        self._tape, self._op, self._group = gradtape, op, group
        self._sparse_as_dense, self._fusion = sparse_as_dense, fusion_bytes

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = reduce_gradients(flat, self._op, self._group, self._fusion, self._sparse_as_dense)
        return tf.nest.pack_sequence_as(grads, reduced)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def DistributedOptimizer(optimizer, name: Optional[str] = None, device_dense: str = "", device_sparse: str = "",
                         compression=None, sparse_as_dense: bool = False, op: str = "average",
                         group: Optional[ops.Group] = None, fusion_bytes: int = 64 << 20,
                         backward_passes_per_step: int = 1):
    """A Keras optimizer whose apply (and apply_gradients, and so model.fit)
    reduces the gradients across the ranks first. The object keeps its
    class's behaviour: it is an instance of a subclass of that class."""
    if backward_passes_per_step != 1:
        raise ValueError("DistributedOptimizer: backward_passes_per_step other than 1 is not supported")
    base = type(optimizer)
    if getattr(base, "_shoal_distributed", False):
        return optimizer

    def apply(self, grads, trainable_variables=None):
        grads = reduce_gradients(list(grads), op, group, fusion_bytes, sparse_as_dense)
        return base.apply(self, grads, trainable_variables)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = reduce_gradients([g for g, _ in grads_and_vars], op, group, fusion_bytes, sparse_as_dense)
        return base.apply_gradients(self, list(zip(grads, [v for _, v in grads_and_vars])), *args, **kwargs)

    # Keras 3: apply_gradients (and fit) go through apply; Keras 2 has no apply.
    hook = {"apply": apply} if hasattr(base, "apply") else {"apply_gradients": apply_gradients}
    cls = type(base.__name__, (base,), {**hook, "_shoal_distributed": True, "__module__": base.__module__})
    optimizer.__class__ = cls
    return optimizer


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int = 0,
                        group: Optional[ops.Group] = None) -> None:
    """Assigns every variable the value it has on `root_rank`."""
    variables = list(variables)
    for v in variables:
        v.assign(ops.broadcast(tf.convert_to_tensor(v), root_rank, group))


def broadcast_global_variables(root_rank: int = 0) -> None:
    """TF1's global variables from `root_rank`. Eager TensorFlow 2 keeps no
    global collection: pass the variables to broadcast_variables."""
    if tf.executing_eagerly():
        raise RuntimeError(f"broadcast_global_variables (rank {ops.rank()}): TensorFlow 2 runs eagerly and has no "
                           f"global variables; call broadcast_variables(model.variables, root_rank={root_rank}) "
                           f"and broadcast_variables(optimizer.variables, root_rank={root_rank}) after the "
                           f"first step")
    broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _keras():
    from tensorflow import keras
    return keras


class BroadcastGlobalVariablesCallback(_keras().callbacks.Callback):
    """Keras callback: broadcasts the model's and optimizer's variables from
    `root_rank` at the end of the first batch (when the optimizer has built its
    state), so every rank trains the same model."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank, self._done = root_rank, False

    def on_train_batch_end(self, batch, logs=None):
        if self._done:
            return
        broadcast_variables(self.model.variables, self.root_rank)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            broadcast_variables(opt.variables, self.root_rank)
        self._done = True
