"""torch.distributed backend `shoal`: every collective against Gloo, errors, DDP, compat.

Each test is one multi-process job (tests/python/harness.py) running many
checks inside (tests/python/worker.py).
"""

import os
import tempfile

import pytest

from harness import assert_all_passed, run_job


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives_match_gloo(world_size):
    passed = assert_all_passed(run_job("collectives", world_size, timeout=240))
    assert len(passed) > 60


def test_bad_input_is_rejected_before_sending():
    assert_all_passed(run_job("errors", 2))


def test_bad_input_world_of_three():
    assert_all_passed(run_job("errors", 3))


def test_ddp_matches_gloo_with_hooks():
    assert_all_passed(run_job("ddp", 2, timeout=240))


def test_sagemaker_deprecated_api():
    assert_all_passed(run_job("compat", 2))


def test_init_methods_tcp_and_file():
    fd, path = tempfile.mkstemp(prefix="shoal-init-")
    os.close(fd)
    os.unlink(path)
    try:
        assert_all_passed(run_job("init_methods", 2, env={"TEST_INIT_FILE": path}))
    finally:
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.parametrize("mode", ["shared", "own"])
def test_subgroups_share_connections(mode):
    assert_all_passed(run_job("groups", 3, env={"SHOAL_GROUP_CONNECTIONS": mode}))


def test_bad_group_connections_knob_is_an_error_on_every_rank():
    assert_all_passed(run_job("groups_bad_knob", 2, env={"SHOAL_GROUP_CONNECTIONS": "bogus"}))


def test_gloo_default_with_shoal_subgroup():
    assert_all_passed(run_job("mixed", 2))
