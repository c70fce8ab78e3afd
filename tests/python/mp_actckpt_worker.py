"""One rank of the activation-checkpointing test job (see harness.py). Usage: mp_actckpt_worker.py SUITE ...

Every check trains a model with dropout through the pipeline twice from the
same seed, once with activation checkpointing and once without, and
compares losses and gradients: with preserve_rng_state the recomputation
draws the same random numbers, so they must agree to float precision. The
modules log their forward calls, which shows that a forward really ran again
in the backward pass, and in which groups.
"""

import os
import sys
import warnings

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shoal.modelparallel as smp  # noqa: E402
import shoal.modelparallel.activation_checkpointing as AC  # noqa: E402
from harness import Checks  # noqa: E402
from shoal.modelparallel import tracing  # noqa: E402
from shoal.modelparallel.patches.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
SUITES = {}
LOG = []            # (block index) of every forward call of a logged block, in order
INNER = []          # one entry per forward call of the Tanh inside a block
D = 16


def suite(name):
    def reg(fn):
        SUITES[name] = fn
        return fn
    return reg


class CountTanh(nn.Module):
    def forward(self, x):
        if not x.is_meta:       # (the pipeline's tracer runs modules on meta tensors for shapes)
            INNER.append(1)
        return torch.tanh(x)


class DBlock(nn.Module):
    """A residual block with dropout that logs its forward calls."""

    def __init__(self, i, functional=False):
        super().__init__()
        self.i, self.functional = i, functional
        self.ff = nn.Sequential(nn.Linear(D, D), nn.Dropout(0.25), CountTanh(), nn.Linear(D, D))

    def forward(self, x):
        if not x.is_meta:
            LOG.append(self.i)
        if self.functional:     # inside a unit: runs at every call
            return x + checkpoint_sequential(self.ff, x, strategy="group_2")
        return x + self.ff(x)


class DropNet(nn.Module):
    """inp -> 6 blocks (an nn.Sequential) -> out; `ckpt_mid`: the forward (glue the
    pipeline traces) checkpoints `mid` with smp.patches.checkpoint.checkpoint."""

    def __init__(self, functional=False, blocks=6):
        super().__init__()
        self.functional = functional
        self.inp = nn.Linear(8, D)
        self.blocks = nn.Sequential(*[DBlock(i, functional) for i in range(blocks)])
        self.mid = nn.Sequential(nn.Linear(D, D), nn.Dropout(0.25))
        self.out = nn.Linear(D, 4)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = self.blocks(h)
        h = checkpoint(self.mid, h) if self.functional else self.mid(h)
        return self.out(h)


def manual_split(net):
    """Blocks 0-2 (and inp) on partition 0, blocks 3-5, mid and out on partition 1."""
    for b in list(net.blocks)[3:]:
        smp.set_partition(b, 1)
    smp.set_partition(net.mid, 1)
    smp.set_partition(net.out, 1)


DATA = [(torch.randn(8, 8, generator=torch.Generator().manual_seed(k)),
         torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(100 + k))) for k in range(2)]


@smp.step
def train_step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    model.backward(loss)
    return loss


@smp.step
def eval_step(model, x, y):
    return F.cross_entropy(model(x), y)


def train(cfg, make, mark=None, place=None, steps=2):
    """Trains `steps` steps through the pipeline; returns losses, per-step local
    gradients, the model, the blocks' forward-call log of the first step and the
    number of forward calls of the Tanh inside the blocks in each step (the
    first step's includes the automatic partitioner's measuring runs)."""
    smp.init(cfg)
    torch.manual_seed(0)
    net = make()
    if place:
        place(net)
    model = smp.DistributedModel(net)
    if mark:
        mark(model)
    opt = smp.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    torch.manual_seed(1)            # the dropout stream: the same in every run
    losses, grads, first_log, inner = [], [], None, []
    for x, y in DATA[:steps]:
        LOG.clear()
        INNER.clear()
        opt.zero_grad()
        losses.append(train_step(model, x, y).reduce_mean())
        if first_log is None:
            first_log = list(LOG)
        inner.append(len(INNER))
        grads.append({n: p.grad.clone() for n, p in model.local_named_parameters() if p.grad is not None})
        opt.step()
    return losses, grads, model, first_log, inner


