"""The options the store unit tests build a store from: TTLs no test outlives by accident, caps
no test reaches unless it means to, and a proto->JSON stand-in that shows the payload length."""

from __future__ import annotations

from typing import Any


def store_options(**overrides: Any) -> dict[str, Any]:
    """The defaults with `overrides` applied (a store's keyword arguments and its Retention's)."""
    options: dict[str, Any] = {
        "completed_ttl": 60.0,
        "retrieved_ttl": 10.0,
        "max_outstanding": 100,
        "max_result_bytes": 1 << 30,
        "to_json": lambda b: b'{"p":' + str(len(b)).encode() + b"}",
    }
    options.update(overrides)
    return options
