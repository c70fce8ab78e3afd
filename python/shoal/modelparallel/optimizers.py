"""``smp.optimizers``: FusedAdam, FusedLamb (also ``FusedLAMB``), FusedNovoGrad.

apex's fused optimizers with apex's constructor signatures, defaults and update
rules, written with torch's multi-tensor kernels (``torch._foreach_*``). The
tensors of a parameter group are bucketed by (device, dtype) and every update
phase is one multi-tensor call per bucket (on CUDA torch launches a few kernels
for the whole list; on the CPU it is one C++ loop); no Python code does
arithmetic per parameter. The only per-parameter Python work is bookkeeping
(finding the gradients and the state) and, for half-precision parameters, the
cast to float32 and back. FusedAdam goes one step further where torch has the
kernel (float32/float64 parameters, bias correction on): the whole update of a
bucket is one call of torch's single-pass fused Adam kernel
(``torch._fused_adam_`` / ``torch._fused_adamw_``, the same rule), else the
``_foreach`` path.

Half-precision parameters (float16, bfloat16) keep their state in float32 and
are updated in float32, then rounded back (apex's FusedAdam does the same;
apex's LAMB and NovoGrad keep half state). Other floating dtypes compute and
keep state in their own dtype.

Across pipeline partitions: after partitioning each rank holds the gradients
of its own partition only. LAMB's global gradient norm (what ``max_grad_norm``
clips against) is a sum of squares over the whole model: when smp runs more
than one partition and the optimizer holds parameters of the partitioned
``DistributedModel``, the local sum (float64) is all-reduced over the model
replica's pipeline group, so every rank of the replica must call ``step()`` (as
smp requires anyway). Per-tensor norms (LAMB's trust ratio, NovoGrad's
per-layer second moment) are local: each parameter lives on one partition.
Data-parallel replicas hold averaged, equal gradients, so no reduction over
them is needed.

State layout (``optimizer.state[p]``, so that smp's partial optimizer states
merge across partitionings): ``exp_avg``, ``exp_avg_sq`` (and
``max_exp_avg_sq`` with amsgrad); NovoGrad's ``exp_avg_sq`` is the per-tensor
moving norm (not squared), a 0-dim tensor. The step count is per group,
``group["step"]``, as in apex.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .state import STATE, require

__all__ = ["FusedAdam", "FusedLamb", "FusedLAMB", "FusedNovoGrad"]

_HALF = (torch.float16, torch.bfloat16)


def _state_dtype(p: torch.Tensor) -> torch.dtype:
    return torch.float32 if p.dtype in _HALF else p.dtype


class _Bucket:
    """The parameters of one group that share a device and dtype, with their
    gradients and state, as parallel lists for the multi-tensor kernels."""

    def __init__(self, device: torch.device, dtype: torch.dtype, keys: Tuple[str, ...]):
        self.device, self.dtype = device, dtype
        self.half = dtype in _HALF
        self.params: List[torch.Tensor] = []
        self.grads: List[torch.Tensor] = []
        self.states: Dict[str, List[torch.Tensor]] = {k: [] for k in keys}
        self.fresh: List[bool] = []      # state created in this step

    def compute(self) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """The parameters and gradients in the compute dtype (float32 copies for half
        parameters; the tensors themselves otherwise)."""
        if not self.half:
            return self.params, self.grads
        return [p.float() for p in self.params], [g.float() for g in self.grads]

    def store(self, p: List[torch.Tensor]) -> None:
        """Writes the updated compute copies back into half parameters."""
        if self.half:
            torch._foreach_copy_(self.params, p)


class _Fused(torch.optim.Optimizer):
    """What the three share: bucketing, state creation, ``set_grad_none``."""

    _state_keys: Tuple[str, ...] = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)
        self._smp_model = None          # the DistributedModel whose membership was checked
        self._smp_owns = False

    @property
    def set_grad_none(self) -> bool:
        return self.defaults["set_grad_none"]

    @set_grad_none.setter
    def set_grad_none(self, value: bool) -> None:
        self.defaults["set_grad_none"] = bool(value)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Sets the gradients to None (``set_grad_none``, apex's default) or zeroes them."""
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    def _new_state(self, key: str, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)

    def _keys(self, group: dict) -> Tuple[str, ...]:
        return self._state_keys

    def _buckets(self, group: dict) -> List[_Bucket]:
        keys = self._keys(group)
        buckets: Dict[Tuple[torch.device, torch.dtype], _Bucket] = {}
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if g.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if not p.dtype.is_floating_point:
                raise RuntimeError(f"{type(self).__name__}: parameter of dtype {p.dtype} (floating point only)")
            b = buckets.get((p.device, p.dtype))
            if b is None:
                b = buckets[(p.device, p.dtype)] = _Bucket(p.device, p.dtype, keys)
            st = self.state[p]
            sd = _state_dtype(p)
            fresh = False
            for k in keys:
                t = st.get(k)
                if t is None:
                    t = st[k] = self._new_state(k, p, sd)
                    fresh = True
                elif t.dtype != sd or t.device != p.device:   # load_state_dict casts state to the param's dtype
                    t = st[k] = t.to(device=p.device, dtype=sd)
                b.states[k].append(t)
            b.params.append(p)
            b.grads.append(g)
            b.fresh.append(fresh)
        return list(buckets.values())

    def _norm_group(self):
        """The process group over which global norms are summed, or None (local): the model
        replica's pipeline group when smp runs more than one partition and this optimizer
        holds parameters of the partitioned DistributedModel."""
        if not STATE.initialized:
            return None
        s = require()
        model = s.model
        if s.pp_size == 1 or model is None or not model.partitioned:
            return None
        if self._smp_model is not model:
            ids = {id(p) for p in model.module.parameters()}
            self._smp_owns = any(id(p) in ids for g in self.param_groups for p in g["params"])
            self._smp_model = model
        return s.pipe if self._smp_owns else None

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None):
        """One update: per group, its step count, then one multi-tensor pass per bucket (_update)."""
        loss = self._closure(closure)
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for b in self._buckets(group):
                self._update(group, b)
        return loss

    @staticmethod
    def _closure(closure: Optional[Callable]):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()


