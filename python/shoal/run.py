"""``python -m shoal.run``: shoalrun, started the way ``python -m torch.distributed.run`` is.

    python -m shoal.run --nproc-per-node 2 train.py [args]

Every argument goes to the ``shoalrun`` binary unchanged (docs/launcher.md).
Python workers run under this interpreter (``SHOAL_PYTHON``, unless already
set), as torchrun runs them under ``sys.executable``.

``main`` is also the ``shoalrun`` console script of the installed package
(docs/install.md).

The binary is looked for, first match wins: beside the package
(``shoal/bin/shoalrun``, where the wheel puts it), in the build tree of a
source checkout the package comes from (``build/bin/shoalrun``), on ``PATH``,
then in this interpreter's prefix (``<prefix>/bin/shoalrun``). The console
script itself, found on ``PATH`` or in the prefix, does not count: it would
run itself for ever. Without one, a one-line error and exit code 2.
"""
import os
import shutil
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def candidates():
    """Where shoalrun may be, in the order they are tried (PATH is looked up separately)."""
    yield _PACKAGE / "bin" / "shoalrun"
    yield _PACKAGE.parents[1] / "build" / "bin" / "shoalrun"


def _is_console_script(path):
    """Whether `path` is a script that runs this module (the package's ``shoalrun`` entry point)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError:
        return False
    return head.startswith(b"#!") and b"shoal.run" in head


def find_shoalrun():
    """The shoalrun binary to run, or None."""
    for path in candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    on_path = shutil.which("shoalrun")
    if on_path and not _is_console_script(on_path):
        return on_path
    in_prefix = Path(sys.prefix) / "bin" / "shoalrun"
    if in_prefix.is_file() and os.access(in_prefix, os.X_OK) and not _is_console_script(in_prefix):
        return str(in_prefix)
    return None


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    exe = find_shoalrun()
    if exe is None:
        looked = ", ".join(str(p) for p in candidates())
        sys.stderr.write(f"shoal.run: error: no shoalrun binary found (looked in {looked}, on PATH and in "
                         f"{Path(sys.prefix) / 'bin'}); build it with `make build`, or reinstall shoal\n")
        return 2
    env = dict(os.environ)
    env.setdefault("SHOAL_PYTHON", sys.executable)
    os.execve(exe, [exe, *args], env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
