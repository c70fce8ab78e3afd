"""One rank of the timeout job (test_timeouts.py): timeouts as PyTorch defines them.

An explicit timeout of 0 is a zero timeout (Gloo fails at once); c10d's unset
value (kUnsetTimeout, what a call without a timeout passes) means the group's
timeout; and the roll call that names a missing rank fits inside the
operation's timeout. Ranks other than 0 stay out of the operations under test
by waiting on a store key, and the last check breaks the group (a timeout
breaks its communicator), so it comes last. Prints one RESULT line
(harness.py, worker.Checks).
"""

import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import shoal.torch  # noqa: F401
from harness import Checks

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


def timed_failure(fn):
    """Runs fn, which must raise; returns (seconds it took, message)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return time.monotonic() - t0, str(e)
    raise AssertionError("no error")


def main():
    c = Checks()
    dist.init_process_group("shoal", timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    pg = dist.group.WORLD
    one_second = dist.new_group(backend="shoal", timeout=datetime.timedelta(seconds=1))
    fresh = dist.new_group(backend="shoal")
    dist.barrier()

    def late_rank_leaves_stderr_clean():
        # The others wait 0.6 s for rank 0 in the group's first collective,
        # which sets up the shared-memory arena through torch's store: that
        # wait must not make torch's store client log its timeouts.
        if RANK == 0:
            time.sleep(0.6)  # being late is the condition under test
        t = torch.ones(1 << 16)
        with tempfile.TemporaryFile("w+") as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                dist.all_reduce(t, group=fresh)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            text = err.read()
        assert t[0].item() == WS, t[0].item()
        assert "[c10d]" not in text, text[:2000]

    c.run("a rank late to the first collective leaves stderr clean", late_rank_leaves_stderr_clean)

    if RANK == 0:
        def zero_is_zero():
            s, msg = timed_failure(lambda: pg.monitored_barrier(datetime.timedelta(0), True))
            assert s < 0.5, f"took {s:.2f} s: {msg}"
            assert "rank" in msg and "not reached the barrier within 0 ms" in msg, msg

        def unset_is_the_groups():
            # No timeout given: the group's 1 s, neither zero nor the default group's 60 s.
            s, msg = timed_failure(lambda: one_second.monitored_barrier(wait_all_ranks=True))
            assert 0.95 <= s < 3.0, f"took {s:.2f} s: {msg}"
            assert "within 1000 ms" in msg, msg

        c.run("monitored_barrier(timeout=0) fails at once", zero_is_zero)
        c.run("monitored_barrier() without a timeout uses the group's", unset_is_the_groups)
        # The receives the failed barriers gave up on stay posted: they must
        # not break the communicators when the group's 1 s has passed since.
        time.sleep(1.2)
        store.set("monitored_done", "1")
    else:
        store.wait(["monitored_done"])
        c.passed.append("stayed out of rank 0's monitored barriers")
    c.run("a failed monitored_barrier leaves the groups working", lambda: dist.barrier())

    # A barrier on the 1 s group that rank WS-1 never joins: every other rank
    # fails after 1 s (plus scheduling noise), naming it.
    if RANK == WS - 1:
        store.wait(["barrier_done"])
        c.passed.append("stayed out of the barrier")
    else:
        def barrier_keeps_its_timeout():
            s, msg = timed_failure(lambda: dist.barrier(group=one_second))
            assert 0.95 <= s < 1.35, f"took {s:.2f} s: {msg}"
            assert f"rank {WS - 1} has not answered a roll call" in msg, msg

        c.run("a 1 s barrier fails within 1 s naming the missing rank", barrier_keeps_its_timeout)
        if store.add("barrier_checked", 1) == WS - 1:
            store.set("barrier_done", "1")
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
