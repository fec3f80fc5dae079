"""The end-to-end stage's drift check: HEAD against a fixed reference (impl.ci.reference) as well
as its parent, and the verdict rule from the rounds' noise (impl.ci.e2e_verdict), on synthetic
rounds through the stage's real code (no server starts)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from impl.ci import e2e_verdict, gate_e2e, reference, significance
from impl.ci import trees as commit_trees
from impl.ci.e2e_rounds import Run
from impl.ci.stage import Verdict

#: a chain of commits, each 1.1x slower than the one before: 1.33x from the first to the last
CHAIN = {"r0": 1.0, "c1": 1.1, "c2": 1.21, "c3": 1.331}


def synthetic_runs(base: float, head: float, rounds: int, seed: int) -> list[Run]:
    """Rounds of two servers whose sample path takes `base` and `head` (relative): each round's
    load moves both (up to 1.5x), and each side jitters by itself (3 percent)."""
    rng = random.Random(seed)
    runs = []
    for r in range(rounds):
        load = 1 + 0.5 * rng.random()
        for side, cost in (("base", base), ("HEAD", head)):
            p50 = 0.030 * cost * load * rng.gauss(1, 0.03)
            runs.append(Run(side, r, 4 / p50, p50, 0.0))
    return runs


def _known(rev: str) -> str | None:
    return rev if rev in CHAIN else None


@pytest.fixture
def chain(monkeypatch, tmp_path):
    """The stage's trees, pins, commits and rounds replaced by the synthetic chain."""
    monkeypatch.setattr(commit_trees, "tree_of", lambda sha, workdir: Path("/trees") / sha)
    monkeypatch.setattr(commit_trees, "pins", lambda trees: [])
    monkeypatch.setattr(reference, "commit_of", lambda rev: _known(rev.split("^")[0]))
    seeds = itertools.count()

    def measure(self) -> bool:
        base, head = (CHAIN[self.trees[side].name] for side in ("base", "HEAD"))
        self.runs = synthetic_runs(base, head, self.rounds, next(seeds))
        self.first = list(self.runs)
        return True

    monkeypatch.setattr(gate_e2e.EndToEnd, "measure", measure)
    return tmp_path


def test_each_step_under_the_line_passes_against_its_parent():
    """1.1x per commit, 5 rounds: within the 1.15 line, so the parent comparison lets each
    through (what the reference is for)."""
    for seed in range(20):
        latency, throughput, worse = gate_e2e.verdict(
            gate_e2e.ratios(synthetic_runs(1.21, 1.331, 5, seed)), e2e_verdict.FACTOR
        )
        assert not worse and 1.0 < latency < 1.15 and 1.0 < throughput < 1.15


def test_drift_fails_a_chain_of_small_steps(chain, capsys):
    """HEAD c3 over base c2 is 1.1x (passes), over the reference r0 1.33x: the stage fails, on
    the reference comparison, and says so."""
    named = reference.parse("r0\n# the release\n")
    out = chain / "e2e.json"
    status = gate_e2e.stage("c2", "c3", workdir=chain, json_path=out, reference=named)
    printed = capsys.readouterr().out
    summary = json.loads(out.read_text())
    assert summary["base_status"] == 0 and not summary["failed"]
    assert summary["reference"]["commit"] == "r0" and summary["reference"]["status"] == 1
    assert summary["reference"]["latency_ratio"] == pytest.approx(1.33, rel=0.05)
    assert status == 1
    assert (
        "gate e2e: PASS - p50 latency" in printed
        and "slower end to end than the reference's" in printed
    )


def test_an_unchanged_commit_passes_both(chain):
    CHAIN["same"] = CHAIN["c3"]
    try:
        named = reference.parse("c3\n")
        assert gate_e2e.stage("c3", "same", workdir=chain, reference=named) == 0
    finally:
        del CHAIN["same"]


def test_a_missing_reference_is_not_compared_and_said(chain, capsys, monkeypatch):
    monkeypatch.setattr(reference, "git", lambda *args: "false")  # not a shallow clone
    named = reference.parse("deadbeef\n# gone\n")
    out = chain / "e2e.json"
    assert gate_e2e.stage("c2", "c3", workdir=chain, json_path=out, reference=named) == 0
    assert "NOT COMPARED with the reference deadbeef" in capsys.readouterr().out
    assert json.loads(out.read_text())["reference"]["compared"] is False


