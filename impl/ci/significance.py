"""When the timer stage calls HEAD slower: beyond the factor, and the two sample sets differ.

The rule is asv's own (`asv continuous` / `asv compare`), written out here so that the gate
depends on no private asv function:

- **Factor.** HEAD is slower when base < HEAD / factor (asv's median of each commit's samples).
- **Statistics.** When both results carry asv's statistics (a `stats` dict each, neither from a
  single repeat), the slowdown also needs the sample sets to differ (`differ`):
  - with raw samples of both commits, and enough of them for the test to be able to reach the
    threshold (the smallest p-value possible, 1 / C(m + n, min(m, n)), below P_THRESHOLD), a
    two-sided Mann-Whitney U test at P_THRESHOLD (0.002): exact for samples of at most 20,
    else its normal approximation; ties are broken conservatively (the tie split that gives
    the least significant U);
  - otherwise the two 99% confidence intervals (`ci_99_a`, `ci_99_b`) must not overlap.
- A result without statistics (a `track_` figure: one value) is judged by the factor alone.

The end-to-end stage's rounds are paired (both commits run in the same seconds), so its rule
(`impl.ci.e2e_verdict`) asks a paired test instead: `signed_rank_p`, the one-sided exact
Wilcoxon signed-rank test of the per-round differences (ties share their mean rank).

`tests/ci/test_significance.py` checks these verdicts case by case and against asv's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

P_THRESHOLD = 0.002
#: samples of at most this size get the exact distribution of U, larger ones the normal one
EXACT_UP_TO = 20


def u_statistic(x: Sequence[float], y: Sequence[float]) -> tuple[int, int]:
    """(pairs with x > y, tied pairs) over every pair of one value of x and one of y."""
    greater = ties = 0
    for a in x:
        for b in y:
            if a > b:
                greater += 1
            elif a == b:
                ties += 1
    return greater, ties


@cache
def _orderings(m: int, n: int) -> tuple[int, ...]:
    """For each u, how many of the C(m + n, m) orderings of two samples of sizes m and n give
    U = u (r(m, n, u) = r(m, n - 1, u) + r(m - 1, n, u - n))."""
    if m == 0 or n == 0:
        return (1,)
    fewer_y, fewer_x = _orderings(m, n - 1), _orderings(m - 1, n)
    return tuple(
        (fewer_y[u] if u < len(fewer_y) else 0)
        + (fewer_x[u - n] if 0 <= u - n < len(fewer_x) else 0)
        for u in range(m * n + 1)
    )


def _cdf(m: int, n: int, u: int) -> float:
    """P(U <= u) under the null hypothesis, for samples of sizes m and n."""
    total = math.comb(m + n, m)
    counts = _orderings(m, n)
    return sum(counts[k] / total if k < len(counts) else 0.0 for k in range(u + 1))


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float:
    """The two-sided p-value of the Mann-Whitney U test of x against y (ties: conservative)."""
    m, n = len(x), len(y)
    u, ties = u_statistic(x, y)
    half = m * n // 2
    if u <= half and u + ties >= half:
        ties = half - u
    low, high = min(u, m * n - u), min(u + ties, m * n - (u + ties))
    extreme = low if low >= high else high  # the tie split farthest from significance
    if max(m, n) <= EXACT_UP_TO:
        return _cdf(m, n, extreme) + (1.0 - _cdf(m, n, max(half, m * n - extreme - 1)))
    z = (extreme - m * n / 2) / math.sqrt(m * n * (m + n + 1) / 12)
    return 2 * (0.5 * math.erfc(-z / math.sqrt(2)))


def differ(
    samples_a: Sequence[float] | None,
    samples_b: Sequence[float] | None,
    stats_a: dict[str, Any],
    stats_b: dict[str, Any],
) -> bool:
    """Whether two results' samples differ significantly (see the module docstring); False
    means they might or might not."""
    if samples_a is not None and samples_b is not None:
        a = [x for x in samples_a if not math.isnan(x)]
        b = [x for x in samples_b if not math.isnan(x)]
        if 1 / math.comb(len(a) + len(b), min(len(a), len(b))) < P_THRESHOLD:
            return mann_whitney_p(a, b) < P_THRESHOLD
    ci_a = (stats_a["ci_99_a"], stats_a["ci_99_b"])
    ci_b = (stats_b["ci_99_a"], stats_b["ci_99_b"])
    return not (ci_a[1] >= ci_b[0] and ci_a[0] <= ci_b[1])


def _has_statistics(stats: dict[str, Any] | None) -> bool:
    return bool(stats) and stats.get("repeat", 0) != 1  # type: ignore[union-attr]


def better(
    a: float,
    b: float,
    a_stats: dict[str, Any] | None,
    b_stats: dict[str, Any] | None,
    a_samples: Sequence[float] | None,
    b_samples: Sequence[float] | None,
    factor: float,
    *,
    use_stats: bool = True,
) -> bool:
    """Whether result a is better (smaller) than b by `factor`: a < b / factor, and, when both
    carry statistics (and `use_stats`), their samples differ."""
    statistics = use_stats and _has_statistics(a_stats) and _has_statistics(b_stats)
    if statistics and not differ(a_samples, b_samples, a_stats or {}, b_stats or {}):
        return False
    return a < b / factor


def signed_rank_p(differences: Sequence[float]) -> float:
    """The one-sided exact p-value of the Wilcoxon signed-rank test that `differences` are
    centred above 0: P(W+ >= observed) over the 2^n equally likely signs (zeros dropped, ties
    given their mean rank). 1.0 for no non-zero difference."""
    values = sorted((abs(d), d > 0) for d in differences if d != 0 and not math.isnan(d))
    n = len(values)
    if n == 0:
        return 1.0
    doubled: list[int] = []  # ranks times 2, so that the mean rank of a tie is an integer
    i = 0
    while i < n:
        j = i
        while j < n and values[j][0] == values[i][0]:
            j += 1
        doubled += [i + j + 1] * (j - i)  # 2 x the mean of ranks i+1 .. j
        i = j
    observed = sum(rank for rank, (_, positive) in zip(doubled, values, strict=True) if positive)
    ways = [0] * (sum(doubled) + 1)  # ways[s]: sign assignments whose positive ranks sum to s
    ways[0] = 1
    for rank in doubled:
        for total in range(len(ways) - 1, rank - 1, -1):
            ways[total] += ways[total - rank]
    return sum(ways[observed:]) / 2**n
