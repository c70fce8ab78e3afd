#!/usr/bin/env python3
"""A PyTorch script for the SageMaker model-parallel library v1 with automatic partitioning,
written as the library's guide tells GPU users to write one: the device set with
``torch.cuda.set_device(smp.local_rank())``, the batch moved with ``.to(device)``, mixed
precision with ``torch.autocast`` and ``smp.amp.GradScaler``. The library splits the model
over ``partitions`` ranks by itself and places each part on its rank's GPU.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/smp/auto_partition.py

The data is synthetic (synthetic.py), shaped as MNIST's. Exit status 1 if the last loss is not below half the first.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import smdistributed.modelparallel.torch as smp
from synthetic import mnist_like


class GroupedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 64)
        self.fc4 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return F.log_softmax(self.fc4(x), 1)


@smp.step
def train_step(model, scaler, data, target):
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        output = model(data)
    loss = F.nll_loss(output.float(), target, reduction="mean")
    model.backward(scaler.scale(loss))
    return output, loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    smp.init({"partitions": 2, "microbatches": 4, "pipeline": "interleaved", "ddp": True})
    torch.cuda.set_device(smp.local_rank())
    device = torch.device("cuda")

    torch.manual_seed(1)
    model = GroupedNet()
    model.to(device)      # the library places the partitions; this is ignored, as in SageMaker's
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)
    scaler = smp.amp.GradScaler()

    model.train()
    losses = []
    for data, target in mnist_like(args.steps, args.batch_size, seed=smp.dp_rank()):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        _, loss_mb = train_step(model, scaler, data, target)
        loss = loss_mb.reduce_mean()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
        if smp.rank() == 0 and len(losses) % 5 == 0:
            print(f"step {len(losses)}: loss {losses[-1]:.4f}", flush=True)
    ok = losses[-1] < 0.5 * losses[0]
    if smp.rank() == 0:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'ok' if ok else 'did not learn'})", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
