"""``smdistributed.dataparallel.torch.parallel.distributed.DistributedDataParallel``.

torch's DistributedDataParallel with the SageMaker library's signature; the
first construction emits a DeprecationWarning.
"""

import torch.nn.parallel as _parallel

from .. import torch_smddp  # noqa: F401  (registers "smddp")
from .._deprecation import warn_once

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(_parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None):
        warn_once("smdistributed.dataparallel.torch.parallel.DistributedDataParallel",
                  "torch.nn.parallel.DistributedDataParallel with backend='smddp'")
        super().__init__(module, device_ids=device_ids, output_device=output_device,
                         broadcast_buffers=broadcast_buffers, process_group=process_group,
                         bucket_cap_mb=25 if bucket_cap_mb is None else bucket_cap_mb)
