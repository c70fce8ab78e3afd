#!/usr/bin/env python3
"""Data-parallel training that survives a lost rank: the survivors agree, shrink and go on.

    build/bin/shoalrun --standalone --nproc-per-node 4 --fault-tolerance shrink \\
        examples/train_elastic.py --kill-rank 2 --kill-step 5

A small regression model trained with torch's DistributedDataParallel on the
``shoal`` backend. Each step is a *commit*: it starts from the state every
rank holds (model and optimizer), takes the step's global batch (the same
samples whatever the number of ranks: a fixed order of the data set, the
step's slice of it), splits it evenly over the ranks there are, and ends with
every rank holding the new state. With ``--kill-rank R --kill-step S`` rank R
SIGKILLs itself in the middle of step S (after its forward pass, before the
gradients are reduced). Every survivor's reduction then fails with an error
that names the lost rank; the survivors call ``shoal.torch.recover(group)``
(agree on who is left, shrink the group through
``torch.distributed.shrink_group``), go back to the step's commit, wrap the
model again for the smaller group and redo the step with the batch split over
fewer ranks. No sample is lost or seen twice: a step's batch depends only on
the step. Each survivor prints what happened and how long the recovery took;
the kill and the end of the redone step carry CLOCK_MONOTONIC stamps (``t=``,
one clock for every process of a machine, network namespaces included).

The launcher must keep the survivors running when a rank dies
(``--fault-tolerance shrink``: shoalrun then also hosts the job's store, so
losing rank 0 loses nothing). With ``--fault-tolerance replace`` it also starts
a replacement process (``SHOAL_REPLACEMENT`` set), which calls
``shoal.torch.join()`` and waits; at the next step boundary the survivors call
``shoal.torch.grow()`` (waiting up to ``--wait-for-replacement`` seconds for as
many newcomers as ranks were lost), the newcomer takes the next rank, rank 0
hands it the commit, and the step is done by the full number of ranks again;
a replacement that comes later is admitted at the first boundary after it
arrives. ``--save-state F --save-at S`` writes the
commit before step S to F; ``--resume F`` starts from such a file (a fresh
job of any size); ``--final F`` writes the final state's sha256 (rank 0),
so that a run that lost a rank can be compared with a fresh one.
"""

import argparse
import hashlib
import io
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shoal.torch  # noqa: F401  (registers the backend, and recover())
from shoal.torch import grow, join, recover


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=24, help="samples per step over all ranks (divisible by 4 and 3)")
    p.add_argument("--samples", type=int, default=2400)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--save-state", default="")
    p.add_argument("--save-at", type=int, default=-1)
    p.add_argument("--resume", default="")
    p.add_argument("--final", default="")
    p.add_argument("--wait-for-replacement", type=float, default=60.0,
                   help="seconds the survivors wait for replacements (--fault-tolerance replace)")
    return p.parse_args()


