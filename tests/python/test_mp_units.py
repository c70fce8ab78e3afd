"""shoal.modelparallel pieces that need no other process: config, rank layout, schedules,
partitioning, graph segments, transfers, microbatch splitting, the SageMaker alias."""

import collections
import itertools
import json
import random
import time

import pytest
import torch
import torch.nn as nn

import mp_models as M
import shoal.modelparallel as smp
from shoal.mpcommon import config as C
from shoal.modelparallel import graph as G
from shoal.modelparallel import placement as P
from shoal.mpcommon import schedule as S
from shoal.modelparallel import stages, tracing, transfer
from shoal.modelparallel.steps import StepOutput, split_inputs, wrap_outputs
from shoal.mpcommon.topology import Topology

# ----------------------------------------------------------------- config


def test_config_defaults_and_alias():
    c = C.parse({}, environ={})
    assert (c.partitions, c.microbatches, c.pipeline, c.auto_partition, c.ddp) == \
        (1, 1, "interleaved", True, False)
    assert c.memory_weight == 0.8 and c.optimize == "memory" and c.active_microbatches == 3
    c = C.parse({"pipeline_parallel_degree": 4, "optimize": "speed", "microbatches": 8}, environ={})
    assert c.partitions == 4 and c.memory_weight == 0.2 and c.active_microbatches == 6
    assert C.parse({"partitions": 2, "pipeline_parallel_degree": 2}, environ={}).partitions == 2


@pytest.mark.parametrize("cfg, err, words", [
    ({"partitons": 2}, smp.SMPConfigError, ["unknown key 'partitons'", "did you mean 'partitions'"]),
    ({"partitions": 2, "pipeline_parallel_degree": 4}, smp.SMPConfigError, ["disagree"]),
    ({"microbatches": "4"}, smp.SMPConfigError, ["'microbatches' must be an integer"]),
    ({"microbatches": 0}, smp.SMPConfigError, ["'microbatches' must be >= 1"]),
    ({"ddp": "true"}, smp.SMPConfigError, ["'ddp' must be true or false"]),
    ({"pipeline": "1f1b"}, smp.SMPConfigError, ["'pipeline' must be one of 'simple', 'interleaved'"]),
    ({"memory_weight": 1.5}, smp.SMPConfigError, ["'memory_weight' must be a number in [0, 1]"]),
    ({"partitions": 2, "default_partition": 2}, smp.SMPConfigError, ["'default_partition' is 2"]),
    ({"placement_strategy": "ring"}, smp.SMPConfigError, ["'placement_strategy'"]),
    ({"tensor_parallel_degree": 2}, smp.SMPConfigError, ["'tensor_parallel_degree' is 2", "needs 'ddp': true"]),
    ({"fp16": True, "bf16": True}, smp.SMPConfigError, ["'fp16' and 'bf16' are both true"]),
    ({"prescaled_batch": "yes"}, smp.SMPConfigError, ["'prescaled_batch' must be true or false"]),
    ({"offload_activations": True}, smp.SMPUnsupportedError, ["'offload_activations'", "activation offloading"]),
    ({"activation_loading_horizon": "4"}, smp.SMPConfigError, ["'activation_loading_horizon' must be an integer"]),
    ({"ddp_dist_backend": "gloo"}, smp.SMPConfigError, ["'ddp_dist_backend' must be one of 'auto', 'nccl'"]),
    ({"static_mode": 1}, smp.SMPConfigError, ["'static_mode' must be true or false"]),
    ([("partitions", 2)], smp.SMPConfigError, ["must be a dict"]),
])
def test_config_errors_name_the_key(cfg, err, words):
    with pytest.raises(err) as e:
        C.parse(cfg, environ={})
    for w in words:
        assert w in str(e.value), str(e.value)


def test_config_off_values_of_unimplemented_keys_are_accepted():
    c = C.parse({"tensor_parallel_degree": 1, "fp16": False, "deterministic_server": True}, environ={})
    assert c.partitions == 1


