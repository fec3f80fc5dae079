"""The pytest-benchmark suite (perf/, `make perf`): kept out of `make test`, JSON for notebooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from impl.ci import perfjson

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str) -> str:
    """The stdout of `python -m pytest ARGS` run in the repository (asserting it passed)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_perf_is_not_collected_by_make_test():
    """pyproject's testpaths collect tests/ only: no perf/ benchmark runs under `make test`."""
    collected = _pytest("--collect-only")
    assert "tests/test_perf_suite.py" in collected
    assert "perf/" not in collected


@pytest.mark.heavy
def test_one_group_runs_and_its_json_reads_as_rows(tmp_path):
    """One perf group runs (implementations side by side) and `perfjson.rows` labels each row."""
    out = tmp_path / "perf.json"
    ran = _pytest(
        "perf/test_perf_accesslog.py", "--benchmark-max-time=0.05", f"--benchmark-json={out}"
    )
    assert "benchmark 'accesslog one access record'" in ran
    rows = perfjson.rows(out)
    names = {row["implementation"] for row in rows}
    assert {"plain", "null"} <= names
    for row in rows:
        assert row["family"] == "accesslog" and row["input"] == "one access record"
        assert row["median_s"] > 0 and row["rounds"] >= 1


def test_perf_holds_only_the_benchmark_loop_and_probes_say_what_they_measure():
    """perf/ is the pytest-benchmark loop alone; the one-off probes behind the docs' figures live
    in impl/probes/, each with a docstring and runnable as `python -m impl.probes.NAME`."""
    import ast

    loose = [
        p.name
        for p in (ROOT / "perf").glob("*.py")
        if p.name != "conftest.py" and not p.name.startswith("test_perf_")
    ]
    assert not loose, f"one-off scripts belong in impl/probes/: {loose}"
    probes = sorted((ROOT / "impl" / "probes").glob("[!_]*.py"))
    assert probes
    for probe in probes:
        tree = ast.parse(probe.read_text())
        assert ast.get_docstring(tree), f"{probe.name}: no docstring saying what it measures"
        assert "__main__" in probe.read_text(), f"{probe.name}: not runnable"
        index = (ROOT / "impl" / "probes" / "__init__.py").read_text()
        assert f"`{probe.stem}`" in index, f"{probe.name} is not listed in impl/probes/__init__.py"
