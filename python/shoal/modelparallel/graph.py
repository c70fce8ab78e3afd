"""Capturing the model's forward as a graph of module calls and glue code.

The pipeline needs to know what the model's forward does between its
submodules: torch.fx traces the wrapped module with a chosen set of *units*
(submodules that are called as a whole, the leaves of the partitioning) and
records every call of a unit, every operation between them (the glue: ``x + y``,
``x.view(...)``, ``torch.arange(t)``) and every parameter read directly.

The unit modules are never traced inside, so their forward may do anything.
The code of the modules above them (the wrapped module's forward, and the
forward of any module the partitioner splits) must be traceable by torch.fx:
no Python control flow on tensor values. Two additions to plain torch.fx:

- the tracer runs every recorded operation on meta tensors beside the trace,
  so it knows shapes; iterating over a size (``b, t = idx.size()``) works,
  and so does control flow on sizes (``if t > 1:``): the branch is taken at
  trace time and the graph is then specific to the input shapes (a
  ``fx.Graph`` attribute, ``_shoal_shape_specialized``, says so);
- buffers read by the traced code are graph values (``self.mask[:t, :t]``);
- a failure names the module whose forward could not be traced
  (:class:`TraceFailure`), so that the partitioner can keep it whole; a
  module marked for activation checkpointing (activation_marks.py) is never
  traced through: it must be a unit or lie inside one, so the same failure
  makes the partitioner keep it whole.

A forward that takes ``**kwargs`` (every Hugging Face model's) is traced with
the call's keyword arguments as its parameters; a mapping it returns (a
``ModelOutput``) is rebuilt with its type (``_shoal_output_type``).

Non-tensor arguments of the call (None, flags, ints) are baked into the graph;
the runtime keeps one graph per distinct set of such values.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import operator
from typing import Any, Dict, Iterable, Mapping, Optional

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from .activation_marks import mark_of
from ..mpcommon.errors import SMPValidationError

_UNKNOWN = object()
_CONCRETE = (type(None), bool, int, float, str, torch.dtype, torch.device)


class TraceFailure(Exception):
    """The forward of `module` (qualified name, '' for the wrapped module) could not be traced."""

    def __init__(self, module: str, cause: BaseException):
        where = f"module '{module}'" if module else "the wrapped module"
        super().__init__(f"the forward of {where} cannot be traced by torch.fx: "
                         f"{type(cause).__name__}: {cause}")
        self.module = module
        self.cause = cause


def is_concrete(v: Any) -> bool:
    if isinstance(v, _CONCRETE):
        return True
    if isinstance(v, (tuple, list)):
        return all(is_concrete(x) for x in v)
    return False


def bind(module: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """The call's arguments by name, defaults applied: `module.forward`'s named
    parameters, then the keyword arguments its ``**kwargs`` took (as Hugging
    Face models' forwards have), each under its own name."""
    sig = inspect.signature(module.forward)
    for p in sig.parameters.values():
        if p.kind == p.VAR_POSITIONAL and len(args) > sum(
                1 for q in sig.parameters.values() if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)):
            raise TypeError(f"smp: the forward of {type(module).__name__} was given more positional arguments "
                            f"than it names (its *{p.name}); the pipeline needs them by name: pass them as "
                            f"keyword arguments")
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    out: Dict[str, Any] = {}
    for name, v in b.arguments.items():
        kind = sig.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            out.update(v)
        elif kind != inspect.Parameter.VAR_POSITIONAL:
            out[name] = v
    return out


def _assigned(t, key, value):
    """`t[key] = value`, as a value: the graph node of an item assignment."""
    t[key] = value
    return t


def _mutations_as_dataflow(g: fx.Graph) -> None:
    """Glue code that changes a tensor in place (`x[..., 1:] = y`,
    `x.masked_fill_(m, v)`) leaves its result unused in the graph, while the
    code after it reads the changed tensor through the original node: the
    pipeline, which runs glue where its result is needed, would skip the
    change. Rewire each later reader to the changing node instead, so the
    change is a value the pipeline must compute first."""
    order = {n: i for i, n in enumerate(g.nodes)}
    for m in list(g.nodes):
        if m.op == "call_function" and m.target is operator.setitem:
            m.target = _assigned
        elif not (m.op == "call_method" and m.target.endswith("_") and not m.target.startswith("_")):
            continue
        changed = m.args[0] if m.args else None
        if not isinstance(changed, fx.Node):
            continue
        for u in list(changed.users):
            if u is not m and order[u] > order[m]:
                u.replace_input_with(changed, m)


