"""``smdistributed.dataparallel.tensorflow.keras``: the Keras flavour
(``init``, ranks, ``DistributedOptimizer``, ``callbacks``)."""

from .. import DistributedOptimizer, init, local_rank, local_size, rank, size  # noqa: F401
from . import callbacks  # noqa: F401
