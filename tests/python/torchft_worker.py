"""One replica of a torchft job on shoal (test_torchft.py), or a device check.

``torchft_worker.py train REPLICA LIGHTHOUSE LOG [--kill-at STEP] [--backend shoal|gloo]``
runs torchft's DDP example loop (torchft's train_ddp.py: a Manager,
torchft.DistributedDataParallel, torchft.DistributedSampler, torchft.Optimizer,
checkpoints for healing sent through the process group by PGTransport), on a
small model and synthetic data (the example downloads CIFAR-10 through
torchvision, which cannot be fetched here), as replica group REPLICA of one
process. It appends
one JSON line per iteration to LOG: the step before and after, whether it
was committed, the participants and the time. With ``--kill-at STEP`` the
replica SIGKILLs itself once the quorum of STEP has formed with it in it,
before its gradients reach the others: their allreduce of STEP fails. It
stops after the first committed step at or past --steps with every replica
(--replicas) taking part, so that every replica stops at the same step, and
writes its final model and optimizer state to LOG.pt.

``kill_job(backend, folder)`` (used by test_torchft.py, and by
``torchft_worker.py bench``, the kill-to-next-step comparison of docs/torchft.md)
runs the whole story: a lighthouse in this process, three replicas, replica 2
killed at --kill-at, restarted once the two others have committed a step
without it, every replica run to the same final step.

``torchft_worker.py device`` checks ProcessGroupShoal on the test accelerator
"fakegpu" (tests/python/fakegpu.py): two ranks as threads of this process run
torchft's own collective checks on device tensors. It prints RESULT lines as
harness.Checks does.
"""

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta


