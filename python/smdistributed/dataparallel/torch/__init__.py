"""``smdistributed.dataparallel.torch``.

Current API: ``import smdistributed.dataparallel.torch.torch_smddp`` and then
``torch.distributed.init_process_group(backend="smddp")``. The deprecated API
lives in ``.distributed`` and ``.parallel``.
"""
