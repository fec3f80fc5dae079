"""The row type of every implementation table, and the two questions asked of a table.

`impl.registry` reads the families' tables through these; the encode family's table of legacy
JSON derivations uses the same row type and the same two functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One implementation: its registry name, the module that builds it and what it imports.

    The module named by `module` exposes `create(**options)`. `requires` lists the optional
    top-level modules it needs; `extra` is the pyproject extra that installs them; `hint`, when
    set, replaces the generated install hint (for what an extra cannot install, e.g. a build).
    """

    name: str
    module: str
    summary: str
    requires: tuple[str, ...] = ()
    extra: str | None = None
    hint: str | None = None

    @property
    def install_hint(self) -> str:
        if self.hint is not None:
            return self.hint
        if self.extra is None:
            return "part of the core install"
        return f"pip install 'hotpath[{self.extra}]'"

    def unavailable_reason(self, label: str) -> str | None:
        """Why this row cannot run here (which import failed, how to install it), or None."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError as exc:  # a missing package, or one installed but broken
                hint = self.install_hint
                return f"{label}/{self.name} needs {module!r} ({exc}); install with {hint}"
        return None


def lookup(rows: Iterable[Entry], name: str, what: str) -> Entry:
    """The row called `name`; `LookupError` naming the known ones if there is none."""
    rows = tuple(rows)
    for row in rows:
        if row.name == name:
            return row
    raise LookupError(f"no {what} {name!r}; known: {', '.join(row.name for row in rows)}")
