"""The model-parallel configuration: parsing, defaults and validation.

Sources, first found wins: the dict passed to ``smp.init(config)``, JSON in
``SHOAL_MP_CONFIG``, JSON in SageMaker's ``SM_HP_MP_PARAMETERS``, else the
defaults (one partition). Keys follow the SageMaker model-parallel library (v1).
Every key is checked: unknown keys and wrong types are errors, and keys of the
SageMaker library that shoal does not implement are rejected by name unless
they carry their "off" value (e.g. ``tensor_parallel_degree: 1``).
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
    source: str = "defaults"              # where the config came from (for messages)

    @property
    def pipeline_parallel_degree(self) -> int:
        return self.partitions


# Keys of the SageMaker library that shoal does not implement, with the value
# that means "off" (accepted) and why the feature is missing.
_UNSUPPORTED = {
    "tensor_parallel_degree": (1, "tensor parallelism"),
    "sharded_data_parallel_degree": (1, "sharded data parallelism"),
    "fp16": (False, "the FP16 training wrapper (use torch.autocast and smp.amp.GradScaler)"),
    "bf16": (False, "the BF16 training wrapper (use torch.autocast)"),
    "fp16_params": (False, "FP16 parameter initialisation"),
    "shard_optimizer_state": (False, "optimizer state sharding"),
    "prescaled_batch": (False, "prescaled batches (a tensor-parallel feature)"),
    "offload_activations": (False, "activation offloading"),
    "delayed_parameter_initialization": (False, "delayed parameter initialisation"),
    "skip_tracing": (False, "skipping the tracing step"),
    "horovod": (False, "Horovod (a TensorFlow option)"),
    "contiguous": (True, "non-contiguous TensorFlow partitions"),
    "predefined_hooks": (True, "predefined Hugging Face hooks"),
}
# Keys that only tune features above; accepted only together with them.
_UNSUPPORTED_TUNING = {
    "activation_loading_horizon": "offload_activations",
    "sdp_reduce_bucket_size": "sharded_data_parallel_degree",
    "sdp_param_persistence_threshold": "sharded_data_parallel_degree",
    "sdp_max_live_parameters": "sharded_data_parallel_degree",
    "sdp_hierarchical_allgather": "sharded_data_parallel_degree",
    "sdp_gradient_clipping": "sharded_data_parallel_degree",
}
# Accepted and meaningless here (documented in docs/modelparallel.md).
_NOOP = {"deterministic_server": bool}

_KNOWN = ("partitions", "pipeline_parallel_degree", "microbatches", "pipeline",
          "active_microbatches", "auto_partition", "default_partition", "memory_weight",
          "optimize", "placement_strategy", "ddp")


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
    """The placement as a permutation of 'D' and 'P' ('cluster' = 'DP', 'spread' = 'PD').

    As in SageMaker, the right-most letter varies fastest over consecutive
    ranks. A 'T' (tensor parallelism, degree 1 here) may appear and is dropped.
    """
    if strategy == "cluster":
        return "DP"
    if strategy == "spread":
        return "PD"
    if sorted(strategy) in (["D", "P"], ["D", "P", "T"]):
        return strategy.replace("T", "")
    raise SMPConfigError(
        f"smp config: 'placement_strategy' must be 'cluster', 'spread' or a permutation of "
        f"'DP' or 'DPT', got {strategy!r}")


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
            continue
        if key in _UNSUPPORTED_TUNING:
            raise SMPUnsupportedError(
                f"smp config ({source}): '{key}' tunes '{_UNSUPPORTED_TUNING[key]}', which shoal does not "
                f"implement; remove it (see docs/modelparallel.md)")
        if key in _NOOP:
            _bool(key, v)
            continue
        if key not in _KNOWN:
            near = difflib.get_close_matches(key, list(_KNOWN) + list(_UNSUPPORTED), n=1)
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

    if world_size is not None:
        if world_size % p:
            raise SMPConfigError(
                f"smp config ({source}): 'partitions' is {p}, which does not divide the world size "
                f"{world_size} (the data-parallel degree is world size / partitions)")
        if world_size // p > 1 and not (ddp or horovod):
            need = "'ddp': true or 'horovod': true" if tf_keys else "'ddp': true"
            raise SMPConfigError(
                f"smp config ({source}): {world_size} ranks and {p} partitions make "
                f"{world_size // p} model replicas, which needs {need} (hybrid model and data "
                f"parallelism); or set 'partitions' to {world_size}")
    return Config(partitions=p, microbatches=m, pipeline=pipeline, active_microbatches=active,
                  auto_partition=auto, default_partition=default_partition, memory_weight=float(mw),
                  optimize=optimize, placement_strategy=placement, ddp=ddp, horovod=horovod, source=source)
