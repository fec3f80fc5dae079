"""A component's counts by name, as /healthz shows them: one dict built the same way by the
body buffers, the intake and the store's keeper (a leaf module, importable from every wing)."""

from __future__ import annotations

from typing import Any


def figures(owner: Any, *names: str, **more: Any) -> dict[str, Any]:
    """`{name: owner.name}` for each of `names`, then `more`."""
    return {**{name: getattr(owner, name) for name in names}, **more}
