"""When the end-to-end stage calls HEAD slower: beyond a line set by the noise, and consistently.

The stage's figures (a sample's p50 latency, results/s) move between runs of the same commit
with the machine's load, and single rounds move the most; a fixed factor wide enough for that
noise lets a real slowdown under it through, and one tight enough to catch it fails unchanged
commits on a loaded machine. So a figure is worse only when both hold:

- **the line**: the median of the per-round ratios (> 1: HEAD worse) is beyond `FACTOR` (1.15),
  a line above the medians unchanged commits read;
- **the test**: the rounds are paired (both commits ran in the same seconds), and a one-sided
  exact Wilcoxon signed-rank test of the per-round log ratios (`impl.ci.significance`) says
  HEAD is worse with p below `P_THRESHOLD` (0.05). With 5 rounds only every round worse
  reaches it (p = 1/32); with the 10 of a confirmation, a round or two the other way still do.

A median beyond the line that the test does not confirm is noise (`Verdict.NOISE`, passes). The
stage confirms (as many rounds again) when the median is beyond the line's square root.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from impl.ci.significance import signed_rank_p
from impl.ci.stage import Verdict

FACTOR = 1.15
P_THRESHOLD = 0.05


@dataclass(frozen=True)
class Judged:
    """One figure over the rounds: the median ratio, the test's p-value, the verdict."""

    ratio: float
    p: float
    verdict: Verdict

    @property
    def worse(self) -> bool:
        return self.verdict.fails


def judge_rounds(ratios: Sequence[float], factor: float = FACTOR) -> Judged:
    """The verdict on one figure's per-round ratios (> 1: HEAD worse); see the module."""
    if not ratios:
        return Judged(math.nan, 1.0, Verdict.NOT_COMPARED)
    median = statistics.median(ratios)
    p = signed_rank_p([math.log(r) for r in ratios])
    if median > factor:
        return Judged(median, p, Verdict.WORSE if p < P_THRESHOLD else Verdict.NOISE)
    if median < 1 / factor and signed_rank_p([-math.log(r) for r in ratios]) < P_THRESHOLD:
        return Judged(median, p, Verdict.BETTER)
    return Judged(median, p, Verdict.PASS)


def borderline(judged: Sequence[Judged], factor: float = FACTOR) -> bool:
    """Whether any figure's median is beyond the square root of the line (worth confirming)."""
    return any(j.ratio > factor**0.5 for j in judged if j.ratio == j.ratio)