def train(a):
    import torch
    from torch import nn, optim
    from torch.utils.data import DataLoader, TensorDataset
    import torch.distributed as dist
    from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer
    from torchft.process_group import ProcessGroupGloo

    from shoal.torchft import ProcessGroupShoal

    log = open(a.log, "a", buffering=1)

    def note(**kw):
        log.write(json.dumps(dict(kw, replica=a.replica, pid=os.getpid(), t=time.time())) + "\n")

    # The replica group's own store (torchrun's, in the example); world size 1.
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=a.timeout)
    pg = ProcessGroupShoal(timeout=timeout) if a.backend == "shoal" else _gloo(ProcessGroupGloo)(timeout=timeout)

    # Synthetic stand-in for the example's CIFAR-10: the same for every replica.
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 16, generator=g), torch.randint(0, 4, (512,), generator=g))
    sampler = DistributedSampler(data, replica_rank=a.replica, num_replica_groups=a.replicas,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)

    def load_state_dict(state_dict):
        m.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optim"])

    def state_dict():
        return {"model": m.state_dict(), "optim": optimizer.state_dict()}

    transport = None
    if a.transport == "pg":  # the example's: the checkpoint goes through the process group
        from torchft.checkpointing.pg_transport import PGTransport
        transport = PGTransport(pg, timeout=timeout, device=torch.device("cpu"))
    manager = Manager(pg=pg, min_replica_size=2, checkpoint_transport=transport, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"train_ddp_{a.replica}", store_addr="localhost", store_port=store.port,
                      rank=0, world_size=1, lighthouse_addr=a.lighthouse, hostname="localhost", port=0,
                      timeout=timeout, quorum_timeout=timedelta(seconds=a.quorum_timeout),
                      connect_timeout=timedelta(seconds=30))

    torch.manual_seed(1 + a.replica)  # different on every replica: init_sync makes them equal
    m = DistributedDataParallel(manager, nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = Optimizer(manager, optim.AdamW(m.parameters(), lr=1e-2))
    criterion = nn.CrossEntropyLoss()
    note(event="start", backend=a.backend)

    done = False
    while not done:
        for inputs, labels in loader:
            before = manager.current_step()
            optimizer.zero_grad()  # starts the quorum of this step
            if a.kill_at is not None and before == a.kill_at:
                manager.wait_quorum()  # the others' quorum of this step holds this replica
                note(event="kill", step=before, participants=manager.num_participants())
                os.kill(os.getpid(), signal.SIGKILL)
            loss = criterion(m(inputs), labels)
            loss.backward()  # the gradient allreduce, through the process group
            optimizer.step()  # commits (steps the optimizer) only if every replica's allreduce succeeded
            after = manager.current_step()
            note(event="step", step=before, committed=after > before, after=after,
                 participants=manager.num_participants(), healed=bool(manager._healing) or None,
                 errored=str(manager.errored()) if manager.errored() else None, loss=loss.item())
            if after > before and after >= a.steps and manager.num_participants() == a.replicas:
                done = True
                break
            if a.step_sleep:
                time.sleep(a.step_sleep)

    torch.save(state_dict(), a.log + ".pt")
    note(event="end", step=manager.current_step())
    manager.shutdown(wait=False)
    log.close()
    os._exit(0)  # the lighthouse and peers may still be talking: exit without waiting on them


def _gloo(base):
    """torchft's ProcessGroupGloo with the one change torchft's DDP needs to
    survive a lost peer (ProcessGroupShoal has it built in): a failed wait()
    returns False and errored() names the failure, instead of wait() raising
    (torchft 0.2.0's DDP comm hook then fails `assert fut._fut`)."""
    import torch.distributed as dist

    class Work(dist._Work):
        def __init__(self, pg, work):
            super().__init__()
            self._pg, self._work = pg, work

        def wait(self, timeout=None):
            try:
                return self._work.wait()
            except Exception as e:  # noqa: BLE001
                self._pg._error = self._pg._error or e
                return False

        def get_future(self):
            return self._work.get_future()

    class Gloo(base):
        _error = None

        def _create_pg(self, *args):
            self._error = None
            return super()._create_pg(*args)

        def _wrap_work(self, work, opts):
            return Work(self, work)

        def errored(self):
            return self._error

    return Gloo


def device(a):
    import threading

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fakegpu
    fakegpu.load()  # before shoal: the backend then serves "fakegpu"
    from harness import Checks
    from torch.distributed import TCPStore
    import torchft.process_group_test as upstream

    from shoal.torchft import ProcessGroupShoal

    checks = Checks()
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    addr = f"localhost:{store.port}/device"
    world = 2
    pgs = [ProcessGroupShoal(timeout=timedelta(seconds=30)) for _ in range(world)]

    def each(fn):
        errors = [None] * world

        def run(r):
            try:
                fn(r)
            except BaseException as e:  # noqa: BLE001
                errors[r] = e
        ts = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        for e in errors:
            if e is not None:
                raise e

    each(lambda r: pgs[r].configure(addr, "0", r, world))
    for name, fn in upstream._COLLECTIVE_TO_FUNC.items():
        checks.run(f"fakegpu {name}", each,
                   lambda r, fn=fn: fn(pgs[r], r, torch.tensor([r + 1], device=torch.device("fakegpu", r))))

    def values_come_back_to_the_device(r):
        t = torch.full((1000,), float(r + 1), device=torch.device("fakegpu", r))
        pgs[r].allreduce([t], torch.distributed.ReduceOp.SUM).wait()
        assert t.device.type == "fakegpu", t.device
        assert torch.equal(t.cpu(), torch.full((1000,), 3.0)), t.cpu()[:4]
    checks.run("fakegpu allreduce of 1000 floats", each, values_come_back_to_the_device)
    for pg in pgs:
        pg.shutdown()
    os.environ["RANK"] = "0"
    code = checks.report()
    sys.stdout.flush()
    os._exit(code)


def _lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def kill_job(backend, folder, *, replicas=3, kill_at=3, steps=8, heartbeat_timeout_ms=1000,
             step_sleep=0.01, timeout=240):
    """Runs the job and returns {"logs": {replica: [records]}, "codes": [...],
    "detect_s": kill -> the survivors' failed step (the slower survivor),
    "next_step_s": kill -> the survivors' next committed step}. Raises
    AssertionError with the replicas' output when a replica fails or the job
    runs past `timeout` seconds."""
    import subprocess
    from torchft._torchft import LighthouseServer

    os.makedirs(folder, exist_ok=True)
    victim = replicas - 1
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=heartbeat_timeout_ms,
                                  quorum_tick_ms=50, heartbeat_timeout_ms=heartbeat_timeout_ms)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG=os.environ.get("RUST_LOG", "warn"),
               PYTHONPATH=os.path.join(root, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("SHOAL_TRACE_DIR", folder)
    log = {r: os.path.join(folder, f"replica{r}.jsonl") for r in range(replicas)}
    for path in log.values():
        for stale in (path, path + ".pt", path + ".out"):
            if os.path.exists(stale):
                os.unlink(stale)

    def start(r, kill=None):
        args = [sys.executable, os.path.abspath(__file__), "train", str(r), lighthouse.address(), log[r],
                "--replicas", str(replicas), "--steps", str(steps), "--backend", backend,
                "--step-sleep", str(step_sleep)]
        if kill is not None:
            args += ["--kill-at", str(kill)]
        out = open(log[r] + ".out", "a")
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)

    procs = [start(r, kill_at if r == victim else None) for r in range(replicas)]
    deadline = time.monotonic() + timeout
    survivors = [r for r in range(replicas) if r != victim]
    restarted, killed_code = False, None
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise AssertionError(f"job ran past {timeout} s")
            for r, p in enumerate(procs):
                if p.poll() not in (None, 0) and not (r == victim and not restarted):
                    raise AssertionError(f"replica {r} exited with {p.returncode}")
            if not restarted and procs[victim].poll() is not None:
                kills = [x for x in _lines(log[victim]) if x["event"] == "kill"]
                if not kills:
                    raise AssertionError(f"replica {victim} exited with {procs[victim].returncode} before its kill")
                moved_on = {x["replica"] for r in survivors for x in _lines(log[r])
                            if x["event"] == "step" and x["committed"] and x["t"] > kills[0]["t"]}
                if moved_on == set(survivors):
                    killed_code = procs[victim].returncode
                    procs[victim] = start(victim)
                    restarted = True
            time.sleep(0.05)
    except AssertionError as e:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        outs = "\n".join(f"----- replica {r} -----\n" + open(log[r] + ".out").read()[-4000:]
                         for r in range(replicas) if os.path.exists(log[r] + ".out"))
        raise AssertionError(f"{backend} kill job: {e}\n{outs}") from None
    finally:
        lighthouse.shutdown()
    logs = {r: _lines(log[r]) for r in range(replicas)}
    kill_t = [x for x in logs[victim] if x["event"] == "kill"][0]["t"]

    def first_after(r, committed):
        return min(x["t"] for x in logs[r] if x["event"] == "step" and x["t"] > kill_t and x["committed"] == committed)
    return {"logs": logs, "codes": [p.returncode for p in procs], "killed_code": killed_code,
            "states": {r: log[r] + ".pt" for r in range(replicas)},
            "detect_s": max(first_after(r, False) for r in survivors) - kill_t,
            "next_step_s": max(first_after(r, True) for r in survivors) - kill_t}


