"""A selection of PyTorch's own distributed test suite
(torch.testing._internal.distributed.distributed_test) run against shoal.

The suite keys its skips on the BACKEND environment variable and on
DistTestCases.backend_feature; shoal is added to the "ddp", "subgroup" and
"plugin" features (what it supports on CPU) before the suite is imported.
Each test spawns WORLD_SIZE (2) processes that rendezvous through a file://
init method. SELECTED lists what runs; docs/torch.md says why the rest does not.
"""

import os
import tempfile

import pytest

pytest.importorskip("expecttest", reason="PyTorch's test suite needs expecttest (pip install expecttest)")

os.environ["BACKEND"] = "shoal"
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="shoal-torch-suite-"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shoal.torch  # noqa: E402,F401  (registers the backend, in the spawned ranks too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for _feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[_feature].add("shoal")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

SELECTED = [
    # collectives, sync and async, world / group / full group
    "test_broadcast", "test_broadcast_group", "test_broadcast_full_group",
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max", "test_all_reduce_min",
    "test_all_reduce_product", "test_all_reduce_group_sum", "test_all_reduce_full_group_sum",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_reduce_sum", "test_reduce_max", "test_reduce_group_sum",
    "test_all_gather", "test_all_gather_group", "test_all_gather_complex",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_gather", "test_gather_group", "test_scatter", "test_scatter_group",
    "test_barrier", "test_barrier_group", "test_barrier_full_group",
    # point to point
    "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend",
    "test_irecv",
    # groups
    "test_get_rank_size_group", "test_get_backend",
    # DDP on CPU
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
]


class TestShoalBackend(TestDistBackend, DistributedTest._DistTestBase):
    pass

# conftest.py deselects every test of TestShoalBackend that is not in SELECTED.
