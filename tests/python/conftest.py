import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    """Runs only the selected tests of PyTorch's suite (test_torch_suite.py's SELECTION, by class),
    and skips, before their ranks start, those whose ranks would skip on this host
    (test_torch_suite.py's skip_before_ranks)."""
    keep, drop = [], []
    for item in items:
        selected = getattr(item.module, "SELECTION", {}).get(item.cls.__name__) if item.cls is not None else None
        if selected is not None and item.name not in selected:
            drop.append(item)
            continue
        keep.append(item)
        skip_before_ranks = getattr(item.module, "skip_before_ranks", None)
        if skip_before_ranks is not None and item.cls is not None:
            reason = skip_before_ranks(item.cls, item.name)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"{reason} (in every rank: skipped before starting them)"))
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
