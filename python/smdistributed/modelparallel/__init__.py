"""SageMaker model-parallel library (``smdistributed.modelparallel``), served by shoal.

Use ``import smdistributed.modelparallel.torch as smp``: it is the very same
module object as ``shoal.modelparallel``.
"""
