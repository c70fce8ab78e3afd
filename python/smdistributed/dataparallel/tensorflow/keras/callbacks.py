"""Keras callbacks of ``smdistributed.dataparallel.tensorflow.keras``."""

from shoal.tensorflow.data_parallel import BroadcastGlobalVariablesCallback  # noqa: F401
