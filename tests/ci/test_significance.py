"""The timer stage's statistical rule (impl.ci.significance): the verdicts asv's comparison gives.

Fixed cases check each branch of the rule (the factor alone, the Mann-Whitney U test exact and
approximate, ties, the confidence-interval fallback, a single repeat); a differential check
runs the same random cases through asv's own comparison, when this asv still has it.
"""

from __future__ import annotations

import math
import random

import pytest

from impl.ci import significance
from impl.ci.significance import better, differ, mann_whitney_p


def _stats(samples: list[float], repeat: int | None = None) -> dict[str, float]:
    """asv-shaped statistics of `samples`: a 99% interval of the median's spread, quartiles."""
    ordered = sorted(samples)
    low, high = ordered[0], ordered[-1]
    stats = {"ci_99_a": low, "ci_99_b": high, "q_25": low, "q_75": high}
    if repeat is not None:
        stats["repeat"] = repeat
    return stats


def test_factor_alone_without_statistics():
    """A track_ figure (no statistics): worse exactly when base < HEAD / factor."""
    assert better(10.0, 20.0, None, None, None, None, 1.5)
    assert not better(10.0, 15.0, None, None, None, None, 1.5)  # 1.5x is not beyond 1.5
    assert not better(10.0, 14.0, None, None, None, None, 1.5)


def test_exact_test_on_separated_samples():
    """Eight rounds each, wholly separated: p = 2 / C(16, 8) < 0.002, so they differ."""
    base = [1.0 + i / 100 for i in range(8)]
    head = [2.0 + i / 100 for i in range(8)]
    assert mann_whitney_p(base, head) == pytest.approx(2 / math.comb(16, 8))
    assert differ(base, head, _stats(base), _stats(head))
    assert better(1.0, 2.0, _stats(base), _stats(head), base, head, 1.5)


def test_interleaved_samples_do_not_differ_even_beyond_the_factor():
    """Medians 2x apart but the samples interleave: not significant, so not slower."""
    base = [1.0, 3.0, 1.1, 3.1, 1.2, 3.2, 1.3, 3.3]
    head = [2.0, 4.0, 2.1, 4.1, 2.2, 4.2, 2.3, 4.3]
    assert mann_whitney_p(base, head) > significance.P_THRESHOLD
    assert not better(1.0, 2.5, _stats(base), _stats(head), base, head, 1.5)


def test_too_few_samples_fall_back_to_the_intervals():
    """Four samples each cannot reach p < 0.002 (1 / C(8, 4) = 0.014): the 99% intervals decide."""
    base, head = [1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3]
    assert differ(base, head, _stats(base), _stats(head))  # intervals apart
    wide = _stats(head) | {"ci_99_a": 1.25}
    assert not differ(base, head, _stats(base), wide)  # intervals overlap


def test_ties_are_broken_against_significance():
    """All-equal samples tie everywhere: the conservative split gives p = 1."""
    assert mann_whitney_p([1.0] * 10, [1.0] * 10) == pytest.approx(1.0)


def test_large_samples_use_the_normal_approximation():
    """Beyond 20 samples the p-value is the normal one; separated samples still differ."""
    base = [1.0 + i / 1000 for i in range(30)]
    head = [2.0 + i / 1000 for i in range(30)]
    p = mann_whitney_p(base, head)
    assert 0 < p < 1e-9
    assert differ(base, head, _stats(base), _stats(head))


def test_a_single_repeat_is_judged_by_the_factor():
    """A result of one repeat has no usable statistics: the factor alone decides."""
    base, head = [1.0, 3.0, 1.1, 3.1], [2.0, 4.0, 2.1, 4.1]
    assert better(1.0, 2.5, _stats(base, repeat=1), _stats(head), base, head, 1.5)


def test_nan_samples_are_ignored():
    base = [1.0 + i / 100 for i in range(8)] + [float("nan")]
    head = [2.0 + i / 100 for i in range(8)]
    assert differ(base, head, _stats(base[:8]), _stats(head))


def _asv_rule():
    """asv's own comparison (a private function: only this check reads it)."""
    compare = pytest.importorskip("asv.commands.compare")
    rule = getattr(compare, "_is_result_better", None)
    if rule is None:
        pytest.skip("this asv has no _is_result_better to compare with")
    return rule


@pytest.mark.heavy
def test_same_verdicts_as_asv_on_random_cases():
    """2,000 random pairs of sample sets (sizes 1-30, shifts, ties, single repeats): our rule
    and asv's give the same verdict, both ways round, at several factors."""
    rule = _asv_rule()
    rng = random.Random(41)
    checked = 0
    for _ in range(2000):
        m, n = rng.randint(1, 30), rng.randint(1, 30)
        shift = rng.choice([1.0, 1.1, 1.4, 1.6, 2.0, 3.0])
        grain = rng.choice([0.0, 0.1, 0.5])  # rounded samples make ties
        a = [rng.gauss(1.0, 0.2) for _ in range(m)]
        b = [rng.gauss(shift, 0.2 * shift) for _ in range(n)]
        if grain:
            a, b = ([round(x / grain) * grain for x in s] for s in (a, b))
        sa = _stats(a, repeat=rng.choice([None, None, 1]))
        sb = _stats(b)
        va, vb = sorted(a)[m // 2], sorted(b)[n // 2]
        for factor in (1.0, 1.22, 1.5):
            for x, y, sx, sy, xs, ys in ((va, vb, sa, sb, a, b), (vb, va, sb, sa, b, a)):
                ours = better(x, y, sx, sy, xs, ys, factor)
                theirs = rule(x, y, (sx, xs), (sy, ys), factor, use_stats=True)
                assert ours == theirs, (x, y, sx, sy, xs, ys, factor)
                checked += 1
    assert checked == 2000 * 6
