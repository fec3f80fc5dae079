"""The embedded future store: dicts and deques on the event loop of one process.

Implements `impl.server.store.FutureStore` (its docstring has the retention rules). Expiry is
lazy on lookup plus a periodic sweep over two deques of deadlines (each append is in time
order, so the sweep pops from the front: O(1) per record, no scan). Session completion logs are
delegated to `impl.server.store.completions.SessionLogs`. Legacy JSON for non-protobuf clients is
derived from the stored proto bytes on first use, cached, and computed once even when several
polls miss together (one asyncio Future per record); large payloads are converted in a worker
thread so the event loop keeps serving. Held polls settle with the reason that released them
(`impl.server.store.held`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from impl.server.store import (
    DONE,
    FAILED,
    PENDING,
    SESSION_ANSWER_LIMIT,
    Key,
    Record,
    Retention,
    to_json_off_loop,
)
from impl.server.store.completions import Entry, SessionLogs, Target, target_of
from impl.server.store.held import AT_ONCE, HOLD_EXPIRED, RELEASED, WOKEN, HeldPolls, settle
from impl.server.store.ids import new_id


class MemoryStore:
    """The embedded store: dicts and deques on the event loop (one process)."""

    clock_starts_on_build = False
    dedup_on_create = False

    def __init__(self, retention: Retention, *, to_json: Callable[[bytes], bytes]) -> None:
        self.retention = retention
        self.to_json = to_json
        #: why held polls answered, this process (/healthz `held_polls`)
        self.held_polls = HeldPolls()
        self.session_logs = SessionLogs(
            retention.session_batch_wait, retention.session_batch_size, self.held_polls
        )
        self.records: dict[str, Record] = {}
        self.keys: dict[Key, Record] = {}
        self.expiries: deque[tuple[float, Record]] = deque()  # completed_ttl deadlines
        self.retrievals: deque[tuple[float, Record]] = deque()  # retrieved_ttl deadlines
        self.tombstones: deque[tuple[float, Record]] = deque()  # dedup_ttl of evicted keys
        self.pending = 0
        self.failed_held = 0  # failed records still stored (their error is retrievable)
        self.stored_bytes = 0
        self.counts = dict.fromkeys(
            (
                "submitted",
                "deduplicated",
                "late_duplicates",
                "completed",
                "failed",
                "delivered",
                "evicted",
                "json_derived",
                "acknowledged",
            ),
            0,
        )
        #: owner -> samples pending (owners with none are dropped)
        self.owners: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule_sweep()

    async def open(self) -> None:
        self.start()

    async def aclose(self) -> None:
        self.close()

    def unavailable(self) -> str | None:
        """Never: the records live in this process."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "memory", "address": None}

    def wake_all(self) -> None:
        for record in self.records.values():
            _wake(record, RELEASED)
        self.session_logs.release()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.wake_all()

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else asyncio.get_running_loop().time()

    def _schedule_sweep(self) -> None:
        interval = min(1.0, self.retention.completed_ttl / 4, self.retention.retrieved_ttl / 4)
        self._sweeper = self._loop.call_later(max(interval, 0.05), self._sweep_tick)

    def _sweep_tick(self) -> None:
        self.sweep()
        self._schedule_sweep()

    # -- the interface ---------------------------------------------------------------------
    async def lookup(self, key: Key) -> Record | None:
        record = self.keys.get(key)
        if record is None:
            return None
        if record.request_id not in self.records or self._expired(record):
            if self.keys.get(key) is not record:  # expired undelivered: forgotten
                return None
            self.counts["late_duplicates"] += 1
            return record
        self.counts["deduplicated"] += 1
        return record

    async def create(self, key: Key | None, n: int, job: Any = None, owner: str = "") -> Record:
        record = Record(new_id(), key, n, owner)
        owners = self.owners
        owners[owner] = owners.get(owner, 0) + 1
        self.records[record.request_id] = record
        if key is not None:
            self.keys[key] = record
            self.session_logs.submitted(key)
        self.pending += 1
        self.counts["submitted"] += 1
        return record

    async def get(self, request_id: str) -> Record | None:
        record = self.records.get(request_id)
        if record is None or self._expired(record):
            return None
        return record

    async def complete(self, record: Record, payload: bytes) -> None:
        self._finish(record, DONE, payload, None)

    async def fail(self, record: Record, message: str) -> None:
        self._finish(record, FAILED, None, message)

    async def abandon(self, record: Record, message: str) -> None:
        self._finish(record, FAILED, None, message)

    async def wait(self, record: Record, timeout: float) -> None:
        if record.state != PENDING or timeout <= 0:
            self.held_polls.count("future", AT_ONCE)
            return
        loop = self._loop or asyncio.get_running_loop()
        waiter = loop.create_future()
        if record.waiters is None:
            record.waiters = []
        record.waiters.append(waiter)
        timer = loop.call_later(timeout, settle, waiter, HOLD_EXPIRED)
        try:
            self.held_polls.count("future", await waiter)
        finally:
            timer.cancel()
            if not waiter.done() and record.waiters is not None:
                record.waiters.remove(waiter)

    async def proto(self, record: Record) -> bytes:
        return record.payload

    async def json(self, record: Record) -> bytes:
        if record.json is not None:
            return record.json
        if record.json_future is None:  # first miss computes; concurrent misses await it
            record.json_future = asyncio.ensure_future(self._derive_json(record))
        return await asyncio.shield(record.json_future)

    async def _derive_json(self, record: Record) -> bytes:
        text = await to_json_off_loop(self.to_json, record.payload)
        self.counts["json_derived"] += 1
        if record.request_id in self.records:  # still stored: count its bytes until eviction
            record.json = text
            record.size += len(text)
            self.stored_bytes += len(text)
        return text

    async def delivered(self, record: Record) -> None:
        if record.state == PENDING or record.request_id not in self.records:
            return
        self.counts["delivered"] += 1
        record.delivered = True
        record.deadline = self._now() + self.retention.retrieved_ttl
        self.retrievals.append((record.deadline, record))

    async def session_completions(
        self, target: Target, cursor: int, hold: float, *, limit: int = SESSION_ANSWER_LIMIT
    ) -> tuple[list[Entry], int] | None:
        return await self.session_logs.answer(target, cursor, hold, limit)

    async def acknowledge(self, target: Target, request_ids: Iterable[str]) -> int:
        started = 0
        for request_id in request_ids:
            record = self.records.get(request_id)
            if (
                record is None
                or record.state == PENDING
                or record.delivered
                or record.key is None
                or target_of(*record.key) != target
                or self._expired(record)
            ):
                continue
            await self.delivered(record)
            started += 1
        self.counts["acknowledged"] += started
        return started

    def pressure(self) -> str | None:
        return self.retention.refusal(self.pending, self.stored_bytes)

    def outstanding_of(self, owner: str) -> int:
        return self.owners.get(owner, 0)

    def outstanding_by_owner(self) -> dict[str, int]:
        return dict(self.owners)

    def stats(self) -> dict[str, int]:
        return {
            "records": len(self.records),
            "pending": self.pending,
            "failed_held": self.failed_held,
            "stored_bytes": self.stored_bytes,
            **self.session_logs.stats(),
            **self.counts,
        }

    # -- internals -------------------------------------------------------------------------
    def _finish(self, record: Record, state: str, payload: bytes | None, error: str | None) -> None:
        if record.state != PENDING:
            return
        record.state = state
        record.payload = payload
        record.error = error
        self.pending -= 1
        left = self.owners.get(record.owner, 1) - 1
        if left > 0:
            self.owners[record.owner] = left
        else:
            self.owners.pop(record.owner, None)
        self.counts["completed" if state == DONE else "failed"] += 1
        if record.request_id in self.records:
            self.failed_held += state == FAILED
            record.size = len(payload) if payload is not None else len(error or "")
            self.stored_bytes += record.size
            record.deadline = self._now() + self.retention.completed_ttl
            self.expiries.append((record.deadline, record))
        if record.key is not None:
            size = len(payload) if payload is not None else 0
            self.session_logs.finished(record.key, record.request_id, state == DONE, size)
        _wake(record)

    def _expired(self, record: Record) -> bool:
        if record.state == PENDING or record.deadline > self._now():
            return False
        self._evict(record)
        return True

    def _evict(self, record: Record) -> None:
        if self.records.pop(record.request_id, None) is None:
            return
        if record.key is not None and self.keys.get(record.key) is record:
            if record.delivered:  # the key stays a tombstone for dedup_ttl
                self.tombstones.append((self._now() + self.retention.dedup_ttl, record))
            else:
                del self.keys[record.key]
        self.stored_bytes -= record.size
        self.failed_held -= record.state == FAILED
        self.counts["evicted"] += 1
        record.size = 0
        record.json = None
        record.payload = None
        record.json_future = None

    def sweep(self) -> int:
        """Evict every record whose current deadline has passed; the number evicted."""
        now = self._now()
        evicted = 0
        for queue in (self.expiries, self.retrievals):
            while queue and queue[0][0] <= now:
                deadline, record = queue.popleft()
                # A stale entry (the deadline moved since) is skipped; the record is still
                # in the other deque under its current deadline.
                if record.deadline == deadline and record.request_id in self.records:
                    self._evict(record)
                    evicted += 1
        while self.tombstones and self.tombstones[0][0] <= now:
            _, record = self.tombstones.popleft()
            if self.keys.get(record.key) is record:
                del self.keys[record.key]
        self.session_logs.forget(lambda request_id: request_id not in self.records)
        return evicted


def _wake(record: Record, reason: str = WOKEN) -> None:
    if record.waiters:
        for waiter in record.waiters:
            settle(waiter, reason)
    record.waiters = None
