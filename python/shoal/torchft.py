"""shoal as a process group for torchft (docs/torchft.md).

``ProcessGroupShoal`` is what torchft's ``Manager`` reconfigures at every
quorum change, as it does ``torchft.process_group.ProcessGroupGloo``::

    from shoal.torchft import ProcessGroupShoal
    manager = torchft.Manager(pg=ProcessGroupShoal(), min_replica_size=2, ...)

Each ``configure(store_addr, replica_id, rank, world_size, ...)`` (the
contract of torchft 0.2.0, the version ``pip install shoal[torchft]`` pins)
aborts the group's previous communicator locally and builds a fresh shoal
backend over ``host:port/prefix``, the store prefix torchft draws anew for
each quorum. The group serves CPU tensors and every device shoal.torch serves
(``shoal.torch.DEVICES``: CUDA or ROCm, a named PrivateUse1 device).

``abort()`` never waits for a peer: it breaks the communicator (pending and
later operations fail with Aborted) and drops it. ``errored()`` returns the
first cause that broke the communicator (a lost peer, a timeout, an abort),
named as shoal names it, or None.

An operation that fails because the communicator broke does not raise from
``Work.wait()``: wait() returns False, the Work's future carries the error,
and ``errored()`` names it, as torchft's Manager expects of a process group
(its ProcessGroupNCCL behaves so). torchft's DistributedDataParallel needs it:
its comm hook asserts on the future chain that Manager's work wrapper never
builds when wait() raises (torchft 0.2.0, ddp.py ``assert fut._fut``), so a
lost peer would crash the survivors instead of skipping the step. Any other
failure (a bad argument) raises as usual.
"""

from __future__ import annotations

import os
import zlib
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.distributed import Store
from torch.distributed.distributed_c10d import Work

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "shoal.torchft needs torchft (pip install 'shoal[torchft]', or torchft==0.2.0 with --no-deps "
        "next to an installed torch)") from e

import shoal.torch as shoal_torch

__all__ = ["ProcessGroupShoal"]

# Job ranks are how shoal finds an earlier communicator to share connections
# with (Communicator::create_or_split). torch.distributed numbers processes
# from 0; a torchft group's members are another numbering, and its
# membership may change at every configure. Each configure therefore names
# its members in a range of negative numbers drawn from its store address,
# which torchft makes unique per quorum: no communicator of a torch group,
# nor of an earlier quorum, holds them, so every configure wires a fresh
# communicator of its own (new store keys, new connections).
_RANK_BITS = 24


def _job_ranks(store_addr: str, world_size: int) -> List[int]:
    base = -((zlib.crc32(store_addr.encode()) + 1) << _RANK_BITS)
    return [base + r for r in range(world_size)]


def _advertise_host(store_addr: str) -> str:
    """Where peers reach this rank: the route to the quorum's store host (the
    one address every member reaches), unless SHOAL_ADVERTISE_ADDR says it;
    '' lets shoal decide (MASTER_ADDR, else 127.0.0.1)."""
    if os.environ.get("SHOAL_ADVERTISE_ADDR"):
        return ""
    host = store_addr.partition("/")[0].rpartition(":")[0].strip("[]")
    if not host or shoal_torch._is_loopback(host):
        return ""
    return shoal_torch._route_to(host)


class _Work(Work):
    """A shoal Work whose wait() reports a broken communicator by returning
    False (the future still carries the error) instead of raising."""

    def __init__(self, work: Work, backend: "shoal_torch.ShoalBackend") -> None:
        super().__init__()
        self._work = work
        self._backend = backend

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception:
            if self._backend.comm_error():
                return False  # errored() names the cause; the future carries it
            raise

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def synchronize(self) -> None:
        self._work.synchronize()


class ProcessGroupShoal(ProcessGroupWrapper):
    """A reconfigurable shoal process group for torchft.

    Args:
        timeout: the default timeout of every collective, and of building the
            group at configure (the store client's timeout too).
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._backend: Optional[shoal_torch.ShoalBackend] = None
        self._store_addr: str = ""
        self._errored: Optional[Exception] = None

    def getBackendName(self) -> str:
        return "torchft-shoal"

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[list[int]] = None,
    ) -> None:
        # ProcessGroupWrapper.configure aborts the previous group (abort,
        # errored=False), makes the PrefixStore client and calls _create_pg.
        self._store_addr = store_addr
        super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank,
                          group_world_size, global_ranks)

    def _create_pg(self, store: Store, rank: int, world_size: int) -> dist.ProcessGroup:
        self._errored = None
        name = f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank}"
        backend = shoal_torch.ShoalBackend(
            store, rank, world_size, timeout_s=self._timeout.total_seconds(), name="shoal",
            group_name=name, advertise_host=_advertise_host(self._store_addr),
            global_ranks=_job_ranks(self._store_addr, world_size),
            # The store lives in whichever replica the lighthouse chose: not known here.
            store_host_rank=-1)
        backend._set_sequence_number_for_group()
        pg = dist.ProcessGroup(store, rank, world_size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        for device in shoal_torch.DEVICES:
            pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, backend)
        self._backend = backend
        return pg

    def _wrap_work(self, work: Work, opts: object) -> Work:
        backend = self._backend
        return work if work is None or backend is None else _Work(work, backend)

    def abort(self, errored: bool = True) -> None:
        """Breaks the communicator (locally: never waits for a peer) and drops it."""
        backend = self._backend
        if errored and backend is not None:
            cause = backend.comm_error()  # keep the first cause when there is one
            self._errored = RuntimeError(cause or "shoal: process group aborted (torchft)")
        # Drop our reference first: the ProcessGroup's, released below by the
        # wrapper, frees the backend without holding the GIL (its completion
        # threads may be running Python callbacks).
        self._backend = None
        if backend is not None:
            backend.abort()
            del backend
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Closes the communicator (its connections, at once) and drops it."""
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.shutdown()
            del backend
        super().shutdown()

    def errored(self) -> Optional[Exception]:
        """The first cause that broke the communicator (or the abort), else None."""
        backend = self._backend
        if backend is not None:
            cause = backend.comm_error()
            if cause:
                return RuntimeError(cause)
        return self._errored

    def set_timeout(self, timeout: timedelta) -> None:
        """The default timeout of later operations, and of the next configure."""
        super().set_timeout(timeout)
        backend = self._backend
        if backend is not None:
            backend.set_timeout(timeout)

    def __repr__(self) -> str:
        return f"ProcessGroupShoal(pg={self._pg})"
