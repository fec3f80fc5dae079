"""New samples in bounded portions per event-loop turn while finished ones wait to go out.

An asample costs the server more than anything else a sample needs (the request, then the
forward it starts: the pool's request, the router's answer, decode, encode, store), and the SDK
keeps up to 400 of them in flight. Served as they come, a burst of them fills every loop turn:
each turn runs hundreds of new submissions, and a `retrieve_futures` poll or a result's fetch
that arrived meanwhile waits for the whole turn, then for the next. With the session protocol a
sample needs two such requests after it completed (the poll that reports it, then its fetch),
so under a burst results come out only once the submissions are over, later than with one
held poll per sample, which is answered in the completion's own turn with no request needed
(docs/experiments.md has the runs).

`Intake.turn()` is the first thing asample awaits. While results are going out (a poll or a
fetch was served in the last `CONTENDED` seconds: `finishing()`, called by those routes), at
most `per_turn` asamples proceed per loop turn, in arrival order; the others wait for a later
turn (a future each, no busy loop). Polls, fetches and completions are never held, so they run
in the turn they arrive in. When nothing is going out (a burst's first submissions, or the
seconds a queueing engine takes to generate) asamples are not bounded at all: the intake never
holds back work that would feed an idle engine. The total work is the same; the order changes
from "start everything, then finish" to "finish what was started, then start more", which is
what a sample's latency measures. `per_turn` 0 admits every asample at once (as
`--baseline` does).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from impl._figures import figures

#: seconds after a poll or a fetch during which asamples are bounded per turn
CONTENDED = 0.25


class Intake:
    """Admits at most `per_turn` asamples per event-loop turn while results go out (0: no
    bound), FIFO."""

    def __init__(self, per_turn: int, contended: float = CONTENDED) -> None:
        if per_turn < 0:
            raise ValueError(f"per_turn must be >= 0, got {per_turn!r}")
        self.per_turn = per_turn
        self.contended = contended
        self.admitted_this_turn = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False
        self._finishing_until = float("-inf")
        #: asamples admitted, of which had to wait for a later turn; turns that admitted any
        self.admitted = 0
        self.deferred = 0
        self.turns = 0
        self.peak_waiting = 0

    def finishing(self) -> None:
        """A poll or a fetch is being served: bound the asamples for the next CONTENDED s
        (the process's monotonic clock: on Python 3.11 each `asyncio.get_running_loop()` is
        a getpid system call, and this runs on every poll)."""
        if self.per_turn:
            self._finishing_until = time.monotonic() + self.contended

    def bounded(self) -> bool:
        """True while results are going out (asamples then wait their turn)."""
        return time.monotonic() < self._finishing_until

    async def turn(self) -> None:
        """Return once this asample may proceed (at once while the turn has room)."""
        if self.per_turn == 0:
            return
        if not self.waiting and (self.admitted_this_turn < self.per_turn or not self.bounded()):
            self.admitted_this_turn += 1
            self.admitted += 1
            if not self._scheduled:  # `_arm`, inlined: this is every asample's path
                self._arm()
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiting.append(waiter)
        self.deferred += 1
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        self._arm()
        await waiter  # cancelled (client gone, shutdown): `_next_turn` skips it

    def _arm(self) -> None:
        """Run `_next_turn` once in the next loop turn (call_soon callbacks scheduled during a
        turn run in the following one)."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._scheduled = False
        if self.admitted_this_turn:
            self.turns += 1
        self.admitted_this_turn = 0
        room = self.per_turn if self.bounded() else len(self.waiting)
        while self.waiting and self.admitted_this_turn < room:
            waiter = self.waiting.popleft()
            if waiter.done():  # cancelled while it waited
                continue
            waiter.set_result(None)
            self.admitted_this_turn += 1
            self.admitted += 1
        if self.waiting or self.admitted_this_turn:
            self._arm()

    def stats(self) -> dict[str, int]:
        return figures(
            self,
            "per_turn",
            "admitted",
            "deferred",
            "turns",
            "peak_waiting",
            waiting=len(self.waiting),
        )