def test_config_of_the_sagemaker_gpt2_example_parses_and_every_key_is_kept():
    """The SageMaker GPT-2 example's smp_config (pipeline only, every feature off), and the keys the
    Hugging Face Trainer reads from smp.state.cfg."""
    gpt2 = {"ddp": True, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 2, "microbatches": 4,
            "shard_optimizer_state": False, "prescaled_batch": False, "fp16": True, "bf16": False,
            "offload_activations": False, "delayed_parameter_initialization": False,
            "optimize": "speed", "placement_strategy": "cluster", "activation_loading_horizon": 4,
            "skip_tracing": False, "auto_partition": True, "default_partition": 0, "static_mode": False,
            "fast_mode": False, "sharded_data_parallel_degree": 1, "ddp_dist_backend": "auto",
            "sdp_hierarchical_allgather": True, "sdp_gradient_clipping": 1.0}
    c = C.parse(gpt2, environ={}, world_size=4)
    for k, v in gpt2.items():
        assert getattr(c, k) == v, k
    assert c.half_dtype == "float16" and C.parse({"bf16": True}, environ={}).half_dtype == "bfloat16"
    assert C.parse({}, environ={}).half_dtype is None


def test_config_against_the_world_size():
    with pytest.raises(smp.SMPConfigError, match="does not divide the world size 4"):
        C.parse({"partitions": 3}, environ={}, world_size=4)
    with pytest.raises(smp.SMPConfigError, match="needs 'ddp': true"):
        C.parse({"partitions": 2}, environ={}, world_size=4)
    assert C.parse({"partitions": 2, "ddp": True}, environ={}, world_size=4).partitions == 2


def test_config_from_the_environment():
    env = {"SHOAL_MP_CONFIG": json.dumps({"partitions": 2}),
           "SM_HP_MP_PARAMETERS": json.dumps({"partitions": 4, "microbatches": 2})}
    c = C.parse(None, environ=env)
    assert c.partitions == 2 and c.source == "SHOAL_MP_CONFIG"
    c = C.parse(None, environ={"SM_HP_MP_PARAMETERS": env["SM_HP_MP_PARAMETERS"]})
    assert (c.partitions, c.microbatches, c.source) == (4, 2, "SM_HP_MP_PARAMETERS")
    with pytest.raises(smp.SMPConfigError, match="SHOAL_MP_CONFIG is not valid JSON"):
        C.parse(None, environ={"SHOAL_MP_CONFIG": "{partitions: 2}"})
    with pytest.raises(smp.SMPConfigError, match=r"\(SHOAL_MP_CONFIG\): unknown key 'bogus'"):
        C.parse(None, environ={"SHOAL_MP_CONFIG": '{"bogus": 1}'})
    assert C.parse({"partitions": 8}, environ=env).partitions == 8   # an explicit dict wins


# ----------------------------------------------------------------- topology

