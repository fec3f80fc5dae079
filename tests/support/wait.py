"""Waiting in tests for a server, a process or a store to reach a state, without a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], what: str = "", deadline: float = 30.0) -> T:
    """Call `check()` until it returns something true (that value), or fail at the deadline
    saying what was awaited (`what`, else the check itself)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {deadline} s: {what or check}")
