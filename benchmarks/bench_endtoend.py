"""End to end: a small `hotpath loadtest` run, reported through `track_` benchmarks.

Each class runs the harness's Python API (`impl.harness.load.run_scenario`, the same code as
`hotpath loadtest --preset small-2048`: 2048 small results) `ROUNDS` times in `setup_cache`:
a fresh fake router and a fresh `hotpath serve` per round, the SDK-shaped client in its own
processes, all on loopback. The tracked figure is the median over the rounds, so one
descheduled round on a shared 2-core machine does not move it much. A round that lost or
failed a sample makes setup_cache raise: a server that drops results has no throughput.

`SmallResults` runs the server with the implementations it picks on this machine;
`SmallResultsBaseline` runs `hotpath serve --baseline` (the old path) for the dashboard's
"before" line, in BASELINE_ROUNDS rounds: one, so that `make asv` on one commit stays within
its budget (benchmarks/README.md); its figure is one round's, not a median. The regression gate
runs only `SmallResults`.
"""

import statistics

from impl.harness import load, presets, report

#: the scenario: the small-2048 preset (a round is the servers' start-up, then the load)
REQUESTS = 2048
ROUNDS = 3
#: rounds of the baseline's run (the dashboard's "before" line; not gated)
BASELINE_ROUNDS = 1


def run_rounds(baseline: bool, rounds: int = ROUNDS) -> dict:
    """`rounds` short loadtest runs; the median figures and every round's summary."""
    scenario = presets.get("small-2048").with_overrides(num_requests=REQUESTS, timeout=120.0)
    summaries = []
    for i in range(rounds):
        run = load.run_scenario(
            scenario,
            label=f"{'baseline' if baseline else 'picked'}-{i}",
            baseline=baseline,
            progress_bar=False,
        )
        summaries.append(report.checked_summary(run, f"loadtest round {i}"))
    return {
        "results_per_second": statistics.median(s["results_per_second"] for s in summaries),
        "server_cpu_ms_per_sample": statistics.median(
            1e3 * s["server_cpu_seconds"] / s["completed"] for s in summaries
        ),
        "latency_p99_s": statistics.median(s["latency_p99"] for s in summaries),
        "rounds": summaries,
    }


class SmallResults:
    """2048 small results through the picked server: throughput and server CPU per sample."""

    timeout = 600

    def setup_cache(self):
        return run_rounds(baseline=False)

    def track_results_per_second(self, data):
        return data["results_per_second"]

    track_results_per_second.unit = "results/s"

    def track_wall_ms_per_result(self, data):
        return 1e3 / data["results_per_second"]

    track_wall_ms_per_result.unit = "ms"

    def track_server_cpu_ms_per_sample(self, data):
        return data["server_cpu_ms_per_sample"]

    track_server_cpu_ms_per_sample.unit = "ms"

    def track_latency_p99_s(self, data):
        return data["latency_p99_s"]

    track_latency_p99_s.unit = "s"


class SmallResultsBaseline(SmallResults):
    """The same run against `hotpath serve --baseline` (the path before the fixes)."""

    def setup_cache(self):
        return run_rounds(baseline=True, rounds=BASELINE_ROUNDS)