def test_placement_cluster_and_spread():
    t = Topology(8, 2, 1, C.placement_order("cluster"))
    assert t.groups("mp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert t.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    t = Topology(8, 2, 1, C.placement_order("spread"))
    assert t.groups("mp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert t.groups("dp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.group("dp", 6).index(6) == 2 and t.pp_rank(6) == 1
    assert (C.placement_order("cluster"), C.placement_order("spread")) == ("DPT", "TPD")
    assert C.placement_order("PD") == "PDT" and C.placement_order("PTD") == "PTD"
    with pytest.raises(smp.SMPConfigError, match="permutation of 'DPT'"):
        C.placement_order("DPX")
    for ws, p, tp, order in itertools.product([1, 2, 4, 6, 8], [1, 2], [1, 2], ["DPT", "TPD", "PDT", "TDP"]):
        if ws % (p * tp):
            continue
        t = Topology(ws, p, tp, order)
        for kind in ("pp", "tp", "rdp", "dp", "mp"):
            assert sorted(r for g in t.groups(kind) for r in g) == list(range(ws)), (kind, ws, p, tp, order)
        for r in range(ws):
            assert t.rank_of(*t.coords(r)) == r
            assert set(t.group("tp", r)) <= set(t.group("dp", r)) and set(t.group("rdp", r)) <= set(t.group("dp", r))
            assert len(t.group("dp", r)) == tp * len(t.group("rdp", r)) == ws // p


@pytest.mark.parametrize("order, table", [
    # SageMaker's documented tables (8 ranks, tp 2, pp 2, rdp 2): rank -> (rdp_rank, pp_rank, tp_rank)
    ("DPT", [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]),
    ("PTD", [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1), (0, 1, 0), (1, 1, 0), (0, 1, 1), (1, 1, 1)]),
    # spread = TPD: the reduced-data axis fastest, then pipeline, then tensor
    ("TPD", [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]),
])
def test_placement_with_tensor_parallelism_matches_sagemaker_tables(order, table):
    t = Topology(8, 2, 2, order)
    assert [t.coords(r) for r in range(8)] == table
    if order == "DPT":   # cluster: tensor-parallel pairs are neighbours, a replica is 4 consecutive ranks
        assert t.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert t.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
        assert t.groups("mp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert t.groups("rdp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
        assert t.groups("dp") == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_three_dimensional_config_checks():
    ok = C.parse({"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "ddp": True}, world_size=8)
    assert (ok.tensor_parallel_degree, ok.partitions) == (2, 2)
    with pytest.raises(smp.SMPConfigError, match="'tensor_parallel_degree' is 2, which needs 'ddp': true"):
        C.parse({"tensor_parallel_degree": 2}, world_size=2)
    with pytest.raises(smp.SMPConfigError, match=r"2 x 'tensor_parallel_degree' 4 = 8 does not divide the world size 4"):
        C.parse({"tensor_parallel_degree": 4, "pipeline_parallel_degree": 2, "ddp": True}, world_size=4)
    with pytest.raises(smp.SMPConfigError, match="'sharded_data_parallel_degree' is 3, which does not divide"):
        C.parse({"sharded_data_parallel_degree": 3, "ddp": True}, world_size=4)
    with pytest.raises(smp.SMPConfigError, match="cannot be combined with pipeline parallelism"):
        C.parse({"sharded_data_parallel_degree": 2, "pipeline_parallel_degree": 2, "ddp": True}, world_size=4)
    with pytest.raises(smp.SMPConfigError, match="'shard_optimizer_state' must be true or false"):
        C.parse({"shard_optimizer_state": 1})


# ----------------------------------------------------------------- schedules

def _check_valid(parts, preds, sched, m, backward=True, fc=None, bc=None):
    succs = collections.defaultdict(set)
    for s, ps in enumerate(preds):
        for p in ps:
            succs[p].add(s)
    end = {}
    for w, order in enumerate(sched.order):
        t_prev = -1.0
        for t in order:
            assert parts[t.seg] == w
            st = sched.start[t]
            assert st >= t_prev
            cost = (fc[t.seg] if fc else 1.0) if t.kind == "F" else (bc[t.seg] if bc else 2.0)
            end[t] = st + cost
            t_prev = end[t]
    for t, st in sched.start.items():
        deps = [S.Task("F", t.mb, p) for p in preds[t.seg]] if t.kind == "F" else \
            [S.Task("F", t.mb, t.seg)] + [S.Task("B", t.mb, c) for c in succs[t.seg]]
        for d in deps:
            assert end[d] <= st + 1e-9, (t, d)
    n = len(parts) * m * (2 if backward else 1)
    assert len(sched.start) == n


@pytest.mark.parametrize("policy", ["simple", "interleaved"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 5)])
def test_chain_schedule_matches_the_theory(policy, p, m):
    parts, preds = list(range(p)), [[]] + [[s - 1] for s in range(1, p)]
    sc = S.build(parts, preds, p, m, policy=policy, active=p + 2 if policy == "interleaved" else None)
    _check_valid(parts, preds, sc, m)
    assert sc.makespan == pytest.approx((m + p - 1) * 3)     # forward 1 + backward 2 per slot
    busy = m * 3
    assert 1 - busy / sc.makespan == pytest.approx(S.bubble_fraction(p, m))
    for order in sc.order:
        kinds = "".join(t.kind for t in order)
        if policy == "simple":
            assert kinds == "F" * m + "B" * m


def test_interleaved_limits_microbatches_in_flight():
    p, m, active = 4, 12, 4
    parts, preds = list(range(p)), [[]] + [[s - 1] for s in range(1, p)]
    sc = S.build(parts, preds, p, m, policy="interleaved", active=active)
    for order in sc.order:
        live = peak = 0
        for t in order:
            live += 1 if t.kind == "F" else -1
            peak = max(peak, live)
        assert peak <= active
    assert max(sum(1 for t in sc.order[0][:k] if t.kind == "F") -
               sum(1 for t in sc.order[0][:k] if t.kind == "B") for k in range(len(sc.order[0]))) <= active


def test_random_segment_dags_schedule_validly():
    rng = random.Random(3)
    for _ in range(60):
        nparts = rng.randint(1, 4)
        nseg = rng.randint(1, 7)
        parts = [rng.randrange(nparts) for _ in range(nseg)]
        preds = [sorted(rng.sample(range(s), rng.randint(0, min(2, s)))) for s in range(nseg)]
        m = rng.randint(1, 5)
        for policy in ("simple", "interleaved"):
            for backward in (True, False):
                sc = S.build(parts, preds, nparts, m, backward=backward, policy=policy,
                             active=rng.randint(1, 4))
                _check_valid(parts, preds, sc, m, backward)
        fc = [rng.uniform(0.1, 3) for _ in range(nseg)]
        bc = [rng.uniform(0.1, 6) for _ in range(nseg)]
        active = rng.randint(1, 4)
        sc = S.best(parts, preds, nparts, m, active=active, fwd_cost=fc, bwd_cost=bc)
        _check_valid(parts, preds, sc, m, True, fc, bc)
        plain = S.build(parts, preds, nparts, m, active=active, fwd_cost=fc, bwd_cost=bc)
        assert sc.makespan <= plain.makespan + 1e-9
        span = {}                  # the in-flight limit holds for the schedule chosen
        for t, st in sc.start.items():
            end = st + (fc[t.seg] if t.kind == "F" else bc[t.seg])
            a, b = span.get(t.mb, (st, end))
            span[t.mb] = (min(a, st), max(b, end))
        for a, _ in span.values():
            assert sum(1 for x, y in span.values() if x <= a < y) <= active


def test_measured_costs_reorder_a_model_that_returns_to_a_partition():
    """GPT-2 with tied embeddings runs stage 0 -> 1 -> 0 (lm_head back on stage 0); with its
    measured segment costs the chosen order finishes well before 1F1B's."""
    parts, preds = [0, 1, 0], [[], [0], [1]]
    fc, bc = [27, 44, 17], [36, 58, 30]           # ms per microbatch, measured on the 2-core VM
    one_f_one_b = S.build(parts, preds, 2, 4, active=4, fwd_cost=fc, bwd_cost=bc)
    sc = S.best(parts, preds, 2, 4, active=4, fwd_cost=fc, bwd_cost=bc)
    _check_valid(parts, preds, sc, 4, True, fc, bc)
    assert sc.makespan < 0.95 * one_f_one_b.makespan, (sc.makespan, one_f_one_b.makespan)
    assert sc.makespan >= 4 * (27 + 36 + 17 + 30)   # partition 0's own work bounds it


# ----------------------------------------------------------------- partitioning

def test_split_contiguous_is_optimal():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        costs = [rng.choice([0.0, rng.random()]) for _ in range(n)]
        stage = P.split_contiguous(costs, k)
        assert stage == sorted(stage) and set(stage) == set(range(k))
        got = max(sum(c for c, s in zip(costs, stage) if s == g) for g in range(k))
        best = min(max(sum(costs[a:b]) for a, b in zip((0,) + cuts, cuts + (n,)))
                   for cuts in itertools.combinations(range(1, n), k - 1))
        assert got == pytest.approx(best)


def test_auto_partition_balances_and_keeps_tied_modules_together():
    torch.manual_seed(0)
    m = M.Chain(depth=6)
    x = torch.randn(4, 8)
    costs = tracing.measure(m, (x,), {})
    assert costs["blocks.0"].calls == 1 and costs["blocks.0"].act_bytes == 4 * 16 * 4
    pl, g = P.auto_placement(m, costs, 2, 1.0, G.bind(m, (x,), {}))   # memory only: deterministic
    assert pl.units == ["inp", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "blocks.5", "out"]
    assert [pl.unit_part[u] for u in pl.units] == [0, 0, 0, 0, 1, 1, 1, 1]
    gpt = M.TinyGPT(layers=4)
    idx = torch.randint(0, 13, (2, 5))
    costs = tracing.measure(gpt, (idx,), {})
    pl, g = P.auto_placement(gpt, costs, 2, 0.5, G.bind(gpt, (idx,), {}))
    assert pl.unit_part["head"] == pl.unit_part["tok"] == 0
    # the tied weight is memory once (with tok): the units' memory adds up to the model's
    # parameters but pos (read by glue, in no unit)
    assert sum(c[1] for c in pl.unit_cost.values()) == tracing.param_bytes(gpt) - gpt.pos.numel() * 4
    P.assign_owners(gpt, pl, g, 0)
    assert pl.units[0] == "tok" and pl.owner["pos"] == pl.unit_part[pl.units[1]]   # the unit read after it
    assert pl.owner["head.weight"] == pl.owner["tok.weight"] == 0
    text = P.describe(gpt, pl, 2)
    assert "partition" in text and "tied: tok, head share a parameter: stage 0" in text, text


class _DictOut(nn.Module):
    """Returns a dict, so its own backward hooks cannot fire."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return {"y": self.b(self.a(x).relu())}


class _SlowGrad(torch.autograd.Function):
    """The identity, whose backward takes 30 ms: a backward cost that load cannot shrink."""
    @staticmethod
    def forward(ctx, w):
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.03)
        return g


class _SlowLookup(nn.Module):
    """An embedding-like lookup of token ids whose weight's gradient is slow."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(100, 8))

    def forward(self, ids):
        return _SlowGrad.apply(self.weight)[ids]


class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        y.mul_(2)          # in place on a module's output: its backward cannot be hooked
        return y.sum()


def test_measure_counts_the_backward_and_leaves_no_trace():
    """A training module's time is forward + backward; a module returning a dict gets its
    children's backward; parameters' gradients and the RNG are as before; in eval mode, or
    when a module modifies its output in place, the forward alone is measured."""
    torch.manual_seed(0)
    m = nn.Sequential(_DictOut())
    x = torch.randn(4, 8, requires_grad=True)
    m[0].a.weight.grad = torch.full_like(m[0].a.weight, 3.0)
    rng = torch.get_rng_state()
    costs = tracing.measure(m, (x,), {}, repeats=1)    # one measured run: the sums are exact
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(m[0].a.weight.grad, torch.full_like(m[0].a.weight, 3.0)) and m[0].b.weight.grad is None
    a, b, top = costs["0.a"], costs["0.b"], costs["0"]
    assert a.backward_seen and b.backward_seen and a.backward_s > 0 and b.backward_s > 0
    assert not top.backward_seen and top.backward_s == pytest.approx(a.backward_s + b.backward_s)
    assert top.time_s >= top.backward_s > 0 and x.grad is None
    # token ids need no gradient: the lookup's backward (30 ms at least, in its weight's
    # gradient) still counts, though its backward hook fires before that runs
    emb = nn.Sequential(_SlowLookup(), nn.Linear(8, 4))
    c = tracing.measure(emb, (torch.randint(0, 100, (4, 5)),), {}, repeats=1)
    assert c["0"].backward_seen and c["0"].backward_s >= 0.03
    assert emb[0].weight.grad is None
    m.eval()
    assert all(c.backward_s == 0 for c in tracing.measure(m, (x,), {}).values())
    ip = _InPlace()
    costs = tracing.measure(ip, (torch.randn(2, 8),), {})
    assert costs["lin"].calls == 1 and costs["lin"].backward_s == 0 and costs["lin"].time_s > 0
    assert ip.lin.weight.grad is None


def test_smp_partition_tags_modules_created_inside():
    with smp.partition(1):
        a = nn.Linear(2, 2)
        with smp.partition(0):
            b = nn.Sequential(nn.Linear(2, 2))
        c = nn.ReLU()
    d = nn.Linear(2, 2)
    assert (a._smp_partition, b._smp_partition, b[0]._smp_partition, c._smp_partition) == (1, 0, 0, 1)
    assert not hasattr(d, "_smp_partition")
    assert nn.Module.__init__ is not P._tagging_init
    with pytest.raises(smp.SMPValidationError):
        with smp.partition(-1):
            pass
    m = M.Manual(smp, 2, depth=4)
    pl = P.manual_placement(m, 2, 0)
    assert pl.mode == "manual"
    assert pl.unit_part == {"inp": 0, "blocks.0": 0, "blocks.1": 0, "blocks.2": 1, "blocks.3": 1, "out": 1}


def test_set_partition_places_a_built_model():
    """set_partition on a model built elsewhere: a subtree inherits its ancestor's
    placement unless placed itself; a module's own set_partition beats the context
    it was created in; tied weights split across partitions are refused naming both."""
    with smp.partition(1):
        inner = nn.Linear(2, 2)                      # created in a context, later overridden
    net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), inner, nn.Linear(2, 2))
    smp.set_partition(net[1], 1)
    smp.set_partition(net[1][1], 0)
    smp.set_partition(net[2], 0)
    pl = P.manual_placement(net, 2, 0)
    assert pl.module_part["1"] == pl.module_part["1.0"] == 1
    assert pl.module_part["1.1"] == pl.module_part["2"] == pl.module_part["3"] == pl.module_part["0"] == 0
    assert pl.units == ["0", "1.0", "1.1", "2", "3"]
    with pytest.raises(smp.SMPValidationError, match="index must be an integer"):
        smp.set_partition(net[0], -1)
    with pytest.raises(smp.SMPValidationError, match="torch.nn.Module"):
        smp.set_partition("net", 0)
    smp.set_partition(net[3], 5)
    with pytest.raises(smp.SMPValidationError, match=r"module '3' was placed by smp.set_partition\(\.\.\., 5\)"):
        P.manual_placement(net, 2, 0)
    T = pytest.importorskip("transformers")
    from transformers.utils import logging
    logging.set_verbosity_error()
    gpt = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
                                         bos_token_id=0, eos_token_id=0))
    smp.set_partition(gpt.transformer.h[1], 1)
    smp.set_partition(gpt.lm_head, 1)                # tied to transformer.wte, which stays on 0
    pl = P.manual_placement(gpt, 2, 0)
    with pytest.raises(smp.SMPValidationError, match=r"'transformer.wte.weight' \(partition 0\) and "
                                                     r"'lm_head.weight' \(partition 1\) are one parameter"):
        P.assign_owners(gpt, pl, None, 0)


