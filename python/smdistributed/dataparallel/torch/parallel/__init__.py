"""The deprecated ``smdistributed.dataparallel.torch.parallel`` API."""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
