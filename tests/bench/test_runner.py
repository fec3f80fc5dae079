"""`hotpath bench`'s runner and the pieces that make its default run short (issue 7).

The runner passes `full` only to sections that take it, times every section into the JSON and
ends with where to look next; the pool section predicts burst times from what it measured and
runs each burst in a forked child; the access-log section drives one server per handler, round
robin; encode reuses the decode section's figure. No wall-clock thresholds: behaviour only.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import pytest

import impl.bench as bench
from impl import registry
from impl.bench import accesslog, encode, pool
from impl.bench._common import Section


def _section(family: str, rows: list[dict]) -> Section:
    return Section(family=family, title=f"{family} title", table="t", rows=rows, notes="n")


@pytest.fixture
def fake_sections(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Two sections under impl.bench: one that takes `full`, one written before it existed."""
    calls: dict[str, list] = {"with_full": [], "plain": []}

    def with_full(quick: bool, full: bool = False) -> Section:
        calls["with_full"].append((quick, full))
        return _section("with_full", [{"parity": True}])

    def plain(quick: bool) -> Section:
        calls["plain"].append(quick)
        return _section("plain", [{"parity": True}])

    for name, run in (("with_full", with_full), ("plain", plain)):
        module = types.ModuleType(f"impl.bench.{name}")
        module.run = run  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, f"impl.bench.{name}", module)
    return calls


def _args(tmp_path: Path, **changes: object) -> argparse.Namespace:
    values = dict(
        quick=False, full=False, only=["with_full", "plain"], json=tmp_path / "b.json",
        no_record=True,
    )  # fmt: skip
    values.update(changes)
    return argparse.Namespace(**values)


def test_full_reaches_only_sections_that_take_it(tmp_path, fake_sections, capsys):
    assert bench.run(_args(tmp_path, full=True)) == 0
    assert fake_sections == {"with_full": [(False, True)], "plain": [False]}
    results = json.loads((tmp_path / "b.json").read_text())
    assert results["full"] is True and results["quick"] is False
    assert set(results["section_seconds"]) == {"with_full", "plain"}
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith(f"results: {tmp_path / 'b.json'}  (full run, ")
    assert "with_full" in out[-1] and "plain" in out[-1]
    assert any(line.startswith("Where to look next") for line in out[-3:])


def test_default_and_quick_do_not_pass_full(tmp_path, fake_sections):
    assert bench.run(_args(tmp_path)) == 0
    assert bench.run(_args(tmp_path, quick=True, full=True)) == 0  # --quick wins
    assert fake_sections["with_full"] == [(False, False), (True, False)]
    assert json.loads((tmp_path / "b.json").read_text())["full"] is False


def test_parity_failure_and_broken_section_fail_the_run(tmp_path, monkeypatch, fake_sections):
    module = sys.modules["impl.bench.plain"]
    monkeypatch.setattr(module, "run", lambda quick: _section("plain", [{"parity": False}]))
    assert bench.run(_args(tmp_path)) == 1
    monkeypatch.setattr(module, "run", lambda quick: 1 / 0)
    assert bench.run(_args(tmp_path)) == 1
    results = json.loads((tmp_path / "b.json").read_text())
    assert "ZeroDivisionError" in results["errors"]["plain"]
    assert "plain" in results["section_seconds"]


def test_full_flag_is_in_the_cli():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args(["--full"]).full is True
    assert parser.parse_args([]).full is False


def test_pool_prediction_is_quadratic_then_measured():
    # one burst: assume per-request cost grows with the count (wall ~ count squared)
    assert pool.predict({256: 2.0}, 1024) == pytest.approx(32.0)
    # two bursts: the exponent they show (here 1.5) ...
    assert pool.predict({256: 1.0, 1024: 8.0}, 4096) == pytest.approx(64.0)
    # ... but never below linear
    assert pool.predict({256: 1.0, 1024: 1.0}, 4096) == pytest.approx(4.0)


def test_pool_budget_by_run_length(monkeypatch):
    monkeypatch.delenv("HOTPATH_POOL_BUDGET", raising=False)
    assert pool.budget() == pool.BUDGET_SECONDS < pool.budget(full=True)
    monkeypatch.setenv("HOTPATH_POOL_BUDGET", "600")
    assert pool.budget() == pool.budget(full=True) == 600.0


@pytest.mark.heavy
def test_pool_burst_in_forked_child_against_barrier_router():
    name = registry.reference("pool")
    router = pool.start_barrier_router(16)
    try:
        result = pool.measure(name, router.url, 16, timeout=120)
    finally:
        router.stop()
    assert result["ok"], result
    assert result["router_peak_in_flight"] == 16 and result["failed"] == 0
    assert result["cpu_seconds"] > 0 and result["wall_seconds"] > 0


@pytest.mark.heavy
def test_pool_skips_counts_predicted_over_budget():
    name = registry.reference("pool")
    results = pool.measure_all([name], (4, 8), budget_seconds=0.0)
    assert results[0]["in_flight"] == 4 and results[0]["ok"]
    assert results[1] == {
        "implementation": name,
        "in_flight": 8,
        "skipped": results[1]["skipped"],
    }
    assert "over the 0 s budget" in results[1]["skipped"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc schedstat")
@pytest.mark.heavy
def test_accesslog_servers_started_once_and_every_line_counted():
    runs = accesslog.server_costs(["plain", "null"], {"plain": 40, "null": 40}, 2, warmup=10)
    assert len(runs["plain"]) == len(runs["null"]) == 2
    for run in runs["plain"]:
        assert run["lines"] == run["expected_lines"] == 10 + 2 * 40 and run["complete"]
        assert run["loop_us"] > 0 and run["total_us"] >= run["loop_us"]
    assert runs["null"][0]["lines"] == 0 and runs["null"][0]["complete"]


def test_encode_reuses_the_decode_sections_figure(monkeypatch):
    decode_bench = pytest.importorskip("impl.bench.decode")
    monkeypatch.setitem(decode_bench.LAST_SECONDS, "vllm-1024", {"a": 0.5, "b": 0.25})
    assert encode.fastest_decode(1024) == ("decode/b (decode section)", 0.25)
