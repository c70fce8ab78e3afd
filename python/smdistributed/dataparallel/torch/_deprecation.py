"""One DeprecationWarning per deprecated SageMaker API (the first time it is used)."""

import functools
import threading
import warnings

_warned = set()
_lock = threading.Lock()


def warn_once(api: str, instead: str) -> None:
    with _lock:
        if api in _warned:
            return
        _warned.add(api)
    warnings.warn(f"{api} is deprecated; use {instead}", DeprecationWarning, stacklevel=3)


def deprecated(api: str, instead: str):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            warn_once(api, instead)
            return fn(*args, **kwargs)
        return inner
    return wrap
