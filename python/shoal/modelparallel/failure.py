"""Failure propagation, scoped to the data-parallel replica: one rank's error
ends its replica at once, naming it; it reaches another replica only through
the groups that cross replicas, when that replica next averages gradients.

A pipeline rank that fails while the others wait for its activations or
gradients would leave them blocked in a receive, and a replica that fails
while the others wait for its gradients would leave them blocked in the
gradient average. So, when an exception escapes a step (or the partitioning,
or a checkpoint collective) on some rank:

1. that rank writes a record, "rank R (pp_rank P, dp_rank D): where: Type:
   message", under a key of the job's rendezvous store (the job's first
   record wins) and under a key of its replica (the replica's first record
   wins), aborts its groups and re-raises its exception. A failed collective
   that another rank's failure caused (its record is there) is raised as
   :class:`SMPRemoteError` with that record, which becomes this replica's;
2. every rank runs a watcher thread that polls the store (a single cheap
   ``check`` every 50 ms, or every world size x 5 ms beyond 10 ranks, so
   that the store sees at most about 200 checks a second), first for the
   job's record, on which it aborts the rank's groups that cross replicas
   (the DP and RDP gradient groups, the control group), so that a gradient
   average waiting for a failed replica fails at once; then for its
   replica's record, on which it aborts the replica's own groups (pipeline,
   TP) too, so that every receive blocked on the failed rank fails at once;
3. the rank's step sees its operation fail, finds the record, and raises
   :class:`SMPRemoteError` with the failing rank's message.

A rank that dies without raising (killed) is caught by shoal itself: its
peers' operations fail with "peer lost: rank R", and the rank that sees it
writes that as the record. The replica's groups have connections of their
own (state.py), so a rank lost in one replica breaks nothing in another:
the other replicas' pipelines go on with steps that skip the gradient
average (``backward_passes_per_step``), and their next average fails naming
the lost rank. A replica ends as a unit (every rank of a broken replica
refuses later steps with the same error): one pipeline stage's average may
complete while another's fails, so a replica that went on after a failed
average could run its stages a step apart.
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

    def __init__(self, store, key: str, who: str, replica: int, replica_groups: Callable[[], List],
                 crossing_groups: Callable[[], List], world_size: int = 1):
        """`key`: the job's record (`key`/replica/<replica>: this replica's); `replica_groups()` and
        `crossing_groups()`: this rank's groups within its replica and those that cross replicas."""
        self.poll_s = max(self.POLL_S, 0.005 * world_size)
        self.store = store
        self.key = key
        self.replica_key = f"{key}/replica/{replica}"
        self.who = who
        self.replica_groups = replica_groups
        self.crossing_groups = crossing_groups
        self.broken: Optional[str] = None    # this replica's failure: its groups are aborted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="smp-failure-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        key = self.key   # the job's record first, then the replica's (written after it)
        while not self._stop.wait(self.poll_s):
            try:
                hit = self.store.check([key])
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if not hit:
                continue
            record = self._read(key)
            self.abort(replica=key == self.replica_key, reason=record)
            if key == self.replica_key:
                self.broken = self.broken or record
                return
            key = self.replica_key

    def abort(self, replica: bool = True, reason: Optional[str] = None) -> None:
        """Aborts the groups crossing replicas and, with `replica`, the replica's own; their
        operations fail naming `reason` (the failure's record)."""
        why = f"smp: a rank failed: {reason}" if reason else "smp: a rank failed"
        for g in self.crossing_groups() + (self.replica_groups() if replica else []):
            try:
                be = g._get_backend(torch.device("cpu"))
                if hasattr(be, "abort_because"):
                    be.abort_because(why)
                else:
                    be.abort()
            except Exception:  # noqa: BLE001
                pass

    def _read(self, key: str) -> Optional[str]:
        try:
            if self.store.check([key]):
                return self.store.get(key).decode(errors="replace")
        except Exception:  # noqa: BLE001
            return None
        return None

    def record(self) -> Optional[str]:
        """The job's first failure's record, if any rank wrote one."""
        return self._read(self.key)

    def _publish(self, key: str, msg: str) -> Optional[str]:
        """Writes `msg` under `key` unless a record is there first; returns that one (None: ours)."""
        try:
            if self.store.add(key + "/count", 1) == 1:
                self.store.set(key, msg)
                return None
            return self._read(key)
        except Exception:  # noqa: BLE001 - the store is unreachable; shoal names the lost rank
            traceback.print_exc()
            return None

    def fail(self, exc: BaseException, where: str) -> BaseException:
        """Called with an exception that escaped `where` on this rank. Returns the
        exception to raise: SMPRemoteError when this is a communication failure
        caused by another rank's failure (this replica's first, else the job's),
        else `exc` itself, after publishing it for the other ranks (unless
        another rank's record is there already). Either way this replica ends."""
        if isinstance(exc, SMPRemoteError):
            self._end(str(exc))
            return exc
        comm = _is_comm_failure(exc)
        remote = self._read(self.replica_key) or (self.record() if comm else None)
        if remote is not None and remote.startswith(self.who + " "):
            remote = None
        if remote is not None and comm:
            self._end(self._publish(self.replica_key, remote) or remote)
            return SMPRemoteError(f"smp: {remote}")
        msg = f"{self.who} {where}: {type(exc).__name__}: {exc}"
        if len(msg) > 4000:
            msg = msg[:4000] + " ..."
        if remote is None:
            self._publish(self.key, msg)
            remote = self._publish(self.replica_key, msg)
        self._end(remote or msg)
        return exc

    def _end(self, record: str) -> None:
        """This replica is broken by `record`: its groups and those crossing replicas are aborted."""
        self.broken = self.broken or record
        self.abort(reason=record)

    def check(self) -> None:
        """Raises if this replica is broken by an earlier failure."""
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
