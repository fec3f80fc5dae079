"""The `hotpath bench` sections' shared report type (timing and tables: `impl.measure`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Section:
    """One family's part of the report."""

    family: str
    title: str
    table: str
    rows: list[dict[str, Any]]
    #: rows for `impl.pick.record`: {"input", "size_bytes", "cost": {name: lower-is-better}}
    measurements: list[dict[str, Any]] = field(default_factory=list)
    notes: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
