"""What a cluster's failover may lose, found and written again by the process that wrote it.

A Redis Cluster primary answers a write before its replicas have it; killed in that moment, the
replica promoted in its place lacks the write. Without `--store-ack-replicas`, each process
therefore keeps, per record it created or finished, the record's job (router body and options)
and the primary it wrote to, until that primary confirms a replica has every write up to then
(`confirm_loop`: an INCR and `WAIT 1` on the primary's own connection, every CONFIRM_S; a write
confirmed there is replicated, replication being in order). Records still unconfirmed when their
group's primary changes are checked on the new primary (`check`):

- missing: written again with the same request id (the CREATE script: record, dedup key,
  pending, the session log's pending count); if this process's forward is still running, its
  finish lands on it; if it had finished, the sample is forwarded again (`reforwards`; each
  record written again counts `rewritten`; both are summed over the processes in /healthz's
  `store`);
- pending though this process had finished it (the finish was the lost write): forwarded again.

Before any call resumes, every process moves on the session logs of the groups whose primary
changed (`renumber`, from ClusterStore's comparison after every read of the slot table, its
calls held meanwhile): a poll answered by the lost primary may hold a cursor past the new
primary's log head, where later finishes would land and be taken as seen (or the cursor is
unknown there: 410). Each log's heads move LOG_ROOM positions on (their entries with them),
past every position the lost primary can have handed out; a client's cursor then lies before
them, and its next poll reports them (some a second time, which a poller ignores). Positions
only move up, so a second process's move loses nothing either.

A finish that finds no record (`-2` from FINISH: its create was lost) writes the record again
and finishes it. What this cannot bring back: a record whose writer died with the primary (the
lease of a pending one then lapses on the new primary only if its create reached it).
`--store-ack-replicas 1` closes that window (and its session polls answer only what a replica
has: cluster_pipeline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from impl.server.store import Key, Record, StoreUnavailable
from impl.server.store.redis import slots

log = logging.getLogger("hotpath.server")
#: how often each process asks its primaries to confirm replication
CONFIRM_S = 0.5
#: an entry no primary confirmed (a cluster without replicas) is dropped after this long
KEEP_S = 60.0
#: how far a session log's positions move on after a failover: more completions than one
#: target can have had in the moments a primary's replica lagged
LOG_ROOM = 1 << 20
# KEYS: a session's log hash. ARGV: room. Moves each clone's log head (and so the positions
# of its entries) `room` on; returns how many it moved.
RENUMBER = """
local moved = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, -2) == ':h' then
    redis.call('HINCRBY', KEYS[1], field, ARGV[1])
    moved = moved + 1
  end
