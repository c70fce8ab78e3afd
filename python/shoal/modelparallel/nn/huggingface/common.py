"""What the Hugging Face tensor-parallel mappings share: the mapping record, the state-dict renaming
engine, and the conversions of Hugging Face's forward arguments.

A family module (gpt2.py, gptj.py, bert.py, roberta.py, gptneo.py) describes its model as rename
rules: each rule names one Hugging Face tensor and the one or more SMP tensors it becomes (several
when a fused projection is split, e.g. GPT-2's ``c_attn`` into query, key and value), and whether the
tensor is transposed on the way (GPT-2's ``Conv1D`` keeps its weight as [in, out], SMP's linear
layers as [out, in]). Layer rules are written once, relative to a layer, and applied under the
layer prefixes (``transformer.h.{}.`` on one side, ``transformer.seq_layers.{}.`` on the other).
`translate` applies the rules in either direction, so the two directions are inverse by
construction; every key of the input must be consumed by a rule (or be a key the caller passes
through or drops explicitly), and every key a rule needs must be present: a missing or an
unexpected key is an `SMPValidationError` naming the key.

State dicts here are full (unsharded) tensors; sharding them over the tensor-parallel group is the
replacement machinery's business, not the translations'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.fx

from ....mpcommon.errors import SMPUnsupportedError, SMPValidationError

StateDict = Dict[str, torch.Tensor]

# the additive value of a masked attention position in the SMP modules' [N, 1, 1, S] masks
MASKED_SCORE = -10000.0


@dataclass(frozen=True)
class TPMapping:
    """How one Hugging Face module class is replaced by an smp.nn.Distributed* module.

    - init_hook(*hf_init_args) -> (args, kwargs) for the Distributed* class (its signature is the
      Hugging Face class's __init__ without self).
    - forward_hook(*hf_forward_args, **kwargs) -> (args, kwargs) for the Distributed* forward (the
      signature of the Hugging Face forward without self); unsupported inputs raise
      SMPUnsupportedError naming the argument.
    - return_hook(dist_output) -> what the Hugging Face forward returns.
    - to_smp(state_dict) / to_hf(state_dict): the replaced module's full state dict (keys relative
      to the module) in the Distributed* module's naming, and back.
    """
    hf_class_name: str
    dist_class_name: str
    init_hook: Callable[..., Tuple[tuple, dict]]
    forward_hook: Callable[..., Tuple[tuple, dict]]
    return_hook: Callable[[Any], Any]
    to_smp: Callable[[Mapping[str, torch.Tensor]], StateDict]
    to_hf: Callable[[Mapping[str, torch.Tensor]], StateDict]
    hf_class: Optional[type] = field(default=None, compare=False)     # the class named hf_class_name
    dist_class: Optional[type] = field(default=None, compare=False)   # smp.nn.<dist_class_name>


@dataclass(frozen=True)
class Rule:
    """One Hugging Face tensor `hf` and the SMP tensor(s) `smp` it becomes.

    With several `smp` names the Hugging Face tensor is split into equal pieces along dim 0 (after
    the transpose, if any) in the order given, and concatenated back on the way to Hugging Face.
    Layer rules name tensors relative to a layer."""
    hf: str
    smp: Tuple[str, ...]
    transpose: bool = False

    @staticmethod
    def of(hf: str, *smp: str, transpose: bool = False) -> "Rule":
        return Rule(hf, tuple(smp) if smp else (hf,), transpose)


def linear(hf: str, smp: str, *, bias: bool = True, transpose: bool = False) -> List[Rule]:
    """The rules of one linear layer: `hf`.weight -> `smp`.weight (and the biases)."""
    rules = [Rule.of(f"{hf}.weight", f"{smp}.weight", transpose=transpose)]
    if bias:
        rules.append(Rule.of(f"{hf}.bias", f"{smp}.bias"))
    return rules


def layernorm(hf: str, smp: str) -> List[Rule]:
    return [Rule.of(f"{hf}.weight", f"{smp}.weight"), Rule.of(f"{hf}.bias", f"{smp}.bias")]


def _forward(rule: Rule, tensor: torch.Tensor) -> List[torch.Tensor]:
    if rule.transpose:
        tensor = tensor.t().contiguous()
    if len(rule.smp) == 1:
        return [tensor]
    if tensor.shape[0] % len(rule.smp):
        raise SMPValidationError(f"'{rule.hf}' has {tensor.shape[0]} rows, which do not split into "
                                 f"{len(rule.smp)} equal parts ({', '.join(rule.smp)})")
    return [p.clone() for p in tensor.chunk(len(rule.smp), dim=0)]


def _backward(rule: Rule, parts: List[torch.Tensor]) -> torch.Tensor:
    tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
    return tensor.t().contiguous() if rule.transpose else tensor


def layer_indices(keys: Iterable[str], prefix: str, what: str, shown: str = "") -> List[int]:
    """The layer indices under `prefix` (a format string with one ``{}``), checked to be 0..L-1."""
    pattern = re.compile(re.escape(prefix).replace(r"\{\}", r"(\d+)"))
    found = sorted({int(m.group(1)) for k in keys for m in [pattern.match(k)] if m})
    if found != list(range(len(found))):
        raise SMPValidationError(f"{what}: layers {found} under '{shown}{prefix.format('<i>')}' are not "
                                 f"0..{len(found) - 1}")
    return found


def translate(state_dict: Mapping[str, torch.Tensor], *, to_smp: bool, what: str,
              top: Sequence[Rule] = (), layer: Sequence[Rule] = (), hf_layer: str = "", smp_layer: str = "",
              shown: str = "") -> StateDict:
    """Renames `state_dict` by the rules, towards SMP (`to_smp`) or towards Hugging Face.

    `top` rules apply once; `layer` rules once per layer, with the names prefixed by `hf_layer` /
    `smp_layer` (format strings with the layer index). A key no rule consumes is an unexpected
    key. Errors name the keys with `shown` before them (where the state dict sits in the
    caller's)."""
    src = dict(state_dict)
    src_layer = hf_layer if to_smp else smp_layer
    rules: List[Tuple[Rule, str, str]] = [(r, "", "") for r in top]
    if layer:
        for i in layer_indices(src, src_layer, what, shown):
            rules += [(r, hf_layer.format(i), smp_layer.format(i)) for r in layer]
    out: StateDict = {}

    def take(key: str) -> torch.Tensor:
        if key not in src:
            raise SMPValidationError(f"{what}: the state dict has no '{shown}{key}'")
        return src.pop(key)

    for rule, hp, sp in rules:
        hf_key = hp + rule.hf
        smp_keys = [sp + s for s in rule.smp]
        if to_smp:
            for k, t in zip(smp_keys, _forward(rule, take(hf_key))):
                out[k] = t
        else:
            out[hf_key] = _backward(rule, [take(k) for k in smp_keys])
    if src:
        raise SMPValidationError(f"{what}: unexpected key{'s' if len(src) > 1 else ''} "
                                 f"{', '.join(repr(shown + k) for k in sorted(src))}")
    return out


def sub_dict(state_dict: Mapping[str, torch.Tensor], prefix: str) -> Tuple[StateDict, StateDict]:
    """(the keys under `prefix` with the prefix stripped, the rest)."""
    inner, rest = {}, {}
    for k, v in state_dict.items():
        if k.startswith(prefix):
            inner[k[len(prefix):]] = v
        else:
            rest[k] = v
    return inner, rest


def with_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str) -> StateDict:
    return {prefix + k: v for k, v in state_dict.items()}


