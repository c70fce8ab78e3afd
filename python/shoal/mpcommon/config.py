"""The model-parallel configuration: parsing, defaults and validation.

Sources, first found wins: the dict passed to ``smp.init(config)``, JSON in
``SHOAL_MP_CONFIG``, JSON in SageMaker's ``SM_HP_MP_PARAMETERS``, else the
defaults (one partition). Keys follow the SageMaker model-parallel library (v1).
Every key of the SageMaker library is known and checked: unknown keys and
wrong types are errors; keys of features that shoal does not implement are
rejected by name unless they carry their "off" value (e.g.
``offload_activations: false``); keys that only tune such a feature
(``activation_loading_horizon``, ``ddp_dist_backend``) and a few
switches with no meaning here (``deterministic_server``, ``static_mode``,
``fast_mode``) are accepted, checked and kept in the Config.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Mapping, Optional

from .errors import SMPConfigError, SMPUnsupportedError

PIPELINES = ("simple", "interleaved")
OPTIMIZE = ("speed", "memory")


@dataclasses.dataclass(frozen=True)
class Config:
    """Every key of the SageMaker library (v1), resolved (``smp.state.cfg``)."""
    partitions: int = 1
    microbatches: int = 1
    pipeline: str = "interleaved"
    active_microbatches: int = 0          # 0 until resolved: partitions + 2
    auto_partition: bool = True
    default_partition: int = 0
    memory_weight: float = -1.0           # < 0 until resolved from `optimize`
    optimize: str = "memory"
    placement_strategy: str = "cluster"
    ddp: bool = False
    horovod: bool = False                 # TensorFlow: data parallelism through the Horovod-style API
    fp16: bool = False                    # half-precision parameters and activations (fp32 master weights)
    bf16: bool = False
    fp16_params: bool = False             # the older name of fp16 (v1.6-1.9)
    delayed_parameter_initialization: bool = False
    tensor_parallel_degree: int = 1
    sharded_data_parallel_degree: int = 1
    shard_optimizer_state: bool = False
    prescaled_batch: bool = False
    offload_activations: bool = False
    skip_tracing: bool = False
    activation_loading_horizon: int = 4
    ddp_dist_backend: str = "auto"
    sdp_reduce_bucket_size: int = int(5e8)
    sdp_param_persistence_threshold: int = int(1e6)
    sdp_max_live_parameters: int = int(1e9)
    sdp_hierarchical_allgather: bool = True
    sdp_gradient_clipping: float = 1.0
    deterministic_server: bool = False
    static_mode: bool = False
    fast_mode: bool = False
    predefined_hooks: bool = True
    contiguous: bool = True
    xla: bool = False
    source: str = "defaults"              # where the config came from (for messages)

    @property
    def pipeline_parallel_degree(self) -> int:
        return self.partitions

    @property
    def half_dtype(self) -> Optional[str]:
        """'float16', 'bfloat16' or None: the dtype of the model's parameters and activations."""
        if self.fp16 or self.fp16_params:
            return "float16"
        return "bfloat16" if self.bf16 else None


# Keys of features shoal does not implement, with the value that means "off" (accepted) and the feature.
_UNSUPPORTED = {
    "offload_activations": (False, "activation offloading"),
    "skip_tracing": (False, "skipping the tracing step"),
    "contiguous": (True, "non-contiguous TensorFlow partitions"),
    "predefined_hooks": (True, "turning off the predefined Hugging Face hooks"),
    "horovod": (False, "Horovod (a TensorFlow option)"),
}
# Keys that only tune a feature (the key named): accepted, checked, and meaningful once it is on.
_TUNING = {
    "activation_loading_horizon": ("offload_activations", "int"),
    "sdp_reduce_bucket_size": ("sharded_data_parallel_degree", "int"),  # (see sharded_dp.py)
    "sdp_param_persistence_threshold": ("sharded_data_parallel_degree", "int"),
    "sdp_max_live_parameters": ("sharded_data_parallel_degree", "int"),
    "sdp_hierarchical_allgather": ("sharded_data_parallel_degree", "bool"),
    "sdp_gradient_clipping": ("sharded_data_parallel_degree", "float"),
    "ddp_dist_backend": ("ddp", ("auto", "nccl")),
}
# Accepted and meaningless here (documented in docs/modelparallel.md): the SageMaker server's
# determinism, and two undocumented switches of SMP's own tracer that the GPT-2 example sets.
_NOOP = {"deterministic_server": bool, "static_mode": bool, "fast_mode": bool}

_KNOWN = ("partitions", "pipeline_parallel_degree", "microbatches", "pipeline",
          "active_microbatches", "auto_partition", "default_partition", "memory_weight",
          "optimize", "placement_strategy", "ddp", "fp16", "bf16", "fp16_params",
          "delayed_parameter_initialization", "tensor_parallel_degree", "sharded_data_parallel_degree",
          "shard_optimizer_state", "prescaled_batch")
# Keys of "off"-only features, of tuning knobs and no-ops, which the TensorFlow face also accepts.
_EVERY = _KNOWN + tuple(_UNSUPPORTED) + tuple(_TUNING) + tuple(_NOOP) + ("horovod", "xla")


