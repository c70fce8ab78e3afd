"""Gradient reduction with tensor parallelism, optimizer-state sharding (shard_optimizer_state) and
sharded data parallelism (sharded_data_parallel_degree); mp_sharding_worker.py has the checks."""

import pytest

from harness import HERE, assert_all_passed, run_job

WORKER = HERE / "mp_sharding_worker.py"


@pytest.mark.parametrize("suite, world, checks", [
    ("zero1", 2, 6),           # Adam / SGD-momentum parity, state ~1/dp, clip, fp16, save/load, layout check
    ("zero1_pipeline", 4, 1),  # pp 2 x dp 2 with clipping
    ("tp_rule", 4, 5),         # the tp gradient rule (all-reduce, both divisors, reduce-scatter), tp training
    ("sdp", 2, 3),             # sharded data parallelism (FSDP2) against plain DP, config refusals
    ("sdp_world4", 4, 2),      # HSDP (sdp 2 in rdp 4) and tp 2 x sdp 2 against the unsharded runs
])
def test_sharding_job(suite, world, checks):
    passed = assert_all_passed(run_job(suite, world, worker=WORKER, timeout=400))
    assert len(passed) == checks, passed
