#!/usr/bin/env python3
"""A PyTorch script for the SageMaker model-parallel library v1 with manual partitioning
(``auto_partition: false``): ``smp.partition(i)`` contexts say which layers run on which
partition; layers outside any context go to ``default_partition``. Written as the library's
guide tells GPU users to write one (``torch.cuda.set_device(smp.local_rank())``, the batch
moved with ``.to(device)``); the library places each partition on its rank's GPU.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/smp/manual_partition.py

Synthetic MNIST-shaped data, as in auto_partition.py. Exit status 1 if the last loss is not
below half the first.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import smdistributed.modelparallel.torch as smp
from synthetic import mnist_like


class Net1(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 128)

    def forward(self, x):
        return F.relu(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))))


class Net2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc3 = nn.Linear(128, 64)
        self.fc4 = nn.Linear(64, 10)

    def forward(self, x):
        return F.log_softmax(self.fc4(F.relu(self.fc3(x))), 1)


class GroupedNet(nn.Module):
    def __init__(self):
        super().__init__()
        with smp.partition(0):
            self.net1 = Net1()
        with smp.partition(1):
            self.net2 = Net2()

    def forward(self, x):
        return self.net2(self.net1(x))


@smp.step
def train_step(model, data, target):
    loss = F.nll_loss(model(data), target)
    model.backward(loss)
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    smp.init({"partitions": 2, "microbatches": 4, "pipeline": "simple", "auto_partition": False,
              "default_partition": 0, "ddp": True})
    torch.cuda.set_device(smp.local_rank())
    device = torch.device("cuda")

    torch.manual_seed(1)
    model = GroupedNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model = smp.DistributedModel(model)
    optimizer = smp.DistributedOptimizer(optimizer)

    model.train()
    losses = []
    for data, target in mnist_like(args.steps, args.batch_size, seed=smp.dp_rank()):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = train_step(model, data, target).reduce_mean()
        optimizer.step()
        losses.append(loss.item())
        if smp.rank() == 0 and len(losses) % 5 == 0:
            print(f"step {len(losses)}: loss {losses[-1]:.4f}", flush=True)
    on_device = all(p.device.type == device.type for p in model.local_parameters())
    ok = losses[-1] < 0.5 * losses[0] and on_device
    if smp.rank() == 0:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}, local parameters on {device.type}: {on_device} "
              f"({'ok' if ok else 'failed'})", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
