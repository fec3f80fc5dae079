"""Pool: one burst of N requests in flight through a fresh forwarder, against a barrier router.

The same workload as `hotpath bench`'s pool section (`impl.bench.pool`): the fake router holds
every answer until N requests have arrived, so exactly N are in flight at once. Timed here in
this process (wall time of the burst plus the forwarder's set-up); the CPU per request of each
round is kept in the JSON's extra_info.
"""

import resource

import pytest
from conftest import create_or_skip, label

from impl import registry
from impl.bench import pool

COUNTS = (256, 1024)
#: implementations whose pool rescans every connection per request: ~30-85 s per burst at 1024
#: here, minutes per test; their growth is measured by `hotpath bench --only pool`
QUADRATIC = {"httpx", "httpx2"}


@pytest.fixture(scope="module", params=COUNTS, ids=lambda n: f"{n}-in-flight")
def router(request):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = pool.start_barrier_router(request.param)
    try:
        yield request.param, proc.url + "/v1/completions"
    finally:
        proc.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("name", registry.names("pool"))
def test_burst(benchmark, name, router):
    """N concurrent forwards (N = the router's barrier), every reply checked."""
    import uvloop

    in_flight, url = router
    create_or_skip("pool", name, max_connections=1)  # skips with the hint if unavailable
    if in_flight > 256 and name in QUADRATIC:
        pytest.skip(f"{name} at {in_flight}: ~1 min per burst; `hotpath bench --only pool`")
    label(benchmark, "pool", f"{in_flight} in flight", name)
    cpu = []

    def burst():
        result = uvloop.run(pool._burst(name, url, in_flight))
        assert result["failed"] == 0, result["first_failure"]
        cpu.append(result["cpu_seconds"] * 1e3 / in_flight)

    benchmark.pedantic(burst, rounds=2, iterations=1, warmup_rounds=0)
    benchmark.extra_info["cpu_ms_per_request"] = sorted(cpu)[len(cpu) // 2]
