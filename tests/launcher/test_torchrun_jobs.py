"""What torchrun's process options do, shown by real jobs on one node:
--role and the TORCHELASTIC_* variables, --virtual-local-rank, --local-addr,
--run-path, --start-method, --signals-to-handle, --shutdown-timeout (and its
spellings), --event-log-handler console, and torch's @record error file."""
import signal

import pytest

from conftest import assert_rank_files, env_dump, read_env

DUMP = env_dump("RANK", "LOCAL_RANK", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "SHOAL_ERROR_FILE",
                "CUDA_VISIBLE_DEVICES", "SHOAL_ADVERTISE_ADDR")


def test_role_and_torchelastic_variables(job):
    job.script("env.sh", DUMP)
    r = job.run("--nproc-per-node", "2", "--role", "trainer", "--rdzv-id", "run7", "--max-restarts", "2",
                "--no-python", "./env.sh")
    assert r.rc == 0, r.err
    for rank in range(2):
        e = read_env(job, rank)
        assert (e["ROLE_NAME"], e["ROLE_RANK"], e["ROLE_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) == \
            ("trainer", str(rank), "2", "1")
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"], e["TORCHELASTIC_RUN_ID"]) == \
            ("0", "2", "run7")
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"   # the launcher hosts the store (torchrun agent style)
        assert e["TORCHELASTIC_ERROR_FILE"] == e["SHOAL_ERROR_FILE"] != "unset"
        assert e["LOCAL_RANK"] == str(rank) and e["SHOAL_ADVERTISE_ADDR"] == "unset"


@pytest.mark.parametrize("visible,want", [("5,7", ["5", "7"]), (None, ["0", "1"])])
def test_virtual_local_rank(job, visible, want):
    job.script("env.sh", DUMP)
    r = job.run("--nproc-per-node", "2", "--virtual-local-rank", "--no-python", "./env.sh",
                env=job.env(CUDA_VISIBLE_DEVICES=visible))
    assert r.rc == 0, r.err
    for rank in range(2):
        e = read_env(job, rank)
        assert (e["RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) == (str(rank), "0", want[rank])


@pytest.mark.parametrize("preset,want", [(None, "10.1.2.3"), ("10.9.9.9", "10.9.9.9")])
def test_local_addr_is_what_the_workers_advertise(job, preset, want):
    job.script("env.sh", DUMP)
    r = job.run("--local-addr", "10.1.2.3", "--no-python", "./env.sh", env=job.env(SHOAL_ADVERTISE_ADDR=preset))
    assert r.rc == 0, r.err
    assert read_env(job, 0)["SHOAL_ADVERTISE_ADDR"] == want


def test_run_path_runs_a_python_script_even_with_no_python(job):
    job.script("plain.py", "import sys\nprint('ran', __name__, sys.argv[1:])\n", mode=0o644)  # not executable
    r = job.run("--run-path", "--no-python", "plain.py", "a", "--b")
    assert r.rc == 0, r.err
    assert "[0]: ran __main__ ['a', '--b']" in r.out


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_start_method_accepted(job, method):
    r = job.run("--nproc-per-node", "2", "--start-method", method, "--no-python", "sh", "-c",
                'touch "$JOB_DIR/ran.$RANK"')
    assert r.rc == 0, r.err
    assert_rank_files(job, "ran", 2)


HOLD = r"""#!/bin/bash
trap 'echo TERM > "$JOB_DIR/got.$RANK"; exit 0' TERM
touch "$JOB_DIR/up.$RANK"
while true; do sleep 60 & wait $!; done
"""


def test_signal_left_out_of_signals_to_handle_is_not_forwarded(job):
    job.script("hold.sh", HOLD)
    launcher = job.start("--nproc-per-node", "2", "--signals-to-handle", "SIGTERM", "--no-python", "./hold.sh")
    job.wait_files("up.*", 2)
    launcher.signal(signal.SIGUSR1)  # default action: the launcher dies, its guardian kills the workers
    assert launcher.wait(15) == -signal.SIGUSR1
    assert "forwarded" not in launcher.err
    assert not list(job.dir.glob("got.*"))


def test_signal_in_signals_to_handle_is_forwarded(job):
    job.script("hold.sh", HOLD)
    launcher = job.start("--nproc-per-node", "2", "--signals_to_handle=SIGTERM", "--no-python", "./hold.sh")
    job.wait_files("up.*", 2)
    launcher.signal(signal.SIGTERM)
    assert launcher.wait(15) == 128 + signal.SIGTERM, launcher.err
    assert "received SIGTERM; forwarded it to 2 worker(s)" in launcher.err
    job.wait_files("got.*", 2)


STUBBORN = r"""#!/bin/bash
trap '' TERM
touch "$JOB_DIR/up.$RANK"
if [ "$RANK" = 0 ]; then
  while [ ! -e "$JOB_DIR/up.1" ]; do sleep 0.02; done
  exit 4
fi
while true; do sleep 1; done
"""


@pytest.mark.parametrize("args,env", [
    (["--shutdown-timeout", "0.5"], {}),
    (["--shutdown_timeout=0.5"], {}),
    ([], {"PET_SHUTDOWN_TIMEOUT": "0.5"}),
    ([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0.5"}),
])
def test_shutdown_timeout_is_the_grace_period(job, args, env):
    job.script("stubborn.sh", STUBBORN)
    r = job.run("--nproc-per-node", "2", *args, "--no-python", "./stubborn.sh", env=job.env(**env))
    assert r.rc == 4, r.err
    assert "still running after the grace period; sending SIGKILL" in r.err
    assert r.ended - r.started < 6  # the default grace is 30 s


def test_event_log_handler_console_prints_the_launchers_events(job):
    r = job.run("--event-log-handler", "console", "--no-python", "true")
    assert r.rc == 0, r.err
    assert "shoalrun: cluster description from local" in r.err and "started rank 0" in r.err
    quiet = job.run("--event-log-handler", "null", "--no-python", "true", env=job.env(OMP_NUM_THREADS=1))
    assert quiet.rc == 0 and quiet.err == ""


def test_torch_record_error_file_is_read(job):
    # What torch.distributed.elastic's @record writes to TORCHELASTIC_ERROR_FILE.
    job.script("rec.py", """import json, os, sys
record = {"message": {"message": "RuntimeError: shard 3 is corrupt",
                      "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  in load_shard\\n",
                                    "timestamp": "1700000000"}}}
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    json.dump(record, f)
sys.exit(1)
""")
    r = job.run("rec.py")
    assert r.rc == 1
    assert "uncaught exception in rank 0: RuntimeError: shard 3 is corrupt" in r.err, r.err
    assert "in load_shard" in r.err
