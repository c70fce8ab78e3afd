"""``smdistributed.modelparallel.torch``: an alias of ``shoal.modelparallel``.

Importing this module makes it, and each of its submodules
(``...torch.amp``, ``...torch.nn.huggingface.gpt2``, ...), the very module
object of shoal's, so ``import smdistributed.modelparallel.torch as smp``
yields ``shoal.modelparallel`` and there is one library state per process.
"""

import shoal.modelparallel  # noqa: F401

from ..._alias import alias

alias(__name__, "shoal.modelparallel")