def _bias_corrections(group: dict, b1: float, b2: float) -> Tuple[float, float]:
    if not group["bias_correction"]:
        return 1.0, 1.0
    step = group["step"]
    return 1.0 - b1 ** step, 1.0 - b2 ** step


class FusedAdam(_Fused):
    """Adam (``adam_w_mode=False``: L2 regularisation added to the gradient) or AdamW
    (``adam_w_mode=True``, apex's default: decoupled weight decay), apex's
    ``FusedAdam``. ``amsgrad`` is supported here (apex refuses it)."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True):
        _check(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, adam_w_mode=adam_w_mode, amsgrad=amsgrad,
                                      set_grad_none=set_grad_none))

    def _keys(self, group: dict) -> Tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")

    #: use torch's single-pass Adam kernel (torch._fused_adam_ / _fused_adamw_) where it applies:
    #: float32/float64 parameters, bias correction on, a device torch has the kernel for
    use_torch_kernel = True

    def _update(self, group: dict, b: _Bucket) -> None:
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        if self.use_torch_kernel and not b.half and group["bias_correction"] and self._torch_kernel(group, b):
            return
        bc1, bc2 = _bias_corrections(group, b1, b2)
        p, g = b.compute()
        m, v = b.states["exp_avg"], b.states["exp_avg_sq"]
        if wd and not group["adam_w_mode"]:
            g = torch._foreach_add(g, p, alpha=wd)
        torch._foreach_lerp_(m, g, 1.0 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1.0 - b2)
        if group["amsgrad"]:
            vmax = b.states["max_exp_avg_sq"]
            torch._foreach_maximum_(vmax, v)
            v = vmax
        # m_hat / (sqrt(v_hat) + eps) == (sqrt(bc2) / bc1) * m / (sqrt(v) + eps * sqrt(bc2)):
        # the bias corrections fold into the step size and eps, one pass fewer than dividing sqrt(v)
        rb2 = math.sqrt(bc2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_add_(denom, eps * rb2)
        if wd and group["adam_w_mode"]:
            torch._foreach_mul_(p, 1.0 - lr * wd)
        torch._foreach_addcdiv_(p, m, denom, value=-lr * rb2 / bc1)
        b.store(p)

    def _torch_kernel(self, group: dict, b: _Bucket) -> bool:
        """One pass per bucket in torch's fused Adam kernel (the same rule: L2 added to the
        gradient, or decoupled decay p *= 1 - lr * wd); False where torch lacks it."""
        kernel = torch._fused_adamw_ if group["adam_w_mode"] else torch._fused_adam_
        b1, b2 = group["betas"]
        steps = [torch.tensor(float(group["step"]), device=b.device)] * len(b.params)
        vmax = b.states["max_exp_avg_sq"] if group["amsgrad"] else []
        try:
            kernel(b.params, b.grads, b.states["exp_avg"], b.states["exp_avg_sq"], vmax, steps, lr=group["lr"],
                   beta1=b1, beta2=b2, weight_decay=group["weight_decay"], eps=group["eps"],
                   amsgrad=group["amsgrad"], maximize=False)
        except (RuntimeError, NotImplementedError):   # no kernel for this device or dtype: nothing was written
            return False
        return True


class FusedLamb(_Fused):
    """LAMB, apex's ``FusedLAMB``: Adam moments of the gradient clipped by the global
    gradient norm (``max_grad_norm``; None or 0 disables clipping), the update scaled per
    tensor by the trust ratio ||p|| / ||update|| (for groups with weight decay, or for
    all with ``use_nvlamb``). ``grad_averaging=False`` drops the (1 - beta1) factor on the
    gradient in the first moment. ``max_grad_norm`` applies to the optimizer as a whole
    (read from ``defaults``, as apex does)."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True, max_grad_norm: Optional[float] = 1.0,
                 use_nvlamb: bool = False):
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant")
        _check(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, adam_w_mode=adam_w_mode,
                                      grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
                                      use_nvlamb=use_nvlamb, set_grad_none=set_grad_none))

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None):
        loss = self._closure(closure)
        work = [(group, self._buckets(group)) for group in self.param_groups]
        clip = self._clip_factor([b for _, bs in work for b in bs])
        for group, buckets in work:
            group["step"] = group.get("step", 0) + 1
            for b in buckets:
                self._update(group, b, clip)
        return loss

    def global_grad_norm(self) -> torch.Tensor:
        """The L2 norm of every gradient this optimizer steps, over all partitions
        (a collective over the model replica when partitioned: see the module docstring)."""
        return self._global_norm([b for group in self.param_groups for b in self._buckets(group)])

    def _global_norm(self, buckets: List[_Bucket]) -> torch.Tensor:
        home = buckets[0].device if buckets else torch.device("cpu")
        total = torch.zeros((), dtype=torch.float64, device=home)
        for b in buckets:
            norms = torch._foreach_norm(b.grads, 2, dtype=torch.float32 if b.half else None)
            total = total + torch.stack(norms).double().square().sum().to(home)
        group = self._norm_group()
        if group is not None:
            t = total.reshape(1).cpu()
            dist.all_reduce(t, group=group)
            total = t[0].to(home)
        return total.sqrt()

    def _clip_factor(self, buckets: List[_Bucket]) -> Optional[torch.Tensor]:
        max_norm = self.defaults["max_grad_norm"]
        if not max_norm or max_norm <= 0:
            return None
        return torch.clamp(self._global_norm(buckets) / max_norm, min=1.0)

    @staticmethod
    def _update(group: dict, b: _Bucket, clip: Optional[torch.Tensor]) -> None:
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        bc1, bc2 = _bias_corrections(group, b1, b2)
        beta3 = 1.0 - b1 if group["grad_averaging"] else 1.0
        p, g = b.compute()
        m, v = b.states["exp_avg"], b.states["exp_avg_sq"]
        if clip is not None:
            g = torch._foreach_div(g, clip.to(device=b.device, dtype=_state_dtype(b.params[0])))
            if wd and not group["adam_w_mode"]:
                torch._foreach_add_(g, p, alpha=wd)
        elif wd and not group["adam_w_mode"]:
            g = torch._foreach_add(g, p, alpha=wd)
        _moment(m, g, b1, beta3)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1.0 - b2)
        # update = m_hat / (sqrt(v_hat) + eps) (+ wd * p) = k * (u + wd / k * p) with
        # u = m / (sqrt(v) + eps * sqrt(bc2)) and k = sqrt(bc2) / bc1: k goes into the
        # coefficients, and cancels in the trust ratio ||p|| / ||update||
        rb2 = math.sqrt(bc2)
        k = rb2 / bc1
        u = torch._foreach_sqrt(v)
        torch._foreach_add_(u, eps * rb2)
        u = torch._foreach_div(m, u)
        if wd and group["adam_w_mode"]:
            torch._foreach_add_(u, p, alpha=wd / k)
        if wd or group["use_nvlamb"]:
            pn = torch.stack(torch._foreach_norm(p))
            un = torch.stack(torch._foreach_norm(u))
            ratio = torch.where((pn > 0) & (un > 0), pn / un, torch.full_like(pn, k))   # fallback: ratio 1
            torch._foreach_addcmul_(p, u, list((ratio * -lr).unbind(0)))
        else:
            torch._foreach_add_(p, u, alpha=-lr * k)
        b.store(p)


