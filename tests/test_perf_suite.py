"""The pytest-benchmark suite (perf/, `make perf`): kept out of `make test`, JSON for notebooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from impl.ci import perfjson

ROOT = Path(__file__).resolve().parents[1]


def test_perf_is_not_collected_by_make_test():
    """pyproject's testpaths collect tests/ only: no perf/ benchmark runs under `make test`."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/test_perf_suite.py" in done.stdout
    assert "perf/" not in done.stdout


def test_one_group_runs_and_its_json_reads_as_rows(tmp_path):
    """One perf group runs (implementations side by side) and `perfjson.rows` labels each row."""
    out = tmp_path / "perf.json"
    command = [sys.executable, "-m", "pytest", "perf/test_perf_accesslog.py", "-q"]
    command += ["-p", "no:cacheprovider", "--benchmark-max-time=0.05", f"--benchmark-json={out}"]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "benchmark 'accesslog one access record'" in done.stdout
    rows = perfjson.rows(out)
    names = {row["implementation"] for row in rows}
    assert {"plain", "null"} <= names
    for row in rows:
        assert row["family"] == "accesslog" and row["input"] == "one access record"
        assert row["median_s"] > 0 and row["rounds"] >= 1