def prefixes_of(keys: Iterable[str], marker: str) -> List[str]:
    """Every prefix p with p + `marker` among `keys`, longest first."""
    return sorted({k[:-len(marker)] for k in keys if k.endswith(marker) and
                   (len(k) == len(marker) or k[-len(marker) - 1] == ".")}, key=len, reverse=True)


# ---------------------------------------------------------------- forward arguments

def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__ if not isinstance(value, (bool, int, float, str)) else repr(value)


def masked_positions(attention_mask: Optional[torch.Tensor], input_ids: torch.Tensor,
                     model: str) -> Optional[torch.Tensor]:
    """Hugging Face's [N, S] attention mask (1 = attend) as SMP's 0-1 [N, S] mask (1 = masked).

    No mask (None) means every position is attended, and stays None."""
    n, s = input_ids.shape[0], input_ids.shape[-1]
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (n, s):
        raise SMPUnsupportedError(f"{model} under tensor parallelism: 'attention_mask' must be the [batch, seq] "
                                  f"padding mask ({n}, {s}); got shape {tuple(attention_mask.shape)}")
    return (attention_mask == 0).long()


def additive_key_mask(attention_mask: Any, hidden_states: torch.Tensor, model: str) -> torch.Tensor:
    """The mask a Hugging Face model hands its encoder, as the [N, 1, 1, S] additive mask of
    SMP's transformer (0 where attended, MASKED_SCORE where masked).

    Hugging Face builds the encoder mask from the padding mask: None when nothing is masked, a
    bool [N, 1, S, S] (True = attend; sdpa) or an additive float [N, 1, S, S] (eager), with
    every query row alike for a bidirectional model. A 2-D [N, S] padding mask (1 = attend) is
    accepted as well, for callers of the encoder itself."""
    n, s = hidden_states.shape[0], hidden_states.shape[1]
    dtype, device = hidden_states.dtype, hidden_states.device
    if attention_mask is None:
        return torch.zeros(n, 1, 1, s, dtype=dtype, device=device)
    if not isinstance(attention_mask, torch.Tensor):
        raise SMPUnsupportedError(f"{model} under tensor parallelism: an attention mask of type "
                                  f"{type(attention_mask).__name__} is not supported; use the eager or sdpa "
                                  f"attention implementation")
    if attention_mask.dim() == 2:
        keep = attention_mask.bool()
    elif attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            rows = attention_mask
        else:
            rows = attention_mask > torch.finfo(attention_mask.dtype).min / 2
        rows = rows.expand(n, -1, -1, s)
        keep = rows[:, 0, 0, :]
        if not bool((rows == keep[:, None, None, :]).all()):
            raise SMPUnsupportedError(f"{model} under tensor parallelism: the attention mask masks queries "
                                      f"differently (a causal or per-query mask); only key padding is supported")
    else:
        raise SMPUnsupportedError(f"{model} under tensor parallelism: 'attention_mask' of shape "
                                  f"{tuple(attention_mask.shape)} is not supported")
    mask = torch.zeros(n, 1, 1, s, dtype=dtype, device=device)
    return mask.masked_fill(~keep.to(device)[:, None, None, :], MASKED_SCORE)


