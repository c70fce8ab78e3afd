"""netbed: H "hosts" as network namespaces on one bridge, with shaped links.

The bed (stdlib only) is netbed.py; probe.py measures what plain TCP moves through it
and cpu_cost.py what a collective costs in CPU time on it; see docs/netbed.md.
"""
from .netbed import (IFACE, JobResult, NetBed, NetBedError, NetBedUnavailable,  # noqa: F401
                     RankResult, check_bed, cleanup, cleanup_stale, list_netns, netns_pids,
                     parse_rate, perf_sizes, probe, read_state, shoal_perf_ops)
