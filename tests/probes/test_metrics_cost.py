"""The metrics' cost claim, checked as ratios measured in one run (no wall-clock threshold):
server CPU per sample and per cheap request with metrics on vs `--no-metrics`, side by side.
The target is at most 1.05x (docs/metrics.md, measured by `python -m impl.probes.metrics_cost`);
on a shared noisy machine the test allows a generous margin and checks that both sides did the
same, counted work.
"""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip(
    "prometheus_client", reason="needs prometheus-client: pip install 'hotpath[server]'"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc schedstat")
def test_metrics_cost_little_server_cpu():
    from impl.probes.metrics_cost import LENGTHS, measure

    results = measure(quick=True)
    full = results["full_sample"]
    count, rounds = LENGTHS["quick"]
    # both sides did the work measured: every batch's samples (plus the warm-up) went through
    # the metrics side's store, and it was scraped once per batch
    assert full["submitted_on_metrics_side"] == count * rounds + max(count // 4, 100)
    assert full["scrapes"] == rounds
    assert full["ratio"] < 1.25, f"metrics cost {full['ratio']:.3f}x server CPU per sample"
    # The per-request ratios over HTTP (results["routes"]) are reported by the benchmark, not
    # asserted: a single cheap request's ratio swung from 0.98x to 1.54x between quiet runs.
    # in process (no HTTP): the metrics side counted every request it timed (its histogram's
    # _count; asample also counts the one that made the poll's future), and the middleware's own
    # cost on the cheapest request stays under 2x. No lower bound on the ratio: on a loaded
    # machine the two sides' CPU times of a ~40 µs request crossed (0.91x in one run).
    in_process = results["in_process"]
    assert in_process["retrieve_future"]["counted"] == in_process["retrieve_future"]["timed"]
    assert in_process["asample"]["counted"] == in_process["asample"]["timed"] + 1
    for route, r in in_process.items():
        assert r["ratio"] < 2.0, f"{route} in process: {r['ratio']:.3f}x"
    assert full["scrape_cpu_s"] > 0
