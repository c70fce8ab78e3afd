"""Pipelines as torchft replicas (test_torchft.py, docs/torchft.md "Pipelines").

``torchft_pipeline_worker.py train REPLICA LIGHTHOUSE LOG [--kill-at STEP]``
is one rank of a replica: a job of two processes (RANK 0 and 1 of
WORLD_SIZE 2, with its own MASTER_PORT: its store) running a two-stage
shoal.modelparallel pipeline (smp.init with partitions 2, no smp data
parallelism). Across replicas, each stage averages its gradients with the
same stage of the other replicas through torchft: a Manager per rank (group
rank = the stage; rank 0 hosts the replica's manager server) on a
ProcessGroupShoal, a step committed only when every stage's average
succeeded on every live replica (torchft's should_commit, replica-wide),
and a replica that comes back heals stage by stage from a live one (each
stage's local model and optimizer state through the process group).
It appends one JSON line per iteration to LOG.<rank>. With ``--kill-at
STEP`` the stage ``--kill-stage`` SIGKILLs itself at the first step at or
past STEP whose quorum holds every replica; the replica's other stage then
fails in its pipeline naming the lost rank, writes that, and exits 3. Each
rank stops after the first committed step at or past --steps with every
replica taking part and writes its stage's state to LOG.<rank>.pt.

``kill_job(folder)`` runs the story: a lighthouse in this process, the
replicas, the victim's stage killed; the replica restarted as a whole (its
other rank gone too, as torchrun restarts a replica group) once the others
committed a step without it; every replica run to the same final step.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
STAGES = 2

sys.path.insert(0, HERE)
from torchft_worker import _lines as lines  # noqa: E402  (its records: one JSON line each)


def train(a):
    import torch
    import torch.nn.functional as F
    from torchft import Manager, Optimizer
    from torchft.checkpointing.pg_transport import PGTransport

    sys.path.insert(0, HERE)
    import mp_models as M
    import shoal.modelparallel as smp
    from shoal.torchft import ProcessGroupShoal

    rank = int(os.environ["RANK"])
    log = open(f"{a.log}.{rank}", "a", buffering=1)

    def note(**kw):
        log.write(json.dumps(dict(kw, replica=a.replica, stage=rank, pid=os.getpid(), t=time.time())) + "\n")

    smp.init({"partitions": STAGES, "microbatches": 2, "ddp": False, "auto_partition": False,
              "default_partition": 0})
    torch.manual_seed(1 + a.replica)  # different on every replica: the first quorum heals them equal
    model = smp.DistributedModel(M.Manual(smp, STAGES))
    opt = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))

    # What this stage hands a healing replica's same stage, and takes from it.
    def state_dict():
        return {"model": model.local_state_dict(), "optim": opt.local_state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=a.timeout)
    pg = ProcessGroupShoal(timeout=timeout)   # this stage of every live replica
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                      checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
                      replica_id=f"pipe_{a.replica}", store_addr=os.environ["MASTER_ADDR"],
                      store_port=int(os.environ["MASTER_PORT"]), rank=rank, world_size=STAGES,
                      lighthouse_addr=a.lighthouse, hostname="localhost", port=0, timeout=timeout,
                      quorum_timeout=timedelta(seconds=a.quorum_timeout), connect_timeout=timedelta(seconds=30))
    optimizer = Optimizer(manager, opt)

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    note(event="start")
    while True:
        before = manager.current_step()
        optimizer.zero_grad()  # starts the quorum of this step
        if a.kill_at is not None and before >= a.kill_at and rank == a.kill_stage:
            manager.wait_quorum()  # the others' quorum of this step holds this replica
            if manager.num_participants() == a.replicas:
                note(event="kill", step=before, participants=manager.num_participants())
                os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * before + a.replica)   # this replica's batch of this step
        x, y = torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)
        try:
            train_step(model, x, y)
        except Exception as e:  # noqa: BLE001 - the pipeline of this replica broke: the replica restarts
            note(event="broken", step=before, error=str(e)[:2000])
            log.close()
            os._exit(3)
        futures = [manager.allreduce(p.grad) for p in model.local_parameters() if p.grad is not None]
        for f in futures:
            f.wait()
        optimizer.step()  # steps only if every stage of every live replica averaged its gradients
        after = manager.current_step()
        note(event="step", step=before, committed=after > before, after=after,
             participants=manager.num_participants(),
             errored=str(manager.errored()) if manager.errored() else None)
        if after > before and after >= a.steps and manager.num_participants() == a.replicas:
            break
        if a.step_sleep:
            time.sleep(a.step_sleep)   # pacing: leaves a core to a replica that restarts
    torch.save(state_dict(), f"{a.log}.{rank}.pt")
    note(event="end", step=manager.current_step())
    manager.shutdown(wait=False)
    log.close()
    os._exit(0)  # the lighthouse, the other stage and peers may still be talking


def kill_job(folder, *, replicas=2, kill_at=3, kill_stage=1, steps=8, timeout=240):
    """Runs the job; returns {"logs": {(replica, stage): [records]}, "codes": {(replica, stage): code},
    "states": {(replica, stage): path}, "killed": {stage: code} (the victim replica's first life)}.
    Raises AssertionError with the ranks' output when a rank fails or the job runs past `timeout`."""
    from torchft._torchft import LighthouseServer

    sys.path.insert(0, os.path.dirname(HERE))
    from ports import free_port

    os.makedirs(folder, exist_ok=True)
    victim = replicas - 1
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=1000)
    root = os.path.dirname(os.path.dirname(HERE))
    base = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG=os.environ.get("RUST_LOG", "warn"),
                PYTHONPATH=os.path.join(root, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base.setdefault("SHOAL_TRACE_DIR", folder)
    log = {r: os.path.join(folder, f"replica{r}.jsonl") for r in range(replicas)}

    def start(r, kill=None):
        port = str(free_port())
        procs = []
        for k in range(STAGES):
            env = dict(base, RANK=str(k), LOCAL_RANK=str(k), WORLD_SIZE=str(STAGES), LOCAL_WORLD_SIZE=str(STAGES),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            args = [sys.executable, os.path.abspath(__file__), "train", str(r), lighthouse.address(), log[r],
                    "--replicas", str(replicas), "--steps", str(steps)]
            if kill is not None:
                args += ["--kill-at", str(kill), "--kill-stage", str(kill_stage)]
            out = open(f"{log[r]}.{k}.out", "a")
            procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT))
        return procs

    procs = {r: start(r, kill_at if r == victim else None) for r in range(replicas)}
    deadline = time.monotonic() + timeout
    survivors = [r for r in range(replicas) if r != victim]
    killed = None
    try:
        while any(p.poll() is None for ps in procs.values() for p in ps):
            if time.monotonic() > deadline:
                raise AssertionError(f"job ran past {timeout} s")
            for r, ps in procs.items():
                for k, p in enumerate(ps):
                    if p.poll() not in (None, 0) and not (r == victim and killed is None):
                        raise AssertionError(f"replica {r} stage {k} exited with {p.returncode}")
            first_life = procs[victim]
            if killed is None and all(p.poll() is not None for p in first_life):
                kills = [x for x in lines(f"{log[victim]}.{kill_stage}") if x["event"] == "kill"]
                if not kills:
                    raise AssertionError(f"replica {victim} ended before its kill: "
                                         f"{[p.returncode for p in first_life]}")
                moved_on = {r for r in survivors if any(x["event"] == "step" and x["committed"] and
                                                        x["t"] > kills[0]["t"] for x in lines(f"{log[r]}.0"))}
                if moved_on == set(survivors):
                    killed = {k: p.returncode for k, p in enumerate(first_life)}
                    procs[victim] = start(victim)
            time.sleep(0.05)
    except AssertionError as e:
        for ps in procs.values():
            for p in ps:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = "\n".join(f"----- replica {r} stage {k} -----\n" + open(f"{log[r]}.{k}.out").read()[-3000:]
                         for r in range(replicas) for k in range(STAGES))
        raise AssertionError(f"pipeline kill job: {e}\n{outs}") from None
    finally:
        lighthouse.shutdown()
    keys = [(r, k) for r in range(replicas) for k in range(STAGES)]
    return {"logs": {(r, k): lines(f"{log[r]}.{k}") for r, k in keys},
            "codes": {(r, k): procs[r][k].returncode for r, k in keys},
            "states": {(r, k): f"{log[r]}.{k}.pt" for r, k in keys},
            "killed": killed, "victim": victim}


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("replica", type=int)
    t.add_argument("lighthouse")
    t.add_argument("log")
    t.add_argument("--replicas", type=int, default=2)
    t.add_argument("--steps", type=int, default=8)
    t.add_argument("--kill-at", type=int, default=None)
    t.add_argument("--kill-stage", type=int, default=1)
    t.add_argument("--timeout", type=float, default=30.0)
    t.add_argument("--quorum-timeout", type=float, default=120.0)
    t.add_argument("--step-sleep", type=float, default=0.01)
    a = p.parse_args()
    train(a)


if __name__ == "__main__":
    main()
