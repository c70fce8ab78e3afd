"""One package served under another name: ``smdistributed.<x>`` is shoal's module itself.

:func:`alias` maps the package and every submodule, imported before or
after, so that ``import smdistributed.modelparallel.torch.nn.huggingface.gpt2``
yields the very module object ``shoal.modelparallel.nn.huggingface.gpt2``
(one library state per process, relative imports resolved in shoal).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, name: str, target: str):
        self.name, self.target = name, target

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(self.name + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(self.target + spec.name[len(self.name):])

    def exec_module(self, module):
        pass


def alias(name: str, target: str) -> None:
    """Serves `target` (already imported) and its submodules as `name`."""
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith(target + "."):
            sys.modules[name + mod_name[len(target):]] = mod
    if not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, target))
    sys.modules[name] = sys.modules[target]
