"""``python -m shoal.info``: what this shoal is and what it would run with.

Like ``python -m torch.utils.collect_env``, for bug reports: shoal's version;
the torch that ``shoal._C`` was built against (recorded at build time in
``shoal/_build_info.py``) and the torch imported now; where the extension,
libshoal and ``shoalrun`` are; the transports as the knobs set them; and every
SHOAL_* knob with the value in effect (the library's own table,
src/common/env.cc, through ``shoal._C.knobs()``).

Exit status 0; 1 when ``shoal._C`` cannot be loaded or was built against
another torch than the one imported.
"""
import os
import platform
import sys
from pathlib import Path

import shoal
from shoal import run as _run

# Knobs whose value the report never prints.
SECRET_KNOBS = {"SHOAL_SECRET"}


def _build_info():
    try:
        from shoal import _build_info
    except ImportError:
        return None
    return _build_info


def _loaded(name):
    """The path of the loaded shared object whose file name starts with `name`, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith(name):
                    return path
    except OSError:
        pass
    return None


def _ptrace_scope():
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None


def _transports(knobs):
    value = {name: v for name, v, _, _ in knobs}
    shm = value.get("SHOAL_SHM") or "1"
    lines = [("tcp", f"ranks on other hosts (epoll); SO_SNDBUF {value.get('SHOAL_SOCKET_BUFFER')} B")]
    if shm == "0":
        lines.append(("shm", "off (SHOAL_SHM=0): ranks of one host use TCP too"))
        lines.append(("shared arena", "off (SHOAL_SHM=0)"))
        return lines
    if shm == "copy":
        lines.append(("shm", "ranks of one host: the shared ring only (SHOAL_SHM=copy)"))
    else:
        note = ("messages from 64 KiB single-copy (process_vm_readv) where the kernel allows it, "
                "smaller ones through the shared ring")
        scope = _ptrace_scope()
        if scope not in (None, "0"):
            note += f"; kernel.yama.ptrace_scope = {scope} usually forbids it: the shared ring for all"
        lines.append(("shm", f"ranks of one host: {note}"))
    arena = value.get("SHOAL_SHM_ARENA_BYTES")
    lines.append(("shared arena", "off (SHOAL_SHM_ARENA_BYTES=0)" if arena == "0" else
                  f"when every rank is on one host: 2 slots of {arena} B per rank"))
    return lines


def report():
    """The report as a list of lines, and whether everything is in order."""
    ok = True
    out = [f"shoal:               {shoal.__version__} ({Path(shoal.__file__).parent})"]
    info = _build_info()
    if info is None:
        out.append("built against torch: unknown (no shoal/_build_info.py: shoal._C was not built)")
    else:
        out.append(f"built against torch: {info.torch_version} (python {info.python_version}, "
                   f"{info.compiler}, {info.build_type}; libshoal {info.version})")
        if info.version != shoal.__version__:
            out.append(f"  MISMATCH: libshoal {info.version} beside the Python package {shoal.__version__}")
            ok = False
    try:
        import torch
        out.append(f"torch imported:      {torch.__version__} ({Path(torch.__file__).parent})")
        if info is not None and torch.__version__ != info.torch_version:
            out.append("  MISMATCH: shoal._C was built against another torch; rebuild shoal against this one")
            ok = False
    except Exception as e:  # noqa: BLE001 (a report: any failure to load is what it shows)
        out.append(f"torch imported:      cannot be imported: {e}")
        ok = False
    out.append(f"python:              {platform.python_version()} ({sys.executable})")
    knobs = None
    try:
        from shoal import _C
        knobs = _C.knobs()
        out.append(f"shoal._C:            {_C.__file__}")
        out.append(f"libshoal:            {_loaded('libshoal.') or 'not loaded'}")
    except Exception as e:  # noqa: BLE001
        out.append(f"shoal._C:            cannot be loaded: {e}")
        ok = False
    out.append(f"shoalrun:            {_run.find_shoalrun() or 'not found'}")
    if knobs is None:
        set_here = sorted(k for k in os.environ if k.startswith("SHOAL_"))
        out.append("knobs:               unknown without shoal._C; set here: " + (", ".join(set_here) or "none"))
        return out, ok
    out.append("transports:")
    out += [f"  {name:<17} {what}" for name, what in _transports(knobs)]
    out.append("knobs (docs/knobs.md; * = set in the environment, else the default):")
    width = max(len(name) for name, _, _, _ in knobs)
    for name, value, is_set, shown_default in knobs:
        if is_set:
            shown = "(set, not shown)" if name in SECRET_KNOBS else value
        elif shown_default and (value is None or shown_default != value):
            shown = shown_default
        else:
            shown = value if value is not None else "(none)"
        out.append(f"  {'*' if is_set else ' '} {name:<{width}}  {shown.replace('`', '')}")
    return out, ok


def main():
    lines, ok = report()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
