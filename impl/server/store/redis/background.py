"""The shared store's background work, one loop each: wake-ups from pub/sub, the counters'
refresh, lease renewal and takeover (store.py says why each exists; whether the engine answers
is the health thread's, health.py).

A mixin of `RedisStore`: it uses the store's clients, keys, scripts and local state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from impl.server.store import Record
from impl.server.store.held import WOKEN, settle
from impl.server.store.redis.keys import Space
from impl.server.store.redis.scripts import BUCKET_S, now_ms, unkey

log = logging.getLogger("hotpath.server")
#: How many recently completed request ids each process remembers.
RECENT = 65536


class StoreBackground:
    """Background loops of the shared store (mixed into RedisStore)."""

    client: Any
    control: Any
    scripts: dict[str, Any]
    waiters: dict[str, list[asyncio.Future[str]]]
    recent: Any
    owned: set[str]
    view: dict[str, int]
    owners: dict[str, int]
    on_takeover: Any
    session_logs: Any
    space: Space
    health: Any

    def _wake(self, request_id: str) -> None:
        self.recent[request_id] = None
        if len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        for waiter in self.waiters.get(request_id, ()):
            settle(waiter, WOKEN)

    def _on_message(self, text: str) -> None:
        """A completion: `<request_id>`, or `<request_id> <clone> <sampling_session_id>` when
        its session's held poll is due an answer."""
        request_id, _, target = text.partition(" ")
        self._wake(request_id)
        if target:
            clone, _, session = target.partition(" ")
            self.session_logs.wake((session, int(clone)))

    async def _listen(self) -> None:
        """Wake local waiters on every published completion; reconnect when the engine drops."""
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                self.listening = True
                self.wake_all()  # anything published while we were away: re-read
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        self._on_message(message["data"].decode())
            except (RedisError, OSError):
                self.listening = False
                self.health.count("subscribe")
                await asyncio.sleep(0.5)
            finally:
                self.listening = False
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()

    async def refresh(self) -> None:
        """Read the cluster-wide pending count, stored bytes and counters (and the RTT)."""
        began = time.perf_counter()
        async with self.control.pipeline(transaction=False) as pipe:
            pipe.zcard(self.pending_key)
            pipe.hgetall(self.bytes_key)
            pipe.hgetall(self.stats_key)
            pending, buckets, counters = await pipe.execute()
        self.rtt_ms = round((time.perf_counter() - began) * 1e3, 3)
        now = int(time.time() * 1000 // (BUCKET_S * 1000))  # buckets <= now have all expired
        stale = [b for b in buckets if int(b) <= now]
        if stale:
            await self.control.hdel(self.bytes_key, *stale)
        self.view["pending"] = pending
        self.view["stored_bytes"] = sum(int(v) for b, v in buckets.items() if int(b) > now)
        owners = {}
        for name, value in counters.items():
            if name.startswith(b"o:"):  # a caller's pending samples (store.py)
                owners[name[2:].decode()] = int(value)
            else:
                self.view[name.decode()] = int(value)
        self.owners = owners

    async def _refresh_loop(self) -> None:
        """The counters' view, every `refresh_interval`; whether the engine is there is the
        health thread's to say (health.py), so a failed refresh is only skipped."""
        while True:
            if self.health.away is None:
                try:
                    await self.refresh()
                except (RedisError, OSError):
                    self.health.count("refresh")
            await asyncio.sleep(self.refresh_interval)

    async def _lease_loop(self) -> None:
        """Renew this process's leases four times per lease."""
        await self._every(self.lease_ms / 4000, self.renew, "renew")

    async def _takeover_loop(self) -> None:
        """Claim and forward again records whose owner's lease lapsed (twice per lease)."""
        await self._every(self.lease_ms / 2000, self.take_over, "take_over")

    async def _every(
        self, seconds: float, work: Callable[[], Awaitable[object]], name: str
    ) -> None:
        """`work()` every `seconds`; an engine error is counted under `name` (logged with the
        outage by health.py) and the next round tries again."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await work()
            except (RedisError, OSError):
                self.health.count(name)

    async def renew(self) -> None:
        if self.owned:
            deadline = now_ms() + self.lease_ms
            await self.control.zadd(self.pending_key, dict.fromkeys(self.owned, deadline), xx=True)

    async def take_over(self, most: int = 256) -> int:
        """Claim records whose owner stopped renewing and forward them here; how many."""
        now = now_ms()
        claimed = await self.scripts["claim"](
            client=self.control,
            keys=[self.pending_key, self.stats_key],
            args=[now, now + self.lease_ms, most],
        )
        for raw in claimed:
            await self._take(self.space, raw.decode())
        return len(claimed)

    async def _take(self, space: Space, request_id: str) -> None:
        """Forward claimed `request_id` here, or drop it from the pending set if it finished."""
        call = self._control_call
        state, n, key, body, options, owner = await call(
            "HMGET", space.record(request_id), "s", "n", "k", "jb", "jm", "o"
        )
        if state != b"pending" or body is None:  # finished meanwhile, or expired
            await call("ZREM", space.pending, request_id)
            return
        # its owner too: a finish that must write the record again (a failover lost it)
        # writes it under the caller who asked, whose polls would otherwise get 404
        record = Record(request_id, unkey(key), int(n), owner.decode() if owner else "")
        self.owned.add(request_id)
        log.warning("taking over %s: its owner's lease lapsed", request_id)
        if self.on_takeover is not None:
            self.on_takeover(record, body, options.decode())

    def _control_call(self, *command: Any) -> Awaitable[Any]:
        """One command of the takeover (a cluster sends it to its slot's node)."""
        return self.client.execute_command(*command)
