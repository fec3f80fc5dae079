"""Store round trips and commands per result on the shared store, counted, not estimated.

`python -m impl.probes.store_calls [--samples N] [--concurrency C] [--url URL]` runs N samples
through a `RedisStore` in the order the routes call it, C samples at a time (one
`asyncio.gather` per step, as concurrent requests of one event loop):

- request: asample's `create`, the forward's `complete`, the fetch's `get`, then `delivered`
  (the result was ready when the fetch came: the cheapest per-request poll);
- session: the same, plus the session poller's `session_completions` (answers of at most
  32, the default batch) and the acks of the fetched ids in the next poll (`acknowledge`).

It counts, on the request path's connection pool, every round trip (one send of one command
or one pipeline) and every command, and the client CPU per result. The counts are fixed by the
code and by C (no timing); CPU is a measurement. Without `--url` it starts the embedded
redis-server (Debian's `redis-server`). On a cluster URL it runs a `ClusterStore` and counts
what its pipelines send (one round trip per node pipeline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from impl.server.store.redis import embedded


def count_calls(store: Any) -> dict[str, int]:
    """Count round trips and commands on `store`'s request-path pool from now on."""
    pool = store.client.connection_pool
    counts = {"round_trips": 0, "commands": 0}
    base = pool.connection_class

    class Counting(base):  # type: ignore[misc, valid-type]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counts["round_trips"] += 1
            await super().send_packed_command(command, check_health)

        def pack_command(self, *args: Any) -> Any:
            counts["commands"] += 1
            return super().pack_command(*args)

    pool.connection_class = Counting
    return counts


async def _waves(items: list[Any], concurrency: int, step: Any) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(items), concurrency):
        out += await asyncio.gather(*(step(item) for item in items[i : i + concurrency]))
    return out


async def measure(url: str, protocol: str, samples: int, concurrency: int) -> dict[str, Any]:
    """One protocol's counts per result (see the module docstring)."""
    from impl.server.store import Retention
    from impl.server.store.redis import cluster
    from impl.server.store.redis.store import RedisStore

    retention = Retention(
        completed_ttl=600.0, retrieved_ttl=60.0, max_outstanding=1 << 30, max_result_bytes=1 << 40
    )
    on_cluster = cluster.is_cluster(url)
    kind = cluster.ClusterStore if on_cluster else RedisStore
    store = kind(url, retention, to_json=lambda b: b"{}", prefix=f"calls{uuid.uuid4().hex[:8]}:")
    if on_cluster:  # a cluster's pipelines count their own sends (one per node)
        await store.client.initialize()
        await store.pipe.load()
        counts = store.pipe.__dict__  # round_trips, commands
        store.pipe.round_trips = store.pipe.commands = 0
    else:
        counts = count_calls(store)
        await store.pipe.load()  # a connection, and the scripts loaded (as `open` does)
        counts.update(round_trips=0, commands=0)
    session = f"bench-{uuid.uuid4().hex[:8]}:sample:0"
    payload = b"x" * 200
    began = time.process_time()
    records = await _waves(
        list(range(samples)), concurrency, lambda i: store.create((session, i), 1)
    )
    await _waves(records, concurrency, lambda r: store.complete(r, payload))
    cursor = 0
    if protocol == "session":
        seen = 0
        while seen < samples:
            entries, cursor = await store.session_completions((session, 0), cursor, 0, limit=32)
            seen += len(entries)

    async def fetch(record: Any) -> None:
        found = await store.get(record.request_id)
        assert found is not None and found.payload == payload, record.request_id
        await store.delivered(found)

    await _waves(records, concurrency, fetch)
    if protocol == "session":
        for i in range(0, samples, 32):
            ids = [r.request_id for r in records[i : i + 32]]
            await store.acknowledge((session, 0), ids)
            await store.session_completions((session, 0), cursor, 0)
    cpu = time.process_time() - began
    await store.aclose()
    return {
        "protocol": protocol,
        "samples": samples,
        "concurrency": concurrency,
        "round_trips_per_result": round(counts["round_trips"] / samples, 3),
        "commands_per_result": round(counts["commands"] / samples, 3),
        "client_cpu_us_per_result": round(cpu / samples * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--url", help="a Redis/Valkey URL (default: start the embedded one)")
    parser.add_argument("--protocol", choices=("request", "session", "both"), default="both")
    args = parser.parse_args(argv)
    engine = None if args.url else embedded.start()
    url = args.url or engine.url
    try:
        protocols = ("request", "session") if args.protocol == "both" else (args.protocol,)
        for protocol in protocols:
            result = asyncio.run(measure(url, protocol, args.samples, args.concurrency))
            print(json.dumps(result))
    finally:
        if engine is not None:
            engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
