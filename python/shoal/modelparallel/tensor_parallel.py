"""Turning a model's modules into their tensor-parallel versions (SageMaker's v1 API).

Which modules: a module class is *supported* when a distributed version is
registered for it: ``nn.Linear`` -> ``smp.nn.DistributedLinear``,
``nn.Embedding`` -> ``smp.nn.DistributedEmbedding``, the Hugging Face GPT-2,
GPT-J, BERT, RoBERTa and GPT-Neo classes of nn/huggingface (when transformers
is imported), and whatever ``smp.tp_register`` / ``tp_register_with_module``
add. An instance is *enabled* when it was built inside
``smp.tensor_parallelism()`` (or ``smp.model_creation(tensor_parallelism=True)``;
the innermost context decides), or after ``smp.set_tensor_parallelism(module)``.

When: ``smp.DistributedModel(model)`` replaces, on every rank, each outermost
enabled supported module by its distributed version, built from the
original's constructor arguments through the registration's ``init_hook``
(the context's keyword arguments override), and given the original's weights
(through the registration's state-dict translation; a registration without
one keeps the distributed module's own initialisation, as in SageMaker). Its
``forward_hook``/``return_hook`` adapt the calls. A module whose parameters
are shared with modules outside it is kept whole (with a warning); one whose
sizes do not divide over the tensor-parallel ranks is an error on every rank
that names it, raised before anything is sent.

The replacement happens whatever the tensor-parallel degree (at degree 1 the
distributed modules compute what the originals do), so a script sees the
same module tree on one rank and on many (``model.transformer.seq_layers``).
The replaced modules' state-dict translations are kept (:class:`Replaced`),
so that full checkpoints can be written and read with the original names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from ..mpcommon.errors import SMPValidationError
from .nn import huggingface as hf
from .tp import env as tp_env
from .tp import shards
from .tp.base import DistributedModule
from .tp.embedding import DistributedEmbedding
from .tp.linear import DistributedLinear


@dataclasses.dataclass
class _Registration:
    dist_cls: type
    init_hook: Optional[Callable] = None
    forward_hook: Optional[Callable] = None
    return_hook: Optional[Callable] = None
    to_smp: Optional[Callable] = None      # the original's state dict -> the distributed module's (full tensors)
    to_hf: Optional[Callable] = None       # the inverse


_REGISTRY: Dict[type, _Registration] = {}
_CONTEXT: List[Tuple[bool, dict]] = []     # the open smp.tensor_parallelism() contexts, innermost last
_INSTRUMENTED: set = set()
_HF_LOADED = [False]


def _identity(sd):
    return dict(sd)


# ----------------------------------------------------------------- registration

def tp_register_with_module(module_cls: type, dist_module: type, init_hook: Optional[Callable] = None,
                            forward_hook: Optional[Callable] = None, return_hook: Optional[Callable] = None,
                            _to_smp: Optional[Callable] = None, _to_hf: Optional[Callable] = None) -> None:
    """Registers `dist_module` (a subclass of smp.nn.DistributedModule) as the distributed version of
    `module_cls`. The hooks translate the constructor's arguments, the forward's arguments and the
    distributed module's result (SageMaker's semantics)."""
    if not isinstance(module_cls, type) or not issubclass(module_cls, torch.nn.Module):
        raise SMPValidationError(f"smp.tp_register_with_module: module_cls must be an nn.Module class, got "
                                 f"{module_cls!r}")
    if not isinstance(dist_module, type) or not issubclass(dist_module, DistributedModule):
        raise SMPValidationError(f"smp.tp_register: dist_module must be a subclass of smp.nn.DistributedModule "
                                 f"(e.g. smp.nn.DistributedTransformer), got {dist_module!r}")
    for name, hook in (("init_hook", init_hook), ("forward_hook", forward_hook), ("return_hook", return_hook)):
        if hook is not None and not callable(hook):
            raise SMPValidationError(f"smp.tp_register: {name} must be callable, got {hook!r}")
    _REGISTRY[module_cls] = _Registration(dist_module, init_hook, forward_hook, return_hook, _to_smp, _to_hf)
    _instrument(module_cls)


def tp_register(dist_module: type, init_hook: Optional[Callable] = None, forward_hook: Optional[Callable] = None,
                return_hook: Optional[Callable] = None):
    """Class decorator: ``@smp.tp_register(smp.nn.DistributedTransformer, init_hook=...)``."""
    def decorate(cls):
        tp_register_with_module(cls, dist_module, init_hook, forward_hook, return_hook)
        return cls
    return decorate


def _instrument(cls: type) -> None:
    """Makes instances of `cls` remember their constructor's arguments and the tensor-parallelism
    context they were built in (what the replacement needs)."""
    if cls in _INSTRUMENTED:
        return
    _INSTRUMENTED.add(cls)
    orig = cls.__init__

    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if type(self) is cls:
            object.__setattr__(self, "_smp_tp_args", (args, kwargs))
            if _CONTEXT:
                object.__setattr__(self, "_smp_tp_mark", _CONTEXT[-1])
    __init__.__wrapped__ = orig
    __init__.__signature__ = inspect.signature(orig)
    cls.__init__ = __init__


def _builtins() -> None:
    """The built-in registrations (the Hugging Face ones once transformers is imported)."""
    if torch.nn.Linear not in _REGISTRY:
        tp_register_with_module(torch.nn.Linear, DistributedLinear, _to_smp=_identity, _to_hf=_identity)
        tp_register_with_module(torch.nn.Embedding, DistributedEmbedding,
                                init_hook=_embedding_init, _to_smp=_identity, _to_hf=_identity)
    if not _HF_LOADED[0] and "transformers" in sys.modules:
        _HF_LOADED[0] = True
        for m in getattr(hf, "mappings", list)():
            if m.hf_class not in _REGISTRY:
                tp_register_with_module(m.hf_class, m.dist_class, m.init_hook, m.forward_hook, m.return_hook,
                                        _to_smp=m.to_smp, _to_hf=m.to_hf)


def _embedding_init(num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                    scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None,
                    dtype=None):
    return (num_embeddings, embedding_dim), {"padding_idx": padding_idx}


# ----------------------------------------------------------------- enabling

@contextlib.contextmanager
def tensor_parallelism(enabled: bool = True, **kwargs) -> Iterator[None]:
    """Supported modules built inside are distributed when the model is wrapped (the innermost
    context decides; its keyword arguments override the distributed modules' arguments)."""
    if not isinstance(enabled, bool):
        raise SMPValidationError(f"smp.tensor_parallelism: enabled must be True or False, got {enabled!r}")
    _builtins()
    _CONTEXT.append((enabled, dict(kwargs)))
    try:
        yield
    finally:
        _CONTEXT.pop()


def set_tensor_parallelism(module: torch.nn.Module, enabled: bool = True, **kwargs) -> None:
    """Enables (the outermost supported submodules of `module`) or disables (its whole subtree)
    tensor parallelism, after the model is built and before it is wrapped."""
    if not isinstance(module, torch.nn.Module):
        raise SMPValidationError(f"smp.set_tensor_parallelism: module must be an nn.Module, got "
                                 f"{type(module).__name__}")
    if not isinstance(enabled, bool):
        raise SMPValidationError(f"smp.set_tensor_parallelism: enabled must be True or False, got {enabled!r}")
    _builtins()
    for m in module.modules():
        if not enabled or type(m) in _REGISTRY:
            object.__setattr__(m, "_smp_tp_mark", (enabled, dict(kwargs)))


# ----------------------------------------------------------------- replacing

@dataclasses.dataclass
class Replaced:
    """A module that the wrapping replaced: where, what it was, how its state dict translates."""
    path: str
    original: str                # the original class's name
    to_smp: Optional[Callable]
    to_hf: Optional[Callable]


def replace_modules(root: torch.nn.Module, who: str, tp_size: int) -> Tuple[torch.nn.Module, List[Replaced]]:
    """Replaces the outermost enabled supported modules of `root` (maybe `root` itself); returns the
    new root and what was replaced."""
    _builtins()
    done: List[Replaced] = []
    owners = _param_owners(root)

    def visit(mod: torch.nn.Module, path: str) -> torch.nn.Module:
        mark = getattr(mod, "_smp_tp_mark", None)
        reg = _REGISTRY.get(type(mod))
        if reg is not None and mark is not None and mark[0] and not isinstance(mod, DistributedModule):
            if _shares_weights(mod, path, owners):
                warnings.warn(f"smp: '{path or 'the model'}' ({type(mod).__name__}) shares parameters with "
                              f"modules outside it and is kept whole (not tensor-parallel)")
            else:
                new = _build(mod, reg, mark[1], path, who, tp_size)
                done.append(Replaced(path, type(mod).__name__, reg.to_smp, reg.to_hf))
                return new
        for name, child in list(mod._modules.items()):
            if child is not None:
                new = visit(child, f"{path}.{name}" if path else name)
                if new is not child:
                    mod._modules[name] = new
        return mod

    root = visit(root, "")
    _check_groups(root, who, tp_size)
    return root, done


def _check_groups(root: torch.nn.Module, who: str, tp_size: int) -> None:
    """Every distributed module of the model must have been built for this job's TP group."""
    want = tp_env.current()
    for name, m in root.named_modules():
        if isinstance(m, DistributedModule) and (m.tp_env.size != tp_size or m.tp_env.group is not want.group):
            raise SMPValidationError(
                f"smp.DistributedModel ({who}): '{name or 'the model'}' ({type(m).__name__}) was built for a "
                f"tensor-parallel group of {m.tp_env.size} rank(s), this job's has {tp_size}: build the "
                f"smp.nn.Distributed* modules after smp.init (not before smp.init, nor under another init)")


def _build(mod: torch.nn.Module, reg: _Registration, overrides: dict, path: str, who: str,
           tp_size: int) -> torch.nn.Module:
    recorded = getattr(mod, "_smp_tp_args", None)
    if recorded is None:   # built before its class was registered: a Hugging Face module has its config
        recorded = ((mod.config,), {}) if hasattr(mod, "config") else ((), {})
    args, kwargs = recorded
    if reg.init_hook is not None:
        args, kwargs = reg.init_hook(*args, **kwargs)
    kwargs = dict(kwargs)
    accepted = inspect.signature(reg.dist_cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    kwargs.update({k: v for k, v in overrides.items() if takes_any or k in accepted})
    params = [p for p in mod.parameters()]
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.get_default_dtype())
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        new = reg.dist_cls(*args, **kwargs)
    except SMPValidationError as e:
        raise SMPValidationError(
            f"smp.DistributedModel ({who}): cannot distribute '{path or 'the model'}' ({type(mod).__name__}) over "
            f"tensor_parallel_degree {tp_size}: {e}. Build it outside smp.tensor_parallelism(), or call "
            f"smp.set_tensor_parallelism(module, False), to keep it whole") from None
    finally:
        torch.set_default_dtype(prev)
    if reg.to_smp is not None and not any(p.is_meta for p in params):
        full = reg.to_smp({k: v.detach() for k, v in mod.state_dict().items()})
        try:
            shards.load_full(new, full)
        except SMPValidationError as e:
            raise SMPValidationError(f"smp.DistributedModel ({who}): '{path or 'the model'}' ({type(mod).__name__}): "
                                     f"its translated weights do not fit {type(new).__name__}: {e}") from None
    new.train(mod.training)
    if reg.forward_hook is not None or reg.return_hook is not None:
        _adapt_calls(new, reg, type(mod))
    return new


_ADAPTED: Dict[Tuple[type, type, int], type] = {}


def _adapt_calls(new: torch.nn.Module, reg: _Registration, orig_cls: type) -> None:
    """Calls with the original module's signature reach the distributed module through the hooks.
    The instance's class becomes a subclass of the distributed class (same name) whose forward is
    the adapted one, so that the pipeline's tracer (which reads the class's forward) sees it."""
    key = (type(new), orig_cls, id(reg))
    cls = _ADAPTED.get(key)
    if cls is None:
        inner, fwd, ret = type(new).forward, reg.forward_hook, reg.return_hook

        def forward(self, *args, **kwargs):
            if fwd is not None:
                args, kwargs = fwd(*args, **kwargs)
            out = inner(self, *args, **kwargs)
            return ret(out) if ret is not None else out
        try:
            forward.__signature__ = inspect.signature(orig_cls.forward)
        except (TypeError, ValueError):
            pass
        cls = type(type(new).__name__, (type(new),), {"forward": forward, "__module__": type(new).__module__,
                                                       "__doc__": type(new).__doc__})
        _ADAPTED[key] = cls
    new.__class__ = cls


def _param_owners(root: torch.nn.Module) -> Dict[int, List[str]]:
    owners: Dict[int, List[str]] = {}
    for mname, m in root.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append(f"{mname}.{pname}" if mname else pname)
    return owners


def _shares_weights(mod: torch.nn.Module, path: str, owners: Dict[int, List[str]]) -> bool:
    prefix = f"{path}." if path else ""
    for p in mod.parameters():
        if any(not n.startswith(prefix) for n in owners.get(id(p), [])):
            return True
    return False


# ----------------------------------------------------------------- state dicts

def to_original_names(sd: Dict[str, Any], replaced: List[Replaced]) -> Dict[str, Any]:
    """A full state dict of the replaced model, keyed as the model before replacement (where each
    replacement has a translation)."""
    return _translate(sd, replaced, "to_hf")


def to_distributed_names(sd: Dict[str, Any], replaced: List[Replaced], keys) -> Dict[str, Any]:
    """The inverse, applied when `sd` is keyed as the original model (not as the replaced one)."""
    if all(k in keys for k in sd):
        return dict(sd)
    return _translate(sd, replaced, "to_smp")


def _translate(sd: Dict[str, Any], replaced: List[Replaced], direction: str) -> Dict[str, Any]:
    out = dict(sd)
    for r in replaced:
        fn = getattr(r, direction)
        if fn is None:
            continue
        prefix = f"{r.path}." if r.path else ""
        inner = {k[len(prefix):]: v for k, v in out.items() if k.startswith(prefix)}
        if not inner:
            continue
        for k in list(out):
            if k.startswith(prefix):
                del out[k]
        out.update({prefix + k: v for k, v in fn(inner).items()})
    return out


def distributed_named(root: torch.nn.Module, kind: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, tensor) of the parameters (`kind` "parameters") or buffers that are tensor-parallel pieces."""
    items = root.named_parameters() if kind == "parameters" else root.named_buffers()
    for n, t in items:
        if getattr(t, "_smp_distributed", False):
            yield n, t


def _pieces(root: torch.nn.Module) -> Dict[str, int]:
    """name -> split dim of every tensor-parallel piece of `root` (parameters and buffers)."""
    out = {}
    for n, t in list(root.named_parameters(remove_duplicate=False)) + list(root.named_buffers(remove_duplicate=False)):
        if getattr(t, "_smp_distributed", False):
            out[n] = int(getattr(t, "_smp_split_dim", 0))
    return out


def join_pieces(root: torch.nn.Module, sd: Dict[str, torch.Tensor], group, size: int) -> Dict[str, torch.Tensor]:
    """`sd` (this rank's tensors) with each tensor-parallel piece joined with the other TP ranks' into
    the whole tensor (a collective over `group`; every TP rank holds the same keys)."""
    dims = _pieces(root)
    out = dict(sd)
    for k in sorted(k for k in sd if k in dims):
        t = sd[k].contiguous()
        parts = [torch.empty_like(t) for _ in range(size)]
        torch.distributed.all_gather(parts, t, group=group)
        out[k] = torch.cat(parts, dim=dims[k])
    return out


def own_pieces(root: torch.nn.Module, sd: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    """`sd` (whole tensors) with each tensor-parallel piece cut to this TP rank's."""
    dims = _pieces(root)
    local = dict(root.state_dict(keep_vars=True))
    out = dict(sd)
    for k, d in dims.items():
        if k in sd and k in local and tuple(sd[k].shape) != tuple(local[k].shape):
            if sd[k].shape[d] != local[k].shape[d] * size:
                raise SMPValidationError(
                    f"smp: load_state_dict: '{k}' has shape {tuple(sd[k].shape)}, which is not this model's "
                    f"{tuple(local[k].shape)} split {size} ways along dim {d}")
            out[k] = torch.chunk(sd[k], size, dim=d)[rank]
    return out
