"""Families -> implementations: the one place that lists, checks and builds them.

Each family's package (`impl/<family>/__init__.py`) holds its contract and one literal table,
`IMPLEMENTATIONS`, with `REFERENCE` naming the implementation parity tests compare against.
This module reads those tables; it imports an implementation's module only in `create()`.

    registry.families()            # ("decode", "encode", "pool", "accesslog")
    registry.all_families()        # those, then "runtime" (the HTTP server itself)
    registry.names("decode")       # every registered implementation, reference first
    registry.available("decode")   # those whose optional dependency imports here
    registry.reference("decode")   # the parity reference
    registry.create("decode", "simdjson", **options)
"""

from __future__ import annotations

import importlib
from functools import cache
from types import MappingProxyType
from typing import Any

from impl._table import Entry

_FAMILY_PACKAGES = MappingProxyType(
    {
        "decode": "impl.decode",
        "encode": "impl.encode",
        "pool": "impl.pool",
        "accesslog": "impl.accesslog",
        "runtime": "impl.runtime",
    }
)
#: families whose implementations run as objects in the server's process (a `hotpath bench`
#: section, a `hotpath profile` loop and an asv suite each); the runtime is the server itself
_IN_PROCESS = ("decode", "encode", "pool", "accesslog")


class UnavailableError(ImportError):
    """The implementation exists but its optional dependency does not import here."""


def families() -> tuple[str, ...]:
    """The in-process families, in hot-path order."""
    return _IN_PROCESS


def all_families() -> tuple[str, ...]:
    """Every family the server picks: the in-process ones, then the runtime."""
    return tuple(_FAMILY_PACKAGES)


def _package(family: str) -> Any:
    try:
        return importlib.import_module(_FAMILY_PACKAGES[family])
    except KeyError:
        raise LookupError(
            f"unknown family {family!r}; known: {', '.join(_FAMILY_PACKAGES)}"
        ) from None


@cache
def _entries(family: str) -> MappingProxyType[str, Entry]:
    package = _package(family)
    table = {entry.name: entry for entry in package.IMPLEMENTATIONS}
    if len(table) != len(package.IMPLEMENTATIONS):
        raise RuntimeError(f"{family}: duplicate names in IMPLEMENTATIONS")
    if package.REFERENCE not in table:
        raise RuntimeError(f"{family}: REFERENCE {package.REFERENCE!r} is not in the table")
    return MappingProxyType(table)


def reference(family: str) -> str:
    """The implementation every other one in `family` is compared against."""
    return _package(family).REFERENCE


def entry(family: str, name: str) -> Entry:
    """The table row for `name`; `LookupError` naming the known ones if there is none."""
    entries = _entries(family)
    try:
        return entries[name]
    except KeyError:
        raise LookupError(
            f"no {family} implementation {name!r}; known: {', '.join(names(family))}"
        ) from None


def names(family: str) -> tuple[str, ...]:
    """Every registered implementation of `family`, the reference first, then table order."""
    ref = reference(family)
    return (ref, *(name for name in _entries(family) if name != ref))


@cache
def unavailable_reason(family: str, name: str) -> str | None:
    """Why `name` cannot run here (which import failed, and how to install it), or None."""
    return entry(family, name).unavailable_reason(family)


def available(family: str) -> tuple[str, ...]:
    """The implementations of `family` whose optional dependencies import on this machine."""
    return tuple(name for name in names(family) if unavailable_reason(family, name) is None)


def create(family: str, name: str, **options: Any) -> Any:
    """A ready implementation object; `UnavailableError` with the install hint if it cannot run."""
    row = entry(family, name)
    reason = unavailable_reason(family, name)
    if reason is not None:
        raise UnavailableError(reason)
    module = importlib.import_module(row.module)
    return module.create(**options)
