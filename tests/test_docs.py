"""The documentation a clone needs is in the clone: no pointer outside it, no dead link."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: names of documents that live outside the repository, and a path out of it
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|VLLM_BODY|TINKER_SDK|\.\./shared")
#: a Markdown link or image target that is a relative path
LINK = re.compile(r"\]\(((?!https?://|#)[^)\s#]+)(#[^)\s]*)?\)")


def _tracked() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (the file list comes from git ls-files)")
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_nothing_points_outside_the_repository():
    """Code, docstrings, --help texts and docs cite docs/, not documents a clone lacks."""
    this = Path(__file__).resolve()
    found = []
    for path in _tracked():
        if path == this or path.suffix not in {".py", ".md", ".proto", ".toml", ".ipynb", ""}:
            continue
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not found, found


@pytest.mark.parametrize(
    "doc", sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")]), ids=lambda p: p.name
)
def test_relative_links_resolve(doc: Path):
    targets = [m.group(1) for m in LINK.finditer(doc.read_text())]
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert not missing, missing


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages and all(f"({page})" in index for page in pages)