end
return moved
"""


@dataclass(slots=True)
class Written:
    group: int
    node: str | None
    at: float
    key: Key | None
    n: int
    job: Any
    owner: str = ""
    finished: bool = False


class Recovery:
    """One process's unconfirmed writes on a ClusterStore, and their recovery."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.entries: OrderedDict[str, Written] = OrderedDict()
        self.rewritten = 0
        self.reforwards = 0
        self.confirmations = 0
        self.renumbered = 0

    def wrote(self, record: Record, job: Any) -> None:
        group = slots.group_of_id(record.request_id) or 0
        self.entries[record.request_id] = Written(
            group, self.store.primaries.get(group), time.monotonic(), record.key,
            len(record.sequence_ids), job, record.owner,
        )  # fmt: skip

    def finished(self, record: Record) -> None:
        entry = self.entries.pop(record.request_id, None)
        if entry is not None:
            entry.finished = True
            entry.at = time.monotonic()
            entry.node = self.store.primaries.get(entry.group)
            self.entries[record.request_id] = entry  # to the end: the newest write

    async def rewrite(self, record: Record) -> bool:
        """CREATE `record` again (its job and owner as this process wrote it); False when its key
        belongs to another record."""
        request_id = record.request_id
        entry = self.entries.get(request_id)
        job, owner = (entry.job, entry.owner) if entry is not None else (None, record.owner)
        n = len(record.sequence_ids)
        written = await self.store._rewrite(request_id, record.key, n, job, owner)
        if written:
            self.rewritten += 1
            with contextlib.suppress(RedisError, OSError):
                space = self.store._space_of(request_id)
                await self.store.pipe.call("HINCRBY", space.stats, "rewritten", 1)
            log.warning("%s was lost with a primary: written again", request_id)
        return written

    # -- confirmation ----------------------------------------------------------------------
    async def confirm_loop(self) -> None:
        while True:
            await asyncio.sleep(CONFIRM_S)
            if self.store.health.away is not None:
                continue
            with contextlib.suppress(RedisError, OSError, StoreUnavailable):
                await self.confirm()

    async def confirm(self) -> None:
        """Drop the entries each primary confirms a replica has (and those too old)."""
        began = time.monotonic()
        while self.entries:
            first = next(iter(self.entries.values()))
            if began - first.at < KEEP_S:
                break
            self.entries.popitem(last=False)
        nodes = {e.node for e in self.entries.values() if e.node is not None}
        groups = {name: g for g, name in self.store.primaries.items()}
        confirmed = set()
        for node in nodes:
            group = groups.get(node)
            if group is None:
                continue  # no longer a primary: `check` deals with its entries
            host, port = node.rsplit(":", 1)
            client = self.store.topology.client(host, int(port))
            async with client.pipeline(transaction=False) as pipe:
                pipe.incr(self.store.spaces[group].prefix + "w")
                pipe.execute_command("WAIT", 1, 500)
                replies = await pipe.execute(raise_on_error=False)
            if not isinstance(replies[1], Exception) and int(replies[1]) >= 1:
                confirmed.add(node)
        if confirmed:
            self.confirmations += 1
            for request_id in [
                r for r, e in self.entries.items() if e.node in confirmed and e.at < began
            ]:
                del self.entries[request_id]

    # -- after a failover ------------------------------------------------------------------
    async def check(self, groups: list[int]) -> None:
        """Check this process's unconfirmed records of `groups` on their new primaries."""
        store = self.store
        todo = [
            (rid, e)
            for rid, e in self.entries.items()
            if e.group in groups and e.node != store.primaries.get(e.group)
        ]
        if not todo:
            return
        states = await asyncio.gather(
            *(store.pipe.call("HGET", store._space_of(rid).record(rid), "s") for rid, _ in todo),
            return_exceptions=True,
        )
        for (rid, entry), state in zip(todo, states, strict=True):
            if isinstance(state, BaseException):
                continue  # checked again at the next change, or dropped after KEEP_S
            entry.node, entry.at = store.primaries.get(entry.group), time.monotonic()
            if state is None:
                if not await self.rewrite(Record(rid, entry.key, entry.n, entry.owner)):
                    continue
                if rid in store.owned:
                    continue  # its forward runs here: its finish lands on the new record
                await self.forward_again(rid, entry)
            elif state == b"pending" and entry.finished and rid not in store.owned:
                await self.forward_again(rid, entry)

    async def renumber(self, groups: list[int]) -> None:
        """Move every session log of `groups` LOG_ROOM positions on (the docstring), on each
        group's new primary."""
        store = self.store
        for group in groups:
            name = store.primaries.get(group)
            if name is None:
                continue
            host, port = name.rsplit(":", 1)
            client = store.topology.client(host, int(port))
            match = store.spaces[group].meta("*")
            keys = [key async for key in client.scan_iter(match=match, count=1000)]
            if not keys:
                continue
            # on the node's own connection, not the store's pipeline (its calls are held
            # meanwhile); EVAL, not EVALSHA: a promoted replica may not have the script cached
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.eval(RENUMBER, 1, key, LOG_ROOM)
                moved = await pipe.execute(raise_on_error=False)
            self.renumbered += sum(1 for m in moved if not isinstance(m, BaseException))

    async def forward_again(self, request_id: str, entry: Written) -> None:
        """Forward a record this process had finished, whose result a failover lost."""
        store = self.store
        if entry.job is None or store.on_takeover is None:
            return
        self.reforwards += 1
        store.owned.add(request_id)
        space = store._space_of(request_id)
        with contextlib.suppress(RedisError, OSError):
            await store.pipe.call("HINCRBY", space.stats, "reforwards", 1)
        log.warning("forwarding %s again: its result was lost with a primary", request_id)
        body, options = entry.job.pack()
        store.on_takeover(Record(request_id, entry.key, entry.n, entry.owner), body, options)

    def describe(self) -> dict[str, int]:
        return {
            "unconfirmed_writes": len(self.entries),
            "rewritten_here": self.rewritten,
            "reforwards_here": self.reforwards,
            "logs_renumbered_here": self.renumbered,
        }
