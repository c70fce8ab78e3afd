import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    """Runs only the selected tests of PyTorch's suite (test_torch_suite.py's SELECTION, by class)."""
    keep, drop = [], []
    for item in items:
        selected = getattr(item.module, "SELECTION", {}).get(item.cls.__name__) if item.cls is not None else None
        if selected is not None and item.name not in selected:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
