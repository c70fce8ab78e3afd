"""The test-only accelerator (tests/fakegpu/fakegpu.cc) as torch device "fakegpu".

``load()`` imports the extension from the build tree, names torch's
PrivateUse1 device "fakegpu" and gives it the small device module torch looks
for (``torch.fakegpu``). Import it before ``shoal`` so that the backend
serves the device (shoal serves the PrivateUse1 device when it is named).
"""

import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
NAME = "fakegpu"
_ext = None


def _find():
    build = os.environ.get("SHOAL_CMAKE_BUILD_DIR") or str(ROOT / "build")
    folder = Path(build) / "tests" / "fakegpu"
    found = sorted(folder.glob("_fakegpu*.so"))
    if not found:
        raise RuntimeError(f"the fakegpu extension is not built (no _fakegpu*.so in {folder}); run `make build`")
    return found[0]


def load():
    global _ext
    if _ext is not None:
        return _ext
    spec = importlib.util.spec_from_file_location("_fakegpu", _find())
    _ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_ext)
    torch.utils.rename_privateuse1_backend(NAME)
    mod = types.ModuleType(f"torch.{NAME}")
    state = {"device": 0}
    mod.is_available = lambda: True
    mod.device_count = lambda: 2
    mod.current_device = lambda: state["device"]
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed_all = lambda seed: None
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]   # torch.autocast("fakegpu")

    def set_device(d):
        state["device"] = torch.device(NAME, d).index if not isinstance(d, int) else d
    mod.set_device = set_device
    mod.synchronize = lambda device=None: torch.accelerator.synchronize(device)
    mod.current_stream = lambda device=None: torch.accelerator.current_stream(device)
    mod.set_stream = torch.accelerator.set_stream
    mod.Stream = lambda device=None, priority=0, **kw: torch.Stream(device=device or NAME, priority=priority)
    mod.Event = lambda enable_timing=False, **kw: torch.Event(device=NAME, enable_timing=enable_timing)

    def stream(s):
        return s if s is not None else torch.accelerator.current_stream()
    mod.stream = stream
    torch._register_device_module(NAME, mod)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    sys.modules.setdefault(f"torch.{NAME}", mod)
    return _ext
