"""Runtime family: the HTTP runtimes under the server's own app, on the load harness's traffic.

`impl.bench.runtime.measure(quick=True)` starts one `hotpath serve --runtime NAME` per
available runtime (the other families pinned to the reference's picks) and drives them in
turn: small-2048 results with session polling (server CPU per result and results/s, and the
CPU ratio to uvicorn_httptools in the same round), probe-128x262k (/healthz p99), long
results (server RSS after they are served and after they are dropped) and a burst of
connections opened at once. `setup_cache` runs it once; the `track_` benchmarks read the
figures. A runtime that cannot run here is n/a (NotImplementedError with its reason), as in the
other families. Linux only (the figures come from /proc).
"""

from impl import registry
from impl.bench.runtime import measure

NAMES = list(registry.names("runtime"))


def _check(runtime):
    reason = registry.unavailable_reason("runtime", runtime)
    if reason:
        raise NotImplementedError(reason)


class Runtime:
    """Per runtime: CPU and throughput on small results, probe latency, RSS, a burst."""

    params = (NAMES,)
    param_names = ("runtime",)
    timeout = 1800

    def setup_cache(self):
        return measure(quick=True)

    def setup(self, results, runtime):
        _check(runtime)

    def track_small_cpu_ms_per_result(self, results, runtime):
        return results["small"][runtime]["cpu_ms_per_result"]

    track_small_cpu_ms_per_result.unit = "ms"

    def track_small_cpu_ratio_to_httptools(self, results, runtime):
        return results["small"][runtime]["cpu_ratio"]

    track_small_cpu_ratio_to_httptools.unit = "ratio"

    def track_small_results_per_second(self, results, runtime):
        return results["small"][runtime]["results_per_second"]

    track_small_results_per_second.unit = "results/s"

    def track_probe_healthz_p99_ms(self, results, runtime):
        return results["probe"][runtime]["healthz_p99"] * 1e3

    track_probe_healthz_p99_ms.unit = "ms"

    def track_rss_after_long_results_mb(self, results, runtime):
        return results["rss"][runtime]["rss_served"] / 1e6

    track_rss_after_long_results_mb.unit = "MB"

    def track_rss_after_dropped_mb(self, results, runtime):
        return results["rss"][runtime]["rss_dropped"] / 1e6

    track_rss_after_dropped_mb.unit = "MB"

    def track_burst_seconds(self, results, runtime):
        bursts = results["bursts"][runtime]
        return bursts[max(bursts, key=int)]["seconds"]

    track_burst_seconds.unit = "s"
