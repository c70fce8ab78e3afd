"""A per-rank timeline of the pipeline, written as a Chrome / Perfetto trace.

When enabled, the executor records, per task, the forward or backward compute
of a microbatch through a segment, the time spent waiting in receives, the
sends it started, and the data-parallel gradient reduction. ``dump(path)``
gathers every rank's events on rank 0 and writes a JSON trace
(``chrome://tracing`` or https://ui.perfetto.dev): one process per rank, a
"compute" and a "comm" thread in each. Times are ``time.perf_counter()``,
which is one clock for all processes of a host (multi-host traces are aligned
per host only).

    from shoal.modelparallel import timeline
    timeline.enable()
    ...  # steps
    timeline.dump("trace.json")   # on every rank (a collective)
"""

from __future__ import annotations

import json
import os
import time
from typing import List, Optional

import torch.distributed as dist

from .state import require

_EVENTS: List[list] = []
_ON = [False]


def enable() -> None:
    _ON[0] = True


def disable() -> None:
    _ON[0] = False


def enabled() -> bool:
    return _ON[0]


def clear() -> None:
    _EVENTS.clear()


def now() -> float:
    return time.perf_counter()


def record(name: str, lane: str, t0: float, t1: float, **args) -> None:
    if _ON[0]:
        _EVENTS.append([name, lane, t0, t1, args])


def events() -> List[list]:
    return list(_EVENTS)


def dump(path: Optional[str]) -> Optional[dict]:
    """Gathers every rank's events (a collective over all ranks) and, on rank 0,
    writes them to `path` atomically; returns the trace on rank 0."""
    s = require()
    gathered: List = [None] * s.world_size
    dist.all_gather_object(gathered, {"rank": s.rank, "pp_rank": s.pp_rank, "dp_rank": s.dp_rank,
                                      "events": _EVENTS}, group=s.ctl)
    if s.rank != 0:
        return None
    t_min = min((e[2] for g in gathered for e in g["events"]), default=0.0)
    out = []
    for g in gathered:
        pid = g["rank"]
        out.append({"ph": "M", "name": "process_name", "pid": pid,
                    "args": {"name": f"rank {pid} (pp {g['pp_rank']}, dp {g['dp_rank']})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        for tid, lane in enumerate(("compute", "comm")):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        for name, lane, t0, t1, args in g["events"]:
            out.append({"ph": "X", "name": name, "pid": pid, "tid": 0 if lane == "compute" else 1,
                        "ts": (t0 - t_min) * 1e6, "dur": max(0.0, (t1 - t0) * 1e6),
                        "cat": lane, "args": args})
    trace = {"traceEvents": out, "displayTimeUnit": "ms"}
    if path:
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(trace, f)
        os.replace(tmp, path)
    return trace
