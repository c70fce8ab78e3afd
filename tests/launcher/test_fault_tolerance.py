"""The workers' store hosted by the launcher, the death records, fencing, and
--fault-tolerance shrink / replace (docs/launcher.md, "Fault tolerance").

Workers reach the store with torch_store_client.py (torch's wire protocol,
without importing torch); test_torch_client_outlives_rank_0 uses torch's own
TCPStore client."""
import json
from pathlib import Path

from conftest import one_error_line, wait_for

CLIENT_DIR = str(Path(__file__).resolve().parent)

# SCENARIO: kill (VICTIM SIGKILLs itself), exit (VICTIM exits with CODE),
# stop (VICTIM SIGSTOPs itself and rank 0 excludes it), replace (as exit;
# the replacement reports what it was given). Every worker waits until all
# are up before VICTIM goes.
WORKER = r"""
import json, os, signal, socket, sys
sys.path.insert(0, os.environ["CLIENT_DIR"])
from torch_store_client import Store

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
inc = os.environ.get("SHOAL_REPLACEMENT", "0")
victim, scenario = int(os.environ["VICTIM"]), os.environ["SCENARIO"]
d = os.environ["JOB_DIR"]
addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
s = Store(addr, port)


def report(name, obj):
    with open(f"{d}/{name}.tmp", "w") as f:
        json.dump(obj, f)
    os.rename(f"{d}/{name}.tmp", f"{d}/{name}")


if os.environ.get("HOLD_TERM") == "1":  # finish the report even while the launcher stops the job
    signal.signal(signal.SIGTERM, lambda *a: None)
s.set(f"test/up/{rank}/{inc}", "1")
if inc == "0":
    s.wait([f"test/up/{r}/0" for r in range(world)])
if rank == victim and inc == "0":
    if scenario == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        report(f"resumed.{rank}", {})  # only if never fenced
        sys.exit(0)
    if scenario == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(os.environ.get("CODE", "3")))
if rank == victim:  # a replacement
    report(f"replacement.{rank}", {
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "SHOAL_REPLACEMENT", "SHOAL_FAULT_TOLERANCE",
                                                "TORCHELASTIC_USE_AGENT_STORE")},
        "incarnation": s.get(f"shoal/incarnation/{rank}").decode(),
        "replacements": s.add("shoal/replacements", 0),
        "dead": json.loads(s.get(f"shoal/dead/{rank}")),
    })
    # The survivors exclude the dead incarnation 0: this one is not fenced
    # (a negative check, over several fence looks).
    s.wait([f"shoal/excluded/{rank}"])
    try:
        s.wait(["never"], 1.0)
    except socket.timeout:
        pass
    report(f"replacement_done.{rank}", {})
    sys.exit(0)
if scenario == "stop" and rank == 0:
    s.set(f"shoal/excluded/{victim}", "0")
dead = json.loads(s.get(f"shoal/dead/{victim}"))
if scenario == "replace" and rank == 0:
    s.set(f"shoal/excluded/{victim}", "0")
others = [r for r in range(world) if r != victim]
s.set(f"test/after/{rank}", str(rank))  # the store still takes writes after the death
s.wait([f"test/after/{r}" for r in others])
report(f"result.{rank}", {
    "dead": dead,
    "deaths": s.add("shoal/deaths", 0),
    "first": json.loads(s.get("shoal/death/1")),
    "seen": [s.get(f"test/after/{r}").decode() for r in others],
})
if os.environ.get("LINGER") == "1":
    s.wait(["never"], 60)
"""


def start(job, n, *flags, **env):
    job.script("w.py", WORKER)
    return job.start(*flags, "--nproc-per-node", str(n), "w.py", env=job.env(CLIENT_DIR=CLIENT_DIR, **env))


def result(job, rank):
    return json.loads((job.dir / f"result.{rank}").read_text())


def test_store_outlives_rank_0_and_records_its_death(job):
    r = start(job, 3, "--fault-tolerance", "shrink", VICTIM=0, SCENARIO="kill")
    assert r.wait(30) == 0, r.err
    for rank in (1, 2):
        got = result(job, rank)
        dead = got["dead"]
        assert (dead["rank"], dead["exit_code"], dead["signal"], dead["fenced"]) == (0, 137, "SIGKILL", False)
        assert dead["node"] == 0 and dead["incarnation"] == 0 and dead["seq"] == 1 and dead["pid"] > 0
        assert dead["mono_ns"] > 0 and got["first"] == dead and got["deaths"] == 1
        assert got["seen"] == ["1", "2"]
    assert "rank 0 (local rank 0, pid" in r.err and "was killed by SIGKILL" in r.err
    assert "going on without rank 0: 2 of 3 ranks are left (--fault-tolerance shrink, --min-ranks 1)" in r.err
    assert "a worker failed on node 0" in r.err and "job failed" not in r.err, r.err


