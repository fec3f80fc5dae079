"""The shared store's key names, gathered per key space: one for a single engine, one per slot
group on a Redis Cluster (`impl.server.store.redis.cluster`).

A `Space` names every key the store writes under one prefix. On one engine the prefix is
`--store-prefix` (`hotpath:`), and the pending set, byte buckets, counters and wake-up channel
are single keys. On a cluster, each slot group has its prefix `hotpath:{tag}` (a hash tag), so
a record, its payload, its dedup key, its session's completion log and the group's pending set,
byte buckets, counters and channel all lie in one hash slot: every Lua script touches keys of
one slot only. The scripts derive no key but from a prefix they are given (`records`,
`prefix`), so the same script text serves both layouts.
"""

from __future__ import annotations

from impl.server.store.completions import Target


class Space:
    """The key names under one prefix (`prefix` ends where a key's own name starts)."""

    __slots__ = ("bytes", "channel", "no_key", "pending", "prefix", "records", "stats")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pending = prefix + "pending"
        self.bytes = prefix + "bytes"
        self.stats = prefix + "stats"
        self.channel = prefix + "done"
        #: a never-written placeholder where a script takes a key a record has none of
        self.no_key = prefix + "k:-"
        #: what a record key starts with (the scripts append a request id)
        self.records = prefix + "r:"

    def record(self, request_id: str) -> str:
        return f"{self.prefix}r:{request_id}"

    def payload(self, request_id: str) -> str:
        return f"{self.prefix}p:{request_id}"

    def dedup(self, key: tuple[str, int]) -> str:
        return f"{self.prefix}k:{key[1]}:{key[0]}"

    def meta(self, sampling_session_id: str) -> str:
        """The completion-log hash of a sampling session (`completions.py`)."""
        return f"{self.prefix}sl:{sampling_session_id}"

    def log(self, target: Target) -> str:
        """The completion list of one target (sampling session, clone)."""
        return f"{self.prefix}sq:{target[1]}:{target[0]}"
