"""netbed: H "hosts" as network namespaces on one bridge, with shaped links.

The bed (stdlib only) is bed.py, on namespaces.py (commands, namespaces,
state files, cleanup) and results.py (a job's outcome); link_probe.py measures what
plain TCP moves through a bed. cli.py is the command line, `python3 -m
tools.netbed ...` from the repository root (__main__.py), the one entry point;
see docs/netbed.md.
"""
from .namespaces import (NetBedError, NetBedUnavailable, cleanup, cleanup_stale, list_netns,  # noqa: F401
                         netns_pids, parse_rate, probe, read_state)
from .bed import IFACE, NetBed, check_bed, perf_sizes, shoal_perf_ops  # noqa: F401
from .results import JobResult, RankResult  # noqa: F401
