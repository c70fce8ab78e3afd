"""Failure propagation: one rank's error ends every rank, naming it.

A pipeline rank that fails while the others wait for its activations or
gradients would leave them blocked in a receive. So, when an exception escapes
a step (or the partitioning, or a checkpoint collective) on some rank:

1. that rank writes a record, "rank R (pp_rank P, dp_rank D): where: Type:
   message", under a key of the job's rendezvous store (the first record wins),
   then aborts its own model-parallel process groups and re-raises its
   exception;
2. every rank runs a watcher thread that polls the store for that key (a
   single cheap ``check`` every 50 ms, or every world size x 5 ms beyond 10
   ranks, so that the store sees at most about 200 checks a second); when it
   appears, the watcher aborts the rank's model-parallel groups, so every
   operation blocked on them fails at once;
3. the rank's step sees its operation fail, finds the record, and raises
   :class:`SMPRemoteError` with the failing rank's message.

A rank that dies without raising (killed) is caught by shoal itself: its
peers' operations fail with "peer lost: rank R", and the rank that sees it
writes that as the record. The groups cannot be used after an abort; the
library refuses later steps with the same error.
"""

from __future__ import annotations

import threading
import traceback
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..mpcommon.errors import SMPRemoteError


class FailureMonitor:
    POLL_S = 0.05

    def __init__(self, store, key: str, who: str, groups: Callable[[], List], world_size: int = 1):
        self.poll_s = max(self.POLL_S, 0.005 * world_size)
        self.store = store
        self.key = key
        self.who = who
        self.groups = groups
        self.broken: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="smp-failure-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                hit = self.store.check([self.key])
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if hit:
                self.broken = self.broken or self.record()
                self.abort()
                return

    def abort(self) -> None:
        for g in self.groups():
            try:
                g._get_backend(torch.device("cpu")).abort()
            except Exception:  # noqa: BLE001
                pass

    def record(self) -> Optional[str]:
        """The first failure's record, if any rank wrote one."""
        try:
            if self.store.check([self.key]):
                return self.store.get(self.key).decode(errors="replace")
        except Exception:  # noqa: BLE001
            return None
        return None

    def fail(self, exc: BaseException, where: str) -> BaseException:
        """Called with an exception that escaped `where` on this rank. Returns the
        exception to raise: SMPRemoteError when this is a communication failure
        caused by another rank's failure, else `exc` itself, after publishing it
        for the other ranks (unless another rank's record is there already)."""
        if isinstance(exc, SMPRemoteError):
            self.broken = self.broken or str(exc)
            self.abort()
            return exc
        remote = self.record()
        if remote is not None and not remote.startswith(self.who + " ") and _is_comm_failure(exc):
            self.broken = remote
            self.abort()
            return SMPRemoteError(f"smp: {remote}")
        msg = f"{self.who} {where}: {type(exc).__name__}: {exc}"
        if len(msg) > 4000:
            msg = msg[:4000] + " ..."
        if remote is None:
            try:
                if self.store.add(self.key + "/count", 1) == 1:
                    self.store.set(self.key, msg)
                else:
                    remote = self.record()
            except Exception:  # noqa: BLE001 - the store is unreachable; shoal names the lost rank
                traceback.print_exc()
        self.broken = remote or msg
        self.abort()
        return exc

    def check(self) -> None:
        """Raises if the library is broken by an earlier failure."""
        if self.broken is not None:
            raise SMPRemoteError(f"smp: an earlier failure broke the model-parallel groups: {self.broken}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)


def _is_comm_failure(exc: BaseException) -> bool:
    """A failed operation on a process group (what an abort or a lost peer causes)."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("shoal rank" in text or "aborted" in text.lower())
