"""Data for the example scripts of this folder: nothing to download.

``mnist_like`` yields (images, labels) batches shaped as MNIST's (1x28x28, 10
classes) that a small network learns in a few steps: each class is a fixed
random image, each sample that image plus noise.
"""

import torch


def mnist_like(steps, batch_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(10, 1, 28, 28, generator=g)
    for _ in range(steps):
        target = torch.randint(0, 10, (batch_size,), generator=g)
        yield prototypes[target] + 0.5 * torch.randn(batch_size, 1, 28, 28, generator=g), target
