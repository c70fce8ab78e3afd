"""netbed: H "hosts" as network namespaces on one bridge, with shaped links.

The bed (stdlib only) is netbed.py, on namespaces.py (commands, namespaces,
state files, cleanup) and results.py (a job's outcome); cli.py is the command
line. probe.py measures what plain TCP moves through a bed and cpu_cost.py what
a collective costs in CPU time on it; see docs/netbed.md.
"""
from .namespaces import (NetBedError, NetBedUnavailable, cleanup, cleanup_stale, list_netns,  # noqa: F401
                         netns_pids, parse_rate, probe, read_state)
from .netbed import IFACE, NetBed, check_bed, perf_sizes, shoal_perf_ops  # noqa: F401
from .results import JobResult, RankResult  # noqa: F401
