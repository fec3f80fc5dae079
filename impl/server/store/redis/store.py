"""`RedisStore`: the future store on a Redis (>= 7) or Valkey server, shared by server processes.

redis-py's asyncio client (with hiredis parsing replies) talks to the engine; every change of a
record is one Lua script, so it is atomic across processes and costs one round trip:

- `{p}r:<request_id>` is a hash: state, n, key, payload, error, derived JSON, size, the bytes
  bucket it is counted in, and while pending the forward itself (router body and options), so
  another process can take it over. `{p}k:<seq_id>:<session>` maps a dedup key to
  `"<request_id> <n>"`; `create` sets it only if absent, so two processes given the same
  `(sampling_session_id, seq_id)` at once create one record.
- Retention uses the engine's own expiry (PEXPIRE): a finished record and its key live
  `completed_ttl`; `delivered` (called only after the response reached a still-connected
  client) moves the record to `retrieved_ttl` and the key to `retrieved_ttl + dedup_ttl` (the
  dedup tombstone). An undelivered result that expired takes its key with it.
- The record's field `o` is the NAME of the caller that submitted it (`Record.owner`), and
  the stats hash's field `o:<NAME>` counts that caller's pending samples (CREATE adds one,
  FINISH takes it away), read with the other counters every refresh (`outstanding_of`).
  Request ids are random (`impl.server.store.ids`), so a caller cannot count its way to another's.
- `{p}pending` is a sorted set of pending request ids scored by their owner's lease deadline
  (ms). The owner renews the leases of its forwards every `lease / 4` seconds in one ZADD; every
  process reaps leases that lapsed (its owner was killed) by claiming them in a script and
  forwarding them again. A record finishes once (the script ignores a second completion), and
  each takeover is counted: generations done twice are bounded by what the dead process had in
  flight.
- `{p}bytes` is a hash of stored-result bytes per 5-second bucket of expiry deadlines; a bucket
  whose time passed is dropped, so the global byte count follows the engine's expiry without
  listening to it. `pressure()` reads a view of pending count and bytes that every process
  refreshes every 0.2 s, so both caps hold across processes within that window.
- Wake-ups: a completion PUBLISHes its request id on `{p}done`; each process keeps one
  subscriber connection and wakes its local waiters. Pub/sub is chosen because a wake-up is
  only a hint: one PUBLISH per completion and no per-poll subscription, where a stream would
  need trimming and a per-poll cursor. A missed message (subscriber reconnecting) costs no
  result: `wait` re-reads the record after registering, after waking and when its hold ends,
  and a reconnected subscriber wakes every local waiter to re-read.
- Session polling: completion logs in the engine, appended by FINISH (redis_completions.py).

The request path's calls of one event-loop iteration share one round trip (pipeline.py).
Any engine error (connection refused, timeout, loading) becomes `StoreUnavailable`, answered
503 with Retry-After; a thread pings the engine (health.py), and while it is away (refused, or
no answer within `timeout`, 1 s) every call fails at once, the calls in flight included, and is
counted; the outage is logged when it starts and when it ends. Scripts: scripts.py; background
loops: background.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from impl.server.store import (
    DONE,
    FAILED,
    PENDING,
    Key,
    Record,
    Retention,
    to_json_off_loop,
)
from impl.server.store import StoreUnavailable as StoreUnavailable
from impl.server.store.completions import CLONE_BLOCK
from impl.server.store.held import AT_ONCE, HOLD_EXPIRED, RELEASED, HeldPolls, settle
from impl.server.store.ids import new_id
from impl.server.store.redis import scripts as lua
from impl.server.store.redis.background import StoreBackground
from impl.server.store.redis.completions import SCRIPTS as SESSION_SCRIPTS
from impl.server.store.redis.completions import RedisSessionLogs, SessionPolling
from impl.server.store.redis.health import StoreHealth
from impl.server.store.redis.keys import Space
from impl.server.store.redis.pipeline import AutoPipeline, settled
from impl.server.store.redis.scripts import address, bucket, guard, now_ms, unkey

log = logging.getLogger("hotpath.server")
_COUNTERS = (
    *("submitted", "deduplicated", "late_duplicates", "completed", "failed", "delivered"),
    *("json_derived", "takeovers", "finished_twice", "acknowledged"),
)


class RedisStore(SessionPolling, StoreBackground):
    """The shared store: records in Redis/Valkey, wake-ups by pub/sub, leases for takeover."""

    clock_starts_on_build = False
    dedup_on_create = True

    def __init__(
        self,
        url: str,
        retention: Retention,
        *,
        to_json: Callable[[bytes], bytes],
        lease: float = 15.0,
        prefix: str = "hotpath:",
        refresh_interval: float = 0.2,
        connections: int = 64,
        timeout: float = 1.0,
    ) -> None:
        self.url = url
        self.address = address(url)
        self.retention = retention
        self.completed_ms = int(retention.completed_ttl * 1000)
        self.retrieved_ms = int(retention.retrieved_ttl * 1000)
        self.dedup_ms = int(retention.dedup_ttl * 1000)
        self.to_json = to_json
        self.lease_ms = int(lease * 1000)
        self.prefix = prefix
        self.refresh_interval = refresh_interval
        self.client, self.control = self._clients(url, connections)
        #: the key names (one space on one engine; a cluster has one per slot group)
        self.space = Space(prefix)
        self.pending_key = self.space.pending
        self.bytes_key = self.space.bytes
        self.stats_key = self.space.stats
        self.channel = self.space.channel
        self.no_key = self.space.no_key
        texts = {
            "create": lua.CREATE,
            "lookup": lua.LOOKUP,
            "finish": lua.FINISH,
            "delivered": lua.DELIVERED,
            "json": lua.JSON,
            "claim": lua.CLAIM,
            **SESSION_SCRIPTS,
        }
        self.scripts = {"claim": self.client.register_script(lua.CLAIM)}  # the control path
        #: the request path's calls: one round trip per event-loop iteration
        self.pipe = self._pipeline(texts)
        #: owner -> pending samples, every process's (refreshed) plus this one's since
        self.owners: dict[str, int] = {}
        self.waiters: dict[str, list[asyncio.Future[str]]] = {}
        #: Request ids whose completion message arrived lately (a poll registering after it).
        self.recent: OrderedDict[str, None] = OrderedDict()
        self.listening = False
        self.owned: set[str] = set()
        self.json_futures: dict[str, asyncio.Future[bytes]] = {}
        #: Set by the lifespan: forwards a record taken over from a process that went away,
        #: given the job as `create` kept it (`job.pack()`: router body, options).
        self.on_takeover: Callable[[Record, bytes, str], None] | None = None
        self.view = {"pending": 0, "stored_bytes": 0, **dict.fromkeys(_COUNTERS, 0)}
        self.rtt_ms: float | None = None
        #: is the engine answering (a ping thread); calls fail at once while it is away
        self.health = self._health(timeout)
        self.health.on_away = self._went_away
        self.health.on_back = self._came_back
        self._tasks: list[asyncio.Task[None]] = []
        #: why held polls answered, this process (/healthz `held_polls`)
        self.held_polls = HeldPolls()
        self.session_logs = RedisSessionLogs(
            self, retention.session_batch_wait, retention.session_batch_size
        )
        #: a log list outlives its newest entry's record by no more than this
        self.log_ttl_ms = max(self.completed_ms, self.retrieved_ms)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for work in (self._listen, self._refresh_loop, self._lease_loop, self._takeover_loop):
            self._tasks.append(loop.create_task(work()))
        self.health.start()

    async def open(self) -> None:
        """Check the engine answers (a wrong URL fails start-up), then start background work."""
        try:
            await self.refresh()  # also the first view of the counters /healthz shows
            await self.pipe.load()
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"cannot reach the store at {self.address}: {exc}") from exc
        self.start()

    def wake_all(self) -> None:
        for waiters in self.waiters.values():
            for waiter in waiters:
                settle(waiter, RELEASED)
        self.session_logs.wake_all()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.health.on_away = self.health.on_back = None
        self.wake_all()
        self.session_logs.release()

    async def aclose(self) -> None:
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.health.stop)
        await self.client.aclose()
        await self.control.aclose()

    def unavailable(self) -> str | None:
        """Why the store cannot serve now (/readyz), or None."""
        return self.health.reason()

    def _went_away(self, reason: str) -> None:
        """The engine went away: the calls already sent fail now rather than at their socket
        timeout (a stalled engine never answers them)."""
        self.pipe.fail_pending(StoreUnavailable(reason))

    async def _came_back(self) -> None:
        """Drop the idle pooled connections before calls resume: the old engine closed them."""
        with contextlib.suppress(RedisError, OSError):
            await self.client.connection_pool.disconnect(inuse_connections=False)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "redis",
            "address": self.address,
            "rtt_ms": self.rtt_ms,
            **self.health.describe(),
            "lease_s": self.lease_ms / 1000,
            "forwards_owned": len(self.owned),
            "round_trips": self.pipe.round_trips,  # this process's request path
            "commands": self.pipe.commands,
        }

    # -- what a cluster store replaces (cluster.py) ----------------------------------------
    def _clients(self, url: str, connections: int) -> tuple[Any, Any]:
        return lua.clients(url, connections)

    def _pipeline(self, texts: dict[str, str]) -> AutoPipeline:
        return AutoPipeline(self.client, texts)

    def _health(self, timeout: float) -> StoreHealth:
        return StoreHealth(self.url, self.address, timeout=timeout)

    def _space_of(self, request_id: str) -> Space:
        """The key space a request id's record lives in."""
        return self.space

    def _space_for(self, sampling_session_id: str | None) -> Space:
        """The key space of a sampling session's records and logs."""
        return self.space

    def _new_id(self, key: Key | None) -> str:
        """A request id nobody can guess (`impl.server.store.ids`); a cluster tags it."""
        return new_id()

    # -- the interface ---------------------------------------------------------------------
    def _key(self, key: Key) -> str:
        return self._space_for(key[0]).dedup(key)

    def _record_key(self, request_id: str) -> str:
        return self._space_of(request_id).record(request_id)

    @guard
    async def lookup(self, key: Key) -> Record | None:
        space = self._space_for(key[0])
        found = await self.pipe.script("lookup", [space.dedup(key), space.stats], [space.records])
        if not found:
            return None
        request_id, n = found[0].decode().split(" ")
        record = Record(request_id, key, int(n))
        record.state = DONE if not found[1] else PENDING  # a tombstone's poll gets 404
        return record

    async def _create(
        self, request_id: str, key: Key | None, n: int, job: Any, owner: str
    ) -> list[Any] | None:
        """CREATE `request_id` (owned by `owner`); what the script answers: None when created,
        else the record that holds `key` already and whether it is pending."""
        space = self._space_of(request_id)
        body, options = (b"", "") if job is None else job.pack()
        return await self.pipe.script(
            "create",
            [
                space.dedup(key) if key else space.no_key,
                space.record(request_id),
                space.pending,
                space.stats,
                self._log_keys(key, space)[0],
            ],
            [
                request_id,
                n,
                f"{key[0]}\0{key[1]}" if key else "",
                now_ms() + self.lease_ms,
                body,
                options,
                space.records,
                key[1] // CLONE_BLOCK if key else 0,
                self.session_logs.base,
                owner,
            ],
        )

    @guard
    async def create(self, key: Key | None, n: int, job: Any = None, owner: str = "") -> Record:
        request_id = self._new_id(key)
        existing = await self._create(request_id, key, n, job, owner)
        if existing:  # the key was claimed before (here or elsewhere): its record, not forwarded
            other, count = existing[0].decode().split(" ")
            record = Record(other, key, int(count))
            record.state = PENDING if existing[1] else DONE  # a tombstone's poll gets 404
            record.fresh = False
            return record
        self.owned.add(request_id)
        self.owners[owner] = self.owners.get(owner, 0) + 1  # until the next refresh
        return Record(request_id, key, n, owner)

    @guard
    async def get(self, request_id: str) -> Record | None:
        return await self._read(request_id)

    async def _read(self, request_id: str, record: Record | None = None) -> Record | None:
        space = self._space_of(request_id)
        fields = self.pipe.call("HMGET", space.record(request_id), "s", "n", "k", "e", "o")
        payload = self.pipe.call("GET", space.payload(request_id))
        (state, n, key, error, owner), payload = await settled(fields, payload)
        if state is None:
            return None
        if record is None:
            record = Record(request_id, unkey(key), int(n), owner.decode() if owner else "")
        record.state = state.decode()
        record.error = error.decode() if error is not None else None
        record.payload = payload
        return record

    def _payload_key(self, request_id: str) -> str:
        return self._space_of(request_id).payload(request_id)

    async def complete(self, record: Record, payload: bytes) -> None:
        await self._finish(record, DONE, "", payload)

    async def fail(self, record: Record, message: str) -> None:
        await self._finish(record, FAILED, message, None)

    @guard
    async def _finish(self, record: Record, state: str, error: str, payload: Any) -> None:
        deadline = time.time() * 1000 + self.completed_ms
        size = len(payload) if payload is not None else len(error.encode())
        space, request_id = self._space_of(record.request_id), record.request_id
        stored = None
        if payload is not None:  # the first generation's bytes win (a takeover's twin)
            stored = self.pipe.call(
                "SET", space.payload(request_id), payload, "NX", "PX", self.completed_ms
            )
        # In the same pipeline, right after the SET: a reader between the two sees the record
        # still pending; a process killed between them leaves bytes that expire.
        finished = self.pipe.script(
            "finish",
            [
                space.record(request_id),
                space.dedup(record.key) if record.key else space.no_key,
                space.pending,
                space.bytes,
                space.stats,
                space.payload(request_id),
                *self._log_keys(record.key, space),
            ],
            [
                request_id,
                state,
                error,
                self.completed_ms,
                bucket(deadline),
                space.channel,
                size,
                record.key[1] // CLONE_BLOCK if record.key else 0,
                self.session_logs.batch_size,
                self.log_ttl_ms,
                record.key[0] if record.key else "",
            ],
        )
        outcome = (await settled(finished, *([stored] if stored is not None else [])))[0]
        if outcome == -2:  # no record at all (an engine that lost it): the store's to recover
            await self._finished_missing(record, state, error, payload)
        if outcome == -1:
            # the bytes were refused (engine full): the forward stores the result again
            raise StoreUnavailable(
                f"the shared store at {self.address} did not keep the result's bytes; "
                "storing it again"
            )
        if outcome == 1 and record.owner in self.owners:  # until the next refresh
            self.owners[record.owner] = max(0, self.owners[record.owner] - 1)
        self.owned.discard(record.request_id)
        record.state = state
        self._wake(record.request_id)

    async def cursor_in_doubt(self) -> bool:
        """Whether a session-log cursor this store does not know may yet become valid (a
        cluster's failover: cluster.py); one engine: never."""
        return False

    async def _finished_missing(
        self, record: Record, state: str, error: str, payload: bytes | None
    ) -> None:
        """A finish found no record (one engine: it lost its data; counted `finished_twice`,
        like a finish of a record taken over and finished elsewhere)."""

    async def abandon(self, record: Record, message: str) -> None:
        """Hand the record over: its lease lapses now, so another process forwards it."""
        self.owned.discard(record.request_id)
        with contextlib.suppress(RedisError, OSError):
            await self.client.zadd(
                self._space_of(record.request_id).pending, {record.request_id: 0}, xx=True
            )

    @guard
    async def wait(self, record: Record, timeout: float) -> None:
        if record.state != PENDING or timeout <= 0:
            self.held_polls.count("future", AT_ONCE)
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiters = self.waiters.setdefault(record.request_id, [])
        waiters.append(waiter)
        try:
            # Registered first, then checked: a completion whose message came before we
            # registered is in `recent`; without a subscriber, the record is re-read.
            if not self.listening or record.request_id in self.recent:
                await self._read(record.request_id, record)
            reason = AT_ONCE
            if record.state == PENDING:
                timer = loop.call_later(timeout, settle, waiter, HOLD_EXPIRED)
                try:
                    reason = await waiter
                finally:
                    timer.cancel()
                await self._read(record.request_id, record)  # woken, missed or timed out
            self.held_polls.count("future", reason)
        finally:
            waiters.remove(waiter)
            if not waiters:
                del self.waiters[record.request_id]

    async def proto(self, record: Record) -> bytes:
        return record.payload

    @guard
    async def json(self, record: Record) -> bytes:
        cached = await self.pipe.call("HGET", self._record_key(record.request_id), "j")
        if cached is not None:
            return cached
        future = self.json_futures.get(record.request_id)
        if future is None:  # first miss here computes; concurrent misses await it
            future = asyncio.ensure_future(self._derive_json(record))
            self.json_futures[record.request_id] = future
            future.add_done_callback(lambda f: self._derived(record.request_id, f))
        return await asyncio.shield(future)

    def _derived(self, request_id: str, future: asyncio.Future[bytes]) -> None:
        """Forget a finished derivation; its exception is retrieved here too (the callers that
        awaited it got it; a derivation whose callers all left must not log it later)."""
        self.json_futures.pop(request_id, None)
        if not future.cancelled():
            future.exception()

    async def _derive_json(self, record: Record) -> bytes:
        text = await to_json_off_loop(self.to_json, record.payload)
        space = self._space_of(record.request_id)
        await self.pipe.script(
            "json", [space.record(record.request_id), space.bytes, space.stats], [text]
        )
        return text

    async def delivered(self, record: Record) -> None:
        """Start the retrieved clock; if the store is down, the result keeps its longer TTL."""
        if self.health.away is not None:
            self.health.count("delivered")
            return
        deadline = time.time() * 1000 + self.retrieved_ms
        space = self._space_of(record.request_id)
        try:
            await self.pipe.script(
                "delivered",
                [
                    space.record(record.request_id),
                    space.dedup(record.key) if record.key else space.no_key,
                    space.bytes,
                    space.stats,
                    space.payload(record.request_id),
                ],
                [self.retrieved_ms, self.retrieved_ms + self.dedup_ms, bucket(deadline)],
            )
        except (RedisError, OSError, StoreUnavailable):  # the response has already started
            self.health.count("delivered")  # counted, not logged per request

    def pressure(self) -> str | None:
        if self.health.away is not None:
            return None  # the next store call answers 503 with the reason
        view = self.view
        return self.retention.refusal(view["pending"], view["stored_bytes"], " in the shared store")

    def outstanding_of(self, owner: str) -> int:
        return self.owners.get(owner, 0)

    def outstanding_by_owner(self) -> dict[str, int]:
        return {owner: n for owner, n in self.owners.items() if n > 0}

    def stats(self) -> dict[str, int]:
        return dict(self.view)
