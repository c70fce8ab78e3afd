"""One node: failures, teardown, signals, restarts, and no process left behind."""
import signal

import pytest

from conftest import assert_rank_files

# A worker that says it is up, then waits (interruptibly) until told otherwise.
# FAIL_RANK exits with FAIL_CODE once every worker is up; KILL_RANK SIGKILLs itself.
WORKER = r"""#!/bin/bash
touch "$JOB_DIR/up.$RANK"
echo "rank $RANK up"
if [ "$RANK" = "${FAIL_RANK-x}" ] || [ "$RANK" = "${KILL_RANK-x}" ]; then
  while [ "$(ls "$JOB_DIR" | grep -c '^up\.')" -lt "$WORLD_SIZE" ]; do sleep 0.02; done
  echo "rank $RANK going down"
  [ "$RANK" = "${KILL_RANK-x}" ] && kill -9 $$
  exit "${FAIL_CODE-3}"
fi
sleep 60 & wait $!
"""


def up(job, n, timeout=10):
    job.wait_files("up.*", n, timeout)


def test_worker_exit_code_stops_the_others(job):
    job.script("w.sh", WORKER)
    r = job.run("--nproc-per-node", "3", "--no-python", "./w.sh", env=job.env(FAIL_RANK=1, FAIL_CODE=3))
    assert r.rc == 3, r.err
    assert "rank 1 (local rank 1, pid" in r.err and "exited with code 3" in r.err
    assert "job failed: first failure on node 0" in r.err
    assert "[1]: rank 1 going down" in r.err  # the tail of its output in the summary
    assert r.ended - r.started < 10


def test_worker_killed_by_signal(job):
    job.script("w.sh", WORKER)
    r = job.run("--nproc-per-node", "2", "--no-python", "./w.sh", env=job.env(KILL_RANK=0))
    assert r.rc == 128 + 9, r.err
    assert "rank 0 (local rank 0, pid" in r.err and "was killed by SIGKILL (signal 9)" in r.err


def test_python_exception_reported_from_error_file(job):
    job.script("boom.py", """
import os
def train():
    raise RuntimeError("loss is NaN at step 7")
if os.environ["RANK"] == "1":
    train()
else:
    import time; time.sleep(30)
""")
    r = job.run("--nproc-per-node", "2", "boom.py")
    assert r.rc == 1, r.err
    assert "uncaught exception in rank 1: RuntimeError: loss is NaN at step 7" in r.err
    assert 'File "boom.py", line 4, in train' in r.err
    assert "shoalrun_boot" not in r.err and "runpy" not in r.err


def test_python_exit_code_is_not_an_exception(job):
    job.script("quit.py", "import os, sys\nif os.environ['RANK'] == '0':\n    sys.exit(3)\n")
    r = job.run("--nproc-per-node", "2", "quit.py")
    assert r.rc == 3, r.err
    assert "rank 0 (local rank 0, pid" in r.err and "exited with code 3" in r.err
    assert "uncaught exception" not in r.err


def test_grace_period_then_sigkill(job):
    job.script("stubborn.sh", r"""#!/bin/bash
trap '' TERM
touch "$JOB_DIR/up.$RANK"
if [ "$RANK" = 0 ]; then
  while [ ! -e "$JOB_DIR/up.1" ]; do sleep 0.02; done
  exit 4
fi
while true; do sleep 1; done
""")
    r = job.run("--nproc-per-node", "2", "--term-timeout", "1", "--no-python", "./stubborn.sh")
    assert r.rc == 4, r.err
    assert "still running after the grace period; sending SIGKILL" in r.err
    assert 0.9 < r.ended - r.started < 8


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_terminating_signal_forwarded(job, sig):
    name = signal.Signals(sig).name
    job.script("trap.sh", rf"""#!/bin/bash
trap 'echo {name} > "$JOB_DIR/got.$RANK"; exit 0' {name[3:]}
touch "$JOB_DIR/up.$RANK"
while true; do sleep 60 & wait $!; done
""")
    launcher = job.start("--nproc-per-node", "2", "--no-python", "./trap.sh")
    up(job, 2)
    launcher.signal(sig)
    rc = launcher.wait(15)
    assert rc == 128 + sig, launcher.err
    for rank in range(2):
        assert (job.dir / f"got.{rank}").read_text().strip() == name
    assert f"received {name}; forwarded it to 2 worker(s)" in launcher.err


