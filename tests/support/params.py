"""pytest params over a table of implementations: every name is a test id, and the ones that
cannot run here are skipped with their reason (absence stays visible, never silently dropped)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from impl import registry


def skipped_unless_available(names: Iterable[str], reason_of: Callable[[str], object]) -> list:
    """One param per name, skipped with `reason_of(name)` when that is not None."""
    params = []
    for name in names:
        reason = reason_of(name)
        marks = pytest.mark.skipif(reason is not None, reason=str(reason))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def family_params(family: str) -> list:
    """Every registered name of `family`, reference first; unavailable ones skipped (hint)."""
    return skipped_unless_available(
        registry.names(family), lambda name: registry.unavailable_reason(family, name)
    )
