"""``smdistributed.modelparallel.torch``: an alias of ``shoal.modelparallel``.

Importing this module makes ``sys.modules`` map it, and each of its
submodules (``...torch.amp``, ...), to shoal's, so
``import smdistributed.modelparallel.torch as smp`` yields the very module
object ``shoal.modelparallel`` and there is one library state per process.
"""

import sys

import shoal.modelparallel as _smp

for _name, _mod in list(sys.modules.items()):
    if _name.startswith("shoal.modelparallel."):
        sys.modules["smdistributed.modelparallel.torch." + _name[len("shoal.modelparallel."):]] = _mod
sys.modules[__name__] = _smp
