"""Cutting a sequence of costed items into contiguous stages."""

from __future__ import annotations

from typing import Collection, List, Optional, Sequence


def split_contiguous(costs: Sequence[float], parts: int, allowed: Optional[Collection[int]] = None) -> List[int]:
    """The stage of each item: `parts` contiguous non-empty groups minimising the
    largest group sum (ties broken towards earlier cuts). `allowed`: the
    positions where a group may start (a cut before item i), if not all."""
    n = len(costs)
    if n < parts:
        raise ValueError(f"{n} items cannot fill {parts} groups")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    ok = (lambda j: True) if allowed is None else (lambda j: j == 0 or j in allowed)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                if not ok(j) or best[k - 1][j] == inf:
                    continue
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i] - 1e-15:
                    best[k][i], cut[k][i] = v, j
    if best[parts][n] == inf:
        raise ValueError(f"{n} items cannot be cut into {parts} groups at the allowed positions "
                         f"{sorted(allowed or [])}")
    stage = [0] * n
    i = n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        for x in range(j, i):
            stage[x] = k - 1
        i = j
    return stage
