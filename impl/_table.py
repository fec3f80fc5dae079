"""The row type of every family's implementation table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One implementation: its registry name, the module that builds it and what it imports.

    The module named by `module` exposes `create(**options)`. `requires` lists the optional
    top-level modules it needs; `extra` is the pyproject extra that installs them.
    """

    name: str
    module: str
    summary: str
    requires: tuple[str, ...] = ()
    extra: str | None = None

    @property
    def install_hint(self) -> str:
        if self.extra is None:
            return "part of the core install"
        return f"pip install 'hotpath[{self.extra}]'"
