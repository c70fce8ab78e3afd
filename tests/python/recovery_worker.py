"""A DDP job that loses a rank and goes on (test_recovery.py).

    recovery_worker.py kill  OUT   4 ranks; rank 3 SIGKILLs itself at step 30;
                                   the survivors recover through
                                   shoal.torch.recover (dist.shrink_group) and
                                   train to step 100; rank 0 saves the step-29
                                   state and the final one's sha256
    recovery_worker.py fresh OUT   3 ranks from that step-29 state, steps 30-99

Every batch is a function of (step, rank) only, so the two runs see the same
data in the same order from step 30 on.
"""
import faulthandler
import hashlib
import io
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shoal.torch

MODE, OUT = sys.argv[1], sys.argv[2]
KILL_STEP, STEPS = 30, 100


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def digest(model):
    buf = io.BytesIO()
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


def main():
    faulthandler.enable()
    dist.init_process_group("shoal", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    start = 0
    if MODE == "fresh":
        model.load_state_dict(torch.load(os.path.join(OUT, "step29.pt")))
        start = KILL_STEP
    group = dist.group.WORLD
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = start
    recovered_after = None
    while step < STEPS:
        if MODE == "kill" and step == KILL_STEP and rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, group.rank())
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        except Exception as e:  # noqa: BLE001  a lost rank: recover, then redo this step
            t0 = time.monotonic()
            assert MODE == "kill" and step == KILL_STEP, f"step {step}: {e}"
            group = shoal.torch.recover(group)
            assert group.size() == 3 and dist.get_backend(group) == "shoal", (group.size(), dist.get_backend(group))
            ddp = DDP(model, process_group=group)
            recovered_after = time.monotonic() - t0
            continue
        opt.step()
        step += 1
        if MODE == "kill" and step == KILL_STEP and rank == 0:
            torch.save(model.state_dict(), os.path.join(OUT, "step29.pt"))
    if group.rank() == 0:
        with open(os.path.join(OUT, f"{MODE}.sha256"), "w") as f:
            f.write(digest(model))
    print(f"DONE rank {rank} recovered_after {recovered_after}", flush=True)


main()
