"""Auto-pipelining on a Redis Cluster: one event-loop iteration's calls, one pipeline per node.

The calls are those of `pipeline.AutoPipeline` (the same queue, the same NOSCRIPT reload);
only the send differs. Each call's hash slot (its first key) names the primary that serves it
in the cluster client's slot table; every node's share goes as one pipeline on one connection
of that node's pool, all nodes at once. A `MOVED` reply (a slot that moved: a failover, a
resharding) refreshes the slot table and sends those calls again to their new node; an `ASK`
(a slot being migrated) sends them to the node named, after `ASKING`; a node that cannot be
reached refreshes the table too (its replica may have taken over) and its callers get the
error (503, retried by the client).

Acknowledged by replicas (`--store-ack-replicas N`): a node's pipeline that carries a write
that must survive its primary (a create, a finish) ends with `WAIT N timeout` on the same
connection, so the reply counts the replicas that have every write of that pipeline. Fewer
than N: those calls fail (`StoreUnavailable`, 503), and their callers retry them. A WAIT counts
the replicas that have every write up to its connection's last, but such a call may answer from
a write of another connection without writing itself (a create's retry finding the record its
first try wrote; a session poll reading a finish): so the pipeline writes once more before the
WAIT (an INCR of the call's slot's `w` key), and the reply then covers everything the calls saw.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, RedisClusterException, RedisError

from impl.server.store import StoreUnavailable
from impl.server.store.redis.pipeline import AutoPipeline

#: a call is sent at most this often when its slot keeps moving
REDIRECTS = 3


def slot_of(command: tuple[Any, ...]) -> int:
    """The hash slot of a command's first key (`EVALSHA sha n key...`, or `CMD key ...`)."""
    key = command[3] if command[0] == "EVALSHA" else command[1]
    return key_slot(key.encode() if isinstance(key, str) else key)


