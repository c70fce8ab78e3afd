"""``smp.init`` for PyTorch: the library's state (shoal.mpcommon.state) and its groups.

The configuration, the rank layout and the current model live in
:data:`STATE` (framework-free part: mpcommon/state.py); this module adds the
torch.distributed groups. Calling ``init`` again replaces them (new groups;
models wrapped before must not be used any more).

Groups (all torch.distributed groups on the ``shoal`` backend, created on
every rank in the same order):

- ``ctl``: every rank; the library's own collectives (the partition plan,
  checkpoints, the gradient-norm and inf/nan agreement);
- ``pipe``: this rank's pipeline (PP group); activations and gradients;
- ``grad``: this rank's DP group; gradients of replicated parameters (``ddp``);
- ``rdp_grad``: this rank's RDP group; gradients of tensor-parallel pieces;
- ``tpg``: this rank's TP group; the tensor-parallel modules' collectives;
- ``world``/``mp``/``pp``/``tp``/``dp``/``rdp``: the same sets of ranks again,
  for the user (``smp.get_*_process_group()`` and the communication helpers),
  so that user traffic never interleaves with the library's.

Without tensor parallelism TP groups have one rank and are not created
(``tpg``/``tp`` are groups of this rank alone only when asked), and the RDP
groups are the DP groups (``rdp_grad`` is ``grad``).

The groups within one data-parallel replica (``pipe``/``pp``, ``mp``,
``tpg``/``tp``) have connections of their own; those that cross replicas
(``ctl``/``world``, ``grad``/``dp``, ``rdp_grad``/``rdp``) share the
default group's. So a rank lost in one replica breaks the groups that
contain it and no others: the other replicas' pipelines go on, and the
gradient groups fail naming the lost rank (failure.py). Own connections
cost each such group a listening socket per rank and connections (or
shared-memory rings) to the peers it talks to (docs/torch.md).
"""

from __future__ import annotations

import atexit
import os
import socket
from typing import Any, List, Optional

import torch.distributed as dist

import shoal.torch  # registers the backend; its Options

from ..mpcommon import config as C
from ..mpcommon import state as core
from ..mpcommon.errors import SMPConfigError
from .failure import FailureMonitor
from .placement import set_limit


class _State(core.State):
    def __init__(self):
        super().__init__()
        # the library's groups (control, pipeline, gradients) and the user's (world, mp, dp)
        self.ctl = self.pipe = self.grad = self.rdp_grad = self.tpg = None
        self.world = self.mp = self.pp = self.tp = self.dp = self.rdp = None
        self.monitor: Optional[FailureMonitor] = None
        self.optimizers: List[Any] = []   # DistributedOptimizers
        self.step_ctx: Any = None         # the step being run (steps.py)

    def replica_groups(self) -> List:
        """The library's groups within this rank's data-parallel replica."""
        return [g for g in (self.pipe, self.tpg) if g is not None]

    def crossing_groups(self) -> List:
        """The library's groups that cross replicas."""
        return [g for g in (self.grad, self.rdp_grad, self.ctl) if g is not None]


STATE = _State()
require = STATE.require

# The kinds of group within one data-parallel replica (mpcommon/topology.py).
_REPLICA_KINDS = ("pp", "mp", "tp")
# The library's groups that cross replicas (the failure monitor aborts them).
_ABORTED = ("grad", "rdp_grad")


def _new_group(ranks: List[int], own_connections: bool = False):
    """A shoal group; with `own_connections` it gets connections of its own instead of sharing those
    of the first communicator holding its ranks: its collectives need no common order with that
    communicator's, and it fails only with its own members (docs/torch.md)."""
    opts = shoal.torch.Options(own_connections=True) if own_connections else None
    return dist.new_group(ranks, backend="shoal", pg_options=opts)


def init(config=None) -> None:
    """Initialises the library (see mpcommon/config.py for where the config comes from)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            if os.environ.get("WORLD_SIZE", "1") != "1":
                raise SMPConfigError(
                    f"smp.init: WORLD_SIZE is {os.environ['WORLD_SIZE']} but RANK is not set: start the job with "
                    f"a launcher (shoalrun, torchrun, mpirun), or unset WORLD_SIZE to run one process")
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend="shoal")
    world_size = dist.get_world_size()
    cfg = C.parse(config, world_size=world_size)
    shutdown()
    s = STATE
    rank = dist.get_rank()
    s.setup(cfg, rank, world_size, int(os.environ.get("LOCAL_RANK", rank)),
            int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    # The groups the failure monitor aborts (the library's crossing groups, and those within a
    # replica) own their connections: an abort that meets one of their operations in the
    # transport then stops that group's connections, never the default group's, so a rank that
    # saw a failure and one that did not agree on the default group's health (a new smp.init
    # makes its groups from it).
    s.ctl = _new_group(list(range(world_size)), own_connections=True)
    s.world = _new_group(list(range(world_size)))
    # every rank creates every group, in the same order (torch.distributed's rule)
    tp = s.tp_size > 1
    for kind, names in (("pp", ("pipe", "pp")), ("mp", ("mp",)), ("dp", ("grad", "dp")),
                        ("rdp", ("rdp_grad", "rdp") if tp else ()), ("tp", ("tpg", "tp") if tp else ())):
        for ranks in s.topo.groups(kind):
            # groups within a replica own their connections (see above); so the TP modules'
            # collectives, run inside forward and backward (on an accelerator's autograd thread
            # too), need no common order with the pipeline's and the gradient buckets' traffic
            made = [_new_group(ranks, own_connections=kind in _REPLICA_KINDS or name in _ABORTED)
                    for name in names]
            if s.rank in ranks:
                for name, g in zip(names, made):
                    setattr(s, name, g)
    if not tp:
        s.rdp_grad, s.rdp = s.grad, s.dp
    store = dist.distributed_c10d._get_default_store()
    s.monitor = FailureMonitor(store, f"shoal/smp/{s.epoch}/failure", s.who(), min(s.mp_ranks), s.replica_groups,
                               s.crossing_groups, world_size)
    s.optimizers = []
    s.step_ctx = None
    s.initialized = True
    core.activate(s)
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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


atexit.register(shutdown)
