"""The repository the CI tools work on: its root directory and one way to ask git about it.

Every `impl.ci` module reads `ROOT` from here (tests point it at a throwaway repository with
`monkeypatch.setattr(repo, "ROOT", path)`, which moves every tool at once) and runs git through
`git()`, so a failing git command raises one error that carries git's own message.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: the checkout this package was imported from
ROOT = Path(__file__).resolve().parents[2]


class GitFailed(RuntimeError):
    """A git command exited non-zero (the message has the command and git's error output)."""


def git(*args: str, cwd: Path | None = None) -> str:
    """stdout of `git ARGS` (stripped) in `cwd`, default `ROOT`; GitFailed when git fails."""
    done = subprocess.run(["git", *args], cwd=cwd or ROOT, capture_output=True, text=True)
    if done.returncode:
        raise GitFailed(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def commit_of(name: str, cwd: Path | None = None) -> str | None:
    """The full hash `name` resolves to (`git rev-parse --verify`), or None when it names
    nothing."""
    try:
        return git("rev-parse", "--verify", "--quiet", name, cwd=cwd)
    except GitFailed:
        return None
