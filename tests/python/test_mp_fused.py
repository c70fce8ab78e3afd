"""smp.nn.FusedLayerNorm and smp.optimizers (FusedAdam, FusedLamb, FusedNovoGrad).

Each optimizer is checked against a plain per-parameter float64 implementation of
apex's update rule written here, over 50 steps, three parameter groups (weight
decay on and off, a zero-initialised tensor, a tensor whose gradient is
sometimes missing) and a sweep of the options; the fused path is checked to be
multi-tensor (its torch calls do not grow with the number of parameters).
The last test runs tests/python/mp_fused_worker.py on 2 ranks: 2 partitions
against the same model trained in one process.
"""

import collections
import inspect
import itertools
import math

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from harness import HERE, assert_all_passed, run_job
from shoal.modelparallel import optimizers as O
from shoal.modelparallel.nn import FusedLayerNorm

STEPS = 50
SHAPES = [[(7, 5), (5,), (3, 4, 2)], [(6,), (4, 4)], [(9, 2)]]   # one list per parameter group


def make_params(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes] for shapes in SHAPES]
    groups[0][1].zero_()          # a zero tensor: LAMB's trust ratio falls back to 1
    return [[nn.Parameter(t.to(dtype)) for t in ts] for ts in groups]


def grads_for(step, groups, scale=3.0):
    """Deterministic gradients; groups[1][0] has none on every 7th step."""
    g = torch.Generator().manual_seed(1000 + step)
    out = [[torch.randn(p.shape, generator=g, dtype=torch.float64) * scale for p in ps] for ps in groups]
    if step % 7 == 3:
        out[1][0] = None
    return out


def run_fused(cls, group_opts, kwargs, dtype=torch.float64, steps=STEPS):
    groups = make_params(dtype)
    opt = cls([{"params": ps, **o} for ps, o in zip(groups, group_opts)], **kwargs)
    for t in range(steps):
        opt.zero_grad()
        for ps, gs in zip(groups, grads_for(t, groups)):
            for p, g in zip(ps, gs):
                p.grad = None if g is None else g.to(dtype)
        opt.step()
    return groups, opt


def run_ref(update, group_opts, kwargs, steps=STEPS, global_clip=None, round_to=None):
    """update(p, g, state, step, opts) on float64 tensors, one parameter at a time; for
    LAMB, global_clip(all grads) gives the divisor applied to every gradient first."""
    groups = [[p.detach().clone() for p in ps] for ps in make_params(torch.float64)]
    if round_to is not None:
        groups = [[p.to(round_to).double() for p in ps] for ps in groups]
    state = collections.defaultdict(dict)
    clipped = 0
    for t in range(steps):
        gs_all = grads_for(t, groups)
        div = 1.0
        if global_clip is not None:
            div = global_clip([g for gs in gs_all for g in gs if g is not None])
            clipped += div > 1.0
        for gi, (ps, gs, o) in enumerate(zip(groups, gs_all, group_opts)):
            opts = {**kwargs, **o}
            for pi, (p, g) in enumerate(zip(ps, gs)):
                if g is not None:
                    update(p, g / div, state[(gi, pi)], t + 1, opts)
                    if round_to is not None:
                        p.copy_(p.to(round_to).double())
    return groups, clipped