def same_run(got, want, what):
    """Losses and every local gradient of two runs agree (tight tolerance)."""
    gl, gg = got[0], got[1]
    wl, wg = want[0], want[1]
    assert torch.allclose(torch.tensor(gl, dtype=torch.float64), torch.tensor(wl, dtype=torch.float64),
                          rtol=1e-6, atol=1e-7), f"{what}: losses {gl} != {wl}"
    for k, (a, b) in enumerate(zip(gg, wg)):
        assert set(a) == set(b) and a, f"{what}: step {k}: gradients of {sorted(a)} against {sorted(b)}"
        for n in a:
            if not torch.allclose(a[n], b[n], rtol=1e-6, atol=1e-7):
                raise AssertionError(f"{what}: step {k}: gradient of {n} differs by "
                                     f"{(a[n] - b[n]).abs().max().item():.3g}")


# ----------------------------------------------------------------- strategies

# The forward-call log of one step on each rank, m = 2, fill-drain schedule:
# the forward of both microbatches, then each microbatch's recomputation in
# the order the backward reaches it (a group recomputes its blocks in order).
RECOMPUTE = {
    "each": {0: [2, 1, 0], 1: [5, 4, 3]},
    "contiguous": {0: [0, 1, 2], 1: [3, 4, 5]},
    "group_2": {0: [2, 0, 1], 1: [5, 3, 4]},
}


@suite("strategies")
def strategies(c):
    """2 partitions (manual: blocks 0-2 | 3-5), both schedules: set_activation_checkpointing on
    the nn.Sequential of blocks (each block a pipeline unit) with the three strategies, and on
    the nn.Sequential inside every block (inside a unit), against the same run without."""
    mine = [0, 1, 2] if RANK == 0 else [3, 4, 5]     # rank = pp_rank (2 ranks, 2 partitions)
    for pipeline in ("simple", "interleaved"):
        cfg = {"partitions": 2, "microbatches": 2, "pipeline": pipeline, "auto_partition": False}
        base = train(cfg, DropNet, place=manual_split)
        fwd = [b for _ in range(2) for b in mine]
        assert base[3] == fwd, f"without checkpointing: forward calls {base[3]}, want {fwd}"

        for strategy in ("each", "contiguous", "group_2"):
            def run(strategy=strategy):
                got = train(cfg, DropNet, place=manual_split, mark=lambda model: smp_ac(
                    model.module.blocks, strategy=strategy))
                same_run(got, base, f"{pipeline} {strategy}")
                if pipeline == "simple":
                    want = fwd + RECOMPUTE[strategy][RANK] * 2
                    assert got[3] == want, f"forward calls {got[3]}, want {want}"
                else:   # the order interleaves microbatches: each block ran twice per microbatch
                    assert sorted(got[3]) == sorted(fwd * 2), got[3]
            c.run(f"{pipeline}: blocks (units), strategy {strategy}", run)

        def inside(strategy):
            def marks(model):
                for b in model.module.blocks:
                    smp_ac(b.ff, strategy=strategy)
            got = train(cfg, DropNet, place=manual_split, mark=marks)
            same_run(got, base, f"{pipeline} inside units, {strategy}")
            assert got[3] == fwd, f"a block's own forward ran again: {got[3]}"
            assert got[4] == [2 * len(fwd)] * 2 and base[4] == [len(fwd)] * 2, \
                f"Tanh inside: {got[4]} calls, {base[4]} without"
        c.run(f"{pipeline}: ff inside every block, each", inside, "each")
        c.run(f"{pipeline}: ff inside every block, contiguous", inside, "contiguous")

        def whole_block():
            def marks(model):
                smp_ac(model.module.blocks[1])
                smp_ac(model.module.blocks[4])
            got = train(cfg, DropNet, place=manual_split, mark=marks)
            same_run(got, base, f"{pipeline} one whole block")
            again = 1 if RANK == 0 else 4
            assert got[3].count(again) == 4 and all(got[3].count(b) == 2 for b in mine if b != again), got[3]
        c.run(f"{pipeline}: one block checkpointed whole", whole_block)


def smp_ac(module, **kw):
    AC.set_activation_checkpointing(module, **kw)


# ----------------------------------------------------------------- functional forms