FusedLAMB = FusedLamb


class FusedNovoGrad(_Fused):
    """NovoGrad, apex's ``FusedNovoGrad``: the second moment is one number per tensor, a
    moving average of the gradient's norm (``norm_type`` 2: L2, averaged in squares;
    0: infinity norm, averaged linearly), started at the first gradient's norm or at 0
    (``init_zero``). ``reg_inside_moment=True`` normalises the gradient and adds the weight
    decay before the first moment (the paper's form); False (default) keeps the raw
    gradient in the moment and applies normalisation and decay to the update."""

    _state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 reg_inside_moment: bool = False, grad_averaging: bool = True, norm_type: int = 2,
                 init_zero: bool = False, set_grad_none: bool = True):
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant")
        if norm_type not in (0, 2, math.inf):
            raise RuntimeError(f"FusedNovoGrad: norm_type {norm_type!r}; 2 (L2) and 0 (infinity) are supported")
        _check(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, reg_inside_moment=reg_inside_moment,
                                      grad_averaging=grad_averaging, norm_type=norm_type, init_zero=init_zero,
                                      set_grad_none=set_grad_none))

    def _new_state(self, key: str, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if key == "exp_avg_sq":
            return torch.zeros((), dtype=dtype, device=p.device)
        return super()._new_state(key, p, dtype)

    @staticmethod
    def _update(group: dict, b: _Bucket) -> None:
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        b1, b2 = group["betas"]
        bc1, bc2 = _bias_corrections(group, b1, b2)
        rb2 = math.sqrt(bc2)                       # the moment is a norm, not a square
        beta3 = 1.0 - b1 if group["grad_averaging"] else 1.0
        l2 = group["norm_type"] == 2
        p, g = b.compute()
        m, norms = b.states["exp_avg"], b.states["exp_avg_sq"]
        n = torch.stack(torch._foreach_norm(g, 2 if l2 else math.inf)).to(norms[0].dtype)
        old = torch.stack(norms)
        if not group["init_zero"] and any(b.fresh):
            old = torch.where(torch.tensor(b.fresh, device=old.device), n, old)
        new = (old.square() * b2 + n.square() * (1.0 - b2)).sqrt() if l2 else old * b2 + n * (1.0 - b2)
        torch._foreach_copy_(norms, list(new.unbind(0)))
        denom = new / rb2 + eps
        if group["reg_inside_moment"]:
            gn = torch._foreach_div(g, list(denom.unbind(0)))
            if wd:
                torch._foreach_add_(gn, p, alpha=wd)
            _moment(m, gn, b1, beta3)
            torch._foreach_add_(p, m, alpha=-lr / bc1)
        else:
            _moment(m, g, b1, beta3)
            if wd:
                torch._foreach_mul_(p, 1.0 - lr * wd)
            torch._foreach_addcdiv_(p, m, list((denom * bc1).unbind(0)), value=-lr)
        b.store(p)


def _moment(m: List[torch.Tensor], g: List[torch.Tensor], b1: float, beta3: float) -> None:
    """m = b1 * m + beta3 * g, in one pass (a lerp) when beta3 == 1 - b1 (gradient averaging)."""
    if beta3 == 1.0 - b1:
        torch._foreach_lerp_(m, g, beta3)
    else:
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=beta3)


def _check(lr: float, betas, eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"invalid epsilon value: {eps}")
    if len(betas) != 2 or not all(0.0 <= x < 1.0 for x in betas):
        raise ValueError(f"invalid betas: {betas}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"invalid weight_decay value: {weight_decay}")