# ----------------------------------------------------------------- graph and segments

def test_gpt_graph_segments():
    torch.manual_seed(0)
    gpt = M.TinyGPT(layers=4)
    idx = torch.randint(0, 13, (2, 7))
    units = ["tok", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "head"]
    pl = P.Placement(2, "auto", units, {"tok": 0, "blocks.0": 0, "blocks.1": 0, "blocks.2": 1,
                                        "blocks.3": 1, "ln_f": 1, "head": 0})
    g = G.trace(gpt, units, G.bind(gpt, (idx,), {}))
    P.assign_owners(gpt, pl, g, 0)
    plan = stages.build(g, pl, set(dict(gpt.named_parameters(remove_duplicate=False))))
    assert [s.part for s in plan.segments] == [0, 1, 0]
    assert plan.output_seg == 2
    rep = {n.name for n in plan.replicated}
    assert {"idx", "arange"} <= rep, rep          # inputs and what derives from them only
    crossing = {n.name for e in plan.edges for n in e.values}
    assert "blocks_1" in crossing and "ln_f" in crossing
    # the int `t` (from idx.size()) is replicated, never sent
    assert not any("getitem" in n for n in crossing), crossing


def test_untraceable_root_is_named():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x):
            if x.sum() > 0:
                return self.a(x)
            return x
    with pytest.raises(G.TraceFailure, match="control flow"):
        G.trace(Bad(), ["a"], {"x": torch.ones(2, 2)})


