"""One rank of tests/python/test_mp_fault_scope.py: a failure stays in its data-parallel replica.

4 ranks, 2 partitions x 2 replicas: ranks 0 and 1 are replica 0's pipeline,
ranks 2 and 3 replica 1's; the DP groups are [0, 2] and [1, 3]. The model
trains two steps with ``backward_passes_per_step=2`` (the second averages
the gradients over the replicas) against a plain reference; then rank 3 is
SIGKILLed and:

- rank 2 (its pipeline's other rank): its next step fails naming rank 3;
- ranks 0 and 1 (replica 0): a step that skips the gradient average runs
  through their pipeline with the reference's loss and gradients; a step
  that averages fails naming rank 3, within seconds, and so do later steps
  (the replica ends as a unit, failure.py); collectives on smp's PP and MP
  groups still run, one on the DP group fails naming rank 3; rank 1 then
  recovers its DP group ([1, 3]) without rank 3 (shoal.torch.recover).

Rank 2 stays up until replica 0 is done (a key in the store), so that
nothing replica 0 sees is caused by its exit. Prints the RESULT line of
harness.Checks.
"""

import os
import signal
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mp_models as M  # noqa: E402
import shoal.modelparallel as smp  # noqa: E402
import shoal.torch  # noqa: E402
from harness import Checks  # noqa: E402
from mp_worker import close, same_state  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)

RANK = int(os.environ["RANK"])
DEAD = 3
FAST_S = 20   # a failure must be raised within this (the operation timeout is 60 s)


def raises_naming_dead(fn, what):
    """Runs `fn`, which must fail within FAST_S naming rank DEAD as the job numbers it."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        took = time.monotonic() - t0
        text = f"{type(e).__name__}: {e}"
        assert f"rank {DEAD}" in text, f"{what}: the error does not name rank {DEAD}: {text}"
        assert took < FAST_S, f"{what}: took {took:.1f} s to fail"
        print(f"rank {RANK}: {what} failed in {took:.2f} s: {text[:600]}", flush=True)
        return text
    raise AssertionError(f"{what}: did not fail after rank {DEAD} died")


def main():
    c = Checks()
    smp.init({"partitions": 2, "ddp": True, "microbatches": 2, "pipeline": "interleaved"})
    assert (smp.pp_size(), smp.dp_size(), smp.get_mp_group()) == (2, 2, [RANK // 2 * 2, RANK // 2 * 2 + 1])
    dp, r = smp.dp_size(), smp.dp_rank()
    data = M.chain_data(3, 8 * dp)

    def mine(k):
        x, y = data[k]
        b = x.size(0) // dp
        return x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]

    torch.manual_seed(0)
    ref = M.Chain(depth=4)
    torch.manual_seed(0)
    net = M.Chain(depth=4)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in data[:2]:
        F.cross_entropy(ref(x), y).backward()
    ropt.step()
    # what this replica's step on its part of batch 2 must give: no average, no optimizer step
    ref.zero_grad()
    want_loss = F.cross_entropy(ref(mine(2)[0]), mine(2)[1])
    want_loss.backward()
    want_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}

    model = smp.DistributedModel(net, backward_passes_per_step=2)
    opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))

    @smp.step
    def train_step(model, x, y):
        loss = F.cross_entropy(model(x), y)
        model.backward(loss)
        return loss

    def train():
        opt.zero_grad()
        for k in (0, 1):
            train_step(model, *mine(k))
        opt.step()
        same_state(model.state_dict(), ref.state_dict(), "parameters after two steps")
    c.run("two steps averaged over both replicas", train)
    smp.barrier()
    if RANK == DEAD:
        os.kill(os.getpid(), signal.SIGKILL)
    store = dist.distributed_c10d._get_default_store()

    if smp.dp_rank() == 1:   # rank 2: the dead rank's pipeline
        c.run("the dead rank's pipeline fails naming it",
              raises_naming_dead, lambda: train_step(model, *mine(2)), "rank 2's step")
        store.wait(["replica0-done/0", "replica0-done/1"])
        return c.report()

    def pipeline_step():
        opt.zero_grad()
        loss = train_step(model, *mine(2)).reduce_mean()   # backward pass 3: no average
        close(loss, want_loss, "loss")
        local = dict(model.local_named_parameters())
        assert local, "no parameters on this rank"
        for n, p in local.items():
            close(p.grad, want_grads[n], f"gradient of {n}")

    c.run("replica 0: a step through its pipeline after rank 3 died", pipeline_step)
    c.run("replica 0: the gradient average fails naming rank 3",
          raises_naming_dead, lambda: train_step(model, *mine(0)), "step 4 (averages)")
    c.run("replica 0: a later step is refused naming rank 3",
          raises_naming_dead, lambda: train_step(model, *mine(2)), "step 5")

    def groups():
        for name, g in (("pp", smp.get_pp_process_group()), ("mp", smp.get_mp_process_group())):
            t = torch.full((5,), float(RANK + 1))
            dist.all_reduce(t, group=g)
            close(t, torch.full((5,), 3.0), f"all_reduce on smp's {name} group")
        raises_naming_dead(lambda: dist.all_reduce(torch.ones(3), group=smp.get_dp_process_group()),
                           "all_reduce on smp's dp group")
    c.run("replica 0: collectives on its pp and mp groups; the dp group fails", groups)

    if RANK == 1:
        def recover():
            g = shoal.torch.recover(smp.get_dp_process_group(), window=5.0)
            assert g.size() == 1, f"the recovered dp group has {g.size()} ranks, want 1"
            t = torch.full((2,), 4.0)
            dist.all_reduce(t, group=g)
            close(t, torch.full((2,), 4.0), "all_reduce on the recovered dp group")
        c.run("rank 1 recovers its dp group without rank 3", recover)
    store.set(f"replica0-done/{RANK}", "1")
    return c.report()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)   # no teardown: the groups with the dead rank cannot be destroyed collectively