def data(n):
    """The data set and its order: the same on every rank, whatever the world."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return x, y, torch.randperm(n, generator=g)


def model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def state_of(net, opt, step):
    return {"step": step, "model": {k: v.clone() for k, v in net.state_dict().items()},
            "optimizer": _copy(opt.state_dict())}


def _copy(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def sha256(net, opt):
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def hand_over(net, opt, step):
    """After a grow: rank 0's commit to every rank (the newcomers have none)."""
    box = [state_of(net, opt, step) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    net.load_state_dict(box[0]["model"])
    opt.load_state_dict(box[0]["optimizer"])
    return box[0]["step"]


def main():
    a = parse_args()
    me = int(os.environ.get("RANK", "0"))  # the launcher's rank: the name this process keeps in the messages
    replacing = os.environ.get("SHOAL_FAULT_TOLERANCE") == "replace"
    full = int(os.environ.get("WORLD_SIZE", "1"))
    x, y, order = data(a.samples)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    step = 0
    events = []
    if os.environ.get("SHOAL_REPLACEMENT"):
        t0 = time.monotonic()
        group = join(timeout=a.wait_for_replacement + 60)
        step = hand_over(net, opt, step)
        events.append(f"replacement {os.environ['SHOAL_REPLACEMENT']} joined at step {step} in "
                      f"{(time.monotonic() - t0) * 1e3:.0f} ms as rank {dist.get_rank()} of {dist.get_world_size()}")
        print(f"rank {me}: {events[-1]}", flush=True)
    else:
        dist.init_process_group("shoal")
        group = dist.group.WORLD
        if a.resume:
            saved = torch.load(a.resume, weights_only=False)
            net.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
            step = saved["step"]
    ddp = DDP(net, process_group=group)
    lost = 0  # ranks lost and not yet replaced
    redoing = False
    while step < a.steps:
        if replacing and dist.get_world_size(group) < full:
            # A step boundary: admit replacements (waiting for them right after a loss).
            t0 = time.monotonic()
            try:
                grown = grow(joiners=lost if lost else -1, timeout=a.wait_for_replacement)
            except RuntimeError as e:
                grown = None
                print(f"rank {me}: no replacement within {a.wait_for_replacement:.0f} s ({str(e)[:120]}); "
                      f"going on with {dist.get_world_size(group)} ranks", flush=True)
            lost = 0
            if grown is not None:
                before = dist.get_world_size(group)
                group = grown
                step = hand_over(net, opt, step)
                ddp = DDP(net, process_group=group)
                events.append(f"grew at step {step} in {(time.monotonic() - t0) * 1e3:.0f} ms: {before} -> "
                              f"{dist.get_world_size(group)} ranks, this rank is {dist.get_rank(group)}")
                print(f"rank {me}: {events[-1]}", flush=True)
        commit = state_of(net, opt, step)
        if a.save_state and step == a.save_at and me == 0:
            torch.save(commit, a.save_state)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        idx = order[(step * a.batch) % a.samples:][:a.batch]
        mine = idx.chunk(world)[rank]
        try:
            opt.zero_grad(set_to_none=True)
            out = ddp(x[mine])
            # the step's loss is the mean over its whole batch: each rank's share, scaled so that DDP's
            # average over the ranks gives it
            loss = torch.nn.functional.mse_loss(out, y[mine], reduction="sum") * world / a.batch
            if me == a.kill_rank and step == a.kill_step and not os.environ.get("SHOAL_REPLACEMENT"):
                print(f"rank {me}: killing myself in the middle of step {step} (t={time.monotonic():.6f})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()         # the gradients' all-reduce: where the survivors see the loss
            opt.step()
        except RuntimeError as e:
            t0 = time.monotonic()
            cause = str(e).splitlines()[0][:200]
            before = dist.get_world_size(group)
            group = recover(group)
            lost += before - dist.get_world_size(group)
            took = time.monotonic() - t0
            net.load_state_dict(commit["model"])
            opt.load_state_dict(commit["optimizer"])
            ddp = DDP(net, process_group=group)
            events.append(f"step {step} failed ({cause}); recovered in {took * 1e3:.0f} ms: "
                          f"{world} -> {dist.get_world_size(group)} ranks, this rank is now "
                          f"{dist.get_rank(group)}; redoing step {step}")
            print(f"rank {me}: {events[-1]}", flush=True)
            redoing = True
            continue
        if redoing:  # the first step after a recovery is done: every collective of it completed
            print(f"rank {me}: step {step} redone (t={time.monotonic():.6f})", flush=True)
            redoing = False
        step += 1
    digest = sha256(net, opt)
    if dist.get_rank(group) == 0:
        print(f"rank {me}: done: {step} steps on {dist.get_world_size(group)} ranks, last loss "
              f"{loss.item():.5f}, state sha256 {digest[:16]}", flush=True)
        if a.final:
            with open(a.final, "w") as f:
                f.write(digest + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
