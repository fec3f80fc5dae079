"""The body budget: at most `--max-body-bytes-in-flight` upstream body bytes held at once.

Every router answer's body is held by the server (on its loop, or in a fetch process, which
asks the server before it reads) from when its headers arrive until its SampleResponse bytes
exist. `BodyBudget` is the server's one count of those bytes, its waiters served in order;
`Admission` is one forward's hold on it, the pool contract's `admit`. The budget delays reading
an answer, never sending a request: a body that does not fit yet waits unread in its socket,
and TCP flow control holds the router.
"""

from __future__ import annotations

import asyncio
import collections


class BodyBudget:
    """At most `cap` upstream body bytes held at once; FIFO waiters; one body may exceed it alone.

    A forward takes its body's size when the router's answer starts to arrive (its
    Content-Length, or the expected size for an answer without one: `Admission`), settles it to
    the real size once the body is read, and releases it when the proto bytes exist (or the
    forward failed). While the budget is full, further answers wait unread in their sockets
    (TCP flow control holds the router); requests are never kept from being sent by it.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self.peak = 0
        self.holders = 0
        self.peak_holders = 0
        self.waited = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> None:
        if not self._waiters and self._fits(size):
            self._take(size)
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((size, future))
        self.waited += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted while being cancelled: give it back
            else:
                self._waiters.remove((size, future))
                self._wake()
            raise

    def settle(self, reserved: int, actual: int) -> int:
        """Replace a reservation by the real size (the body is already here); the new size."""
        self.used += actual - reserved
        self.peak = max(self.peak, self.used)
        if actual < reserved:
            self._wake()
        return actual

    def release(self, size: int) -> None:
        self.used -= size
        self.holders -= 1
        self._wake()

    def _fits(self, size: int) -> bool:
        return self.holders == 0 or self.used + size <= self.cap

    def _take(self, size: int) -> None:
        self.used += size
        self.holders += 1
        self.peak = max(self.peak, self.used)
        self.peak_holders = max(self.peak_holders, self.holders)

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            size, future = self._waiters.popleft()
            if not future.done():
                self._take(size)
                future.set_result(None)

    def stats(self) -> dict[str, int]:
        return {
            "cap_bytes": self.cap,
            "bytes": self.used,
            "peak_bytes": self.peak,
            "bodies": self.holders,
            "peak_bodies": self.peak_holders,
            "waiting": len(self._waiters),
            "waited_total": self.waited,
        }


class Admission:
    """One forward's hold on the `BodyBudget`: the pool contract's `admit` (awaited between the
    router answer's headers and its body) takes the body's Content-Length, or `expected` when
    the answer has none; a second answer (the retry after a 5xx) first gives the first one's
    share back. `settle` replaces the hold by the size really read; `release` ends it.

    A body is held once while it is read: every pool keeps what it read so far (its chunks, or
    aiohttp's one buffer for a long answer) and makes one `bytes` of it when the last byte
    arrives (a join or a copy, synchronous on the event loop that read it). That second copy
    exists for one body at a time per loop (the server's, each fetch process's) and only while
    it runs, so the bound is the budget plus one body per loop, like the decoded arrays, which
    the budget does not count either."""

    __slots__ = ("budget", "expected", "held", "holding")

    def __init__(self, budget: BodyBudget, expected: int) -> None:
        self.budget, self.expected = budget, expected
        self.held, self.holding = 0, False

    async def __call__(self, status: int, length: int | None) -> None:
        self.release()
        size = self.expected if length is None else length
        await self.budget.acquire(size)
        self.held, self.holding = size, True

    def settle(self, actual: int) -> None:
        if self.holding:
            self.held = self.budget.settle(self.held, actual)

    def release(self) -> None:
        if self.holding:
            self.holding = False
            self.budget.release(self.held)