def test_user_signals_forwarded_and_job_continues(job):
    job.script("trap.sh", r"""#!/bin/bash
trap 'echo x >> "$JOB_DIR/usr1.$RANK"' USR1
trap 'echo x >> "$JOB_DIR/usr2.$RANK"' USR2
touch "$JOB_DIR/up.$RANK"
while [ ! -e "$JOB_DIR/stop" ]; do sleep 60 & wait $!; done
echo "rank $RANK done"
""")
    launcher = job.start("--nproc-per-node", "2", "--no-python", "./trap.sh")
    up(job, 2)
    launcher.signal(signal.SIGUSR1)
    job.wait_files("usr1.*", 2)
    launcher.signal(signal.SIGUSR2)
    job.wait_files("usr2.*", 2)
    assert launcher.poll() is None  # still running
    (job.dir / "stop").touch()
    launcher.signal(signal.SIGUSR1)  # wakes the workers up to see the stop file
    assert launcher.wait(15) == 0, launcher.err
    assert "[0]: rank 0 done" in launcher.out and "[1]: rank 1 done" in launcher.out


def test_restarts(job):
    job.script("flaky.sh", r"""#!/bin/bash
echo "rank $RANK attempt $SHOAL_RESTART_COUNT"
[ "$RANK" = 1 ] && [ "$SHOAL_RESTART_COUNT" -lt 2 ] && exit 5
exit 0
""")
    r = job.run("--nproc-per-node", "2", "--max-restarts", "2", "--no-python", "./flaky.sh")
    assert r.rc == 0, r.err
    assert r.err.count("restarting the workers") == 2
    for attempt in range(3):
        assert f"[1]: rank 1 attempt {attempt}" in r.out
    assert "[0]: rank 0 attempt 2" in r.out  # the last attempt, where nobody is stopped early
    r = job.run("--nproc-per-node", "2", "--max-restarts", "1", "--no-python", "./flaky.sh")
    assert r.rc == 5, r.err
    assert r.err.count("restarting the workers") == 1


def test_no_restart_after_a_signal(job):
    job.script("w.sh", WORKER)
    launcher = job.start("--nproc-per-node", "2", "--max-restarts", "3", "--no-python", "./w.sh")
    up(job, 2)
    launcher.signal(signal.SIGTERM)
    assert launcher.wait(15) == 128 + signal.SIGTERM
    assert "restarting" not in launcher.err


def test_kill_9_of_launcher_leaves_no_process(job):
    # Each worker also starts a grandchild: it must go too.
    job.script("family.sh", r"""#!/bin/bash
sleep 120 &
echo $! > "$JOB_DIR/child.$RANK"
touch "$JOB_DIR/up.$RANK"
sleep 120 & wait $!
""")
    launcher = job.start("--nproc-per-node", "2", "--no-python", "./family.sh")
    up(job, 2)
    launcher.signal(signal.SIGKILL)
    launcher.wait(5)
    # check_no_orphans (run by the fixture) waits up to 5 s for every process of the job.
    job.check_no_orphans()


def test_escaped_grandchild_is_killed_at_exit(job):
    # A worker's child that moved to its own session is still cleaned up.
    job.script("daemon.sh", r"""#!/bin/bash
setsid sleep 120 < /dev/null > /dev/null 2>&1 &
echo $! > "$JOB_DIR/escaped.$RANK"
sleep 0.1
exit 0
""")
    r = job.run("--nproc-per-node", "1", "--no-python", "./daemon.sh")
    assert r.rc == 0, r.err
    assert_rank_files(job, "escaped", 1)  # the worker ran and started the grandchild


def test_missing_executable_at_exec(job):
    job.script("notexec.sh", "#!/nonexistent/interpreter\n")
    r = job.run("--no-python", "./notexec.sh")
    assert r.rc == 127, r.err
    assert "cannot execute" in r.err