# ---------------------------------------------------------------- the causal LMs (GPT-2, GPT-J, GPT-Neo)

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "relu": "relu"}


def activation(name: Any, model: str) -> str:
    """A Hugging Face activation name as the distributed modules' ``activation``."""
    if name not in _ACTIVATIONS:
        raise SMPUnsupportedError(f"{model} under tensor parallelism: activation {name!r} is not supported "
                                  f"(one of {', '.join(sorted(_ACTIVATIONS))})")
    return _ACTIVATIONS[name]


def _neutral(name: str, value: Any) -> bool:
    """Whether a forward argument asks for nothing the distributed module does not do."""
    if value is None:
        return True
    if name == "return_dict":
        return value is True
    if name == "logits_to_keep":
        return isinstance(value, int) and not isinstance(value, bool) and value == 0
    return value is False


def refuse_inputs(model: str, **given: Any) -> None:
    """Refuses, naming it, each forward argument that asks for what the distributed module does
    not do: a KV cache (past_key_values, use_cache=True), embeddings instead of ids, attention
    weights or hidden states as outputs, a head mask, cross attention, a tuple return ..."""
    for name, value in given.items():
        if not _neutral(name, value):
            raise SMPUnsupportedError(f"{model} under tensor parallelism: '{name}' is not supported by the "
                                      f"distributed module that replaces it (got {_describe(value)})")


