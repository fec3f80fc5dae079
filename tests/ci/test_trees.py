"""Which compiled decoders a commit's exported tree gets (impl.ci.trees): reused or rebuilt.

The end-to-end stage runs each commit's server from `git archive` of it; the compiled decoders
of this working tree are copied in only when everything they are built from is the same in the
commit: `setup.py` and every file under `impl/decode/_native/` (sources, headers, the table
generator). A commit whose header differs must get its own build, never this tree's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from impl.ci import repo, trees
from tests.support import asv_tiny as tiny

#: stands for the real build: writes the extension, saying it was built in that tree
SETUP = 'from pathlib import Path\nPath("impl/decode/_fast.so").write_bytes(b"built")\n'
COPIED = b"\x7fELF this working tree's build"


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A repository laid out like this one (one commit), with a built extension, as ROOT."""
    root = tmp_path / "source"
    native = root / "impl" / "decode" / "_native"
    (native / "common").mkdir(parents=True)
    (root / ".gitignore").write_text("*.so\n")
    (root / "setup.py").write_text(SETUP)
    (native / "common" / "reader.h").write_text("// reader v1\n")
    (native / "fast.cpp").write_text('#include "common/reader.h"\n')
    (native / "powers_of_five.py").write_text("TABLE = 1\n")
    tiny.git(root, "init", "-q", "-b", "main")
    tiny.git(root, "add", "-A")
    tiny.git(root, "commit", "-qm", "first")
    (root / "impl" / "decode" / "_fast.so").write_bytes(COPIED)
    monkeypatch.setattr(repo, "ROOT", root)
    return root


def _extension(tree: Path) -> bytes:
    return (tree / "impl" / "decode" / "_fast.so").read_bytes()


def test_unchanged_sources_reuse_this_build(source, tmp_path):
    first = tiny.git(source, "rev-parse", "HEAD")
    assert trees.same_native(first)
    assert _extension(trees.tree_of(first, tmp_path / "e2e")) == COPIED


@pytest.mark.parametrize(
    "changed", ["common/reader.h", "powers_of_five.py", "fast.cpp", "common/new.h"]
)
def test_a_changed_native_file_makes_the_commit_build_its_own(source, tmp_path, changed):
    """A header (or the table generator, a source, a new header) changed in a later commit:
    the earlier commit's tree is built, not given this working tree's extension."""
    first = tiny.git(source, "rev-parse", "HEAD")
    path = source / "impl" / "decode" / "_native" / changed
    path.write_text(path.read_text() + "// v2\n" if path.exists() else "// new\n")
    tiny.git(source, "add", "-A")
    tiny.git(source, "commit", "-qm", f"change {changed}")
    second = tiny.git(source, "rev-parse", "HEAD")
    assert not trees.same_native(first) and trees.same_native(second)
    assert _extension(trees.tree_of(first, tmp_path / "e2e")) == b"built"
    assert _extension(trees.tree_of(second, tmp_path / "e2e")) == COPIED


def test_an_uncommitted_header_edit_counts(source, tmp_path):
    """This tree's extension was built from the edited header: HEAD's tree builds its own."""
    header = source / "impl" / "decode" / "_native" / "common" / "reader.h"
    header.write_text("// being edited\n")
    assert _extension(trees.tree_of("HEAD", tmp_path / "e2e")) == b"built"


def test_native_dir_is_what_setup_builds_from():
    """NATIVE_DIR is the directory setup.py compiles the extensions from."""
    setup = (repo.ROOT / "setup.py").read_text()
    assert re.search(rf'^NATIVE = Path\("{re.escape(trees.NATIVE_DIR)}"\)$', setup, re.M)
    assert (repo.ROOT / trees.NATIVE_DIR).is_dir()
