"""The server's hot routes: server CPU per request, next to a bare Starlette route, in one run.

`impl.bench.server.measure` starts three apps under the same uvicorn configuration (the
production app with its forward left unsent, bare Starlette + orjson doing the same JSON work,
idiomatic FastAPI), drives them in alternating batches over keep-alive connections, checks every
response, and reads each server process's CPU from /proc. `setup_cache` runs it once; the
`track_` benchmarks read the figures (µs per request, and the ratio to Starlette, whose target
is <= 1.2 for hotpath). Linux only (NotImplementedError elsewhere, shown as n/a).
"""

from impl.bench.server import measure

APPS = ["hotpath", "hotpath-routed", "starlette", "fastapi"]
ROUTES = ["retrieve_future", "asample"]


class HotRoutes:
    """retrieve_future answering try_again, and asample (route only), per app."""

    params = (APPS, ROUTES)
    param_names = ("app", "route")
    timeout = 600

    def setup_cache(self):
        return measure(quick=True)

    def track_server_cpu_us(self, results, app, route):
        return results[route][app]["cpu_s"] * 1e6

    track_server_cpu_us.unit = "µs"

    def track_ratio_to_starlette(self, results, app, route):
        return results[route][app]["ratio_to_starlette"]

    track_ratio_to_starlette.unit = "ratio"
