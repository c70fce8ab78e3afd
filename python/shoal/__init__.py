"""shoal: collective communication for distributed training.

``import shoal.torch`` registers the ``shoal`` backend with torch.distributed
(``dist.init_process_group(backend="shoal")``); see docs/torch.md.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
