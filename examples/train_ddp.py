#!/usr/bin/env python3
"""Data-parallel training, written the way the SageMaker data-parallel guide
writes it, running on shoal's `smddp` backend.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/train_ddp.py
    build/bin/shoalrun --standalone --nproc-per-node 2 examples/train_ddp.py --backend gloo

On a machine with GPUs it is the guide's GPU script (each worker on the GPU of
its LOCAL_RANK, `torch.cuda.set_device`, the model moved there, DDP with
`device_ids`); elsewhere it runs on the CPU. `--device` chooses.

The structure is the guide's: import the smddp client, init_process_group with
backend "smddp", divide the batch size by the world size, shard the data with a
DistributedSampler(num_replicas, rank), wrap the model in
DistributedDataParallel, train with Adadelta and StepLR, evaluate on rank 0 and
save the checkpoint on rank 0 only (atomically: write, then rename).

The data is scikit-learn's handwritten digits (1797 8x8 images, 10 classes),
split 80/20 with a fixed seed. Rank 0 prints, per epoch, the training loss
averaged over all ranks, the test accuracy, and the throughput (samples/s over
all ranks). The exit status is 1 if the final accuracy is under
--min-accuracy.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="smddp", help="smddp (default), shoal, gloo or nccl")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto (default): cuda when there is a GPU, else cpu")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (default 64)")
    p.add_argument("--test-batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=1.0, help="Adadelta learning rate (default 1.0)")
    p.add_argument("--gamma", type=float, default=0.8, help="StepLR decay per epoch (default 0.8)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-accuracy", type=float, default=0.95,
                   help="exit 1 if the final test accuracy is below this (default 0.95)")
    p.add_argument("--checkpoint", default="build/demo/digits_cnn.pt",
                   help="where rank 0 saves the model (default build/demo/digits_cnn.pt)")
    return p.parse_args()


class Net(nn.Module):
    """A small CNN for 8x8 digit images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def digits_datasets(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixels are 0..16
    x = (x - 0.5) / 0.5
    y = torch.tensor(d.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(range(len(y)), test_size=0.2, random_state=seed,
                                           stratify=d.target)
    return TensorDataset(x[idx_train], y[idx_train]), TensorDataset(x[idx_test], y[idx_test])


def train(model, train_loader, optimizer, epoch, device):
    model.train()
    total, count = torch.zeros(2, dtype=torch.float64), 0
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total[0] += loss.item() * len(data)
        total[1] += len(data)
        count += len(data)
    dist.all_reduce(total)  # the loss over every rank's samples (a CPU tensor: one group serves both)
    return (total[0] / total[1]).item(), int(total[1].item())


def test(model, test_loader, device):
    model.eval()
    correct = loss = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            out = model(data)
            loss += F.nll_loss(out, target, reduction="sum").item()
            correct += (out.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    return loss / n, correct / n


def save_atomically(state, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    args = parse_args()
    if args.backend == "smddp":
        import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
    elif args.backend == "shoal":
        import shoal.torch  # noqa: F401
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:  # the guide's GPU script: one GPU per worker, chosen by LOCAL_RANK
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=args.backend)
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))

    # The guide's rule: the batch size is divided among the workers.
    args.batch_size = max(args.batch_size // world_size, 1)
    torch.manual_seed(args.seed)

    train_dataset, test_dataset = digits_datasets(args.seed)
    train_sampler = DistributedSampler(train_dataset, num_replicas=world_size, rank=rank,
                                       shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=False,
                              sampler=train_sampler)
    test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size, shuffle=False)

    model = DDP(Net().to(device), device_ids=[device.index] if use_cuda else None)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    if rank == 0:
        print(f"train_ddp: backend {dist.get_backend()}, {world_size} workers on {device.type}, "
              f"{len(train_dataset)} training / {len(test_dataset)} test images (sklearn digits), "
              f"batch {args.batch_size} per worker", flush=True)
    accuracy = 0.0
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        train_loss, samples = train(model, train_loader, optimizer, epoch, device)
        dt = time.perf_counter() - t0
        if rank == 0:
            test_loss, accuracy = test(model.module, test_loader, device)
            print(f"epoch {epoch:2d}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"accuracy {accuracy:6.2%}  {samples / dt:8.0f} samples/s", flush=True)
        scheduler.step()
    elapsed = time.perf_counter() - start

    if rank == 0:
        save_atomically(model.module.state_dict(), args.checkpoint)
        print(f"train_ddp: final test accuracy {accuracy:.2%} after {args.epochs} epochs "
              f"in {elapsed:.1f} s; checkpoint {args.checkpoint}", flush=True)
    ok = torch.tensor([1 if (rank != 0 or accuracy >= args.min_accuracy) else 0])
    dist.broadcast(ok, src=0)
    dist.destroy_process_group()
    if not ok.item():
        if rank == 0:
            print(f"train_ddp: accuracy {accuracy:.2%} is below {args.min_accuracy:.0%}", flush=True)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
