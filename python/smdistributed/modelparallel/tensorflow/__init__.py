"""``smdistributed.modelparallel.tensorflow``: an alias of
``shoal.tensorflow.modelparallel`` (the very same module object, so there is
one library state per process)."""

import sys

import shoal.tensorflow.modelparallel as _smp

for _name, _mod in list(sys.modules.items()):
    if _name.startswith("shoal.tensorflow.modelparallel."):
        sys.modules["smdistributed.modelparallel.tensorflow." + _name[len("shoal.tensorflow.modelparallel."):]] = _mod
sys.modules[__name__] = _smp
