"""Per-session completion logs: what `POST /api/v1/retrieve_futures` reads (Tinker SDK 0.38).

With `sample_use_retrieve_futures`, the SDK runs one background poller per sampling session and
clone (`cloned_sampler_id` = `seq_id // 1_000_000_000`) instead of one held `retrieve_future`
per sample. The server keeps, per such *target*, a log of completions in the order they
happened, each at a position one above the previous. A poll names the last position it has
seen (`prev_cursor`); the server drops every entry at or before it (seen: the client got it)
and answers the entries after it, with the new cursor (the last position answered, or
`prev_cursor` when none). An answer lost on its way keeps its entries: only a later
`prev_cursor` drops them.

Positions start above a base taken from the clock when the store starts, so a cursor a
client got from an earlier server (a restart lost the in-memory records) is recognised as
unknown instead of silently skipping the new log's entries. Entries of records already evicted
are dropped from the front by the store's sweep; the log never outgrows the live records.

When a poll may answer is `hold_for`'s rule, Nagle's algorithm with a cork: a poll answers at
once when completions are waiting and no batch is filling (one completion, the target's last
pending sample, or `batch_size` of them); a batch fills only while completions arrive faster
than polls carry them (two or more arrived while the previous answer was on its way) and keep
arriving (no pause of four times their mean interval), for at most `batch_wait` seconds
after the oldest of them arrived. An idle session's completion is therefore answered at once,
and a busy one's polls carry up to `batch_size` completions each (a completion wakes a held
poll only when it makes the answer due: the first, a full batch, or the last pending).
`SessionLogs` is the embedded (in-memory) implementation the MemoryStore delegates to; a
shared store keeps the same facts in its own storage (its scripts apply the same rule).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from impl.server.store.held import AT_ONCE, RELEASED, WOKEN, HeldPolls, hold_until, settle

#: A clone's seq_ids all lie in one block of this size (SDK 0.38: `seq_id // 1_000_000_000`).
CLONE_BLOCK = 1_000_000_000

#: (sampling_session_id, cloned_sampler_id): one SDK poller's target.
Target = tuple[str, int]


def target_of(sampling_session_id: str, seq_id: int) -> Target:
    """The poller target a sample of `(sampling_session_id, seq_id)` belongs to."""
    return sampling_session_id, seq_id // CLONE_BLOCK


def cursor_base() -> int:
    """First position of every log of a store started now: milliseconds since the epoch
    shifted left 10 bits. A later store's base is above every position an earlier one handed
    out (room for 1024 completions per millisecond of uptime, a million a second), and
    positions stay below 2**53 until the year 2248, exact as doubles (JSON readers, and the
    shared store's Lua scripts)."""
    return int(time.time() * 1000) << 10


#: A filling batch is answered once no completion came for PAUSE_INTERVALS times their mean
#: interval (a pause: the flow slowed below what polls carry), but never sooner than
#: PAUSE_FLOOR seconds after the newest: completions that land in one event-loop turn have no
#: interval between them, and on a busy machine a turn, or a store's round trip, takes
#: milliseconds (with 2 intervals and 2 ms, a loaded shared store saw pauses in a steady flow).
PAUSE_INTERVALS = 4
PAUSE_FLOOR = 0.005


def hold_for(
    waiting: int,
    pending: int,
    batch: int,
    first_at: float,
    last_at: float,
    now: float,
    batch_wait: float,
) -> float:
    """Seconds a poll with `waiting` (>= 1) completions should still hold (0: answer now).

    `pending`: the target's samples not finished yet; `batch`: the most one answer carries
    (`min(limit, batch_size)`); `first_at`/`last_at`: when the oldest and the newest waiting
    completion arrived; `batch_wait`: the longest a batch fills. Due at once when nothing more
    is coming, the batch is full, or only one completion is waiting (it came no faster than the
    previous answer took: nothing to batch); otherwise the batch fills until the completions
    pause (no new one for PAUSE_INTERVALS times their mean interval, PAUSE_FLOOR at least) or
    `batch_wait` after the oldest."""
    if pending <= 0 or waiting >= batch or waiting < 2:
        return 0.0
    interval = (last_at - first_at) / (waiting - 1)
    until = min(last_at + max(PAUSE_INTERVALS * interval, PAUSE_FLOOR), first_at + batch_wait)
    return max(0.0, until - now)


class Entry(NamedTuple):
    """One completion: its log position, request id, `finished`/`failed`, payload bytes, and
    the loop time it arrived (batching; 0 where the store keeps it elsewhere)."""

    position: int
    request_id: str
    state: str
    size: int
    at: float = 0.0


class SessionLog:
    """One target's completions after the last acknowledged cursor, and its held polls."""

    __slots__ = ("base", "entries", "head", "pending", "waiters")

    def __init__(self, base: int) -> None:
        self.base = base
        self.head = base  # position of the newest entry ever appended
        self.entries: deque[Entry] = deque()
        #: samples of this target submitted and not yet finished
        self.pending = 0
        self.waiters: list[asyncio.Future[str]] = []

    def knows(self, cursor: int) -> bool:
        """True for 0 (from the beginning) and for any position this log has handed out."""
        return cursor == 0 or self.base <= cursor <= self.head

    def append(self, request_id: str, state: str, size: int, at: float) -> None:
        self.head += 1
        self.entries.append(Entry(self.head, request_id, state, size, at))

    def trim(self, cursor: int) -> None:
        """Drop the entries at or before `cursor` (the client has seen them)."""
        entries = self.entries
        while entries and entries[0].position <= cursor:
            entries.popleft()

    def first(self, limit: int) -> list[Entry]:
        entries = self.entries
        if len(entries) <= limit:
            return list(entries)
        return [entries[i] for i in range(limit)]

    def wake(self, reason: str = WOKEN) -> None:
        if self.waiters:
            for waiter in self.waiters:
                settle(waiter, reason)
            self.waiters = []


class SessionLogs:
    """Every target's log, created on its first submitted sample or first poll."""

    def __init__(
        self, batch_wait: float, batch_size: int = 32, held: HeldPolls | None = None
    ) -> None:
        self.batch_wait = batch_wait
        #: why held polls answered (the store's counters, shown on /healthz)
        self.held = held if held is not None else HeldPolls()
        self.batch_size = max(batch_size, 1)
        self.logs: dict[Target, SessionLog] = {}
        self.base = cursor_base()
        self.released = False  # shutdown: held polls answer at once

    def log(self, target: Target) -> SessionLog:
        log = self.logs.get(target)
        if log is None:
            log = self.logs[target] = SessionLog(self.base)
        return log

    def submitted(self, key: tuple[str, int]) -> None:
        """A new sample of `key = (sampling_session_id, seq_id)` is pending."""
        self.log(target_of(*key)).pending += 1

    def finished(self, key: tuple[str, int], request_id: str, ok: bool, size: int) -> None:
        """The sample of `key` finished (`ok`, `size` payload bytes) or failed."""
        log = self.log(target_of(*key))
        log.pending -= 1
        now = asyncio.get_running_loop().time()
        log.append(request_id, "finished" if ok else "failed", size if ok else 0, now)
        waiting = len(log.entries)
        if waiting == 1 or waiting >= self.batch_size or log.pending <= 0:
            log.wake()  # the first completion, a full batch, or the last one pending

    def forget(self, evicted: Callable[[str], bool]) -> None:
        """Drop, from the front of every log, completions whose records are evicted; and the
        logs that never had a completion and are idle (a poll for a clone that never sampled
        leaves nothing behind)."""
        unused = []
        for target, log in self.logs.items():
            entries = log.entries
            while entries and evicted(entries[0].request_id):
                entries.popleft()
            if log.head == log.base and not log.pending and not log.waiters:
                unused.append(target)
        for target in unused:
            del self.logs[target]

    def release(self) -> None:
        self.released = True
        for log in self.logs.values():
            log.wake(RELEASED)

    async def answer(
        self, target: Target, cursor: int, hold: float, limit: int
    ) -> tuple[list[Entry], int] | None:
        """See `FutureStore.session_completions`."""
        log = self.log(target)
        if not log.knows(cursor):
            return None
        log.trim(cursor)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold
        # what released the last wait: why this poll answers now
        reason = RELEASED if self.released else AT_ONCE
        batch = min(limit, self.batch_size)
        while not self.released:
            until = deadline
            entries = log.entries
            if entries:
                now = loop.time()
                wait = hold_for(
                    len(entries), log.pending, batch, entries[0].at, entries[-1].at, now,
                    self.batch_wait,
                )  # fmt: skip
                if wait <= 0:
                    break
                until = min(deadline, now + wait)
            if loop.time() >= until:
                break
            waiter = loop.create_future()
            log.waiters.append(waiter)
            try:
                reason = await hold_until(waiter, until, deadline)
            finally:
                if waiter in log.waiters:
                    log.waiters.remove(waiter)
        self.held.count("session", reason)
        entries = log.first(limit)
        if not entries:
            return [], cursor
        return entries, entries[-1].position

    def stats(self) -> dict[str, int]:
        return {
            "session_logs": len(self.logs),
            "session_log_entries": sum(len(log.entries) for log in self.logs.values()),
        }
