"""MNIST-shaped data for the TensorFlow examples, made here (nothing is
downloaded): 28 x 28 x 1 images of noise with a bright bar whose position
(one of 10) is the label. Every rank makes the same data from the seed."""

import numpy as np


def load(n_train=4096, n_test=1024, seed=0):
    rng = np.random.default_rng(seed)

    def make(n):
        y = rng.integers(0, 10, n)
        x = rng.uniform(0.0, 0.6, (n, 28, 28, 1)).astype(np.float32)
        for i, label in enumerate(y):
            x[i, 2 + 2 * label:4 + 2 * label, 4:24, 0] += 0.4
        return x, y.astype(np.uint8)
    return make(n_train), make(n_test)
