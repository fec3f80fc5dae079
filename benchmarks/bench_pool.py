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

Budget (as `hotpath bench`'s pool section): some pools cost quadratically in the count (httpx
spent minutes per burst of 4096 here, and asv repeats a sample up to 5 times), so each class
keeps the wall seconds of every burst in its `setup_cache` directory, and `setup` raises
NotImplementedError (n/a) for a count whose burst `impl.bench.pool.predict` scales, from that
implementation's smaller counts, beyond the class's budget (FORWARD_BUDGET_SECONDS per burst
of `Forward`, CLIENT_BUDGET_SECONDS per fresh-process burst of `ClientCPU`). asv runs a
class's parameter combinations in order, smallest count first; a combination selected alone
(the gate's) has no smaller count measured and always runs. The budgets are tighter than
`hotpath bench`'s (20 s, `--full` 200 s), whose pool table is where the long bursts are
measured: they keep `make asv` on one commit within its 10-minute budget (benchmarks/README.md).
Both classes run one round (`rounds = 1`, one process per combination): a burst re-runs its
router and warm-up in `setup` before every sample, so a second round doubles the cost; the
gate passes its own `-a rounds=4` for the one `Forward` combination it times.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from impl import registry
from impl.bench import pool as bench

FAMILY = "pool"
NAMES = list(registry.names(FAMILY))


#: wall seconds one warm `Forward` burst may be predicted to take (each sample re-runs setup,
#: which bursts once more to open the connections, so a sample costs two bursts and a router)
FORWARD_BUDGET_SECONDS = 2.0
#: wall seconds one fresh-process `ClientCPU` burst may be predicted to take
CLIENT_BUDGET_SECONDS = 5.0


def _unavailable(implementation: str) -> None:
    reason = registry.unavailable_reason(FAMILY, implementation)
    if reason:
        raise NotImplementedError(reason)


def _walls(cache: str, implementation: str) -> dict[int, float]:
    """Wall seconds of the bursts of `implementation` recorded in `cache`, by count."""
    walls = {}
    for path in Path(cache).glob("*-*.json"):
        # by exact name: a pattern "httpx-*" would also read httpx-aiohttp's bursts
        name, count = path.stem.rsplit("-", 1)
        if name == implementation and count.isdigit():
            walls[int(count)] = json.loads(path.read_text())["wall_seconds"]
    return walls


def check_budget(cache: str, implementation: str, in_flight: int, budget: float) -> None:
    """NotImplementedError (n/a) when the smaller bursts predict one of `in_flight` over budget."""
    walls = {
        count: wall for count, wall in _walls(cache, implementation).items() if count < in_flight
    }
    if walls and (predicted := bench.predict(walls, in_flight)) > budget:
        raise NotImplementedError(
            f"{implementation}: a burst of {in_flight} is predicted to take {predicted:.0f} s "
            f"wall (from {max(walls)} in flight), over the {budget:.0f} s budget"
        )


class Forward:
    """One burst of N requests through a forwarder whose N connections are already open."""

    params = (NAMES, [256, 1024, 4096])
    param_names = ("implementation", "in_flight")
    number = 1
    repeat = (1, 5, 20.0)
    rounds = 1
    warmup_time = 0.0
    timeout = 3600

    def setup_cache(self):
        """A directory where each (implementation, N)'s first burst records its wall seconds."""
        return tempfile.mkdtemp(prefix="hotpath-bench-forward-")

    def setup(self, cache, implementation, in_flight):
        _unavailable(implementation)
        check_budget(cache, implementation, in_flight, FORWARD_BUDGET_SECONDS)
        self.router = bench.start_barrier_router(in_flight)
        self.url = self.router.url + "/v1/completions"
        self.loop = asyncio.new_event_loop()
        self.forwarder = registry.create(FAMILY, implementation, max_connections=in_flight)
        try:
            started = time.perf_counter()
            self.time_forward(cache, implementation, in_flight)  # opens the N connections
            wall = time.perf_counter() - started
        except BaseException:
            self.teardown(cache, implementation, in_flight)
            raise
        record = Path(cache, f"{implementation}-{in_flight}.json")
        if not record.exists():
            record.write_text(json.dumps({"wall_seconds": wall}))

    def teardown(self, cache, implementation, in_flight):
        router = self.__dict__.pop("router", None)
        if router is None:  # setup was n/a before starting anything; asv calls teardown anyway
            return
        try:
            forwarder = self.__dict__.pop("forwarder", None)
            if forwarder is not None:
                self.loop.run_until_complete(forwarder.aclose())
            self.loop.close()
        finally:
            router.stop()

    async def _burst(self, in_flight):
        post = self.forwarder.post
        return await asyncio.gather(
            *(post(self.url, bench.REQUEST, bench.HEADERS) for _ in range(in_flight))
        )

    def time_forward(self, cache, implementation, in_flight):
        replies = self.loop.run_until_complete(self._burst(in_flight))
        if any(reply.status != 200 for reply in replies):
            raise RuntimeError(f"{implementation}: a forward failed")


class ClientCPU:
    """Client-process CPU per request for one burst of N in a fresh process (cold pool)."""

    params = (NAMES, [256, 1024, 4096, 8192])
    param_names = ("implementation", "in_flight")
    rounds = 1
    timeout = 3600

    def setup_cache(self):
        """A directory where the measurement of each (implementation, N) is kept for both tracks."""
        return tempfile.mkdtemp(prefix="hotpath-bench-pool-")

    def setup(self, cache, implementation, in_flight):
        _unavailable(implementation)
        check_budget(cache, implementation, in_flight, CLIENT_BUDGET_SECONDS)

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
