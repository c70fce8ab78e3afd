"""shoal as a torch.distributed backend.

Importing this module registers the backend ``shoal`` (CPU tensors, and GPU
tensors when torch has CUDA: ``DEVICES``); after that
``torch.distributed.init_process_group(backend="shoal")`` and
``torch.distributed.new_group(backend="shoal")`` work with every init method
(``env://``, ``tcp://``, ``file://``) and with the store PyTorch passes.

``register(name)`` registers the same engine under another name (the SageMaker
compatibility module uses it for ``smddp``). It is idempotent.
"""

from __future__ import annotations

import atexit
import dataclasses
import ipaddress
import os
import socket
from datetime import timedelta

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from shoal import _C

__all__ = ["register", "ShoalBackend", "DEVICES", "Options", "recover", "grow", "join"]

ShoalBackend = _C.ShoalBackend

def _devices():
    """Device types the backend serves: the CPU, CUDA (or ROCm) when this torch
    has it, and torch's PrivateUse1 device when a package has named it
    (``torch.utils.rename_privateuse1_backend``) before shoal was imported.
    The adapter drives any of them through c10's device-generic streams and
    events (docs/torch.md, "GPU tensors")."""
    devices = ["cpu"]
    if torch.version.cuda or torch.version.hip:
        devices.append("cuda")
    private = torch._C._get_privateuse1_backend_name()
    if private != "privateuseone":
        devices.append(private)
    return devices


DEVICES = _devices()


def _base_store(store):
    """The store under any PrefixStores."""
    seen = 0
    while isinstance(store, dist.PrefixStore) and seen < 64:
        store = store.underlying_store
        seen += 1
    return store


