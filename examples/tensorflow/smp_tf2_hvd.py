#!/usr/bin/env python3
"""The SageMaker model-parallel library's TensorFlow 2 MNIST script with
Horovod (hybrid model and data parallelism) on shoal: 2 partitions x 2
replicas on 4 processes; the gradients of each partition are averaged over
its replicas with hvd.allreduce, and the variables broadcast after the
first batch with hvd.broadcast_variables (after the first step, not inside
it as SageMaker's script does: see docs/tensorflow.md, known issues).

    SM_HP_MP_PARAMETERS='{"partitions": 2, "microbatches": 2, "horovod": true}' \\
        build/bin/shoalrun --standalone --nproc-per-node 4 examples/tensorflow/smp_tf2_hvd.py

Only the import of Horovod differs from the SageMaker script: Horovod's
calls here (allreduce, broadcast_variables) come from shoal's
smdistributed.dataparallel.tensorflow, which under smp with "horovod" acts
on the replicas of this rank's partition, as Horovod does under SageMaker's
library. With Horovod installed (it builds against TensorFlow 2.12), the
original `import horovod.tensorflow as hvd` works too when the job is
started by mpirun: smp then initialises Horovod on that group
(docs/tensorflow.md, "Hybrid parallelism"). The configuration comes from
SM_HP_MP_PARAMETERS (the default below is used when it is not set). Rank 0 prints the loss and
accuracy of every epoch; the exit status is 1 if the test accuracy ends
below --min-accuracy.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("SM_HP_MP_PARAMETERS", '{"partitions": 2, "microbatches": 2, "horovod": true}')

import tensorflow as tf  # noqa: E402
from tensorflow.keras.layers import Conv2D, Dense, Flatten  # noqa: E402

import smdistributed.dataparallel.tensorflow as hvd  # noqa: E402  (was: import horovod.tensorflow as hvd)
import smdistributed.modelparallel.tensorflow as smp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--samples", type=int, default=4096, help="training images")
p.add_argument("--min-accuracy", type=float, default=0.9)
p.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "smp-tf2-checkpoints"))
args = p.parse_args()

smp.init()
tf.random.set_seed(1234)
(x_train, y_train), (x_test, y_test) = mnist_data.load(args.samples)
train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10000, seed=smp.dp_rank()) \
    .batch(args.batch, drop_remainder=True)
test_ds = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch, drop_remainder=True)


class MyModel(smp.DistributedModel):
    def __init__(self):
        super(MyModel, self).__init__()
        self.conv1 = Conv2D(32, 3, activation="relu")
        self.flatten = Flatten()
        self.d1 = Dense(128)
        self.d2 = Dense(10)

    def call(self, x, training=None):
        x = self.conv1(x)
        x = self.flatten(x)
        x = self.d1(x)
        return self.d2(x)


model = MyModel()
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.Adam(1e-3)
train_loss = tf.keras.metrics.Mean(name="train_loss")
train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
test_loss = tf.keras.metrics.Mean(name="test_loss")
test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


@smp.step
def get_grads(images, labels):
    predictions = model(images, training=True)
    loss = loss_object(labels, predictions)
    grads = optimizer.get_gradients(loss, model.trainable_variables)
    return grads, loss, predictions


@tf.function
def train_step(images, labels, first_batch):
    gradients, loss, predictions = get_grads(images, labels)
    gradients = [hvd.allreduce(g.accumulate()) for g in gradients]
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_loss(loss.reduce_mean())
    train_accuracy(labels, predictions.merge())
    return loss.reduce_mean()


@smp.step
def test_step(images, labels):
    predictions = model(images, training=False)
    t_loss = loss_object(labels, predictions)
    test_loss(t_loss)
    test_accuracy(labels, predictions)
    return t_loss


for epoch in range(args.epochs):
    for m in (train_loss, train_accuracy, test_loss, test_accuracy):
        m.reset_state()
    for batch, (images, labels) in enumerate(train_ds):
        train_step(images, labels, epoch == 0 and batch == 0)
        # SageMaker's script broadcasts inside train_step when first_batch; here
        # it runs after the first step, eagerly (docs/tensorflow.md: inside the
        # step it has been seen to overtake a gradient's allreduce on one rank).
        if epoch == 0 and batch == 0:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
    for images, labels in test_ds:
        test_step(images, labels)
    if smp.rank() == 0:
        print(f"epoch {epoch + 1}: loss {float(train_loss.result()):.4f}, accuracy "
              f"{float(train_accuracy.result()):.3f}, test loss {float(test_loss.result()):.4f}, test accuracy "
              f"{float(test_accuracy.result()):.3f}", flush=True)
smp.barrier()
sys.exit(0 if float(test_accuracy.result()) >= args.min_accuracy else 1)