def bench(a):
    """Kill-to-next-step, shoal against torchft's Gloo, interleaved, median of repeats."""
    import statistics
    import tempfile
    rows = {b: [] for b in a.backends}
    for i in range(a.repeats):
        for b in a.backends:
            with tempfile.TemporaryDirectory(prefix=f"torchft-bench-{b}-") as d:
                res = kill_job(b, d, heartbeat_timeout_ms=a.heartbeat_timeout_ms)
            rows[b].append((res["detect_s"], res["next_step_s"]))
            print(f"# {b} run {i}: failure seen {res['detect_s']:.3f} s, next step {res['next_step_s']:.3f} s",
                  flush=True)
    print(f"# lighthouse heartbeat_timeout_ms={a.heartbeat_timeout_ms}, {a.repeats} runs each; seconds after the kill")
    print("| backend | failed step seen (median) | next committed step (median) | next step p10-p90 |")
    print("|---|---|---|---|")
    for b, r in rows.items():
        nxt = sorted(x[1] for x in r)
        q = statistics.quantiles(nxt, n=10) if len(nxt) > 1 else [nxt[0]] * 9
        print(f"| {b} | {statistics.median(x[0] for x in r):.3f} | {statistics.median(nxt):.3f} | "
              f"{q[0]:.3f}-{q[-1]:.3f} |")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("replica", type=int)
    t.add_argument("lighthouse")
    t.add_argument("log")
    t.add_argument("--replicas", type=int, default=3)
    t.add_argument("--steps", type=int, default=8)
    t.add_argument("--kill-at", type=int, default=None)
    t.add_argument("--backend", choices=["shoal", "gloo"], default="shoal")
    t.add_argument("--timeout", type=float, default=30.0)
    t.add_argument("--quorum-timeout", type=float, default=120.0)
    t.add_argument("--step-sleep", type=float, default=0.0)
    t.add_argument("--transport", choices=["pg", "http"], default="pg")
    sub.add_parser("device")
    b = sub.add_parser("bench")
    b.add_argument("--repeats", type=int, default=5)
    b.add_argument("--backends", nargs="+", default=["shoal", "gloo"])
    b.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    a = p.parse_args()
    {"train": train, "device": device, "bench": bench}[a.cmd](a)


if __name__ == "__main__":
    main()
