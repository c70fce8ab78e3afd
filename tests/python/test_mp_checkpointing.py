"""Activation checkpointing in the pipeline (smp.set_activation_checkpointing, smp.patches.checkpoint).

One job of 2 processes (harness.py) runs tests/python/mp_actckpt_worker.py: 2
partitions, both schedules, the three strategies and the functional forms,
each trained with dropout against the same run without checkpointing (equal
losses and gradients), the forward really recomputed, and the argument
errors. The grouping rule and the functional forms outside smp run here.
"""

import pytest
import torch
import torch.nn as nn

from harness import HERE, assert_all_passed, run_job
from shoal.modelparallel import activation_checkpointing as AC
from shoal.modelparallel.patches.checkpoint import checkpoint, checkpoint_sequential

WORKER = HERE / "mp_actckpt_worker.py"


def test_two_ranks_two_partitions():
    passed = assert_all_passed(run_job("strategies", 2, args=("functional", "errors"), worker=WORKER,
                                       timeout=240))
    assert len(passed) == 16, passed


@pytest.mark.parametrize("parts, size, want", [
    ([0, 0, 0, 1, 1, 1], 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]),
    ([0, 0, 0, 1, 1, 1], 0, [(0, 3), (3, 6)]),
    ([0, 0, 1, 1, 1], 3, [(0, 2), (2, 5)]),              # SMP's example: a,b | c,d,e
    ([0, 0, 0, 1, 1, 1], 2, [(0, 2), (2, 3), (3, 5), (5, 6)]),
    ([0, 1, 0], 0, [(0, 1), (1, 2), (2, 3)]),
    ([], 0, []),
])
def test_group_spans(parts, size, want):
    assert AC.group_spans(parts, size) == want


def test_parse_strategy():
    assert [AC.parse_strategy(s, "w") for s in ("each", "contiguous", "group_1", "group_12")] == [1, 0, 1, 12]
    for bad in ("group_0", "group_", "group_-2", "group_2x", "Each", "", None, 2):
        with pytest.raises(Exception, match="strategy"):
            AC.parse_strategy(bad, "w")


class _Logged(nn.Module):
    def __init__(self, i, log):
        super().__init__()
        self.i, self.log = i, log
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        self.log.append(self.i)
        return x + torch.tanh(self.drop(self.lin(x)))


def _run(strategy, preserve=True, tuple_input=False):
    log = []
    torch.manual_seed(0)
    seq = nn.Sequential(*[_Logged(i, log) for i in range(4)])
    x = torch.randn(3, 6)
    torch.manual_seed(1)
    if strategy is None:
        y = seq(x)
    elif tuple_input:
        y = checkpoint_sequential(seq, (x,), strategy=strategy, preserve_rng_state=preserve)
    else:
        y = checkpoint_sequential(seq, x, strategy=strategy, preserve_rng_state=preserve)
    y.sum().backward()
    return y.detach(), [p.grad.clone() for p in seq.parameters()], log


@pytest.mark.parametrize("strategy, recompute", [
    ("each", [3, 2, 1, 0]), ("contiguous", [0, 1, 2, 3]), ("group_3", [3, 0, 1, 2]), ("group_2", [2, 3, 0, 1])])
def test_checkpoint_sequential_outside_smp(strategy, recompute):
    """Without smp (one process, no partitions): the groups recompute in order, after the forward,
    and with the random state preserved the dropout masks and gradients are those of the plain run."""
    y0, g0, _ = _run(None)
    y, g, log = _run(strategy)
    assert log == [0, 1, 2, 3] + recompute
    assert torch.equal(y, y0) and all(torch.equal(a, b) for a, b in zip(g, g0))
    _, g, _ = _run(strategy, tuple_input=True)    # a 1-tuple input spreads into the first child's argument
    assert all(torch.equal(a, b) for a, b in zip(g, g0))


def test_without_preserved_rng_the_dropout_differs():
    """The counter-test of the above: the recomputation then draws new random numbers."""
    _, g0, _ = _run(None)
    _, g, _ = _run("each", preserve=False)
    assert not all(torch.equal(a, b) for a, b in zip(g, g0))


def test_checkpoint_outside_smp_and_without_grad():
    torch.manual_seed(0)
    calls = []
    lin = nn.Linear(4, 4)
    lin.register_forward_pre_hook(lambda m, a: calls.append(1))
    x = torch.randn(2, 4, requires_grad=True)
    y = checkpoint(lin, x)
    y.sum().backward()
    assert len(calls) == 2, calls            # the module call itself is recomputed (hooks included)
    with torch.no_grad():
        checkpoint(lin, x)
    assert len(calls) == 3, calls
