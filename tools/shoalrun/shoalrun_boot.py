"""shoalrun's bootstrap for Python workers.

    python shoalrun_boot.py train.py [args]      run a script, like `python train.py`
    python shoalrun_boot.py -m module [args]     run a module, like `python -m module`

The script or module runs as __main__ with sys.argv and sys.path[0] set as
Python itself would set them. If it raises an uncaught exception (SystemExit
excepted), the exception's type, message and traceback are written as JSON to
the file named by $SHOAL_ERROR_FILE, which shoalrun reads to report the
failure; then the traceback is printed and the worker exits with 1 as usual.
"""
import json
import os
import runpy
import sys
import time
import traceback

_BOOT_PID = os.getpid()
_HIDDEN = (os.path.abspath(__file__), runpy.__file__, "<frozen runpy>")


def _user_traceback(exc):
    """The exception's traceback without the bootstrap's and runpy's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _HIDDEN:
        tb = tb.tb_next
    return tb


def _write_error_file(exc, tb):
    path = os.environ.get("SHOAL_ERROR_FILE")
    # A process forked by the worker is not the worker.
    if not path or os.getpid() != _BOOT_PID:
        return
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else kind.__module__ + "." + kind.__qualname__
    record = {
        "type": name,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(kind, exc, tb)),
        "rank": os.environ.get("RANK"),
        "pid": os.getpid(),
        "time": time.time(),
    }
    try:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        pass


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit("shoalrun_boot: usage: shoalrun_boot.py (script | -m module) [args]")
    try:
        if args[0] == "-m":
            if len(args) < 2:
                sys.exit("shoalrun_boot: -m needs a module name")
            module = args[1]
            sys.argv = [module] + args[2:]
            sys.path[0] = os.getcwd()
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script = args[0]
            sys.argv = args
            if os.path.isdir(script):
                del sys.path[0]  # run_path puts the directory itself first
            else:
                sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        _write_error_file(exc, _user_traceback(exc))
        raise
    except BaseException as exc:  # noqa: B902 - report everything the worker did not catch
        tb = _user_traceback(exc)
        _write_error_file(exc, tb)
        traceback.print_exception(type(exc), exc, tb)
        sys.stderr.flush()
        sys.exit(1)


if __name__ == "__main__":
    main()
