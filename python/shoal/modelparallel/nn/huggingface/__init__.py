"""``smp.nn.huggingface.<model>``: SageMaker's state-dict translations for Hugging Face models.

SageMaker's library renames a Hugging Face model's parameters when it swaps
its transformer layers for tensor-parallel ones (``transformer.seq_layers...``),
and these functions translate checkpoints between the two namings. shoal
keeps the model's own modules and names (no tensor parallelism), so a state
dict in Hugging Face's naming is already the one the model loads: both
directions return it unchanged. A state dict in SageMaker's distributed
naming cannot be loaded by shoal, and is refused by name.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ....mpcommon.errors import SMPUnsupportedError

# key fragments of SageMaker's distributed transformer modules
_DISTRIBUTED = (".seq_layers.", "distributed_embedding", "DistributedTransformer")


def same_naming(state_dict: Dict[str, Any], what: str, max_seq_len: Optional[int] = None) -> Dict[str, Any]:
    for k in state_dict:
        if any(f in k for f in _DISTRIBUTED):
            raise SMPUnsupportedError(f"smp.nn.huggingface {what}: '{k}' is a key of SageMaker's tensor-parallel "
                                      f"modules, which shoal does not implement; save the model with shoal (its "
                                      f"keys are the Hugging Face model's)")
    return state_dict