@suite("functional")
def functional(c):
    """Automatic partitioning (memory only, so both runs place the same): checkpoint() on `mid`
    from the traced forward (mid becomes a unit that checkpoints), checkpoint_sequential inside
    every block (a unit); no checkpoint while smp measures or traces, or without grad."""
    calls = []
    orig = AC.run_checkpointed

    def counting(fn, args, kwargs, preserve):
        calls.append((tracing.is_tracing(), AC._fx_tracing(), torch.is_grad_enabled()))
        return orig(fn, args, kwargs, preserve)

    for pipeline in ("simple", "interleaved"):
        cfg = {"partitions": 2, "microbatches": 2, "pipeline": pipeline, "memory_weight": 1.0}

        def run():
            base = train(cfg, lambda: DropNet(functional=False, blocks=4))
            AC.run_checkpointed = counting
            calls.clear()
            try:
                got = train(cfg, lambda: DropNet(functional=True, blocks=4))
            finally:
                AC.run_checkpointed = orig
            pb, pg = base[2]._smp.rt.pl, got[2]._smp.rt.pl
            assert pb.unit_part == pg.unit_part, \
                f"the runs were placed differently: {pb.unit_part} against {pg.unit_part}"
            assert got[4][-1] == 2 * base[4][-1] > 0, f"Tanh inside the blocks: {got[4]} calls, {base[4]} without"
            same_run(got, base, f"functional {pipeline}")
            assert calls, "no checkpoint ran"
            assert not any(t or fx or not g for t, fx, g in calls), f"checkpointed while tracing: {calls}"
            if "mid" in pg.unit_part and pg.unit_part["mid"] == smp.pp_rank():
                mk = getattr(got[2].module.mid, "_smp_activation_checkpointing", None)
                assert mk is not None and mk.functional, "checkpoint() in the traced forward left no mark"
            n = len(calls)
            with torch.no_grad():
                eval_step(got[2], *DATA[0])
            assert len(calls) == n, "checkpointing ran without grad"
        c.run(f"{pipeline}: checkpoint / checkpoint_sequential", run)


# ----------------------------------------------------------------- bad input

class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class PairNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, D)
        self.pair = Pair()
        self.out = nn.Linear(D, 4)

    def forward(self, x):
        return self.out(self.pair(torch.tanh(self.inp(x))))


def raises(fn, *words):
    try:
        fn()
    except smp.SMPValidationError as e:
        for w in words:
            assert w in str(e), f"the error does not name {w!r}: {e}"
        return
    raise AssertionError(f"no error (expected one naming {words})")


@suite("errors")
def errors(c):
    cfg = {"partitions": 2, "microbatches": 2, "auto_partition": False}

    def arguments():
        smp.init(cfg)
        net = DropNet()
        raises(lambda: smp_ac(net.blocks), "smp.DistributedModel")          # not wrapped yet
        model = smp.DistributedModel(net)
        blocks = model.module.blocks
        raises(lambda: smp_ac(blocks, strategy="eachh"), "strategy", "'eachh'")
        raises(lambda: smp_ac(blocks, strategy="group_0"), "group_N", "'0'")
        raises(lambda: smp_ac(blocks, strategy="group_x"), "group_N", "'x'")
        raises(lambda: smp_ac(blocks, strategy=3), "strategy", "3")
        raises(lambda: smp_ac(blocks, preserve_rng_state="yes"), "preserve_rng_state")
        raises(lambda: smp_ac(model.module.inp, strategy="contiguous"), "strategy", "Linear", "Sequential")
        raises(lambda: smp_ac(model.module.inp, pack_args_as_tuple=True), "pack_args_as_tuple", "Linear")
        raises(lambda: smp_ac(nn.Linear(2, 2)), "not part of the wrapped model")
        raises(lambda: smp_ac(model.module), "wrapped module itself")
        raises(lambda: checkpoint(lambda t: t, torch.ones(2)), "torch.nn.Module")
        raises(lambda: checkpoint_sequential(model.module.inp, torch.ones(2)), "nn.Sequential")
        raises(lambda: checkpoint_sequential(blocks, torch.ones(2), strategy="group_-1"), "group_N")
        manual_split(net)
        train_step(model, *DATA[0])
        raises(lambda: smp_ac(blocks), "partitioned already")
    c.run("argument errors", arguments)

    def split_module():   # last: the failed step breaks this smp.init's groups
        smp.init(cfg)
        net = PairNet()
        smp.set_partition(net.pair.b, 1)
        smp.set_partition(net.out, 1)
        model = smp.DistributedModel(net)
        smp_ac(model.module.pair)
        raises(lambda: train_step(model, *DATA[0]), "'pair'", "partitions 0, 1", "one partition")
        assert not model.partitioned
        assert all(p.grad is None for p in net.parameters())
    c.run("a checkpointed module across partitions (manual)", split_module)


def main():
    c = Checks()
    for item in sys.argv[1:]:
        c.prefix = item + ": "
        SUITES[item](c)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