def assert_close(got, want, rtol, atol, what=""):
    for ps, rs in zip(got, want):
        for p, r in zip(ps, rs):
            torch.testing.assert_close(p.detach().double(), r, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


# ----------------------------------------------------------------- references (apex's rules, per parameter)

def corrections(o, step, b1, b2):
    return (1 - b1 ** step, 1 - b2 ** step) if o.get("bias_correction", True) else (1.0, 1.0)


def ref_adam(p, g, st, step, o):
    b1, b2 = o["betas"]
    lr, eps, wd = o["lr"], o["eps"], o["weight_decay"]
    if not st:
        st.update(m=torch.zeros_like(p), v=torch.zeros_like(p), vmax=torch.zeros_like(p))
    if wd and not o["adam_w_mode"]:
        g = g + wd * p
    st["m"] = b1 * st["m"] + (1 - b1) * g
    st["v"] = b2 * st["v"] + (1 - b2) * g * g
    v = st["v"]
    if o["amsgrad"]:
        st["vmax"] = torch.maximum(st["vmax"], st["v"])
        v = st["vmax"]
    bc1, bc2 = corrections(o, step, b1, b2)
    update = (st["m"] / bc1) / ((v / bc2).sqrt() + eps)
    if wd and o["adam_w_mode"]:
        update = update + wd * p
    p -= lr * update


def ref_lamb(p, g, st, step, o):
    b1, b2 = o["betas"]
    lr, eps, wd = o["lr"], o["eps"], o["weight_decay"]
    beta3 = 1 - b1 if o["grad_averaging"] else 1.0
    if not st:
        st.update(m=torch.zeros_like(p), v=torch.zeros_like(p))
    if wd and not o["adam_w_mode"]:
        g = g + wd * p
    st["m"] = b1 * st["m"] + beta3 * g
    st["v"] = b2 * st["v"] + (1 - b2) * g * g
    bc1, bc2 = corrections(o, step, b1, b2)
    update = (st["m"] / bc1) / ((st["v"] / bc2).sqrt() + eps)
    if wd and o["adam_w_mode"]:
        update = update + wd * p
    ratio = 1.0
    if wd or o["use_nvlamb"]:
        pn, un = p.norm().item(), update.norm().item()
        ratio = pn / un if pn > 0 and un > 0 else 1.0
    p -= lr * ratio * update


def lamb_clip(max_norm):
    def clip(grads):
        if not max_norm:
            return 1.0
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        return norm / max_norm if norm > max_norm else 1.0
    return clip


def ref_novograd(p, g, st, step, o):
    b1, b2 = o["betas"]
    lr, eps, wd = o["lr"], o["eps"], o["weight_decay"]
    beta3 = 1 - b1 if o["grad_averaging"] else 1.0
    n = g.norm().item() if o["norm_type"] == 2 else g.abs().max().item()
    if not st:
        st.update(m=torch.zeros_like(p), norm=0.0 if o["init_zero"] else n)
    if o["norm_type"] == 2:
        st["norm"] = math.sqrt(b2 * st["norm"] ** 2 + (1 - b2) * n * n)
    else:
        st["norm"] = b2 * st["norm"] + (1 - b2) * n
    bc1, bc2 = corrections(o, step, b1, b2)
    denom = st["norm"] / math.sqrt(bc2) + eps
    if o["reg_inside_moment"]:
        st["m"] = b1 * st["m"] + beta3 * (g / denom + wd * p)
        p -= lr * st["m"] / bc1
    else:
        st["m"] = b1 * st["m"] + beta3 * g
        p -= lr * ((st["m"] / bc1) / denom + wd * p)


# ----------------------------------------------------------------- sweeps against the references

GROUPS = [{"weight_decay": 0.05}, {"weight_decay": 0.0}, {"weight_decay": 0.2, "lr": 3e-3}]


@pytest.mark.parametrize("torch_kernel", [True, False], ids=["torch-kernel", "foreach"])
@pytest.mark.parametrize("adam_w_mode, bias_correction, amsgrad",
                         list(itertools.product([True, False], repeat=3)))
def test_adam_matches_reference(adam_w_mode, bias_correction, amsgrad, torch_kernel, monkeypatch):
    monkeypatch.setattr(O.FusedAdam, "use_torch_kernel", torch_kernel)
    kw = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, adam_w_mode=adam_w_mode, bias_correction=bias_correction,
              amsgrad=amsgrad)
    got, opt = run_fused(O.FusedAdam, GROUPS, kw)
    want, _ = run_ref(ref_adam, GROUPS, {**kw, "weight_decay": 0.0})
    assert_close(got, want, 1e-10, 1e-12, "FusedAdam float64")
    assert all(g["step"] == STEPS for g in opt.param_groups)
    got32, _ = run_fused(O.FusedAdam, GROUPS, kw, dtype=torch.float32)
    assert_close(got32, want, 1e-4, 2e-5, "FusedAdam float32")


LAMB_CASES = [dict(adam_w_mode=a, grad_averaging=ga, bias_correction=bc, use_nvlamb=nv, max_grad_norm=mg)
              for a, ga, bc, nv, mg in itertools.product([True, False], [True, False], [True, False],
                                                         [False, True], [1.0, None])]