TORCH_WORKER = r"""
import datetime, json, os, sys
rank = int(os.environ["RANK"])
if rank == 0:
    sys.path.insert(0, os.environ["CLIENT_DIR"])
    from torch_store_client import Store
    s = Store(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    s.wait(["test/up/1"])
    os.kill(os.getpid(), 9)
import torch.distributed as dist
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                  datetime.timedelta(seconds=20))
s.set("test/up/1", "1")
dead = json.loads(s.get("shoal/dead/0"))
s.set("test/after", "written")
assert s.get("test/after") == b"written" and s.add("test/n", 2) == 2
with open(os.path.join(os.environ["JOB_DIR"], "result.1"), "w") as f:
    json.dump({"dead": dead}, f)
"""


def test_torch_client_outlives_rank_0(job):
    job.script("t.py", TORCH_WORKER)
    r = job.run("--fault-tolerance", "shrink", "--nproc-per-node", "2", "t.py",
                env=job.env(CLIENT_DIR=CLIENT_DIR), timeout=60)
    assert r.rc == 0, r.err
    assert result(job, 1)["dead"]["signal"] == "SIGKILL"


def test_default_mode_one_death_ends_the_job(job):
    # The launcher's store without --fault-tolerance: the death is recorded
    # before the others are stopped, and it still ends the job.
    r = start(job, 2, "--workers-store", "launcher", VICTIM=1, SCENARIO="exit", CODE=5, HOLD_TERM=1)
    assert r.wait(30) == 5, r.err
    assert result(job, 0)["dead"]["exit_code"] == 5
    assert "stopping the other workers" in r.err and "job failed: first failure on node 0" in r.err


def test_default_is_the_launchers_store(job):
    job.script("w.py", WORKER)
    r = job.run("--dry-run", "w.py")
    plan = dict(l.split("=", 1) for l in r.out.splitlines())
    assert (plan["workers_store"], plan["fault_tolerance"], plan["min_ranks"]) == ("launcher", "none", "1")
    r = job.run("--dry-run", "--workers-store", "rank0", "w.py")
    assert dict(l.split("=", 1) for l in r.out.splitlines())["workers_store"] == "rank0"
    r = job.run("--dry-run", "--fault-tolerance", "replace", "--min-ranks", "2", "--max-replacements", "5",
                "--nproc-per-node", "2", "w.py")
    plan = dict(l.split("=", 1) for l in r.out.splitlines())
    assert (plan["workers_store"], plan["fault_tolerance"], plan["min_ranks"], plan["max_replacements"]) == \
        ("launcher", "replace", "2", "5")


def test_shrink_stops_below_min_ranks(job):
    r = start(job, 2, "--fault-tolerance", "shrink", "--min-ranks", "2", VICTIM=1, SCENARIO="exit", CODE=5,
              LINGER=1)
    assert r.wait(30) == 5, r.err
    assert "1 of 2 ranks are left, fewer than --min-ranks 2: stopping the job" in r.err


def test_replace_starts_a_replacement(job):
    r = start(job, 2, "--fault-tolerance", "replace", "--monitor-interval", "0.1", VICTIM=1, SCENARIO="replace",
              CODE=7)
    assert r.wait(30) == 0, r.err
    rep = json.loads((job.dir / "replacement.1").read_text())
    assert rep["env"] == {"RANK": "1", "WORLD_SIZE": "2", "SHOAL_REPLACEMENT": "1", "SHOAL_FAULT_TOLERANCE": "replace",
                          "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert rep["incarnation"] == "1" and rep["replacements"] == 1
    assert rep["dead"]["exit_code"] == 7 and rep["dead"]["incarnation"] == 0
    assert (job.dir / "replacement_done.1").exists()
    assert "starting a replacement for rank 1 (replacement 1 of at most 3 on this node)" in r.err
    assert "fencing" not in r.err


def test_excluded_live_rank_is_fenced(job):
    r = start(job, 3, "--fault-tolerance", "shrink", VICTIM=2, SCENARIO="stop")
    assert r.wait(30) == 0, r.err
    dead = result(job, 0)["dead"]
    assert (dead["rank"], dead["signal"], dead["fenced"]) == (2, "SIGKILL", True)
    assert result(job, 1)["dead"] == dead
    assert not (job.dir / "resumed.2").exists()
    assert "rank 2 (pid" in r.err and "was excluded by the other ranks (shoal/excluded/2 = 0) and is still " \
        "running: fencing it (SIGKILL)" in r.err


def test_bad_fault_tolerance_input(job):
    job.script("w.py", WORKER)
    assert "--fault-tolerance grow: must be none, shrink or replace" in one_error_line(
        job.run("--fault-tolerance", "grow", "w.py"))
    assert "needs the store outside the ranks" in one_error_line(
        job.run("--fault-tolerance", "shrink", "--workers-store", "rank0", "w.py"))
    assert "--workers-store ranks: must be launcher or rank0" in one_error_line(
        job.run("--workers-store", "ranks", "w.py"))
    assert "--min-ranks 3 is more than the world size 2" in one_error_line(
        job.run("--fault-tolerance", "shrink", "--min-ranks", "3", "--nproc-per-node", "2", "w.py"))
    r = job.run("--min-ranks", "2", "--dry-run", "w.py")
    assert r.rc == 0 and "--min-ranks has no effect without --fault-tolerance" in r.err
