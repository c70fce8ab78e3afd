"""Importing this module registers the ``smddp`` torch.distributed backend.

It is shoal's engine under the SageMaker name, so that scripts written for the
SageMaker data-parallel library run unchanged::

    import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    torch.distributed.init_process_group(backend="smddp")
"""

import shoal.torch as _shoal_torch

_shoal_torch.register("smddp")