# ----------------------------------------------------------------- transfers

def test_transfer_round_trip():
    big = {"names": [f"name {i:04d}" * 4 for i in range(40)]}   # metadata larger than the header
    x = torch.randn(3, 5, requires_grad=True)
    obj = {"h": x * 2, "t": (torch.arange(7), None, 3.5), "nc": torch.randn(6, 4).t(), "e": torch.empty(0, 2),
           "b": torch.ones(3, dtype=torch.bool), "bf": torch.randn(5).to(torch.bfloat16), "big": big}
    header, extra, data, tensors = transfer.pack(obj)
    assert extra is not None and len(tensors) == 6 and len(data) == 5   # the empty tensor sends nothing
    import struct
    meta_len, ndata = struct.unpack("<QQ", header.numpy()[:16].tobytes())
    assert ndata == 5
    meta = header.numpy()[16:16 + transfer.HEADER_BYTES - 16].tobytes()[:meta_len] + extra.numpy().tobytes()
    payload, received, grads = transfer._allocate(meta, torch.device("cpu"))
    it = iter(data)
    for t in received:                       # what the receiver's irecvs would write
        if t.numel():
            t.copy_(next(it))
    got, leaves = transfer._finish(payload, received, grads)
    assert got["big"] == big and got["t"][1:] == (None, 3.5)
    for k in ("h", "nc", "e", "b", "bf"):
        assert got[k].dtype == obj[k].dtype and torch.equal(got[k], obj[k].detach()), k
    assert got["h"].requires_grad and got["h"].is_leaf and not got["t"][0].requires_grad
    new, leaves, originals = transfer.detached(obj)
    assert originals[0] is obj["h"] and leaves[0].is_leaf and leaves[0].requires_grad