@contextlib.contextmanager
def _item_assignment():
    """While tracing: `x[..., 1:] = y` on a traced tensor is recorded (an
    in-place operator.setitem node), as T5's shift of the decoder inputs does."""
    had = "__setitem__" in vars(fx.Proxy)

    def setitem(self, key, value):
        return self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})
    if not had:
        fx.Proxy.__setitem__ = setitem
    try:
        yield
    finally:
        if not had:
            del fx.Proxy.__setitem__


@contextlib.contextmanager
def _named_forward(root: torch.nn.Module, names: Iterable[str]):
    """While tracing: `root`'s forward as one with exactly these named
    parameters (torch.fx cannot trace a forward that takes ``**kwargs``); the
    module, its class name and its attributes stay what they are."""
    names = list(names)
    params = [p for p in inspect.signature(root.forward).parameters.values()]
    if all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params) and \
            [p.name for p in params] == names:
        yield
        return
    for n in names:
        if not n.isidentifier():
            raise TypeError(f"smp: keyword argument {n!r} of the forward of {type(root).__name__} is not a name")
    cls = type(root)
    ns: Dict[str, Any] = {"_forward": cls.forward}
    exec(f"def forward(self, {', '.join(names)}):\n"  # noqa: S102 - names checked above
         f"    return _forward(self, {', '.join(f'{n}={n}' for n in names)})\n", ns)
    root.__class__ = type(cls.__name__, (cls,), {"forward": ns["forward"], "__module__": cls.__module__})
    try:
        yield
    finally:
        root.__class__ = cls


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    if isinstance(v, (tuple, list)):
        return type(v)(_meta(x) for x in v) if not hasattr(v, "_fields") else type(v)(*(_meta(x) for x in v))
    if isinstance(v, dict):
        return {k: _meta(x) for k, x in v.items()}
    return v