@pytest.mark.parametrize("kw", LAMB_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_lamb_matches_reference(kw):
    kw = dict(lr=1e-2, betas=(0.85, 0.97), eps=1e-6, **kw)
    got, _ = run_fused(O.FusedLamb, GROUPS, kw)
    want, clipped = run_ref(ref_lamb, GROUPS, {**kw, "weight_decay": 0.0}, global_clip=lamb_clip(kw["max_grad_norm"]))
    assert clipped == (STEPS if kw["max_grad_norm"] else 0), clipped    # the clip engaged on every step
    assert_close(got, want, 1e-9, 1e-11, "FusedLamb float64")
    got32, _ = run_fused(O.FusedLAMB, GROUPS, kw, dtype=torch.float32)
    assert_close(got32, want, 1e-4, 2e-5, "FusedLamb float32")


def test_lamb_global_grad_norm():
    """global_grad_norm() is the norm over every group's gradients (what max_grad_norm clips)."""
    _, opt = run_fused(O.FusedLamb, GROUPS, {}, steps=1)
    last = [[p.grad for p in g["params"]] for g in opt.param_groups]
    norm = math.sqrt(sum(float(g.double().square().sum()) for gs in last for g in gs if g is not None))
    assert float(opt.global_grad_norm()) == pytest.approx(norm, rel=1e-12)


NOVO_CASES = [dict(reg_inside_moment=r, grad_averaging=ga, norm_type=nt, init_zero=iz, bias_correction=bc)
              for r, ga, nt, iz, bc in itertools.product([False, True], [True, False], [2, 0], [False, True],
                                                         [True, False])]


@pytest.mark.parametrize("kw", NOVO_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_novograd_matches_reference(kw):
    kw = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-8, **kw)
    got, opt = run_fused(O.FusedNovoGrad, GROUPS, kw)
    want, _ = run_ref(ref_novograd, GROUPS, {**kw, "weight_decay": 0.0})
    assert_close(got, want, 1e-9, 1e-11, "FusedNovoGrad float64")
    st = opt.state[opt.param_groups[0]["params"][0]]
    assert st["exp_avg_sq"].dim() == 0, "the second moment is one number per tensor"
    got32, _ = run_fused(O.FusedNovoGrad, GROUPS, kw, dtype=torch.float32)
    assert_close(got32, want, 1e-4, 2e-5, "FusedNovoGrad float32")


@pytest.mark.parametrize("cls, ref, kw", [
    (O.FusedAdam, ref_adam, dict(adam_w_mode=True, amsgrad=False)),
    (O.FusedLamb, ref_lamb, dict(adam_w_mode=True, grad_averaging=True, use_nvlamb=False, max_grad_norm=1.0)),
    (O.FusedNovoGrad, ref_novograd, dict(reg_inside_moment=False, grad_averaging=True, norm_type=2,
                                         init_zero=False)),
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_parameters_keep_float32_state(cls, ref, kw, dtype):
    kw = dict(lr=1e-2, **kw)
    steps = 10
    got, opt = run_fused(cls, GROUPS, kw, dtype=dtype, steps=steps)
    full = {**_defaults(cls), **kw, "weight_decay": 0.0}
    want, _ = run_ref(ref, GROUPS, full, steps=steps, round_to=dtype,
                      global_clip=lamb_clip(kw["max_grad_norm"]) if cls is O.FusedLamb else None)
    for ps in got:
        for p in ps:
            assert p.dtype == dtype
            assert all(t.dtype == torch.float32 for t in opt.state[p].values())
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    assert_close(got, want, 4 * ulp, 4 * ulp, f"{cls.__name__} {dtype}")


def _defaults(cls):
    return {k: v.default for k, v in inspect.signature(cls).parameters.items() if k != "params"}


# ----------------------------------------------------------------- API

APEX = {   # apex.optimizers' documented signatures, in order
    O.FusedAdam: dict(lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                      weight_decay=0.0, amsgrad=False, set_grad_none=True),
    O.FusedLamb: dict(lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                      amsgrad=False, adam_w_mode=True, grad_averaging=True, set_grad_none=True, max_grad_norm=1.0,
                      use_nvlamb=False),
    O.FusedNovoGrad: dict(lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                          amsgrad=False, reg_inside_moment=False, grad_averaging=True, norm_type=2, init_zero=False,
                          set_grad_none=True),
}


@pytest.mark.parametrize("cls", list(APEX), ids=lambda c: c.__name__)
def test_apex_signatures_and_zero_grad(cls):
    assert _defaults(cls) == APEX[cls] and list(_defaults(cls)) == list(APEX[cls])
    assert issubclass(cls, torch.optim.Optimizer)
    p = nn.Parameter(torch.ones(3))
    for none in (True, False):
        opt = cls([p], set_grad_none=none)
        p.grad = torch.ones(3)
        opt.zero_grad()
        assert (p.grad is None) if none else torch.equal(p.grad, torch.zeros(3))
    if cls is not O.FusedAdam:
        with pytest.raises(RuntimeError, match="AMSGrad"):
            cls([p], amsgrad=True)
    assert O.FusedLAMB is O.FusedLamb


def test_sagemaker_import_paths():
    """The imports of SageMaker's GPT-2 and BERT examples."""
    from smdistributed.modelparallel.torch.nn import FusedLayerNorm as LayerNorm
    from smdistributed.modelparallel.torch.optimizers import FusedLAMB, FusedNovoGrad
    assert (LayerNorm, FusedLAMB, FusedNovoGrad) == (FusedLayerNorm, O.FusedLamb, O.FusedNovoGrad)


@pytest.mark.parametrize("cls", list(APEX), ids=lambda c: c.__name__)
def test_state_dict_resume(cls):
    """10 steps, a state_dict into a fresh optimizer, 10 more: equal to 20 straight steps."""
    straight, _ = run_fused(cls, GROUPS, {"lr": 1e-2}, steps=20)
    groups = make_params()
    opts = [{"params": ps, **o} for ps, o in zip(groups, GROUPS)]
    opt = cls(opts, lr=1e-2)

    def steps(opt, ts):
        for t in ts:
            for ps, gs in zip(groups, grads_for(t, groups)):
                for p, g in zip(ps, gs):
                    p.grad = g
            opt.step()
    steps(opt, range(10))
    sd = opt.state_dict()
    opt2 = cls([{"params": ps, **o} for ps, o in zip(groups, GROUPS)], lr=1e-2)
    opt2.load_state_dict(sd)
    steps(opt2, range(10, 20))
    assert_close(groups, [[p.detach() for p in ps] for ps in straight], 1e-12, 1e-14)


class _Calls(TorchFunctionMode):
    """Counts torch calls by name, attribute reads left out."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__qualname__", repr(func))
        if not name.endswith("__get__"):
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cls, kw, kernel", [
    (O.FusedAdam, {"weight_decay": 0.1, "adam_w_mode": False}, "_fused_adam_"),
    (O.FusedAdam, {"weight_decay": 0.1, "amsgrad": True}, "_fused_adamw_"),
    (O.FusedAdam, {"weight_decay": 0.1, "bias_correction": False}, "_foreach_"),
    (O.FusedLamb, {}, "_foreach_"), (O.FusedLamb, {"use_nvlamb": True, "weight_decay": 0}, "_foreach_"),
    (O.FusedNovoGrad, {"weight_decay": 0.1, "reg_inside_moment": True}, "_foreach_")],
    ids=["adam-kernel", "adamw-amsgrad-kernel", "adam-foreach", "lamb", "nvlamb", "novograd"])
def test_step_is_multi_tensor(cls, kw, kernel):
    """The torch calls of a step are the same for 4 and 40 parameters (no per-parameter
    arithmetic), and the arithmetic runs in torch's multi-tensor kernels (torch._foreach_*,
    or for Adam torch's fused Adam kernel, one call)."""
    counts = []
    for n in (4, 40):
        ps = [nn.Parameter(torch.randn(5, 3)) for _ in range(n)]
        opt = cls(ps, **kw)
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()                                   # creates the state
        with _Calls() as c:
            opt.step()
        counts.append(c.calls)
    assert counts[0] == counts[1], f"per-parameter calls: {counts[1] - counts[0]}"
    calls = sum(v for k, v in counts[0].items() if kernel in k)
    assert calls == 1 if kernel.startswith("_fused") else calls >= 5, counts[0]


# ----------------------------------------------------------------- FusedLayerNorm

@pytest.mark.parametrize("shape, affine, dtype", [
    (8, True, torch.float32), ((4, 8), True, torch.float64), (8, False, torch.float32),
    ((4, 8), False, torch.float64), (8, True, torch.bfloat16)])
def test_fused_layer_norm_equals_layer_norm(shape, affine, dtype):
    torch.manual_seed(0)
    ref = nn.LayerNorm(shape, eps=1e-6, elementwise_affine=affine, dtype=dtype)
    ln = FusedLayerNorm(shape, eps=1e-6, elementwise_affine=affine).to(dtype)
    assert isinstance(ln, nn.LayerNorm)
    assert list(ln.state_dict()) == list(ref.state_dict()) == (["weight", "bias"] if affine else [])
    if affine:
        with torch.no_grad():
            ref.weight.normal_()
            ref.bias.normal_()
        ln.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, *((shape,) if isinstance(shape, int) else shape), dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ln(xa), ref(xb)
    assert torch.equal(ya, yb)
    dy = torch.randn_like(ya)
    ya.backward(dy)
    yb.backward(dy)
    assert torch.equal(xa.grad, xb.grad)
    if affine:
        assert torch.equal(ln.weight.grad, ref.weight.grad) and torch.equal(ln.bias.grad, ref.bias.grad)
    FusedLayerNorm(shape, 1e-5, affine, memory_efficient=True)   # apex's keyword is accepted


# ----------------------------------------------------------------- across partitions

def test_two_partitions_match_one_process():
    """2 ranks, 2 partitions: LAMB (global-norm clip engaged), NovoGrad and Adam through
    smp.DistributedOptimizer match the same model trained in one process."""
    passed = assert_all_passed(run_job("fused", 2, worker=HERE / "mp_fused_worker.py", timeout=120))
    assert len(passed) == 5, passed