def _route_to(host: str) -> str:
    """The local address this host uses to reach `host` ('' if unknown). No packet is sent."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return ""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", "")


def _advertise_host(base) -> str:
    """Where peers reach this rank, when shoal cannot work it out itself.

    shoal uses SHOAL_ADVERTISE_ADDR, else the route to MASTER_ADDR; with a
    tcp:// init method and no MASTER_ADDR, the TCPStore's host tells the route.
    """
    if os.environ.get("SHOAL_ADVERTISE_ADDR") or os.environ.get("MASTER_ADDR"):
        return ""
    if isinstance(base, dist.TCPStore):
        host = base.host
        if host and not _is_loopback(host):
            return _route_to(host)
    return ""


@dataclasses.dataclass
class Options:
    """``pg_options`` of a shoal group: ``dist.new_group(ranks, backend="shoal",
    pg_options=shoal.torch.Options(own_connections=True))``.

    `own_connections`: the group gets connections (and shared memory) of its
    own instead of sharing those of the first shoal group that holds its ranks
    (``SHOAL_GROUP_CONNECTIONS=own`` does this for every group). Its collectives
    then need no common order with that group's, and a lost rank breaks it
    only if it is a member; the price is a listening socket and connections
    per group and rank (docs/torch.md). The group's rank 0 decides for the
    group."""
    own_connections: bool = False


_ADOPT: list = []  # a backend grow() or join() made, for the init_process_group they call to take


def _create(opts, backend_options, *, name: str):
    if _ADOPT:
        return _ADOPT[0]
    store = opts.store
    rank, size = int(opts.group_rank), int(opts.group_size)
    timeout = opts.timeout
    timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    global_ranks = [int(r) for r in (opts.global_ranks_in_group or [])]
    base = _base_store(store)
    store_host_rank = -1
    # env:// and tcp://: global rank 0 hosts it, unless the launcher's agent does
    # (TORCHELASTIC_USE_AGENT_STORE=True: shoalrun's default, torchrun's agent): then no rank does
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if isinstance(base, dist.TCPStore) and not agent_store:
        if not global_ranks:
            store_host_rank = 0
        elif 0 in global_ranks:
            store_host_rank = global_ranks.index(0)
    return _C.ShoalBackend(store, rank, size, timeout_s=timeout_s, name=name,
                           group_name=str(opts.group_id or ""),
                           advertise_host=_advertise_host(base),
                           global_ranks=global_ranks, store_host_rank=store_host_rank,
                           own_connections=bool(getattr(backend_options, "own_connections", False)))


def _creator(name: str):
    def create(opts, backend_options=None):
        return _create(opts, backend_options, name=name)
    create.__name__ = f"create_{name}_backend"
    return create


def register(name: str = "shoal") -> None:
    """Registers shoal with torch.distributed under `name` (idempotent)."""
    _NAMES.add(name)
    if name.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(name, _creator(name), extended_api=True, devices=list(DEVICES))


_NAMES = {"shoal"}  # every name shoal is registered under


def _is_shoal(group) -> bool:
    try:
        return dist.get_backend(group) in _NAMES
    except (RuntimeError, ValueError):
        return False


_torch_monitored_barrier = dist.monitored_barrier


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False):
    """``torch.distributed.monitored_barrier`` that also serves shoal's groups.

    torch's function lets only Gloo through (by name), though the
    ProcessGroup method it calls is the backend's; importing shoal.torch puts
    this one in its place (``torch.distributed.monitored_barrier``). For
    other backends it is torch's own."""
    group = dist.GroupMember.WORLD if group is None else group
    if not _is_shoal(group):
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    c10d = dist.distributed_c10d
    if c10d._rank_not_in_group(group):
        return None
    if timeout is None:
        timeout = c10d._get_default_timeout(dist.get_backend(group))
    elif isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    c10d._check_valid_timeout(timeout)
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _name_backend_in_ddp_logs() -> None:
    """DDP's logging data names a plugin backend "custom" (its C++ logger asks
    the ProcessGroup, which knows only its backend type); say which."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    if getattr(DDP._get_ddp_logging_data, "_shoal", False):
        return
    original = DDP._get_ddp_logging_data

    def _get_ddp_logging_data(self):
        data = original(self)
        if data.get("backend_name") == "custom" and _is_shoal(self.process_group):
            data["backend_name"] = dist.get_backend(self.process_group)
        return data
    _get_ddp_logging_data._shoal = True
    DDP._get_ddp_logging_data = _get_ddp_logging_data


dist.monitored_barrier = monitored_barrier
dist.distributed_c10d.monitored_barrier = monitored_barrier
_name_backend_in_ddp_logs()


def _backend_of(group):
    """The shoal backend object behind `group` (its CPU one)."""
    be = group._get_backend(torch.device("cpu"))
    if not isinstance(be, _C.ShoalBackend):
        raise TypeError(f"shoal.torch.recover: the group's backend is {type(be).__name__}, not shoal's")
    return be


def recover(group=None, window: float = 10.0):
    """After a collective failed on `group` because a rank was lost: agrees
    with the other surviving ranks on who goes on, then shrinks the group to
    them through ``torch.distributed.shrink_group`` (which aborts the old
    group locally and destroys it). Returns the new group, ranked in the old
    order without the lost ranks; the same on every survivor. A rank that the
    survivors left out (it was stopped, cut off, or too late) gets a
    RuntimeError instead. `window`: seconds to wait for a rank that is not
    known lost and has not checked in (docs/torch.md, "Recovery").

    When every rank is alive, a healthy group is returned as it is; a broken
    one (aborted, or broken with a group it shared connections with) is
    replaced by a new group over the same ranks with connections of its own
    (the old one destroyed), except the default group, which torch cannot
    replace: that is a RuntimeError naming its cause."""
    group = dist.GroupMember.WORLD if group is None else group
    be = _backend_of(group)
    members = be.agree(window, be.suspects())
    excluded = [r for r in range(group.size()) if r not in set(members)]
    if excluded:
        return shrink_group(excluded, group=group)
    cause = be.comm_error()
    if not cause:
        return group
    if group is dist.GroupMember.WORLD:
        raise RuntimeError(f"shoal.torch.recover: every rank of the default group is alive but the group is "
                           f"broken ({cause}); make a new group over its ranks (dist.new_group) or restart")
    ranks = dist.get_process_group_ranks(group)
    fresh = dist.new_group(ranks, backend=dist.get_backend(group), pg_options=Options(own_connections=True),
                           use_local_synchronization=True)
    dist.destroy_process_group(group)
    return fresh


def _lobby(base):
    return dist.PrefixStore("shoal/lobby", base)


def _become_world(be, name: str, base, timeout):
    """Makes `be` (a grown communicator's backend) the default group: torch's
    groups are destroyed and the default one is made again over `be`, under
    store keys of its own."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _ADOPT.append(be)
    try:
        dist.init_process_group(name, store=dist.PrefixStore(f"shoal/grown/{be.comm_id()}", base),
                                rank=be.rank(), world_size=be.size(), timeout=timeout)
    finally:
        _ADOPT.clear()
    return dist.group.WORLD


def grow(joiners: int = -1, timeout: float = 120.0):
    """Admits newcomers (processes calling :func:`join`, e.g. the replacements
    ``shoalrun --fault-tolerance replace`` starts) into the default group.
    Every rank of the default group calls it at the same point (a step
    boundary). ``joiners=-1`` admits those waiting when rank 0 looks;
    ``n > 0`` waits for n. Returns the new default group, this rank keeping
    its number and newcomers after the old ranks, or None (nothing changed)
    when nobody was admitted. Other groups are destroyed, as when the default
    group shrinks (docs/torch.md, "Growing back")."""
    group = dist.GroupMember.WORLD
    be = _backend_of(group)
    name = dist.get_backend(group)
    base = _base_store(dist.distributed_c10d._get_default_store())
    grown = be.grow(_lobby(base), joiners, float(timeout))
    if grown is None:
        return None
    return _become_world(grown, name, base, dist.distributed_c10d._get_default_timeout(name))


def join(backend: str = "shoal", timeout: float = 120.0):
    """A newcomer's side of :func:`grow`: connects to the job's store
    (``MASTER_ADDR``/``MASTER_PORT``: under shoalrun, the launcher's), waits
    until the running ranks admit it, and initialises the default group as a
    rank of the grown world (its rank: ``dist.get_rank()``). Returns the group."""
    from datetime import timedelta as _td
    register(backend)
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    base = dist.TCPStore(host, port, is_master=False, timeout=_td(seconds=timeout))
    op_timeout = float(os.environ.get("SHOAL_TIMEOUT_S", "1800"))
    be = _C.ShoalBackend.join(_lobby(base), float(timeout), name=backend,
                              advertise_host=_advertise_host(base), op_timeout_s=op_timeout)
    return _become_world(be, backend, base, _td(seconds=op_timeout))


_torch_shrink_group = getattr(dist, "shrink_group", None)


def shrink_group(ranks_to_exclude, group=None, *args, **kwargs):
    """``torch.distributed.shrink_group`` that also serves shoal's groups.

    torch registers a shrunk CPU group's backend as Gloo's type (its own
    code knows only NCCL and Gloo), and its C++ tooling (DDP's logger) then
    treats shoal's backend as Gloo's and crashes; this one registers it as
    the custom backend it is. Importing shoal.torch puts it in place."""
    new = _torch_shrink_group(ranks_to_exclude, group, *args, **kwargs)
    if _is_shoal(new):
        be = new._get_backend(torch.device("cpu"))
        custom = dist.ProcessGroup.BackendType.CUSTOM
        for device in DEVICES:
            try:
                new._register_backend(torch.device(device), custom, be)
            except RuntimeError:
                pass
        new._set_default_backend(custom)
    return new


if _torch_shrink_group is not None:
    dist.shrink_group = shrink_group
    dist.distributed_c10d.shrink_group = shrink_group


def entry_point() -> None:
    """Target of the ``torch.distributed.backends`` entry point."""
    register("shoal")


register("shoal")

# Operations still completing at exit run their future callbacks (Python ones
# included) on shoal's completion threads: let them finish while the
# interpreter can still run them.
atexit.register(_C._quiesce, 5.0)
