"""The report's pure functions: percentiles, summaries, ratios, verdicts, the JSON report."""

from __future__ import annotations

import json

import pytest

from impl.harness import presets, report


def _run(label: str, wall: float, completed: int, **extra) -> dict:
    run = {
        "label": label,
        "requested": 100,
        "completed": completed,
        "wall_seconds": wall,
        "failed": {},
        "retries": {"poll_try_again": 3},
        "latencies": [0.1 * i for i in range(1, 11)],
        "result_bytes": 5_000_000,
        "tokens": 1000,
        "server": {"peak_rss_bytes": 200_000_000, "peak_fds": 50, "cpu_seconds": 4.0},
        "healthz_latencies": [0.001] * 99 + [0.5],
        "healthz": {
            "picks": {"decode": {"name": "simdjson", "reason": "measured"}, "pool": "aiohttp"}
        },
        "router": {"peak_in_flight": 7, "injected": {"500": 2}},
    }
    run.update(extra)
    return run


def test_percentile_interpolates_between_ranks():
    assert report.percentile([], 50) is None
    assert report.percentile([3.0], 99) == 3.0
    assert report.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert report.percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert report.percentile([5, 1, 3], 0) == 1 and report.percentile([5, 1, 3], 100) == 5


def test_summarize_figures():
    s = report.summarize(_run("picked", wall=2.0, completed=100))
    assert s["results_per_second"] == pytest.approx(50.0)
    assert s["mb_per_second"] == pytest.approx(2.5)
    assert s["latency_p50"] == pytest.approx(0.55)
    assert s["healthz_p99"] == pytest.approx(0.001 + 0.01 * (0.5 - 0.001))  # rank 98.01
    assert s["picks"] == {"decode": "simdjson", "pool": "aiohttp"}
    assert s["router_peak_in_flight"] == 7 and s["router_injected"] == {"500": 2}
    assert report.verdict(s) == []


def test_verdict_flags_failures_and_missing_samples():
    s = report.summarize(_run("x", wall=1.0, completed=90, failed={"lost": 4}))
    problems = report.verdict(s)
    assert any("4 failed" in p and "lost=4" in p for p in problems)
    assert any("6 neither completed nor failed" in p for p in problems)


def test_compare_ratios_are_better_by():
    before = report.summarize(_run("baseline", wall=20.0, completed=100))
    after = report.summarize(
        _run(
            "picked",
            wall=1.0,
            completed=100,
            server={"peak_rss_bytes": 100_000_000, "peak_fds": 50, "cpu_seconds": 2.0},
        )
    )
    ratios = report.compare(before, after)
    assert ratios["results_per_second"] == pytest.approx(20.0)
    assert ratios["wall_seconds"] == pytest.approx(20.0)
    assert ratios["server_peak_rss_bytes"] == pytest.approx(2.0)
    assert ratios["server_cpu_seconds"] == pytest.approx(2.0)
    table = report.render_compare(before, after)
    assert "20.0x" in table and "baseline" in table and "picked" in table


def test_ratio_undefined_cases():
    assert report.ratio(None, 1.0, True) is None
    assert report.ratio(0.0, 1.0, True) is None
    assert report.ratio(2.0, 1.0, False) == 2.0


def test_render_run_and_json_report_are_complete():
    runs = [_run("baseline", 10.0, 100), _run("picked", 1.0, 100)]
    text = report.render_run(report.summarize(runs[1]))
    for label in (
        "completed",
        "results/s",
        "latency p99",
        "server peak RSS",
        "/healthz p99",
        "router peak in flight",
        "server picks: decode=simdjson",
    ):
        assert label in text
    data = report.report_json(runs, environment={"python": "3.11"})
    json.dumps(data)  # serialisable
    assert data["ratios"]["results_per_second"] == pytest.approx(10.0)
    assert "latencies" not in data["runs"][0]["summary"]


def test_presets_are_bounded_and_fit_the_fd_limit():
    for name, (scenario, description) in presets.PRESETS.items():
        assert description
        assert 0 < scenario.num_requests <= 131072 and scenario.timeout <= 3600, name
        # polled per request, client + server each hold one connection per outstanding sample;
        # with session polling a waiting sample holds none
        if scenario.poll != "session":
            assert scenario.max_outstanding <= 16000, name
        assert scenario.poll in ("auto", "session", "request"), name
        assert "--mode" in scenario.router_args()
    with pytest.raises(LookupError, match="small-2048"):
        presets.get("nope")
    assert presets.get("small-2048").with_overrides(num_requests=5, timeout=None).num_requests == 5


def test_requests_and_polls_per_result():
    """Client-side HTTP requests and server-side poll answers are reported per result."""
    run = {
        "completed": 100,
        "wall_seconds": 1.0,
        "poll": "session",
        "requests": {
            "/api/v1/asample": 100,
            "/api/v1/retrieve_future": 100,
            "/api/v1/retrieve_futures": 4,
        },
        "server_polls": {
            "retrieve_future_payload": 100,
            "retrieve_futures": 5,
            "retrieve_futures_completions": 100,
        },
        "server": {"cpu_seconds": 0.05},
    }
    summary = report.summarize(run)
    assert summary["http_requests_per_result"] == pytest.approx(2.04)
    assert summary["poll_requests_per_result"] == pytest.approx(1.04)
    assert summary["server_polls_per_result"] == pytest.approx(1.05)
    assert summary["server_cpu_ms_per_result"] == pytest.approx(0.5)
    text = report.render_run(summary)
    assert "poll requests/result" in text and "1.040" in text
    assert "retrieve_futures=4" in text
    empty = report.summarize({"completed": 0})
    assert empty["poll_requests_per_result"] is None and empty["server_polls_per_result"] is None


def test_retention_prediction_and_per_core_rates():
    """Delivered MB/s x the retrieved TTL (the flag's, else the server's 60 s default), the
    store's RSS apart, results/s per core of the server's affinity and per server CPU second."""
    server = {"peak_rss_bytes": 2e8, "store_peak_rss_bytes": 3e8, "cores": 2, "cpu_seconds": 5.0}
    run = _run("x", wall=10.0, completed=100, server=server)
    s = report.summarize(run)
    assert s["retention_prediction_bytes"] == pytest.approx(5_000_000 / 10.0 * 60.0)
    assert s["store_peak_rss_bytes"] == 3e8
    assert s["results_per_second_per_core"] == pytest.approx(5.0)
    assert s["results_per_server_cpu_second"] == pytest.approx(20.0)
    for flags in (["--retrieved-ttl", "30"], ["--retrieved-ttl=30"]):
        run["scenario"] = {"server_args": ["--workers", "2", *flags]}
        assert report.summarize(run)["retention_prediction_bytes"] == pytest.approx(15e6)
    bare = report.summarize(_run("y", wall=0.0, completed=0))
    assert bare["retention_prediction_bytes"] is None
    assert bare["results_per_second_per_core"] is None and bare["store_peak_rss_bytes"] is None
    assert "retention prediction" in report.render_run(s) and "300 MB" in report.render_run(s)


def test_the_headline_preset():
    """long-queue-8192x212k: long real-text bodies behind a queueing engine (issue 30)."""
    scenario = presets.get("long-queue-8192x212k")
    assert (scenario.num_requests, scenario.max_tokens) == (8192, 212000)
    assert scenario.router_body == "mixed" and scenario.gen_seconds == 5.0
    args = scenario.router_args()
    assert args[args.index("--max-num-seqs") + 1] == "256" and "--workers" in args
    assert scenario.poll == "auto" and report.retrieved_ttl(scenario.as_json()) == 60.0
