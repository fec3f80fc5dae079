"""A tiny asv project in a temporary git repository, for the dashboard and gate tests.

One `track_` benchmark reads its value from a file beside it, so each commit's result is
chosen by the test; results are recorded with asv's `existing` environment (this Python, no
build), under the html/results settings of this repository's asv.conf.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = "bench_tiny.Tiny.track_value"
SOURCE = """
from pathlib import Path


class Tiny:
    def track_value(self):
        return float((Path(__file__).parent / "value.txt").read_text())

    track_value.unit = "ms"
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def asv(repo: Path, *args: str, status: int = 0) -> str:
    """Run asv in `repo`; its stdout. `status`: the exit status expected (2: a benchmark failed)."""
    command = [sys.executable, "-m", "asv", *args, "--config", str(repo / "asv.conf.json")]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == status, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def strip_comments(text: str) -> str:
    """asv.conf.json may hold // comment lines (asv allows them); json does not."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def project(repo: Path, commits: int) -> list[str]:
    """Make `repo` a git repository of `commits` commits with the tiny suite; their hashes."""
    conf = json.loads(strip_comments((ROOT / "asv.conf.json").read_text()))
    conf.update(repo=".", branches=["main"], project="tiny")
    (repo / "asv.conf.json").write_text(json.dumps(conf))
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "bench_tiny.py").write_text(SOURCE)
    git(repo, "init", "-q", "-b", "main")
    hashes = []
    for i in range(commits):
        (repo / "commit.txt").write_text(str(i))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"commit {i}")
        hashes.append(git(repo, "rev-parse", "HEAD"))
    return hashes


def record(repo: Path, machine: str, commit: str, value: str) -> None:
    """Record `value` as the benchmark's result for `commit` on `machine` (not a float: fails)."""
    try:
        float(value)
        status = 0
    except ValueError:
        status = 2
    asv(repo, "machine", "--yes", "--machine", machine)
    (repo / "benchmarks" / "value.txt").write_text(value)
    asv(repo, "run", "--machine", machine, "-E", f"existing:{sys.executable}",
        "--set-commit-hash", commit, status=status)  # fmt: skip
