"""`ClusterStore`: the shared store on a Redis/Valkey Cluster (primaries with replicas).

`--store redis://ANY_NODE` finds a cluster by `INFO cluster` (`is_cluster`) and gets this store;
the routes, scripts and rules are RedisStore's. What differs:

- **Keys per slot group** (slots.py, keys.py): a record, its payload, dedup key and session
  log, and its group's pending set, byte buckets, counters and wake-up channel share one hash
  slot, so every script runs on one primary. What is global on one engine is summed over the
  groups: the pending count, stored bytes and counters every 0.2 s; lease renewals and
  takeovers run per group.
- **One pipeline per node** (cluster_pipeline.py), MOVED/ASK followed, the slot table read
  again when a slot moves or a node cannot be reached, and every second (`_watch`), so a
  failover or a resharding needs no restart.
- **Sharded pub/sub**: FINISH publishes on its group's channel with SPUBLISH (it stays on the
  group's shard); each process holds one connection per primary subscribed (SSUBSCRIBE) to the
  channels of the groups that primary serves, made again when the slot table changes (every
  held poll then re-reads).
- **Health**: the ping thread pings every primary; a shard without a primary (kill -9, until
  its replica is promoted) makes the store away: calls answer 503 + Retry-After meanwhile.
- **What a failover can lose, and how it comes back** (recovery.py): a primary's replicas get
  its writes after it answered, so a write answered in the milliseconds before a kill -9 may be
  missing on the promoted replica. Each process keeps what it wrote (the record's job) until
  a `WAIT` on that node says a replica has it; when a group's primary changes, it checks those
  records on the new primary and writes missing ones again (pending, the same request id) and
  forwards again those whose forward had finished (`reforwards` on /healthz); it compares
  each group's primary after every read of the slot table and, its calls held until then,
  moves those groups' session logs on, so no cursor the lost primary handed out hides a
  later completion. Within GRACE_S of a failover a poll of a missing record answers pending,
  not 404, and a session poll of an unknown cursor nothing yet, not 410. With
  `--store-ack-replicas N`, a create, a finish and a session poll answer only once N replicas
  have what they wrote or read (`WAIT N`), so there is nothing to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from impl.server.store import UNKNOWN_OWNER, Key, Record, Retention, StoreUnavailable
from impl.server.store.redis import scripts as lua
from impl.server.store.redis import slots
from impl.server.store.redis.cluster_health import ClusterHealth
from impl.server.store.redis.cluster_pipeline import ClusterPipeline, Topology
from impl.server.store.redis.health import StoreHealth
from impl.server.store.redis.keys import Space
from impl.server.store.redis.recovery import Recovery
from impl.server.store.redis.scripts import BUCKET_S, guard, now_ms
from impl.server.store.redis.store import RedisStore

log = logging.getLogger("hotpath.server")
#: after a failover, a poll of a missing record answers pending this long (its writer is
#: writing it again)
GRACE_S = 30.0
#: how often each process reads the slot table (a failover, a resharding)
WATCH_S = 1.0


def is_cluster(url: str, timeout: float = 5.0) -> bool:
    """Does the engine at `url` run in cluster mode (`INFO cluster`: cluster_enabled:1)?"""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    finally:
        client.close()


def _cluster_client(url: str, connections: int, socket_timeout: float) -> Any:
    import redis.asyncio as redis

    return redis.RedisCluster.from_url(
        url,
        max_connections=connections,
        socket_connect_timeout=10.0,
        socket_timeout=socket_timeout,
        driver_info=None,
    )


class ClusterStore(RedisStore):
    """RedisStore on a Redis/Valkey Cluster (this module's docstring)."""

    def __init__(
        self,
        url: str,
        retention: Retention,
        *,
        ack_replicas: int = 0,
        prefix: str = "hotpath:",
        **options: Any,
    ) -> None:
        """RedisStore's arguments (`options`), and `ack_replicas` for WAIT."""
        self.ack_replicas = ack_replicas
        self.spaces = [Space(f"{prefix}{{{tag}}}") for tag in slots.TAGS]
        super().__init__(url, retention, prefix=prefix, **options)
        self.recovery = Recovery(self)
        self.failover_at: float | None = None
        self.primaries: dict[int, str] = {}  # group -> its primary's address
        self._subscribed = asyncio.Event()  # set: the subscriptions must be made again
        self._closing = False

    # -- what RedisStore asks of its subclass ----------------------------------------------
    def _clients(self, url: str, connections: int) -> tuple[Any, Any]:
        client = _cluster_client(url, connections, 30.0)
        self.topology = Topology(client, connections)
        self.topology.on_refresh = self._check_primaries
        return client, _cluster_client(url, 4, 5.0)

    def _pipeline(self, texts: dict[str, str]) -> ClusterPipeline:
        texts = {**texts, "finish": _sharded(texts["finish"])}
        self.control_pipe = ClusterPipeline(self.topology, {"claim": lua.CLAIM})
        return ClusterPipeline(
            self.topology,
            texts,
            ack_replicas=self.ack_replicas,
            acked=("create", "finish", "answer"),
        )

    def _health(self, timeout: float) -> StoreHealth:
        return ClusterHealth(self.url, self.address, timeout=timeout)

    def _space_of(self, request_id: str) -> Space:
        group = slots.group_of_id(request_id)
        if group is None:
            raise KeyError(request_id)
        return self.spaces[group]

    def _space_for(self, sampling_session_id: str | None) -> Space:
        if sampling_session_id is None:
            return self.spaces[0]
        return self.spaces[slots.group_of(sampling_session_id)]

    def _new_id(self, key: Key | None) -> str:
        group = slots.group_of(key[0]) if key else random.randrange(slots.GROUPS)
        return slots.tagged(super()._new_id(key), group)

    def _ids_in(self, space: Space, request_ids: Iterable[str]) -> list[str]:
        group = self.spaces.index(space)
        return [i for i in request_ids if slots.group_of_id(i) == group]

    # -- the interface, where a cluster differs --------------------------------------------
    async def create(self, key: Key | None, n: int, job: Any = None, owner: str = "") -> Record:
        record = await super().create(key, n, job, owner)
        if record.fresh and not self.ack_replicas:
            self.recovery.wrote(record, job)
        return record

    async def get(self, request_id: str) -> Record | None:
        if slots.group_of_id(request_id) is None:
            return None  # not an id this store handed out
        record = await super().get(request_id)
        if record is not None:
            return record
        # A miss may be a write the lost primary took with it: the read that missed followed
        # the slot table to the new primary, so compare it now (the watch loop may be behind).
        with contextlib.suppress(RedisError, RedisClusterException, OSError, StoreUnavailable):
            await self._check_primaries()
        recent = self.failover_at is not None and time.monotonic() - self.failover_at < GRACE_S
        if recent:
            return Record(request_id, None, 1, UNKNOWN_OWNER)  # its writer writes it again
        return None

    async def _finish(self, record: Record, state: str, error: str, payload: Any) -> None:
        await super()._finish(record, state, error, payload)
        if not self.ack_replicas:
            self.recovery.finished(record)

    async def cursor_in_doubt(self) -> bool:
        """While the store is away, or within GRACE_S of a failover, an unknown cursor may be
        one the lost primary handed out, valid again once the logs are moved on (recovery.py):
        its poll answers nothing yet rather than 410. The read that found it unknown may have
        followed a new slot table to a new primary: compared first (as `get` does)."""
        with contextlib.suppress(RedisError, RedisClusterException, OSError, StoreUnavailable):
            await self._check_primaries()
            await self.topology.settled()
        recent = self.failover_at is not None and time.monotonic() - self.failover_at < GRACE_S
        return recent or self.health.away is not None

    async def _finished_missing(
        self, record: Record, state: str, error: str, payload: bytes | None
    ) -> None:
        """A finish found no record: its create was lost with a primary. Write it again, and
        finish it (the caller's result is the sample's)."""
        if await self.recovery.rewrite(record):
            await RedisStore._finish(self, record, state, error, payload)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_loop()))
        if not self.ack_replicas:
            self._tasks.append(asyncio.get_running_loop().create_task(self.recovery.confirm_loop()))

    async def open(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.client.initialize()
            self.primaries = self._group_primaries()
        await super().open()

    def close(self) -> None:
        # the listener ends by this flag too: closing a pubsub may swallow its cancellation
        self._closing = True
        self._subscribed.set()
        super().close()

    async def aclose(self) -> None:
        await super().aclose()
        await self.topology.aclose()

    async def _came_back(self) -> None:
        """Every primary answers again: read the slot table, and recover what a failover
        lost before calls resume."""
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            await self.topology.refresh()  # and compares each group's primary

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described.update(
            kind="redis-cluster",
            groups=slots.GROUPS,
            primaries=sorted(set(self.primaries.values())),
            ack_replicas=self.ack_replicas,
            slot_table_reads=self.topology.refreshes,
            waits=self.pipe.waits,
            **self.recovery.describe(),
        )
        return described

    # -- topology ----------------------------------------------------------------------------
    def _group_primaries(self) -> dict[int, str]:
        """Each group's primary in the slot table; a group it does not cover (read mid-failover)
        keeps the primary last seen, so that its replacement still counts as a move."""
        found = dict(self.primaries)
        for group, slot in enumerate(slots.SLOTS):
            with contextlib.suppress(Exception):
                found[group] = self.topology.primary(slot).name
        return found

    async def _check_primaries(self) -> None:
        """Compare each group's primary with the last seen: moved groups are recovered, and the
        subscriptions made again. Runs after every read of the slot table (the pipeline's too:
        a call that met a dead node reads it), and holds every call of this process until the
        moved groups' session logs are moved on."""
        now = self._group_primaries()
        moved = [g for g, name in now.items() if self.primaries.get(g) not in (None, name)]
        changed = now != self.primaries
        self.primaries = now
        if moved:
            self.failover_at = time.monotonic()
            log.warning(
                "the shared store's slot groups %s have a new primary: recovering this "
                "process's writes there",
                moved,
            )
            hold = self.topology.hold()
            try:  # before calls resume: a cursor the lost primary handed out stays valid
                await self.recovery.renumber(moved)
            except (RedisError, RedisClusterException, OSError, StoreUnavailable):
                self.health.count("renumber")
            finally:
                if not hold.done():
                    hold.set_result(None)
            # after the calls resume (this may run while the store is still called away)
            task = asyncio.get_running_loop().create_task(self._recover(moved))
            self._tasks.append(task)
        if changed:
            self._subscribed.set()

    async def _recover(self, groups: list[int]) -> None:
        for _ in range(100):  # until the store is back (every primary answers)
            if self.health.away is None:
                break
            await asyncio.sleep(0.1)
        try:
            await self.recovery.check(groups)
        except (RedisError, OSError, StoreUnavailable):
            self.health.count("recover")

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            if self.health.away is not None:
                continue
            try:
                await self.topology.refresh()  # and compares each group's primary
            except (RedisError, RedisClusterException, OSError):  # mid-failover: next round
                self.health.count("slot_table")

    # -- background work, per group ----------------------------------------------------------
    async def _listen(self) -> None:
        """One SSUBSCRIBE connection per primary, for its groups' channels; made again when
        the slot table changes or a connection drops (every held poll then re-reads)."""
        while not self._closing:
            subs: list[Any] = []
            readers: list[asyncio.Task[None]] = []
            try:
                if self._closing:
                    return
                self._subscribed.clear()
                by_node: dict[str, list[str]] = {}
                for group, slot in enumerate(slots.SLOTS):
                    node = self.topology.primary(slot)
                    by_node.setdefault(node.name, []).append(self.spaces[group].channel)
                for name, channels in by_node.items():
                    host, port = name.rsplit(":", 1)
                    pubsub = self.topology.client(host, int(port)).pubsub()
                    subs.append(pubsub)
                    for channel in channels:  # one slot per SSUBSCRIBE
                        await pubsub.ssubscribe(channel)
                    readers.append(asyncio.ensure_future(self._read_messages(pubsub)))
                self.listening = True
                self.wake_all()  # anything published while we were away: re-read
                changed = asyncio.ensure_future(self._subscribed.wait())
                await asyncio.wait([*readers, changed], return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
            except (RedisError, OSError, KeyError, IndexError):
                self.health.count("subscribe")
            finally:
                self.listening = False
                for reader in readers:
                    reader.cancel()
                for pubsub in subs:
                    with contextlib.suppress(RedisError, OSError):
                        await pubsub.aclose()
            await asyncio.sleep(0.2)

    async def _read_messages(self, pubsub: Any) -> None:
        with contextlib.suppress(RedisError, OSError):
            async for message in pubsub.listen():
                if message["type"] == "smessage":
                    self._on_message(message["data"].decode())

    async def refresh(self) -> None:
        """The pending count, stored bytes and counters: each group's, summed."""
        began = time.perf_counter()
        pipe = self.control_pipe
        calls = []
        for space in self.spaces:
            calls += [
                pipe.call("ZCARD", space.pending),
                pipe.call("HGETALL", space.bytes),
                pipe.call("HGETALL", space.stats),
            ]
        replies = await asyncio.gather(*calls)
        self.rtt_ms = round((time.perf_counter() - began) * 1e3, 3)
        now = int(time.time() * 1000 // (BUCKET_S * 1000))
        pending = stored = 0
        counters: dict[str, int] = {}
        stale = []
        for i, space in enumerate(self.spaces):
            count, buckets, stats = replies[3 * i : 3 * i + 3]
            pending += count
            stored += sum(int(v) for b, v in buckets.items() if int(b) > now)
            old = [b for b in buckets if int(b) <= now]
            if old:
                stale.append(pipe.call("HDEL", space.bytes, *old))
            for name, value in stats.items():
                counters[name.decode()] = counters.get(name.decode(), 0) + int(value)
        if stale:
            await asyncio.gather(*stale)
        self.view["pending"] = pending
        self.view["stored_bytes"] = stored
        self.view.update(counters)

    async def renew(self) -> None:
        if not self.owned:
            return
        deadline = now_ms() + self.lease_ms
        by_group: dict[int, list[str]] = {}
        for request_id in self.owned:
            by_group.setdefault(slots.group_of_id(request_id) or 0, []).append(request_id)
        await asyncio.gather(
            *(
                self.control_pipe.call(
                    "ZADD", self.spaces[g].pending, "XX", *_scored(ids, deadline)
                )
                for g, ids in by_group.items()
            )
        )

    async def take_over(self, most: int = 256) -> int:
        now = now_ms()
        claimed = await asyncio.gather(
            *(
                self.control_pipe.script(
                    "claim", [space.pending, space.stats], [now, now + self.lease_ms, most]
                )
                for space in self.spaces
            )
        )
        count = 0
        for space, ids in zip(self.spaces, claimed, strict=True):
            for raw in ids:
                count += 1
                await self._take(space, raw.decode())
        return count

    def _control_call(self, *command: Any) -> Any:
        return self.control_pipe.call(*command)

    @guard
    async def _rewrite(
        self, request_id: str, key: Key | None, n: int, job: Any, owner: str
    ) -> bool:
        """CREATE again under the same request id (recovery.py); False when its key belongs to
        another record."""
        existing = await self._create(request_id, key, n, job, owner)
        return not existing or existing[0].decode().split(" ")[0] == request_id


def _sharded(text: str) -> str:
    """A script publishing on a shard channel (SPUBLISH: it stays on the slot's shard)."""
    return text.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")


def _scored(ids: list[str], score: int) -> list[Any]:
    out: list[Any] = []
    for request_id in ids:
        out += [score, request_id]
    return out
