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


#: every Markdown page a reader follows links from (top-level folders' READMEs included, not
#: those that tools write into hidden folders such as .pytest_cache)
PAGES = sorted(
    {ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/*.md")}
    | {p for p in ROOT.glob("*/README.md") if not p.parent.name.startswith(".")}
)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces -."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    """Every relative link names a file that exists, and a `#section` in a .md file it has."""
    links = [(m.group(1), m.group(2)) for m in LINK.finditer(doc.read_text())]
    missing = [t for t, _ in links if not (doc.parent / t).exists()]
    assert not missing, missing
    dead = [
        f"{t}{anchor}"
        for t, anchor in links
        if anchor and t.endswith(".md") and anchor[1:] not in _anchors(doc.parent / t)
    ]
    assert not dead, dead


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages and all(f"({page})" in index for page in pages)
