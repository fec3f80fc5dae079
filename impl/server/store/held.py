"""Why held polls answered: per-process counters, shown on /healthz as `held_polls`.

A held poll (`retrieve_future` waiting for its sample, `retrieve_futures` waiting for a
session's completions) ends for one of a few reasons. Each store settles a held poll's waiter
with the reason that released it, and counts the reason of the wait that ended the poll, so a
test (or an operator) can tell a poll woken by a completion from one that sat out its hold
without timing it:

- `at_once`: answered without waiting (already done, already due, or a hold of 0);
- `woken`: a completion woke it (in this process, or its message from another process);
- `batch_deadline`: the session's batch wait ended (`retrieve_futures` only);
- `hold_expired`: the hold ended first;
- `released`: shutdown, or the shared store's subscriber (re)connected and every held poll
  re-reads.

The counts are this process's (a held poll lives in one process), also on a shared store.
"""

from __future__ import annotations

import asyncio

AT_ONCE, WOKEN, BATCH_DEADLINE, HOLD_EXPIRED, RELEASED = (
    "at_once",
    "woken",
    "batch_deadline",
    "hold_expired",
    "released",
)
REASONS = (AT_ONCE, WOKEN, BATCH_DEADLINE, HOLD_EXPIRED, RELEASED)
#: `future`: retrieve_future's wait for one sample; `session`: a retrieve_futures poll
KINDS = ("future", "session")


class HeldPolls:
    """How many held polls of each kind answered for each reason (this process)."""

    def __init__(self) -> None:
        self.counts = {kind: dict.fromkeys(REASONS, 0) for kind in KINDS}

    def count(self, kind: str, reason: str) -> None:
        self.counts[kind][reason] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {kind: dict(reasons) for kind, reasons in self.counts.items()}


def settle(waiter: asyncio.Future[str], reason: str) -> None:
    """Release a held poll's waiter with the reason (the first reason wins)."""
    if not waiter.done():
        waiter.set_result(reason)


async def hold_until(waiter: asyncio.Future[str], until: float, deadline: float) -> str:
    """Wait on a held poll's `waiter` until loop time `until` at most; the reason it answers:
    whatever settled it first (a completion, shutdown), else `batch_deadline` when `until` is a
    batch's end before the hold's `deadline`, `hold_expired` when it is the hold's end."""
    ends = HOLD_EXPIRED if until >= deadline else BATCH_DEADLINE
    timer = asyncio.get_running_loop().call_at(until, settle, waiter, ends)
    try:
        return await waiter
    finally:
        timer.cancel()
