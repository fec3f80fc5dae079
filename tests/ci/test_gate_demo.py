"""The gate demonstration's pieces (impl.ci.gate_demo); the demo itself takes ~10 min a run.

The slowdown patch must make the decoder the gate picks decode every body exactly twice and
still return the reference's result; the throwaway repository must hold a snapshot of the
working tree (untracked files too, ignored ones not) and the case commits on top of it, and
leave the source repository's git state alone.
"""

from __future__ import annotations

import pytest

from impl import registry
from impl.ci import gate_demo, gate_timers, repo
from impl.decode.parity import same
from impl.workloads.synthetic import body_for
from tests.support import asv_tiny as tiny


def test_slowdown_patch_decodes_twice(tmp_path):
    """The patched module of the picked decoder calls the real decode twice, same result."""
    picked = gate_timers.picked("decode")
    source = (repo.ROOT / gate_demo.decoder_module(picked)).read_text()
    path = tmp_path / "patched.py"
    path.write_text(source + gate_demo.SLOWDOWN)
    decoder = gate_demo.load_module(path, "_test_gate_demo_patched").create()
    inner, calls = decoder._decoder, []
    real = inner.decode
    inner.decode = lambda body, **options: calls.append(body) or real(body, **options)
    body = body_for(128, kind="vllm")
    got = decoder.decode(body)
    assert len(calls) == 2
    assert same(got, registry.create("decode", registry.reference("decode")).decode(body))


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A source repository: one commit, then an edited, an untracked and an ignored file."""
    root = tmp_path / "source"
    (root / "pkg").mkdir(parents=True)
    (root / ".gitignore").write_text("ignored.txt\n")
    (root / "pkg" / "mod.py").write_text("def create():\n    return 1\n")
    (root / "gone.txt").write_text("deleted later\n")
    tiny.git(root, "init", "-q", "-b", "main")
    tiny.git(root, "add", "-A")
    tiny.git(root, "commit", "-qm", "first")
    (root / "pkg" / "mod.py").write_text("def create():\n    return 2\n")
    (root / "new.txt").write_text("untracked\n")
    (root / "ignored.txt").write_text("ignored\n")
    monkeypatch.setattr(gate_demo, "ROOT", root)
    return root


@pytest.mark.heavy
def test_snapshot_and_cases(source, tmp_path):
    """The snapshot is the working tree; each case is one commit on it; the source is untouched."""
    head = tiny.git(source, "rev-parse", "HEAD")
    repo = tmp_path / "demo" / "repo"
    base = gate_demo.snapshot(repo)
    assert (repo / "pkg" / "mod.py").read_text().endswith("return 2\n")
    assert (repo / "new.txt").exists() and not (repo / "ignored.txt").exists()
    slow = gate_demo.case_commit(repo, base, "pkg/mod.py", "slow")
    unchanged = gate_demo.case_commit(repo, base, "pkg/mod.py", "unchanged")
    assert tiny.git(repo, "rev-parse", "HEAD") == base
    assert tiny.git(repo, "diff", "--name-only", base, slow) == "pkg/mod.py"
    assert gate_demo.SLOWDOWN.strip() in tiny.git(repo, "show", f"{slow}:pkg/mod.py")
    assert tiny.git(repo, "rev-parse", "unchanged") == unchanged
    diff = tiny.git(repo, "diff", "--unified=0", base, unchanged).splitlines()
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed and all(line == "+" or line.startswith("+# ") for line in changed), changed
    # The source changes again: a new snapshot follows it (a deleted file goes too).
    (source / "gone.txt").unlink()
    assert gate_demo.snapshot(repo) != base
    assert not (repo / "gone.txt").exists()
    assert gate_demo.snapshot(repo) == gate_demo.snapshot(repo)  # nothing new: no new commit
    assert tiny.git(source, "rev-parse", "HEAD") == head
    assert tiny.git(source, "branch", "--format=%(refname:short)") == "main"
    status = [line.strip() for line in tiny.git(source, "status", "--porcelain").splitlines()]
    assert status == ["D gone.txt", "M pkg/mod.py", "?? new.txt"]


def test_snapshot_brings_built_extensions_uncommitted(source, tmp_path):
    """Ignored built extensions under impl/ are copied beside the snapshot (the gate process
    there must pick what this tree picks) but never committed; other ignored files stay out."""
    (source / ".gitignore").write_text("ignored.txt\n*.so\n")
    (source / "impl" / "decode").mkdir(parents=True)
    (source / "impl" / "decode" / "_fast.so").write_bytes(b"\x7fELF")
    repo = tmp_path / "demo" / "repo"
    gate_demo.snapshot(repo)
    assert (repo / "impl" / "decode" / "_fast.so").read_bytes() == b"\x7fELF"
    assert "impl/decode/_fast.so" not in tiny.git(repo, "ls-files")
    assert not (repo / "ignored.txt").exists()