def lm_inputs(model: str, input_ids: Any, attention_mask: Optional[torch.Tensor],
              position_ids: Optional[torch.Tensor], labels: Optional[torch.Tensor]) -> Tuple[tuple, dict]:
    """The DistributedTransformerLMHead call for a causal LM's forward arguments."""
    # (a torch.fx Proxy when the pipeline traces the model: its dim() is known to the tracer)
    if not isinstance(input_ids, (torch.Tensor, torch.fx.Proxy)) or input_ids.dim() != 2:
        raise SMPUnsupportedError(f"{model} under tensor parallelism: 'input_ids' must be a [batch, seq] tensor "
                                  f"(got {_describe(input_ids)})")
    mask = masked_positions(attention_mask, input_ids, model)
    return ((input_ids, mask, None, position_ids, labels),), {}


@dataclass(frozen=True)
class CausalLM:
    """The state-dict translations of a GPT-style family replaced by DistributedTransformerLMHead.

    `top` and `layer` are the rules of the body (``GPT2Model``-like: keys ``wte``, ``h.<i>.``,
    ``ln_f``); the causal LM holds the body under ``transformer.`` and an LM head, tied to the
    word embedding (dropped on the way in after checking it is equal, restored on the way back)
    unless `head` gives the rules of an untied one (relative to the LM). Layer keys ending in one
    of `dropped` (causal-mask buffers of older checkpoints) are dropped on the way in."""
    model: str
    top: Sequence[Rule]
    layer: Sequence[Rule]
    dropped: Tuple[str, ...] = ()
    head: Sequence[Rule] = ()
    hf_layer: str = "h.{}."
    smp_layer: str = "transformer.seq_layers.{}."

    def body_to_smp(self, state_dict: Mapping[str, torch.Tensor], shown: str = "") -> StateDict:
        sd = {k: v for k, v in state_dict.items() if not any(k.endswith("." + d) for d in self.dropped)}
        return translate(sd, to_smp=True, what=f"{self.model} to smp", top=self.top, layer=self.layer,
                         hf_layer=self.hf_layer, smp_layer=self.smp_layer, shown=shown)

    def body_to_hf(self, state_dict: Mapping[str, torch.Tensor], shown: str = "") -> StateDict:
        return translate(state_dict, to_smp=False, what=f"{self.model} to Hugging Face", top=self.top,
                         layer=self.layer, hf_layer=self.hf_layer, smp_layer=self.smp_layer, shown=shown)

    def lm_to_smp(self, state_dict: Mapping[str, torch.Tensor], shown: str = "") -> StateDict:
        body, rest = sub_dict(state_dict, "transformer.")
        if self.head:
            head = translate(rest, to_smp=True, what=f"{self.model} to smp", top=self.head, shown=shown)
        else:
            _drop_tied(rest, body, self.model, shown)
            if rest:
                raise SMPValidationError(f"{self.model} to smp: unexpected key{'s' if len(rest) > 1 else ''} "
                                         f"{', '.join(repr(shown + k) for k in sorted(rest))}")
            head = {}
        return {**self.body_to_smp(body, shown + "transformer."), **head}

    def lm_to_hf(self, state_dict: Mapping[str, torch.Tensor], shown: str = "") -> StateDict:
        head_keys = {s for r in self.head for s in r.smp}
        head = {k: v for k, v in state_dict.items() if k in head_keys}
        body = {k: v for k, v in state_dict.items() if k not in head_keys}
        out = with_prefix(self.body_to_hf(body, shown), "transformer.")
        if self.head:
            out.update(translate(head, to_smp=False, what=f"{self.model} to Hugging Face", top=self.head,
                                 shown=shown))
        else:
            out["lm_head.weight"] = out["transformer.wte.weight"]
        return out

    def whole_to_smp(self, state_dict: Mapping[str, Any]) -> Dict[str, Any]:
        """A whole model's state dict: each causal LM found (``<p>transformer.wte.weight`` with
        ``<p>lm_head.weight``) is translated at its prefix, else each body (``<p>wte.weight``);
        other keys pass through."""
        out = dict(state_dict)
        for p in prefixes_of(state_dict, "wte.weight"):
            root = p[:-len("transformer.")] if p.endswith("transformer.") else None
            if root is not None and root + "lm_head.weight" in out:
                inner, out = sub_dict(out, root)
                mine = {k: v for k, v in inner.items() if k.startswith(("transformer.", "lm_head."))}
                out.update(with_prefix({k: v for k, v in inner.items() if k not in mine}, root))
                out.update(with_prefix(self.lm_to_smp(mine, root), root))
            else:
                inner, out = sub_dict(out, p)
                out.update(with_prefix(self.body_to_smp(inner, p), p))
        return out

    def whole_to_hf(self, state_dict: Mapping[str, Any], lm_head: bool = True) -> Dict[str, Any]:
        """The inverse of `whole_to_smp`: each distributed module found (``<p>word_embedding.weight``)
        becomes a causal LM's keys at its prefix (a body's with ``lm_head=False``)."""
        out = dict(state_dict)
        head_keys = tuple(s for r in self.head for s in r.smp)
        for p in prefixes_of(state_dict, "word_embedding.weight"):
            inner, out = sub_dict(out, p)
            mine = {k: v for k, v in inner.items()
                    if k.startswith(("word_embedding.", "position_embedding.", "transformer.")) or k in head_keys}
            out.update(with_prefix({k: v for k, v in inner.items() if k not in mine}, p))
            out.update(with_prefix(self.lm_to_hf(mine, p) if lm_head else self.body_to_hf(mine, p), p))
        return out


