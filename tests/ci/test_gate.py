"""The regression gate's decisions (impl.ci.gate), on asv's real result files.

The full gate (two commits built and benchmarked) takes minutes and runs in .ci/run; here a
tiny asv project records chosen values per commit and the gate's comparison must flag a
slowdown beyond the factor, pass one within it, fail a benchmark that breaks on HEAD, and
pass a first commit. A last test keeps the gate's selection in step with `benchmarks/`.
"""

from __future__ import annotations

import importlib
import itertools
import re
import sys

import pytest

from impl.ci import gate, gate_timers, repo
from impl.ci.stage import Verdict
from tests.support import asv_tiny as tiny

pytestmark = pytest.mark.heavy

MACHINE = "tiny-gate"
BENCH = [(tiny.BENCH, None)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The tiny project with results 10, 20 (2x slower), 11, and a failure; its commits."""
    repo = tmp_path_factory.mktemp("gaterepo")
    commits = tiny.project(repo, 4)
    for commit, value in zip(commits, ("10", "20", "11", "not a number"), strict=True):
        tiny.record(repo, MACHINE, commit, value)
    return repo, commits


@pytest.fixture
def at(recorded, monkeypatch):
    project, commits = recorded
    monkeypatch.setattr(repo, "ROOT", project)
    monkeypatch.setattr(gate_timers, "MACHINE", MACHINE)
    return commits


def _timers(base: str, head: str, factor: float = 1.5) -> gate_timers.Timers:
    return gate_timers.Timers(base, head, BENCH, factor, hashes=repo.ROOT / "unused")


@pytest.mark.slow
def test_twice_as_slow_fails(at, capsys):
    """20 after 10 is a 2x slowdown: worse at factor 1.5, and the table is printed."""
    timers = _timers(at[0], at[1])
    assert [row.verdict for row in timers.compare()] == [Verdict.WORSE]
    assert timers.measured() == ({tiny.BENCH}, {tiny.BENCH})
    out = capsys.readouterr().out
    assert re.search(r"track_value\s*\|\s*10\S*\s*\|\s*20\S*\s*\|\s*2\.00\s*\|\s*FAIL", out), out


def test_within_the_factor_passes(at):
    """11 after 10 (1.1x) passes at 1.5; 20 after 10 passes at factor 2.5."""
    assert [row.verdict for row in _timers(at[0], at[2]).compare()] == [Verdict.PASS]
    assert [row.verdict for row in _timers(at[0], at[1], 2.5).compare()] == [Verdict.PASS]


def test_rows_and_ratios_per_benchmark(at):
    """A failure on HEAD is no slowdown (it broke); an accepted slowdown is marked so; ratios
    are HEAD/base."""
    assert gate_timers.rows(at[0], at[3], BENCH, 1.5)[0].verdict is Verdict.BROKE
    accepted = gate_timers.rows(at[0], at[1], BENCH, 1.5, lambda name: name == tiny.BENCH)
    assert accepted[0].verdict is Verdict.ACCEPTED
    row = gate_timers.ratios(at[0], at[1], BENCH)[tiny.BENCH]
    assert (row["base"], row["head"], row["ratio"]) == (10.0, 20.0, 2.0)


def test_failure_on_head_is_reported(at):
    """A benchmark that ran on the base and fails on HEAD has no HEAD result."""
    assert _timers(at[0], at[3]).measured() == ({tiny.BENCH}, set())


def test_first_commit_passes(tmp_path, monkeypatch, capsys):
    """A repository of one commit has nothing to compare: pass, saying so."""
    tiny.git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.txt").write_text("a")
    tiny.git(tmp_path, "add", "-A")
    tiny.git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(repo, "ROOT", tmp_path)
    assert gate.main([]) == 0
    assert "first commit" in capsys.readouterr().out


def test_regex_selects_only_the_gated_combination():
    """asv matches `name(param, ...)`; 'json' must not also select 'orjson'."""
    name = "bench_decode.Decode.time_decode"
    pattern = gate_timers.regex(name, ("json", "vllm-262k"))
    grid = [["'json'", "'orjson'", "'simdjson'"], ["'vllm-262k'", "'vllm-262k-x'", "'min'"]]
    names = [f"{name}({', '.join(combo)})" for combo in itertools.product(*grid)]
    assert [n for n in names if re.search(pattern, n)] == [f"{name}('json', 'vllm-262k')"]


def test_gated_benchmarks_exist():
    """Each gated benchmark exists in benchmarks/ with the gated parameter values."""
    picks = {f: gate_timers.picked(f) for f in ("decode", "encode", "pool", "accesslog")}
    sys.path.insert(0, str(repo.ROOT))
    try:
        for name, params in gate_timers.gated(picks):
            module_name, class_name, method = name.split(".")
            cls = getattr(importlib.import_module(f"benchmarks.{module_name}"), class_name)
            assert callable(getattr(cls, method, None)), name
            if params is not None:
                assert tuple(params) in set(itertools.product(*cls.params)), (name, params)
    finally:
        sys.path.remove(str(repo.ROOT))


def test_only_selects_one_family(capsys):
    """`--only decode --list`: the decode benchmark and the decode counts, nothing else; a
    family with nothing gated exits 2 saying so."""
    assert gate.main(["--only", "decode", "--list"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("^")]
    assert listed and all("decode" in line for line in listed)
    assert any("time_decode" in line for line in listed)
    assert any("track_instructions" in line for line in listed)
    assert gate.main(["--only", "nosuchfamily", "--list"]) == 2
    assert "nothing gated" in capsys.readouterr().err
