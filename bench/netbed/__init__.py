"""netbed: H "hosts" as network namespaces on one bridge, with shaped links.

The whole implementation (stdlib only) is netbed.py; see docs/netbed.md.
"""
from .netbed import (IFACE, JobResult, NetBed, NetBedError, NetBedUnavailable,  # noqa: F401
                     RankResult, check_bed, cleanup, cleanup_stale, list_netns, netns_pids,
                     parse_rate, perf_sizes, probe, read_state, shoal_perf_ops)
