"""The library's one piece of process state: what ``smp.init`` set up.

The SageMaker API is a module-level API (``smp.rank()``, ``smp.step``), so the
configuration, the rank layout and the process groups live in one object,
:data:`STATE`, created by :func:`init`. Calling ``init`` again replaces it
(new groups; models wrapped before must not be used any more).

Groups (all torch.distributed groups on the ``shoal`` backend, created on
every rank in the same order):

- ``ctl``: every rank; the library's own collectives (the partition plan,
  checkpoints, the gradient-norm and inf/nan agreement);
- ``pipe``: this rank's model replica (MP group); activations and gradients;
- ``grad``: this rank's DP group; gradient averaging (``ddp``);
- ``world``/``mp``/``dp``: the same sets of ranks again, for the user
  (``smp.get_*_process_group()`` and the communication helpers), so that user
  traffic never interleaves with the pipeline's.
"""

from __future__ import annotations

import atexit
import os
from typing import Any, List, Optional

import torch.distributed as dist

from ..mpcommon import config as C
from ..mpcommon.errors import SMPValidationError
from .failure import FailureMonitor
from .placement import set_limit
from ..mpcommon.topology import Topology


class _State:
    def __init__(self):
        self.initialized = False
        self.epoch = 0
        self.cfg: Optional[C.Config] = None
        self.topo: Optional[Topology] = None
        self.rank = 0
        self.world_size = 1
        self.local_rank = 0
        self.local_size = 1
        self.pp_rank = 0
        self.dp_rank = 0
        self.mp_ranks: List[int] = [0]
        self.dp_ranks: List[int] = [0]
        self.ctl = None
        self.pipe = None
        self.grad = None
        self.world = None
        self.mp = None
        self.dp = None
        self.monitor: Optional[FailureMonitor] = None
        self.model: Any = None            # the DistributedModel
        self.optimizers: List[Any] = []   # DistributedOptimizers
        self.step_ctx: Any = None         # the step being run (steps.py)

    @property
    def pp_size(self) -> int:
        return self.cfg.partitions

    @property
    def dp_size(self) -> int:
        return self.world_size // self.cfg.partitions

    def who(self) -> str:
        return f"rank {self.rank} (pp_rank {self.pp_rank}, dp_rank {self.dp_rank})"

    def internal_groups(self) -> List:
        return [g for g in (self.pipe, self.grad, self.ctl) if g is not None]


STATE = _State()


def require() -> _State:
    if not STATE.initialized:
        raise SMPValidationError("smp: call smp.init() first")
    return STATE


def _new_group(ranks: List[int]):
    return dist.new_group(ranks, backend="shoal")


def init(config=None) -> None:
    """Initialises the library (see config.py for where the config comes from)."""
    import shoal.torch  # noqa: F401  (registers the backend)

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend="shoal")
    world_size = dist.get_world_size()
    cfg = C.parse(config, world_size=world_size)
    shutdown()
    s = STATE
    s.epoch += 1
    s.cfg = cfg
    s.rank = dist.get_rank()
    s.world_size = world_size
    s.local_rank = int(os.environ.get("LOCAL_RANK", s.rank))
    s.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    s.topo = Topology(world_size, cfg.partitions, C.placement_order(cfg.placement_strategy))
    s.pp_rank = s.topo.pp_rank(s.rank)
    s.dp_rank = s.topo.dp_rank(s.rank)
    s.mp_ranks = s.topo.mp_group(s.rank)
    s.dp_ranks = s.topo.dp_group(s.rank)
    s.ctl = _new_group(list(range(world_size)))
    s.world = _new_group(list(range(world_size)))
    for ranks in s.topo.mp_groups():
        pipe, mp = _new_group(ranks), _new_group(ranks)
        if s.rank in ranks:
            s.pipe, s.mp = pipe, mp
    for ranks in s.topo.dp_groups():
        grad, dp = _new_group(ranks), _new_group(ranks)
        if s.rank in ranks:
            s.grad, s.dp = grad, dp
    store = dist.distributed_c10d._get_default_store()
    s.monitor = FailureMonitor(store, f"shoal/smp/{s.epoch}/failure", s.who(), s.internal_groups, world_size)
    s.model = None
    s.optimizers = []
    s.step_ctx = None
    s.initialized = True
    set_limit(cfg.partitions)


def shutdown() -> None:
    """Stops the failure watcher and forgets the groups (they are not destroyed:
    torch keeps them until the default group is destroyed)."""
    s = STATE
    if s.monitor is not None:
        s.monitor.stop()
        s.monitor = None
    s.initialized = False


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


atexit.register(shutdown)
