"""The runtime section of `hotpath bench` (impl/bench/runtime.py) and its asv suite.

The section's table, rows and recorded costs from a fixed set of figures (an unavailable
runtime is reported with its reason, not measured); the asv suite's n/a for a runtime that
cannot run and its tracks reading the figures; and one real burst against a server per
available runtime (every connection answered, the server's CPU read).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from impl import registry
from impl.bench import runtime as section

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_runtime  # noqa: E402 - the suite is imported from the repository


def _figures(names: list[str], missing: dict[str, str]) -> dict:
    small = {
        n: {
            "cpu_ms_per_result": 0.4 * (i + 1),
            "results_per_second": 900.0 / (i + 1),
            "cpu_ratio": float(i + 1),
            "cpu_ratios": [float(i + 1)],
            "rate_ratio": 1.0 / (i + 1),
            "http_requests_per_result": 2.0,
            "completed": 16,
            "requested": 16,
            "failed": 0,
        }
        for i, n in enumerate(names)
    }
    probe = {
        n: {
            "healthz_p50": 0.01,
            "healthz_p99": 0.05,
            "healthz_max": 0.1,
            "healthz_failures": 0,
            "results_per_second": 2.0,
            "server_cpu_ms_per_result": 30.0,
            "server_peak_rss_bytes": 2e8,
            "completed": 8,
            "requested": 8,
            "failed": 1 if n == names[-1] else 0,
        }
        for n in names
    }
    rss = {
        n: {
            "rss_before": int(1e8),
            "rss_served": int(1.5e8),
            "rss_dropped": int(1.2e8),
            "peak_rss": int(2e8),
            "completed": 4,
            "requested": 4,
            "failed": 0,
        }
        for n in names
    }
    burst = {"seconds": 0.5, "failures": 0, "server_cpu_us_per_connection": 80.0, "rss_after": 1}
    return {
        "lengths": section._lengths(True, False),
        "names": names,
        "missing": missing,
        "small": small,
        "probe": probe,
        "rss": rss,
        "bursts": {n: {"256": burst, "1024": {**burst, "seconds": 2.0}} for n in names},
    }


def test_section_reports_every_runtime_and_records_the_ratios(monkeypatch):
    names = ["uvicorn_httptools", "uvicorn_h11"]
    figures = _figures(names, {"granian": "granian is not installed"})
    monkeypatch.setattr(section, "measure", lambda quick, full=False: figures)
    result = section.run(quick=True)
    assert result.family == "runtime"
    by_name = {row["runtime"]: row for row in result.rows}
    assert by_name["granian"] == {"runtime": "granian", "unavailable": "granian is not installed"}
    assert by_name["uvicorn_httptools"]["parity"] is True
    assert by_name["uvicorn_h11"]["parity"] is False  # a failed probe sample
    assert result.measurements == [
        {"input": "small-2048", "size_bytes": None, "cost": {names[0]: 1.0, names[1]: 2.0}}
    ]
    assert "granian: unavailable (granian is not installed)" in result.notes
    lines = result.table.splitlines()
    assert "burst 256" in lines[0] and "burst 1024" in lines[0]
    assert any(line.startswith("uvicorn_h11") and "2.00x" in line for line in lines)


def test_rounds_rotate_the_order():
    names = ["a", "b", "c"]
    assert [section._rotated(names, i)[0] for i in range(4)] == ["a", "b", "c", "a"]


def test_asv_runtime_is_na_when_unavailable_and_reads_the_figures(monkeypatch):
    suite = bench_runtime.Runtime()
    monkeypatch.setattr(registry, "unavailable_reason", lambda family, name: "not here")
    with pytest.raises(NotImplementedError, match="not here"):
        suite.setup({}, "granian")
    monkeypatch.undo()
    figures = _figures(["uvicorn_httptools"], {})
    suite.setup(figures, "uvicorn_httptools")
    assert suite.track_small_cpu_ratio_to_httptools(figures, "uvicorn_httptools") == 1.0
    assert suite.track_probe_healthz_p99_ms(figures, "uvicorn_httptools") == pytest.approx(50.0)
    assert suite.track_rss_after_dropped_mb(figures, "uvicorn_httptools") == pytest.approx(120.0)
    assert suite.track_burst_seconds(figures, "uvicorn_httptools") == 2.0  # the largest burst


@pytest.mark.heavy
@pytest.mark.slow
def test_a_burst_is_answered_by_every_runtime():
    """64 connections at once on a real server per available runtime: all answered 200, and
    the server's CPU over the burst is read (more than nothing)."""
    names = registry.available("runtime")
    bursts = section._bursts(names, (64,))
    for name in names:
        got = bursts[name]["64"]
        assert got["failures"] == 0, (name, got)
        assert got["server_cpu_us_per_connection"] > 0 and got["rss_after"] > 0, (name, got)