# ----------------------------------------------------------------- steps

def test_microbatch_splitting():
    def fn(model, x, extra, d, flag=True):
        pass
    Pair = collections.namedtuple("Pair", "a b")

    class Sliceable:
        def __init__(self, t):
            self.t = t

        def smp_slice(self, num_mb, mb, axis):
            n = self.t.size(axis) // num_mb
            return Sliceable(self.t.narrow(axis, mb * n, n))
    x = torch.arange(8).reshape(8, 1)
    args_in = (nn.Linear(1, 1), x, Pair(torch.arange(4), 7), {"s": Sliceable(torch.zeros(2, 8))})
    parts = split_inputs(fn, args_in, {}, 4, non_split=[], axes={"d": 1})
    assert len(parts) == 4
    args, _ = parts[2]
    assert torch.equal(args[1], x[4:6]) and args[2].a.tolist() == [2] and args[2].b == 7
    assert args[3]["s"].t.shape == (2, 2) and len(args) == 4
    parts = split_inputs(fn, (None, x, torch.ones(3), {}), {}, 2, non_split=["extra"], axes={})
    assert parts[1][0][2].shape == (3,)
    with pytest.raises(smp.SMPValidationError, match="not divisible by microbatches=3"):
        split_inputs(fn, (None, x, None, None), {}, 3, non_split=[], axes={})
    with pytest.raises(smp.SMPValidationError, match="'nope'"):
        split_inputs(fn, (None, x, None, None), {}, 2, non_split=["nope"], axes={})


