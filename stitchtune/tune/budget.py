"""One trial budget split over several searches (the buckets of ``search --dynamic``, the regions of
``tune``): :func:`split_by_share`.

Contract: ``split_by_share(shares, total)`` returns one non-negative integer per share whose sum is
exactly ``total`` (for ``total >= 0``; nothing for no shares):

* each gets ``floor(share / sum(shares) x total)``, and the trials left over go one each to the largest
  remainders (ties: the earlier one), the largest-remainder rule;
* when ``total >= len(shares)``, each one left with 0 then gets 1 trial, taken from the one holding the
  most (ties: the earlier one): every search runs at least its trial 0, the heuristic schedule;
* when ``total < len(shares)``, the smallest shares keep 0 (the caller records them as skipped).

Shares are weights (any non-negative finite numbers; all zero: equal weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["split_by_share"]


def split_by_share(shares: Sequence[float], total: int) -> list[int]:
    """Trials per share, summing to exactly ``total`` (module docstring)."""
    n = len(shares)
    if n == 0 or total <= 0:
        return [0] * n
    if any(not math.isfinite(s) or s < 0 for s in shares):
        raise ValueError(f"shares must be finite and >= 0: {list(shares)}")
    weight = sum(shares)
    exact = [(s / weight if weight > 0 else 1 / n) * total for s in shares]
    got = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - got[i]), i))
    for i in order[: total - sum(got)]:
        got[i] += 1
    if total >= n:
        for i in [i for i, k in enumerate(got) if k == 0]:
            got[max(range(n), key=lambda j: (got[j], -j))] -= 1
            got[i] = 1
    return got
