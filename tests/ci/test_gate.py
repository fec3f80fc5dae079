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

from impl.ci import gate
from tests.support import asv_tiny as tiny

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
    repo, commits = recorded
    monkeypatch.setattr(gate, "ROOT", repo)
    monkeypatch.setattr(gate, "MACHINE", MACHINE)
    return commits


def test_twice_as_slow_fails(at, capsys):
    """20 after 10 is a 2x slowdown: worse at factor 1.5, and the table is printed."""
    worse, on_base, on_head = gate.compare(at[0], at[1], BENCH, 1.5)
    assert worse
    assert on_base == on_head == {tiny.BENCH}
    out = capsys.readouterr().out
    assert re.search(r"\|\s*\+\s*\|\s*10\s*\|\s*20\s*\|\s*2(\.00)?\s*\|", out), out


def test_within_the_factor_passes(at):
    """11 after 10 (1.1x) passes at 1.5; 20 after 10 passes at factor 2.5."""
    assert not gate.compare(at[0], at[2], BENCH, 1.5)[0]
    assert not gate.compare(at[0], at[1], BENCH, 2.5)[0]


def test_slower_and_ratios_per_benchmark(at):
    """The per-benchmark rule the confirmation uses agrees with the table; ratios are HEAD/base."""
    assert gate.slower(at[0], at[1], BENCH, 1.5) == {tiny.BENCH}
    assert gate.slower(at[0], at[2], BENCH, 1.5) == set()
    assert gate.slower(at[0], at[3], BENCH, 1.5) == set()  # a failure is not a slowdown
    row = gate.ratios(at[0], at[1], BENCH)[tiny.BENCH]
    assert (row["base"], row["head"], row["ratio"]) == (10.0, 20.0, 2.0)


def test_failure_on_head_is_reported(at):
    """A benchmark that ran on the base and fails on HEAD has no HEAD result."""
    _, on_base, on_head = gate.compare(at[0], at[3], BENCH, 1.5)
    assert on_base == {tiny.BENCH} and on_head == set()


def test_first_commit_passes(tmp_path, monkeypatch, capsys):
    """A repository of one commit has nothing to compare: pass, saying so."""
    tiny.git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.txt").write_text("a")
    tiny.git(tmp_path, "add", "-A")
    tiny.git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(gate, "ROOT", tmp_path)
    assert gate.main([]) == 0
    assert "first commit" in capsys.readouterr().out


def test_regex_selects_only_the_gated_combination():
    """asv matches `name(param, ...)`; 'json' must not also select 'orjson'."""
    name = "bench_decode.Decode.time_decode"
    pattern = gate.regex(name, ("json", "vllm-262k"))
    grid = [["'json'", "'orjson'", "'simdjson'"], ["'vllm-262k'", "'vllm-262k-x'", "'min'"]]
    names = [f"{name}({', '.join(combo)})" for combo in itertools.product(*grid)]
    assert [n for n in names if re.search(pattern, n)] == [f"{name}('json', 'vllm-262k')"]


def test_gated_benchmarks_exist():
    """Each gated benchmark exists in benchmarks/ with the gated parameter values."""
    picks = {f: gate.picked(f) for f in ("decode", "encode", "pool", "accesslog")}
    sys.path.insert(0, str(gate.ROOT))
    try:
        for name, params in gate.gated(picks):
            module_name, class_name, method = name.split(".")
            cls = getattr(importlib.import_module(f"benchmarks.{module_name}"), class_name)
            assert callable(getattr(cls, method, None)), name
            if params is not None:
                assert tuple(params) in set(itertools.product(*cls.params)), (name, params)
    finally:
        sys.path.remove(str(gate.ROOT))


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
