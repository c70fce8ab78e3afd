"""SageMaker model-parallel library (``smdistributed.modelparallel``), served by shoal.

Use ``import smdistributed.modelparallel.torch as smp``: it is the very same
module object as ``shoal.modelparallel``. ``__version__`` is the version of
SageMaker's v1 API that shoal serves, with shoal's own as its local part
(scripts and the Hugging Face Trainer compare it with "1.10" and the like).
"""

import shoal

__version__ = f"1.15.0+shoal{shoal.__version__}"