class _Tracer(fx.Tracer):
    def __init__(self, root: torch.nn.Module, leaves: Iterable[str], example: Mapping[str, Any],
                 meta_state: Mapping[str, torch.Tensor]):
        super().__init__(autowrap_modules=(math,))
        # Buffers read by the traced code become graph values, so that code
        # may index them with traced sizes (self.mask[:T, :T]).
        self.proxy_buffer_attributes = True
        self.root_module = root
        self.leaves = set(leaves)
        self.example = dict(example)
        self.meta_state = meta_state
        self.shadow: Dict[fx.Node, Any] = {}
        self.placeholder_names = list(inspect.signature(root.forward).parameters)
        self.n_placeholders = 0
        self.stack = [""]
        self.in_shadow = False
        self.shape_specialized = False
        self.last_mapping = None

    # -- units are leaves; everything else is traced through
    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return qualname in self.leaves

    def call_module(self, m, forward, args, kwargs):
        if self.in_shadow:  # a module called while computing shapes: just run it
            return forward(*args, **kwargs)
        try:
            qualname = self.path_of_module(m)
        except NameError:  # made inside the forward (a loss module): its code is glue
            return forward(*args, **kwargs)
        if qualname in self.leaves:
            return super().call_module(m, forward, args, kwargs)
        if mark_of(m) is not None:
            raise TraceFailure(qualname, SMPValidationError(
                f"module '{qualname}' is checkpointed, so the pipeline must call it whole, but its submodules "
                f"are in different pipeline units (on different partitions)"))
        self.stack.append(qualname)
        try:
            return super().call_module(m, forward, args, kwargs)
        except TraceFailure:
            raise
        except Exception as e:  # noqa: BLE001 - any failure inside this module's forward
            raise TraceFailure(qualname, e) from e
        finally:
            self.stack.pop()

    # -- shapes beside the trace
    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        self.in_shadow = True
        try:
            self.shadow[proxy.node] = self._run(proxy.node)
        except Exception:  # noqa: BLE001 - best effort: unknown shapes only matter when iterated
            self.shadow[proxy.node] = _UNKNOWN
        finally:
            self.in_shadow = False
        return proxy

    def _run(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            i = self.n_placeholders
            self.n_placeholders += 1
            name = self.placeholder_names[i] if i < len(self.placeholder_names) else node.target
            return _meta(self.example.get(name, _UNKNOWN))
        unknown = []

        def val(n: fx.Node):
            v = self.shadow.get(n, _UNKNOWN)
            if v is _UNKNOWN:
                unknown.append(n)
            return v
        args = map_arg(node.args, val)
        kwargs = map_arg(node.kwargs, val)
        if unknown:
            return _UNKNOWN
        with torch.no_grad(), torch.device("meta"):
            if node.op == "get_attr":
                if node.target in self.meta_state:
                    return self.meta_state[node.target]
                obj = self.root_module
                for part in node.target.split("."):
                    obj = getattr(obj, part)
                return _meta(obj)
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            if node.op == "call_module":
                prefix = node.target + "."
                state = {k[len(prefix):]: v for k, v in self.meta_state.items() if k.startswith(prefix)}
                mod = self.root_module.get_submodule(node.target)
                return torch.func.functional_call(mod, state, tuple(args), dict(kwargs), strict=False,
                                                  tie_weights=False)
        return _UNKNOWN

    def iter(self, obj):
        v = self.shadow.get(obj.node, _UNKNOWN)
        if isinstance(v, (torch.Size, tuple, list)):
            return iter([obj[i] for i in range(len(v))])
        raise fx.proxy.TraceError(
            "iterating over a traced value whose length is not a static shape (for example a "
            "tensor's rows, or a data-dependent list); move this code into a submodule")

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self.in_shadow:  # computing shapes: attributes are what they are
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    # -- a mapping the forward returns (a Hugging Face ModelOutput) keeps its type
    def create_arg(self, a):
        if isinstance(a, Mapping) and type(a) is not dict and \
                not isinstance(a, fx.immutable_collections.immutable_dict):
            self.last_mapping = (type(a), list(a.keys()))
            a = dict(a)
        return super().create_arg(a)

    def to_bool(self, obj):
        # A condition on sizes (`if q_len == 1`, `t > self.max_t`) is known
        # at trace time: the branch taken is baked in, and the graph then
        # holds for these input shapes only (the runtime keys it on them).
        v = self.shadow.get(obj.node, _UNKNOWN)
        if isinstance(v, (bool, int, float)):
            self.shape_specialized = True
            return bool(v)
        raise fx.proxy.TraceError(
            "Python control flow on a tensor's values (if/while/and/or/bool() of a tensor, not of its "
            "shape); move this code into a submodule, which the pipeline then runs whole")


def trace(root: torch.nn.Module, leaves: Iterable[str], call_args: Mapping[str, Any],
          meta_state: Optional[Mapping[str, torch.Tensor]] = None) -> fx.Graph:
    """Traces `root` with `leaves` (qualified names) as units.

    call_args: the bound arguments of a real call (see bind); non-tensor ones
    are baked in, tensors are example values for shapes. meta_state: meta
    tensors of every parameter and buffer by qualified name (shapes of
    parameters that were freed on this rank); built from `root` when None.
    """
    if meta_state is None:
        meta_state = {k: _meta(v) for k, v in list(root.named_parameters(remove_duplicate=False)) +
                      list(root.named_buffers(remove_duplicate=False))}
    concrete = {k: v for k, v in call_args.items() if is_concrete(v)}
    with _named_forward(root, call_args), _item_assignment():
        tracer = _Tracer(root, leaves, call_args, meta_state)
        try:
            g = tracer.trace(root, concrete_args=concrete)
            _mutations_as_dataflow(g)
            g._shoal_shape_specialized = tracer.shape_specialized
            out = next(n for n in reversed(g.nodes) if n.op == "output").args[0]
            g._shoal_output_type = None
            if isinstance(out, dict) and tracer.last_mapping and list(out) == tracer.last_mapping[1]:
                g._shoal_output_type = tracer.last_mapping[0]
            return g
        except TraceFailure:
            raise
        except Exception as e:  # noqa: BLE001
            raise TraceFailure("", e) from e


def traceable(module: torch.nn.Module, children: Iterable[str], call_args: Mapping[str, Any]) -> Optional[str]:
    """None if `module`'s own forward traces with its `children` (names relative
    to it) as units, else the reason."""
    try:
        trace(module, children, call_args)
        return None
    except TraceFailure as e:
        return str(e)
