"""Every notebook under notebooks/ runs headless on the committed results sample.

Each notebook is executed by nbclient with the `python3` kernel pinned to this interpreter (a
kernelspec written under a temporary JUPYTER_PATH, checked from inside the kernel), figures go
to a temporary directory, and every figure the notebook saves must exist afterwards. So the
notebooks and `impl.analysis` cannot drift apart from the results format without a failure.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs the notebooks extra")
nbclient = pytest.importorskip("nbclient", reason="needs the notebooks extra")
pytest.importorskip("matplotlib", reason="needs the notebooks extra")
pytest.importorskip("ipykernel", reason="needs the notebooks extra")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SAMPLE = ROOT / "notebooks" / "data"
_SAVED = re.compile(r"analysis\.save\(fig, '([\w-]+)'\)")


def test_there_are_notebooks_and_a_sample() -> None:
    assert NOTEBOOKS, "no notebooks under notebooks/"
    files = sorted(SAMPLE.glob("*.json"))
    assert files, f"no `hotpath bench --json` sample under {SAMPLE}"
    for path in files:
        run = json.loads(path.read_text())
        assert run["environment"]["git_sha"], f"{path.name} must say which commit produced it"
        assert run["sections"], f"{path.name} holds no section"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook executes without error and writes the figures it names."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "hotpath", "language": "python"})
    )
    figures = tmp_path / "figures"
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("HOTPATH_FIGURES", str(figures))
    monkeypatch.setenv("HOTPATH_RESULTS", str(SAMPLE))
    monkeypatch.setenv("MPLBACKEND", "Agg")

    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell("import sys; print(sys.executable)")
    probe["id"] = "probe"
    nb.cells.insert(0, probe)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()

    assert nb.cells[0].outputs[0]["text"].strip() == sys.executable
    source = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    names = _SAVED.findall(source)
    assert names, f"{path.name} saves no figure"
    for name in names:
        png = figures / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert (ROOT / "notebooks" / "figures" / f"{name}.png").is_file(), (
            f"figure {name}.png is not committed under notebooks/figures/"
        )
