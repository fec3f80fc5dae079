"""The fixed commit the end-to-end stage also compares HEAD with: named in `.ci/reference`.

Comparing each commit only with its parent lets a loss through that comes in steps each under
the stage's line, however far they add up. So the stage also runs HEAD against
one fixed commit, the reference, and fails when HEAD is slower than it beyond the same line:
the cumulative loss. The reference is named in one committed file, `.ci/reference`: its first
line that is neither blank nor a `#` comment is the commit (any revision git resolves); the
other lines say why it is the reference. Moving the reference is a commit that edits the file,
with its why (a release, or an accepted slowdown). `gate --reference REV` overrides it for one
run; `--reference none` skips the comparison.
"""

from __future__ import annotations

import contextlib
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from impl.ci import repo, trees
from impl.ci.repo import GitFailed, commit_of, git

#: the file naming the reference, relative to the repository's root
FILE = Path(".ci") / "reference"
#: `--reference` value that skips the comparison
NONE = "none"


class BadReference(ValueError):
    """`.ci/reference` (or `--reference`) does not name a commit (the message says why)."""


@dataclass(frozen=True)
class Reference:
    """The named revision, why it is the reference, and where it was named."""

    rev: str
    why: str
    source: str


def parse(text: str, source: str = str(FILE)) -> Reference:
    """The reference a `.ci/reference` text names (BadReference: no commit line in it)."""
    lines = [line.strip() for line in text.splitlines()]
    named = [line for line in lines if line and not line.startswith("#")]
    if not named or len(named[0].split()) != 1:
        raise BadReference(
            f"{source}: its first line that is not blank or a # comment must be one commit "
            f"(a hash or any revision), found {named[0]!r}" if named else
            f"{source}: names no commit (its first line that is not a # comment is the commit)"
        )  # fmt: skip
    why = " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#")).strip()
    return Reference(named[0], why, source)


def named(option: str | None, root: Path | None = None) -> Reference | None:
    """The reference of a run: `option` (a revision, or `none`), else `.ci/reference`'s; None
    when there is none (`--reference none`, or no file)."""
    if option is not None:
        return None if option.lower() == NONE else Reference(option, "--reference", "--reference")
    path = (root or repo.ROOT) / FILE
    if not path.is_file():
        return None
    return parse(path.read_text(), str(FILE))


def resolve(reference: Reference) -> str | None:
    """The reference's full commit hash; in a shallow clone that lacks it, fetched first. None:
    this repository does not have it (the caller says so)."""
    sha = commit_of(f"{reference.rev}^{{commit}}")
    if sha is None and git("rev-parse", "--is-shallow-repository") == "true":
        with contextlib.suppress(GitFailed):
            git("fetch", "--quiet", "--depth=1", "origin", reference.rev)
        sha = commit_of(f"{reference.rev}^{{commit}}")
    return sha


def prepare(reference: Reference | None, base: str, head: str, workdir: Path) -> dict[str, Any]:
    """What the comparison with the reference needs: its commit and exported tree (`tree`), or
    why it is not compared, printed (no reference, the base or HEAD itself, not in this
    repository, or its tree cannot be exported)."""
    if reference is None:
        print("gate e2e: no reference (--reference none, or no .ci/reference): base only")
        return {"compared": False, "why": "no reference"}
    what = f"the reference {reference.rev} ({reference.source}: {reference.why or 'no why'})"
    sha = resolve(reference)
    if sha is None:
        print(f"gate e2e: NOT COMPARED with {what}: no such commit in this repository "
              "(a clone without it: fetch it, or move .ci/reference)")  # fmt: skip
        return {"compared": False, "why": f"{reference.rev}: no such commit", "rev": reference.rev}
    found = {"rev": reference.rev, "commit": sha}
    if sha in (base, head):
        side = "the base" if sha == base else "HEAD"
        print(f"gate e2e: {what} is {side}: compared above" if sha == base else
              f"gate e2e: {what} is HEAD: nothing to compare")  # fmt: skip
        return {**found, "compared": sha == base, "why": f"the reference is {side}"}
    try:
        tree = trees.tree_of(sha, workdir)
    except (OSError, subprocess.CalledProcessError, tarfile.TarError, GitFailed) as exc:
        stderr = getattr(exc, "stderr", None)
        detail = stderr.decode(errors="replace")[-500:] if isinstance(stderr, bytes) else ""
        print(f"gate e2e: NOT COMPARED with {what}: its tree cannot be exported: {exc} {detail}")
        return {**found, "compared": False, "why": f"cannot be exported: {exc}"}
    print(f"gate e2e: HEAD against {what}: the loss since it, whatever each commit cost")
    return {**found, "tree": tree}
