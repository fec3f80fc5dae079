"""Pool family: forwarding a burst of N requests held in flight together by the fake router.

The router (`hotpath router --mode barrier --barrier N`, its own process) answers nobody until
N requests have arrived, so exactly N are in flight at once; an instant upstream would hide the
cost (requests would finish as fast as they are sent). Params are the registry table, not what
is installed: an implementation that cannot run here raises NotImplementedError (n/a).

- `Forward.time_forward`: wall time of one burst of N through a warm pool (N connections open),
  in this process; the CI gate times the picked implementation at 1024.
- `ClientCPU.track_cpu_ms_per_request` / `track_wall_seconds`: one burst in a fresh process
  (`impl.bench.pool.measure`), its CPU (all threads) per request and its wall time; the two
  share one measurement through `setup_cache`'s directory.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from impl import registry
from impl.bench import pool as bench

FAMILY = "pool"
NAMES = list(registry.names(FAMILY))


def _unavailable(implementation: str) -> None:
    reason = registry.unavailable_reason(FAMILY, implementation)
    if reason:
        raise NotImplementedError(reason)


class Forward:
    """One burst of N requests through a forwarder whose N connections are already open."""

    params = (NAMES, [256, 1024, 4096])
    param_names = ("implementation", "in_flight")
    number = 1
    repeat = (1, 5, 60.0)
    warmup_time = 0.0
    timeout = 3600

    def setup(self, implementation, in_flight):
        _unavailable(implementation)
        self.router = bench.start_barrier_router(in_flight)
        self.url = self.router.url + "/v1/completions"
        self.loop = asyncio.new_event_loop()
        self.forwarder = registry.create(FAMILY, implementation, max_connections=in_flight)
        try:
            self.time_forward(implementation, in_flight)  # opens the N connections
        except BaseException:
            self.teardown(implementation, in_flight)  # asv skips teardown when setup fails
            raise

    def teardown(self, implementation, in_flight):
        try:
            self.loop.run_until_complete(self.forwarder.aclose())
            self.loop.close()
        finally:
            self.router.stop()

    async def _burst(self, in_flight):
        post = self.forwarder.post
        return await asyncio.gather(
            *(post(self.url, bench.REQUEST, bench.HEADERS) for _ in range(in_flight))
        )

    def time_forward(self, implementation, in_flight):
        replies = self.loop.run_until_complete(self._burst(in_flight))
        if any(reply.status != 200 for reply in replies):
            raise RuntimeError(f"{implementation}: a forward failed")


class ClientCPU:
    """Client-process CPU per request for one burst of N in a fresh process (cold pool)."""

    params = (NAMES, [256, 1024, 4096, 8192])
    param_names = ("implementation", "in_flight")
    timeout = 3600

    def setup_cache(self):
        """A directory where the measurement of each (implementation, N) is kept for both tracks."""
        return tempfile.mkdtemp(prefix="hotpath-bench-pool-")

    def setup(self, cache, implementation, in_flight):
        _unavailable(implementation)
        half = Path(
            cache, f"{implementation}-{in_flight // 2}.json"
        )  # measured when N/2 is a param
        if half.exists() and json.loads(half.read_text())["wall_seconds"] > bench.BUDGET_SECONDS:
            raise NotImplementedError(
                f"{implementation}: the burst of N/2 exceeded the time budget"
            )

    def _measure(self, cache, implementation, in_flight):
        path = Path(cache, f"{implementation}-{in_flight}.json")
        if not path.exists():
            router = bench.start_barrier_router(in_flight)
            try:
                result = bench.measure(implementation, router.url, in_flight)
            finally:
                router.stop()
            if not result["ok"]:
                raise RuntimeError(f"{implementation}: wrong replies: {result['first_failure']}")
            path.write_text(json.dumps(result))
        return json.loads(path.read_text())

    def track_cpu_ms_per_request(self, cache, implementation, in_flight):
        return self._measure(cache, implementation, in_flight)["cpu_ms_per_request"]

    track_cpu_ms_per_request.unit = "ms"

    def track_wall_seconds(self, cache, implementation, in_flight):
        return self._measure(cache, implementation, in_flight)["wall_seconds"]

    track_wall_seconds.unit = "seconds"