def _type_name(v: Any) -> str:
    return type(v).__name__


def _int(key: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SMPConfigError(f"smp config: '{key}' must be an integer, got {v!r} ({_type_name(v)})")
    if v < lo:
        raise SMPConfigError(f"smp config: '{key}' must be >= {lo}, got {v}")
    return v


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise SMPConfigError(f"smp config: '{key}' must be true or false, got {v!r} ({_type_name(v)})")
    return v


def _choice(key: str, v: Any, choices) -> str:
    if v not in choices:
        raise SMPConfigError(f"smp config: '{key}' must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def placement_order(strategy: str) -> str:
    """The placement as a permutation of 'D', 'P' and 'T' ('cluster' = 'DPT', 'spread' = 'TPD').

    As in SageMaker, the right-most letter varies fastest over consecutive
    ranks. A permutation of 'D' and 'P' alone places 'T' right-most.
    """
    if strategy == "cluster":
        return "DPT"
    if strategy == "spread":
        return "TPD"
    if isinstance(strategy, str) and sorted(strategy) == ["D", "P", "T"]:
        return strategy
    if isinstance(strategy, str) and sorted(strategy) == ["D", "P"]:
        return strategy + "T"
    raise SMPConfigError(
        f"smp config: 'placement_strategy' must be 'cluster', 'spread' or a permutation of "
        f"'DPT' (or of 'DP'), got {strategy!r}")


# Keys only the TensorFlow front end takes (framework="tensorflow").
_TENSORFLOW = {"horovod": bool}
_TENSORFLOW_OFF = {"xla": (False, "XLA compilation of the pipeline")}


def parse(config: Optional[Mapping[str, Any]] = None, *, environ: Optional[Mapping[str, str]] = None,
          world_size: Optional[int] = None, framework: str = "torch") -> Config:
    """Builds a validated Config (see the module docstring for the sources).
    `framework` ("torch" or "tensorflow") selects the keys only one front end
    has: TensorFlow takes ``horovod`` (and ``xla: false``)."""
    tf_keys = framework == "tensorflow"
    env = os.environ if environ is None else environ
    source = "smp.init(config)"
    if config is None:
        for var in ("SHOAL_MP_CONFIG", "SM_HP_MP_PARAMETERS"):
            text = env.get(var)
            if text:
                try:
                    config = json.loads(text)
                except json.JSONDecodeError as e:
                    raise SMPConfigError(f"smp config: {var} is not valid JSON ({e}): {text[:200]!r}") from None
                source = var
                break
        else:
            config, source = {}, "defaults"
    if not isinstance(config, Mapping):
        raise SMPConfigError(f"smp config ({source}): must be a dict of parameters, got {_type_name(config)}")

    cfg: dict = {}
    for key, v in config.items():
        if not isinstance(key, str):
            raise SMPConfigError(f"smp config ({source}): keys must be strings, got {key!r}")
        if tf_keys and key in _TENSORFLOW:
            cfg[key] = _bool(key, v)
            continue
        unsupported = {**_UNSUPPORTED, **_TENSORFLOW_OFF} if tf_keys else _UNSUPPORTED
        if key in unsupported:
            off, what = unsupported[key]
            if v != off or type(v) is not type(off):
                raise SMPUnsupportedError(
                    f"smp config ({source}): '{key}': {v!r} is not supported by shoal: {what} is not "
                    f"implemented (only {json.dumps(off)} is accepted); see docs/modelparallel.md")
            cfg[key] = v
            continue
        if key in _TUNING:
            cfg[key] = _tuning(key, v, _TUNING[key][1], source)
            continue
        if key in _NOOP:
            cfg[key] = _bool(key, v)
            continue
        if key not in _KNOWN:
            near = difflib.get_close_matches(key, list(_EVERY), n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise SMPConfigError(
                f"smp config ({source}): unknown key '{key}'{hint}; known keys: {', '.join(_KNOWN)}")
        cfg[key] = v

    if "partitions" in cfg and "pipeline_parallel_degree" in cfg and \
            cfg["partitions"] != cfg["pipeline_parallel_degree"]:
        raise SMPConfigError(
            f"smp config ({source}): 'partitions' ({cfg['partitions']!r}) and its alias "
            f"'pipeline_parallel_degree' ({cfg['pipeline_parallel_degree']!r}) disagree")
    p = _int("partitions", cfg.get("partitions", cfg.get("pipeline_parallel_degree", 1)))
    m = _int("microbatches", cfg.get("microbatches", 1))
    pipeline = _choice("pipeline", cfg.get("pipeline", "interleaved"), PIPELINES)
    active = _int("active_microbatches", cfg.get("active_microbatches", p + 2))
    auto = _bool("auto_partition", cfg.get("auto_partition", True))
    default_partition = _int("default_partition", cfg.get("default_partition", 0), lo=0)
    if default_partition >= p:
        raise SMPConfigError(
            f"smp config ({source}): 'default_partition' is {default_partition} but there are only "
            f"{p} partitions (0..{p - 1})")
    optimize = _choice("optimize", cfg.get("optimize", "memory"), OPTIMIZE)
    mw = cfg.get("memory_weight", 0.2 if optimize == "speed" else 0.8)
    if isinstance(mw, bool) or not isinstance(mw, (int, float)) or not 0.0 <= float(mw) <= 1.0:
        raise SMPConfigError(f"smp config ({source}): 'memory_weight' must be a number in [0, 1], got {mw!r}")
    placement = cfg.get("placement_strategy", "cluster")
    if not isinstance(placement, str):
        raise SMPConfigError(f"smp config ({source}): 'placement_strategy' must be a string, got {placement!r}")
    placement_order(placement)
    ddp = _bool("ddp", cfg.get("ddp", False))
    horovod = cfg.get("horovod", False)
    fp16 = _bool("fp16", cfg.get("fp16", False))
    fp16_params = _bool("fp16_params", cfg.get("fp16_params", False))
    delayed = _bool("delayed_parameter_initialization", cfg.get("delayed_parameter_initialization", False))
    bf16 = _bool("bf16", cfg.get("bf16", False))
    if bf16 and (fp16 or fp16_params):
        raise SMPConfigError(f"smp config ({source}): 'fp16' and 'bf16' are both true; choose one half-precision "
                             f"type")
    tp = _int("tensor_parallel_degree", cfg.get("tensor_parallel_degree", 1))
    sdp = _int("sharded_data_parallel_degree", cfg.get("sharded_data_parallel_degree", 1))
    shard_opt = _bool("shard_optimizer_state", cfg.get("shard_optimizer_state", False))
    prescaled = _bool("prescaled_batch", cfg.get("prescaled_batch", False))
    if tf_keys and (tp > 1 or sdp > 1 or shard_opt or prescaled):
        raise SMPUnsupportedError(
            f"smp config ({source}): tensor parallelism, sharded data parallelism and optimizer-state sharding "
            f"are features of the PyTorch front end; the TensorFlow front end takes only "
            f"'tensor_parallel_degree': 1, 'sharded_data_parallel_degree': 1 and the sharding switches off")
    if tp > 1 and not ddp:
        raise SMPConfigError(f"smp config ({source}): 'tensor_parallel_degree' is {tp}, which needs 'ddp': true "
                             f"(as in SageMaker: tensor-parallel ranks are data-parallel ranks of the pipeline)")
    if sdp > 1 and p > 1:
        raise SMPConfigError(
            f"smp config ({source}): 'sharded_data_parallel_degree' ({sdp}) cannot be combined with pipeline "
            f"parallelism ('pipeline_parallel_degree' is {p}): use one partition, or shard_optimizer_state")
    if tf_keys and (fp16 or fp16_params or bf16):
        raise SMPUnsupportedError(f"smp config ({source}): 'fp16'/'bf16': the TensorFlow front end takes its "
                                  f"precision from Keras (tf.keras.mixed_precision), not from smp")

    if world_size is not None:
        if world_size % p:
            raise SMPConfigError(
                f"smp config ({source}): 'partitions' is {p}, which does not divide the world size "
                f"{world_size} (the data-parallel degree is world size / partitions)")
        if world_size % (p * tp):
            raise SMPConfigError(
                f"smp config ({source}): 'pipeline_parallel_degree' {p} x 'tensor_parallel_degree' {tp} = {p * tp} "
                f"does not divide the world size {world_size}")
        rdp = world_size // (p * tp)
        if rdp % sdp:
            raise SMPConfigError(
                f"smp config ({source}): 'sharded_data_parallel_degree' is {sdp}, which does not divide the "
                f"reduced data-parallel degree {rdp} (world size {world_size} / pipeline {p} / tensor {tp})")
        if world_size // p > 1 and not (ddp or horovod):
            need = "'ddp': true or 'horovod': true" if tf_keys else "'ddp': true"
            raise SMPConfigError(
                f"smp config ({source}): {world_size} ranks and {p} partitions make "
                f"{world_size // p} model replicas, which needs {need} (hybrid model and data "
                f"parallelism); or set 'partitions' to {world_size}")
    rest = {k: cfg[k] for k in list(_UNSUPPORTED) + list(_TUNING) + list(_NOOP) + ["xla"] if k in cfg and k != "horovod"}
    return Config(partitions=p, microbatches=m, pipeline=pipeline, active_microbatches=active,
                  auto_partition=auto, default_partition=default_partition, memory_weight=float(mw),
                  optimize=optimize, placement_strategy=placement, ddp=ddp, horovod=horovod, fp16=fp16,
                  fp16_params=fp16_params, bf16=bf16, delayed_parameter_initialization=delayed, source=source,
                  tensor_parallel_degree=tp, sharded_data_parallel_degree=sdp, shard_optimizer_state=shard_opt,
                  prescaled_batch=prescaled,
                  **rest)


def _tuning(key: str, v: Any, kind, source: str) -> Any:
    if kind == "int":
        return _int(key, v, lo=0)
    if kind == "bool":
        return _bool(key, v)
    if kind == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SMPConfigError(f"smp config ({source}): '{key}' must be a number, got {v!r}")
        return float(v)
    return _choice(key, v, kind)
