"""The options of the transformer modules (attention, output layer, layer, transformer, LM head).

SageMaker's modules take the same keyword arguments all the way down (the
LM head hands its own to the transformer, which hands them to each layer,
which hands them to its attention and output layers): :class:`Options` holds
them. Beside SMP's documented arguments it has the extensions the Hugging
Face families need; their defaults keep SMP's reference behaviour:

===========================  =========  ==================================================
extension                    default    meaning
===========================  =========  ==================================================
``activation``               "gelu"     also "gelu_new" (tanh approximation), "relu"
``use_qkv_bias``             True       biases of query/key/value (GPT-Neo, GPT-J: False)
``use_dense_bias``           True       bias of the attention output (GPT-J: False)
``scale_attention_scores``   True       divide scores by sqrt(head size) (GPT-Neo: False)
``rotary_dim``               None       GPT-J rotary embedding on the first dims of a head
``rotary_style``             "gptj"     interleaved pairs (the only style)
``parallel_attn_output``     False      GPT-J block: x + attn(ln(x)) + mlp(ln(x))
``window_size``              None       GPT-Neo local attention window
``attention_layers``         None       "global"/"local" (a layer), a list (transformer)
``fp32_residual_addition``   False      residual adds in float32 (SMP's output layer arg)
===========================  =========  ==================================================

SMP's tuning switches ``fused_softmax``, ``fused_bias_gelu``,
``fused_dropout``, ``attention_in_fp32`` and ``query_key_layer_scaling`` are
accepted and change nothing: attention scores and softmax are always computed
in float32, which is what they ask for numerically.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

ACTIVATIONS = ("gelu", "gelu_new", "relu")


@dataclass
class Options:
    num_attention_heads: int = 32
    attention_head_size: int = 32
    hidden_size: int = 1024
    intermediate_size: int = 4096
    attention_dropout_prob: float = 0.1
    hidden_dropout_prob: float = 0.1
    activation: str = "gelu"
    layernorm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    use_normal_initialization: bool = False
    causal_mask_size: Optional[int] = None
    add_cross_attention: bool = False
    pre_layernorm: bool = False
    post_layernorm: bool = True
    fp32_residual_addition: bool = False
    use_qkv_bias: bool = True
    use_dense_bias: bool = True
    scale_attention_scores: bool = True
    rotary_dim: Optional[int] = None
    rotary_style: str = "gptj"
    parallel_attn_output: bool = False
    window_size: Optional[int] = None
    attention_layers: Union[None, str, List[str]] = None
    fused_softmax: bool = True
    fused_bias_gelu: bool = False
    fused_dropout: bool = False
    attention_in_fp32: bool = False
    query_key_layer_scaling: bool = False

    @property
    def init_std(self) -> Optional[float]:
        """The normal initialisation's std, or None for torch's default initialisation."""
        return self.initializer_range if self.use_normal_initialization else None

    def kwargs(self, **changes: Any) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(changes)
        return d


FIELDS = frozenset(f.name for f in dataclasses.fields(Options))


def make(owner: str, documented: Dict[str, Any], extensions: Dict[str, Any]) -> Options:
    """Options from a constructor's documented arguments and its extension keywords; an unknown
    keyword is a TypeError naming the class, as Python's own."""
    unknown = sorted(k for k in extensions if k not in FIELDS)
    if unknown:
        raise TypeError(f"smp.nn.{owner}.__init__() got unexpected keyword argument(s) {', '.join(unknown)}")
    return Options(**{k: v for k, v in documented.items() if k in FIELDS}, **extensions)


def check_attention(module, o: Options) -> None:
    """The checks of everything that holds attention heads (raises module._error)."""
    if o.num_attention_heads <= 0 or o.attention_head_size <= 0:
        raise module._error(f"num_attention_heads {o.num_attention_heads} and attention_head_size "
                            f"{o.attention_head_size} must be positive")
    module._check_divisible("num_attention_heads", o.num_attention_heads)
    if o.hidden_size != o.num_attention_heads * o.attention_head_size:
        raise module._error(f"hidden_size {o.hidden_size} is not num_attention_heads {o.num_attention_heads} x "
                            f"attention_head_size {o.attention_head_size}")
    _check_layernorms(module, o)
    if o.rotary_dim is not None:
        if o.rotary_style != "gptj":
            raise module._error(f"rotary_style {o.rotary_style!r} is not one of ('gptj',)")
        if not 0 < o.rotary_dim <= o.attention_head_size or o.rotary_dim % 2:
            raise module._error(f"rotary_dim {o.rotary_dim} must be even and in 1..attention_head_size "
                                f"{o.attention_head_size}")
    if o.parallel_attn_output and (not o.pre_layernorm or o.post_layernorm or o.add_cross_attention):
        raise module._error("parallel_attn_output needs pre_layernorm=True, post_layernorm=False and no "
                            "cross attention")
    types = o.attention_layers if isinstance(o.attention_layers, list) else [o.attention_layers]
    for t in types:
        if t not in (None, "global", "local"):
            raise module._error(f"attention_layers entry {t!r} is not 'global' or 'local'")
        if t == "local" and (o.window_size is None or o.window_size <= 0 or o.causal_mask_size is None):
            raise module._error(f"local attention needs a positive window_size (got {o.window_size}) and a "
                                f"causal_mask_size (got {o.causal_mask_size})")


def check_output(module, o: Options) -> None:
    """The checks of everything that holds an output (MLP) layer."""
    if o.intermediate_size <= 0:
        raise module._error(f"intermediate_size {o.intermediate_size} must be positive")
    module._check_divisible("intermediate_size", o.intermediate_size)
    if o.activation not in ACTIVATIONS:
        raise module._error(f"activation {o.activation!r} is not one of {ACTIVATIONS}")
    _check_layernorms(module, o)


def _check_layernorms(module, o: Options) -> None:
    if not (o.pre_layernorm or o.post_layernorm):
        raise module._error("at least one of pre_layernorm and post_layernorm must be True")