def test_step_outputs():
    out = wrap_outputs([(torch.tensor(1.0), 2, {"k": torch.ones(2)}),
                        (torch.tensor(3.0), 4, {"k": torch.zeros(2)})])
    loss, n, d = out
    assert isinstance(loss, StepOutput) and loss.reduce_mean().item() == 2.0 and loss.reduce_sum().item() == 4.0
    assert list(n) == [2, 4] and sum(n) == 6 and n.reduce_mean() == 3.0
    assert d["k"].concat().tolist() == [1, 1, 0, 0] and d["k"].stack().shape == (2, 2)
    assert wrap_outputs([None, None]) is None


def test_sagemaker_import_path_is_the_same_module():
    import smdistributed.modelparallel.torch as smp2
    import smdistributed.modelparallel.torch.amp as amp2
    assert smp2 is smp and amp2 is smp.amp
    from smdistributed.modelparallel.torch import DistributedModel, step
    assert DistributedModel is smp.DistributedModel and step is smp.step


def test_split_with_ties_balances_under_the_constraint():
    # GPT-2's shape: a tied embedding and head at both ends, the head costly.
    costs = [1.0, 1.0, 1.0, 1.0, 1.0, 0.01, 3.0]   # wte, h0-h3, ln_f, lm_head (tied to wte)
    stage = P.split_with_ties(costs, 2, [[0, 6]])
    assert stage[0] == stage[6]
    sums = [sum(c for c, s in zip(costs, stage) if s == g) for g in range(2)]
    assert max(sums) == pytest.approx(4.01)   # fixing up after a plain split gives 7
    rng = random.Random(5)
    for _ in range(150):
        n = rng.randint(2, 8)
        k = rng.randint(1, min(3, n))
        costs = [rng.random() for _ in range(n)]
        tie = sorted(rng.sample(range(n), 2))
        stage = P.split_with_ties(costs, k, [tie])
        assert stage[tie[0]] == stage[tie[1]]
        got = max(sum(c for c, s in zip(costs, stage) if s == g) for g in range(k))
        best = float("inf")
        for cuts in itertools.combinations(range(1, n), k - 1):
            st = [sum(1 for c in cuts if c <= i) for i in range(n)]
            st[tie[1]] = st[tie[0]]
            if len(set(st)) == k:
                best = min(best, max(sum(c for c, s in zip(costs, st) if s == g) for g in range(k)))
        if best < float("inf"):
            assert got == pytest.approx(best)


