#!/usr/bin/env python3
"""The SageMaker data-parallel library's TensorFlow 2 MNIST script on shoal:
DistributedGradientTape averages the gradients over the ranks (one fused
collective per bucket), the variables are broadcast from rank 0 after the
first batch, and the loss printed is averaged over the ranks.

    build/bin/shoalrun --standalone --nproc-per-node 2 examples/tensorflow/sdp_tf2_mnist.py

Each rank reads its own shard of the data; rank 0 prints the loss every
--log-every batches. The exit status is 1 if the final test accuracy is
below --min-accuracy.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import smdistributed.dataparallel.tensorflow as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--samples", type=int, default=4096, help="training images")
p.add_argument("--log-every", type=int, default=20)
p.add_argument("--min-accuracy", type=float, default=0.9)
args = p.parse_args()

tf.random.set_seed(42)
dist.init()
(x_train, y_train), (x_test, y_test) = mnist_data.load(args.samples)
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(dist.size(), dist.rank()) \
    .repeat().shuffle(10000, seed=dist.rank()).batch(args.batch)

mnist_model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
loss = tf.losses.SparseCategoricalCrossentropy()
opt = tf.optimizers.Adam(0.000125 * dist.size() * 8)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    tape = dist.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
    if first_batch:
        dist.broadcast_variables(mnist_model.variables, root_rank=0)
        dist.broadcast_variables(opt.variables(), root_rank=0)
    return dist.oob_allreduce(loss_value)


for batch, (images, labels) in enumerate(dataset.take(args.steps)):
    loss_value = training_step(images, labels, batch == 0)
    if batch % args.log_every == 0 and dist.rank() == 0:
        print(f"step {batch}: loss {float(loss_value):.4f} (averaged over {dist.size()} ranks)", flush=True)

accuracy = tf.keras.metrics.SparseCategoricalAccuracy()
accuracy(y_test, mnist_model(x_test))
acc = float(dist.oob_allreduce(tf.constant(float(accuracy.result()))))
if dist.rank() == 0:
    print(f"test accuracy {acc:.3f}", flush=True)
sys.exit(0 if acc >= args.min_accuracy else 1)