def _drop_tied(rest: Dict[str, torch.Tensor], body: Mapping[str, torch.Tensor], model: str, shown: str) -> None:
    """Drops the causal LM's ``lm_head.weight``, which must be the body's ``wte.weight``."""
    head, wte = f"'{shown}lm_head.weight'", f"'{shown}transformer.wte.weight'"
    if "lm_head.weight" not in rest:
        raise SMPValidationError(f"{model} to smp: the state dict has no {head}")
    if "wte.weight" not in body:
        raise SMPValidationError(f"{model} to smp: the state dict has no {wte}")
    if not torch.equal(rest.pop("lm_head.weight"), body["wte.weight"]):
        raise SMPUnsupportedError(f"{model} to smp: {head} differs from {wte}; the distributed LM head is tied to "
                                  f"the word embedding, so an untied head cannot be translated")


def lm_output(output_class: type) -> Callable[[Any], Any]:
    """The return hook of a causal LM: DistributedTransformerLMHead's (loss, logits) as
    `output_class` (loss None without labels)."""
    def return_hook(output):
        loss, logits = output
        return output_class(loss=loss, logits=logits)
    return return_hook


def body_output(output_class: type) -> Callable[[Any], Any]:
    """The return hook of a model body: the hidden states [N, S, H] as `output_class`'s
    ``last_hidden_state`` (a DistributedTransformer's (hidden_states, mask) too)."""
    def return_hook(output):
        hidden = output[0] if isinstance(output, tuple) else output
        return output_class(last_hidden_state=hidden)
    return return_hook


def mapping(hf_class: type, dist_class_name: str, init_hook, forward_hook, return_hook, to_smp, to_hf) -> TPMapping:
    return TPMapping(hf_class.__name__, dist_class_name, init_hook, forward_hook, return_hook, to_smp, to_hf,
                     hf_class=hf_class)
