"""``smp.CheckpointManager``: a tf.train.CheckpointManager per partition.

Every rank holds every variable of the model but updates only its
partition's; save() first gives every rank of the pipeline the current value
of every variable (each broadcast from the partition that owns it), so the
model part of each partition's checkpoint is the whole, current model (it
loads into the plain, unpartitioned model) and the optimizer part holds that
partition's slots. The ranks of data-parallel rank 0 write,
``<directory>/mp_rank_<pp_rank>/``; restore() reads this partition's folder.
"""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf

from ...mpcommon import layout as L
from .. import ops
from .state import require


def sync_model(model) -> None:
    """Every model variable on every rank of the pipeline: its owner's value."""
    s = require()
    plans = getattr(model, "_smp_plans", None)
    if not plans or s.pp_size == 1:
        return
    plan = next(iter(plans.values()))
    for layer in plan.unit_layers:
        owner = plan.unit_part[id(layer)]
        for v in layer.weights:
            v.assign(ops.broadcast(tf.convert_to_tensor(v), owner, s.pipe))


class CheckpointManager:
    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str = "/opt/ml/checkpoints",
                 max_to_keep: Optional[int] = None, checkpoint_name: str = "ckpt"):
        s = require()
        self.checkpoint = checkpoint
        self.directory = L.partition_dir(directory, s.pp_rank)
        self._writer = s.dp_rank == 0
        self._mgr = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=max_to_keep,
                                               checkpoint_name=checkpoint_name)

    @property
    def latest_checkpoint(self):
        return self._mgr.latest_checkpoint

    def save(self, checkpoint_number=None) -> Optional[str]:
        s = require()
        if s.model is not None:
            sync_model(s.model)
        path = self._mgr.save(checkpoint_number=checkpoint_number) if self._writer else None
        ops.barrier(ops.Group(0, list(range(s.world_size))))
        return path

    def restore(self, restore_path: Optional[str] = None, restore_prefix: Optional[str] = None):
        path = restore_path or (os.path.join(self.directory, restore_prefix) if restore_prefix
                                else self._mgr.latest_checkpoint)
        if path is None:
            return None
        return self.checkpoint.restore(path).expect_partial()
