"""`make results` (`impl.analysis.results`): sample, figures and README tables from one command.

The tables are checked on the committed sample; the whole command runs once on a tiny
configuration (a quick decode section, the decode notebook) into a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from impl import analysis, registry
from impl.analysis import results

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = analysis.load_results(ROOT / "notebooks" / "data")


@pytest.mark.parametrize("family", list(results.TABLES))
def test_table_from_the_committed_sample_is_stamped(family: str):
    """Every family's table names each implementation and says which commit and day made it."""
    section = analysis.section(SAMPLE, family)
    assert section is not None, f"the committed sample has no {family} section"
    table = results.markdown_table(SAMPLE, family)
    env = section["environment"]
    first_line = table.splitlines()[0]
    assert f"commit `{env['git_sha']}`" in first_line
    assert env["time"][:10] in first_line
    assert f"--only {family}" in first_line
    names = {r.get("implementation") or r.get("scenario") for r in section["rows"]}
    # encode's comparison row (the fastest decode of the same result), shown in the notes instead
    names = {n for n in names if not (n or "").startswith("decode/")}
    for name in names - {None}:
        assert name in table, name


def test_a_row_that_differs_from_the_reference_is_marked():
    rows = [
        {"input": "vllm-128", "tokens": 128, "body": "vllm", "size_bytes": 9000}
        | {"implementation": name, "seconds": 1e-3, "parity": name != "bad"}
        for name in ("json", "bad")
    ]
    table = results._grid(results._decode(rows))
    assert table.splitlines()[2] == "| vllm, 128 tokens (9 KB) | 1.00 ms | ✗ 1.00 ms |"


def test_rewrite_touches_only_marked_regions_with_results(tmp_path: Path):
    readme = tmp_path / "README.md"
    before = (
        "intro\n<!-- results:decode -->\n| old |\n<!-- /results:decode -->\nmiddle\n"
        "<!-- results:nosuch -->\n| kept |\n<!-- /results:nosuch -->\nend\n"
    )
    readme.write_text(before)
    assert results.rewrite_readme(readme, SAMPLE) == ["decode"]
    after = readme.read_text()
    assert "| old |" not in after and "| kept |" in after
    assert after.startswith("intro\n<!-- results:decode -->\n_Measured by `hotpath bench")
    assert "middle\n<!-- results:nosuch -->\n| kept |\n<!-- /results:nosuch -->\nend\n" in after
    assert results.rewrite_readme(readme, SAMPLE) == ["decode"]
    assert readme.read_text() == after  # idempotent on the same results


def test_readme_has_a_region_per_family_table():
    text = (ROOT / "README.md").read_text()
    for family in registry.families():
        assert f"<!-- results:{family} -->\n" in text and f"<!-- /results:{family} -->" in text


def test_partial_run_refuses_the_committed_sample():
    """`--only` into notebooks/data would drop the other sections from the sample: refused."""
    done = subprocess.run(
        [sys.executable, "-m", "impl.analysis.results", "--quick", "--only", "decode"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "--only would leave the committed sample" in done.stderr


@pytest.mark.slow
def test_one_command_refreshes_sample_figures_and_tables(tmp_path: Path):
    """A tiny real run: quick decode section, the decode notebook, a README copy rewritten."""
    pytest.importorskip("nbclient", reason="needs the notebooks extra (pip install 'hotpath[all]')")
    pytest.importorskip(
        "ipykernel", reason="needs the notebooks extra (pip install 'hotpath[all]')"
    )
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
    readme = tmp_path / "README.md"
    readme.write_text(
        "x\n<!-- results:decode -->\nold\n<!-- /results:decode -->\n"
        "<!-- results:pool -->\nold pool\n<!-- /results:pool -->\n"
    )
    data, figures = tmp_path / "data", tmp_path / "figures"
    command = [sys.executable, "-m", "impl.analysis.results", "--quick", "--only", "decode"]
    command += ["--notebooks", "decode", "--data", str(data), "--figures", str(figures)]
    command += ["--readme", str(readme)]
    env = {"JUPYTER_PATH": str(tmp_path / "jupyter"), "HOTPATH_MEASUREMENTS": str(tmp_path / "m")}
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]

    assert sorted(p.name for p in data.iterdir()) == ["bench-families.json"]
    run = json.loads((data / "bench-families.json").read_text())
    assert [s["family"] for s in run["sections"]] == ["decode"]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert run["environment"]["git_sha"] == head
    assert len(run["environment"]["load_average"]) == 3
    assert (figures / "decode-scaling.png").stat().st_size > 10_000
    text = readme.read_text()
    assert f"at commit `{head}`" in text and "`hotpath bench --quick --only decode`" in text
    assert "| vllm, 32768 tokens" in text and "\nold\n" not in text
    assert "old pool" in text  # no pool section in this run: its region is left alone
    assert not (tmp_path / "m").exists()  # --no-record: the recorded picks are untouched