def test_a_reference_that_cannot_be_exported_is_not_compared_and_said(chain, capsys, monkeypatch):
    def broken(sha: str, workdir: Path) -> Path:
        if sha == "r0":
            raise OSError("disk full")
        return Path("/trees") / sha

    monkeypatch.setattr(commit_trees, "tree_of", broken)
    assert gate_e2e.stage("c2", "c3", workdir=chain, reference=reference.parse("r0\n")) == 0
    assert "NOT COMPARED with the reference r0" in capsys.readouterr().out


def test_the_reference_file_names_one_commit(tmp_path):
    found = reference.parse("# a comment first\n\n81df66b\n# the 0.2.0 release\n")
    assert (found.rev, found.why) == ("81df66b", "a comment first the 0.2.0 release")
    for bad in ("", "# only comments\n", "81df66b and more words\n"):
        with pytest.raises(reference.BadReference, match="commit"):
            reference.parse(bad)
    assert reference.named("none") is None
    assert reference.named("v1").rev == "v1"
    assert reference.named(None, root=tmp_path) is None  # no file: no reference
    committed = reference.named(None)
    assert committed is not None and committed.why  # the committed file: a commit and its why
    assert all(c in "0123456789abcdef" for c in committed.rev)


def test_the_rule_needs_the_line_and_the_test():
    """Beyond the line but inconsistent: noise; consistent but under the line: pass; a large
    consistent ratio: worse; every round better by more than the line: better."""
    assert e2e_verdict.judge_rounds([1.3, 0.8, 1.4, 0.9, 1.3]).verdict is Verdict.NOISE
    assert e2e_verdict.judge_rounds([1.1, 1.12, 1.08, 1.1, 1.11]).verdict is Verdict.PASS
    assert e2e_verdict.judge_rounds([1.2, 1.25, 1.18, 1.3, 1.22]).verdict is Verdict.WORSE
    assert e2e_verdict.judge_rounds([0.8, 0.7, 0.75, 0.8, 0.78]).verdict is Verdict.BETTER
    assert e2e_verdict.judge_rounds([]).verdict is Verdict.NOT_COMPARED


def test_signed_rank_p_is_the_exact_distribution():
    """Against enumerating every sign assignment, ties included."""
    rng = random.Random(7)
    for n in range(1, 9):
        values = [rng.choice([-3, -2, -1, 1, 2, 2, 3, 0.5]) for _ in range(n)]
        ranks = sorted(abs(v) for v in values)
        mean_rank = {
            a: sum(i + 1 for i, b in enumerate(ranks) if b == a) / ranks.count(a) for a in ranks
        }
        observed = sum(mean_rank[abs(v)] for v in values if v > 0)
        signs = list(itertools.product((0, 1), repeat=n))
        at_least = sum(
            sum(mean_rank[abs(v)] for v, s in zip(values, sign, strict=True) if s)
            >= observed - 1e-9
            for sign in signs
        )
        assert significance.signed_rank_p(values) == pytest.approx(at_least / len(signs))
    assert significance.signed_rank_p([0.0, 0.0]) == 1.0


def test_the_demo_scales_its_delay_until_it_delivers_the_slowdown():
    """A path whose server share is 40 percent: the first delay (F - 1) gives 1 + 0.4 (F - 1);
    the correction scales it to deliver F; a measurement that shows nothing (noise) counts as
    the smallest share, 0.1, and the delay is scaled, not kept."""
    from impl.ci import gate_demo_e2e

    made: list[float] = []

    def commit(extra: float) -> str:
        made.append(extra)
        return f"commit-{len(made)}"

    def measure(commit: str) -> tuple[float, float]:
        latency = 1 + 0.4 * made[int(commit.split("-")[1]) - 1]
        return latency, latency

    final, extra, steps = gate_demo_e2e.calibrate(1.5, commit, measure)
    assert steps[0][:2] == (pytest.approx(0.5), pytest.approx(1.2))
    assert final == "commit-2" and extra == pytest.approx(1.25)
    assert steps[-1][1] == pytest.approx(1.5) and len(steps) == 2
    made.clear()
    flat = gate_demo_e2e.calibrate(1.2, commit, lambda c: (0.97, 1.0))
    assert flat[0] == "commit-3" and [round(d, 3) for d, _, _ in flat[2]] == [0.2, 2.0, 2.0]
    assert "0.75" in gate_demo_e2e.patch(1.5, 0.75) and "0.5" in gate_demo_e2e.patch(1.5)
