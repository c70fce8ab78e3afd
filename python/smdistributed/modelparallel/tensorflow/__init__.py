"""``smdistributed.modelparallel.tensorflow``: an alias of
``shoal.tensorflow.modelparallel`` (the very same module object, and its
submodules, so there is one library state per process)."""

import shoal.tensorflow.modelparallel  # noqa: F401

from ..._alias import alias

alias(__name__, "shoal.tensorflow.modelparallel")