def test_tracing_accepts_ordinary_model_code():
    """Sizes as integers, a buffer sliced by them, `if self.training`: traced, not refused."""
    m = M.MaskedLM(layers=2)
    idx = torch.randint(0, 13, (2, 7))
    g = G.trace(m, ["emb", "layers.0", "layers.1", "head"], G.bind(m, (idx,), {}))
    targets = [n.target for n in g.nodes]
    assert "mask" in targets and "layers.0" in targets and "layers.1" in targets
    gm = torch.fx.GraphModule(m, g)
    torch.testing.assert_close(gm(idx)["logits"], m(idx)["logits"])


def test_branches_on_sizes_are_taken_at_trace_time():
    class Sized(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            if x.size(0) == 1:      # a condition on a size, not on values
                return self.a(x)
            return self.b(self.a(x))
    m = Sized()
    g1 = G.trace(m, ["a", "b"], G.bind(m, (torch.randn(1, 4),), {}))
    g3 = G.trace(m, ["a", "b"], G.bind(m, (torch.randn(3, 4),), {}))
    assert g1._shoal_shape_specialized and g3._shoal_shape_specialized
    assert "b" not in [n.target for n in g1.nodes] and "b" in [n.target for n in g3.nodes]

    class Valued(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) if x.sum() > 0 else x   # on values: refused, naming the cause
    with pytest.raises(G.TraceFailure, match="tensor's values"):
        G.trace(Valued(), ["a"], G.bind(Valued(), (torch.randn(2, 4),), {}))
    plain = G.trace(M.Chain(depth=2), ["inp", "blocks.0", "blocks.1", "out"],
                    G.bind(M.Chain(depth=2), (torch.randn(2, 8),), {}))
    assert not plain._shoal_shape_specialized


def test_in_place_glue_becomes_dataflow():
    """`y[..., 1:] = ...` and `y.masked_fill_(...)` on a value nothing else uses
    must still happen before it is read (T5 shifts its decoder inputs so)."""
    class Shift(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            shifted = ids.new_zeros(ids.shape)
            shifted[..., 1:] = ids[..., :-1].clone()
            shifted.masked_fill_(shifted == 3, 9)
            return self.emb(shifted)
    m = Shift()
    ids = torch.tensor([[1, 3, 5, 7]])
    g = G.trace(m, ["emb"], G.bind(m, (ids,), {}))
    emb = next(n for n in g.nodes if n.op == "call_module")
    assert emb.args[0].op == "call_method" and emb.args[0].target == "masked_fill_", emb.args
    torch.testing.assert_close(torch.fx.GraphModule(m, g)(ids), m(ids))


def test_memory_weight_moves_the_split_of_real_models():
    """GPT-2 and BERT from transformers: memory_weight 0 (time) and 1 (memory) give different
    splits. Times are made deterministic (every module's measured time replaced by one
    microsecond per transformer block it holds, at least one), so the test shows the
    weighting, not the machine's noise."""
    T = pytest.importorskip("transformers")
    from transformers.utils import logging
    logging.set_verbosity_error()
    x = torch.randint(0, 100, (2, 16))
    models = [
        (T.GPT2LMHeadModel(T.GPT2Config(n_layer=6, n_embd=64, n_head=2, vocab_size=8000, n_positions=32,
                                        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)),
         dict(input_ids=x, labels=x, use_cache=False)),
        (T.BertForMaskedLM(T.BertConfig(num_hidden_layers=6, hidden_size=64, num_attention_heads=2,
                                        intermediate_size=128, vocab_size=8000, max_position_embeddings=32)),
         dict(input_ids=x, labels=x, attention_mask=torch.ones_like(x))),
    ]
    for m, kw in models:
        costs = tracing.measure(m, (), kw)
        for name, c in costs.items():
            mod = m.get_submodule(name) if name else m
            blocks = sum(1 for sub in mod.modules() if type(sub).__name__ in ("GPT2Block", "BertLayer"))
            c.time_s = 1e-6 * max(1, blocks)
        splits = []
        for w in (0.0, 1.0):
            pl, _ = P.auto_placement(m, costs, 2, w, G.bind(m, (), kw))
            splits.append(tuple(pl.unit_part[u] for u in pl.units) + tuple(pl.units))
            assert "stage" in P.describe(m, pl, 2)
        assert splits[0] != splits[1], f"{type(m).__name__}: memory_weight did not change the split"
