"""Each commit's server as a source tree beside this one: what the end-to-end stage runs.

`tree_of(commit, workdir)` exports a commit (`git archive`) into `workdir/<sha>` once and reuses
it; `python -m impl.cli serve` started in that directory imports that commit's `impl` with this
interpreter and its packages (`impl.harness.procs.start_server(cwd=)`). The compiled decoders
are copied from this working tree when everything they are built from (`NATIVE_SOURCES`:
`setup.py` and every file under `impl/decode/_native/`, sources, headers and the table
generator) is the same in the commit (`same_native`), else built in the tree (without g++ or
simdjson they stay missing there, as in any install). `pins(trees)` names
one implementation per family that every tree has, so that no server calibrates at start-up and
both run the same implementations.
"""

from __future__ import annotations

import importlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from impl.ci import repo
from impl.ci.repo import git

#: the directory of the compiled decoders' sources (setup.py builds every extension from it)
NATIVE_DIR = "impl/decode/_native"
#: what the compiled decoders are built from, as git pathspecs: a directory stands for every
#: file under it (their .so are copied when these are unchanged)
NATIVE_SOURCES = ("setup.py", NATIVE_DIR)


def tree_of(commit: str, workdir: Path) -> Path:
    """The source tree of `commit` under `workdir` (exported once, then reused), with the
    compiled decoders in place."""
    sha = git("rev-parse", "--verify", commit)
    tree = workdir / sha
    if (tree / ".exported").exists():
        return tree
    partial = workdir / f"{sha}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", sha], cwd=repo.ROOT, check=True, capture_output=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as exported:
        exported.extractall(partial, filter="data")
    _native(sha, partial)
    (partial / ".exported").write_text(sha + "\n")
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    return tree


def same_native(sha: str) -> bool:
    """Whether commit `sha` has the same `NATIVE_SOURCES` as this working tree (edits not yet
    committed count; files git does not track do not)."""
    command = ["git", "diff", "--quiet", sha, "--", *NATIVE_SOURCES]
    return subprocess.run(command, cwd=repo.ROOT).returncode == 0


def _native(sha: str, tree: Path) -> None:
    """The compiled decoders in `tree`: this working tree's when built from the same sources,
    else built there (without g++ or simdjson they stay missing, as in any install)."""
    built = list((repo.ROOT / "impl").rglob("*.so"))
    if built and same_native(sha):
        for path in built:
            target = tree / path.relative_to(repo.ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        return
    if not (tree / "setup.py").exists():
        return
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        print(f"gate e2e: building {sha[:8]}'s compiled decoders failed:\n{done.stderr[-1500:]}")


def pins(trees: list[Path]) -> list[str]:
    """`hotpath serve` flags naming one implementation per family for every tree (so neither
    server calibrates): what this tree picks, else the first of the family's preference order
    that every tree has (an older commit may lack a newer implementation)."""
    from impl import pick, registry

    probe = "import json; from impl import registry as r; " + (
        "print(json.dumps({f: r.available(f) for f in r.families()}))"
    )
    available = []
    for tree in trees:
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True, check=True
        )
        available.append(json.loads(done.stdout.strip().splitlines()[-1]))
    flags: list[str] = []
    for family in registry.families():
        preference = importlib.import_module(f"impl.{family}").PREFERENCE
        for name in (pick.pick(family).name, *preference):
            if all(name in there.get(family, ()) for there in available):
                flags += [f"--{family}", name]
                break
    return flags