class Topology:
    """The cluster client's slot table, and a pooled plain client per primary node."""

    def __init__(self, cluster: Any, connections: int) -> None:
        self.cluster = cluster
        self.connections = connections
        self.nodes: dict[str, Any] = {}
        self._refreshing: asyncio.Task[None] | None = None
        #: how many times the slot table was read again
        self.refreshes = 0
        #: run after every read of the slot table, before its readers go on (the store's
        #: comparison of each group's primary, and its recovery of what moved)
        self.on_refresh: Callable[[], Awaitable[None]] | None = None
        #: while set, no call is sent: a moved group's session logs are being moved on
        self._hold: asyncio.Future[None] | None = None

    def primary(self, slot: int) -> Any:
        return self.cluster.nodes_manager.get_node_from_slot(slot)

    def client(self, host: str, port: int) -> Any:
        """A plain client of one node (its own blocking pool)."""
        import redis.asyncio as redis

        name = f"{host}:{port}"
        client = self.nodes.get(name)
        if client is None:
            pool = redis.BlockingConnectionPool(
                host=host, port=port, max_connections=self.connections, timeout=None,
                socket_connect_timeout=10.0, socket_timeout=30.0, driver_info=None,
            )  # fmt: skip
            client = self.nodes[name] = redis.Redis(connection_pool=pool)
        return client

    async def refresh(self) -> None:
        """Read the slot table again (one refresh at a time; concurrent callers share it)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        self.refreshes += 1
        await self.cluster.nodes_manager.initialize()
        if self.on_refresh is not None:
            await self.on_refresh()

    def hold(self) -> asyncio.Future[None]:
        """Hold every call until the returned future is resolved (`settled` waits for it)."""
        if self._hold is None or self._hold.done():
            self._hold = asyncio.get_running_loop().create_future()
        return self._hold

    async def settled(self) -> None:
        """Wait while calls are held."""
        while self._hold is not None and not self._hold.done():
            await asyncio.shield(self._hold)

    async def aclose(self) -> None:
        for client in self.nodes.values():
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()
        self.nodes.clear()


class ClusterPipeline(AutoPipeline):
    """`AutoPipeline` over a cluster: per-node pipelines, redirects followed, WAIT for acks."""

    def __init__(
        self,
        topology: Topology,
        scripts: dict[str, str],
        *,
        ack_replicas: int = 0,
        acked: tuple[str, ...] = (),
        ack_timeout_ms: int = 1000,
    ) -> None:
        super().__init__(topology.cluster, scripts)
        self.topology = topology
        self.ack_replicas = ack_replicas
        self.ack_timeout_ms = ack_timeout_ms
        #: the scripts whose writes WAIT for `ack_replicas` replicas
        self.acked = {self.shas[name] for name in acked if name in self.shas}
        self.waits = 0

    async def load(self) -> None:
        """Load every script on every primary (a promoted replica may lack them)."""
        for node in self.topology.cluster.get_primaries():
            client = self.topology.client(node.host, node.port)
            for text in self.texts.values():
                await client.script_load(text)

    async def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        replies: list[Any] = [None] * len(commands)
        todo = [(i, None) for i in range(len(commands))]  # (index, ASK target or None)
        for attempt in range(REDIRECTS):
            await self.topology.settled()
            by_node: dict[tuple[str, int], list[tuple[int, bool]]] = {}
            for i, ask in todo:
                if ask is not None:
                    address = ask
                else:
                    node = self.topology.primary(slot_of(commands[i]))
                    address = (node.host, node.port)
                by_node.setdefault(address, []).append((i, ask is not None))
            sent = list(by_node.items())
            results = await asyncio.gather(
                *(
                    self._send_node(addr, [(commands[i], a) for i, a in calls])
                    for addr, calls in sent
                ),
                return_exceptions=True,
            )
            todo, moved = [], False
            for (_, calls), result in zip(sent, results, strict=True):
                if isinstance(result, BaseException):
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    moved = True  # unreachable: its replica may have taken over
                    for i, _ in calls:
                        replies[i] = result
                    continue
                for (i, _), reply in zip(calls, result, strict=True):
                    replies[i] = reply
                    if isinstance(reply, MovedError):
                        moved = True
                        todo.append((i, None))
                    elif isinstance(reply, AskError):
                        todo.append((i, reply.node_addr))
            if moved:
                with contextlib.suppress(RedisError, RedisClusterException, OSError):
                    await self.topology.refresh()
            if not todo or attempt == REDIRECTS - 1:
                break
        return replies

    async def _send_node(
        self, address: tuple[str, int], calls: list[tuple[tuple[Any, ...], bool]]
    ) -> list[Any]:
        client = self.topology.client(*address)
        wait = self.ack_replicas > 0 and any(
            c[0] == "EVALSHA" and c[1] in self.acked for c, _ in calls
        )
        anchor = wait and next(
            (c for c, asking in calls if not asking and c[0] == "EVALSHA" and c[1] in self.acked),
            None,
        )
        async with client.pipeline(transaction=False) as pipe:
            for command, asking in calls:
                if asking:
                    pipe.execute_command("ASKING")
                pipe.execute_command(*command)
            if anchor:
                pipe.execute_command("INCR", _write_key(anchor[3]))
            if wait:
                pipe.execute_command("WAIT", self.ack_replicas, self.ack_timeout_ms)
            self.round_trips += 1
            self.commands += len(calls) + wait + bool(anchor)
            out = await pipe.execute(raise_on_error=False)
        if wait:
            self.waits += 1
            confirmed = out.pop()
            if anchor:
                out.pop()
            if isinstance(confirmed, Exception) or int(confirmed) < self.ack_replicas:
                error = StoreUnavailable(
                    f"the shared store's node {address[0]}:{address[1]} had the write confirmed "
                    f"by {confirmed} of {self.ack_replicas} replicas within "
                    f"{self.ack_timeout_ms} ms"
                )
                out = [
                    error
                    if c[0] == "EVALSHA" and c[1] in self.acked and not isinstance(r, Exception)
                    else r
                    for r, (c, _) in zip(self._drop_asking(out, calls), calls, strict=True)
                ]
                return out
        return self._drop_asking(out, calls)

    @staticmethod
    def _drop_asking(out: list[Any], calls: list[tuple[tuple[Any, ...], bool]]) -> list[Any]:
        if not any(asking for _, asking in calls):
            return out
        replies, position = [], 0
        for _, asking in calls:
            position += asking
            replies.append(out[position])
            position += 1
        return replies


def _write_key(key: Any) -> str:
    """The `w` key of `key`'s hash tag (`hotpath:{tag}...` -> `hotpath:{tag}w`): same slot."""
    text = key.decode() if isinstance(key, bytes) else str(key)
    return text[: text.index("}") + 1] + "w"
