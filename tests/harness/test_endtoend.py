"""The harness end to end: real fake router, real `hotpath serve`, real client processes.

Small scale (tens of samples) so the whole file takes well under a minute; every assertion is a
count (never a wall-clock threshold).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from impl.harness import load, presets, procs, report, watch
from impl.workloads import realtext

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("impl.server.cli") is None, reason="the server (impl.server) is absent"
)

FAULTS = "500:0.06,html:0.06,truncate:0.06,reset:0.06"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.slow
def test_router_faults_are_counted_and_no_result_is_lost():
    """64 samples, every fault kind injected upstream: each router answer is one result."""
    scenario = presets.Scenario(
        num_requests=64, max_tokens=32, client_processes=2, router_fail=FAULTS, timeout=120.0
    )
    run = load.run_scenario(
        scenario, label="faults", seed=18, verify="exact", warmup=0, progress_bar=False
    )
    summary = report.summarize(run)
    router = run["router"]
    injected = summary["router_injected"]
    assert set(injected) == {"500", "html", "truncate", "reset"}, injected  # seed 18 hits all
    assert sum(injected.values()) == router["faults"]
    # every good upstream answer became exactly one checked result, every fault a failure
    assert summary["completed"] == router["served"]
    assert summary["completed"] + summary["failed"] == 64
    assert set(run["failed"]) <= {"sample_error_server"}, run["examples"]
    # the server retried the 5xx answers once: the router saw one request per try
    assert router["served"] + router["faults"] >= 64
    assert summary["server_peak_rss_bytes"] and summary["server_cpu_seconds"] is not None
    assert summary["picks"], "the server reports its picks on /healthz"


@pytest.mark.slow
def test_compare_baseline_prints_both_and_writes_the_report(tmp_path, capsys):
    """`--compare baseline`: two runs, side by side, ratios in the JSON report."""
    path = tmp_path / "r.json"
    code = load.run(_args([
        "--num-requests", "32", "--client-processes", "1", "--compare", "baseline", "--no-progress",
        "--verify", "exact", "--report", str(path),
    ]))  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "baseline" in out and "picked" in out and "better by" in out
    data = json.loads(path.read_text())
    labels = [r["summary"]["label"] for r in data["runs"]]
    assert labels == ["baseline", "picked"]
    assert all(r["summary"]["completed"] == 32 for r in data["runs"])
    assert data["runs"][0]["summary"]["picks"] != data["runs"][1]["summary"]["picks"]
    assert data["ratios"]["results_per_second"] is not None
    # every /healthz probe is on the timeline: offset, latency, connect, loop lag, GC pause
    for run in data["runs"]:
        timeline = run["healthz_timeline"]
        assert len(timeline) == run["summary"]["healthz_samples"] >= 1
        offset, latency, connect, lag, pause = timeline[-1]
        assert 0 <= connect <= latency and lag >= 0 and pause >= 0 and offset >= 0
    # /metrics was sampled: where each measured result's time went, with what ran each step
    assert "where each result's time went" in out
    for run in data["runs"]:
        split = {(r["step"], r["implementation"]): r["count"] for r in run["summary"]["steps"]}
        picks = run["summary"]["picks"]
        for step, family in (("upstream_wait", "pool"), ("decode", "decode"), ("encode", "encode")):
            assert split[(step, picks[family])] == 32, (run["summary"]["label"], step)
        assert split[("serve", "protobuf")] >= 32
        assert run["steps_timeline"], "at least the final scrape is on the timeline"


@pytest.mark.parametrize("poll", ["session", "request"])
@pytest.mark.slow
def test_real_sdk_client_gets_every_token(poll):
    """`--client sdk`: the unmodified Tinker SDK samples through the server; exact tokens.
    `--poll` sets the server's flag, and the server's poll counts show which protocol ran."""
    pytest.importorskip("tinker")
    scenario = presets.Scenario(num_requests=12, max_tokens=20, num_samples=2, client_processes=1,
                                timeout=120.0, poll=poll)  # fmt: skip
    run = load.run_scenario(scenario, label="sdk", client="sdk", verify="exact", progress_bar=False)
    assert run["completed"] == 12, run["examples"]
    assert run["failed"] == {}
    assert run["poll"] == poll
    served = run["server_polls"]
    if poll == "session":
        assert served["retrieve_futures"] >= 1 and served["retrieve_future_payload"] == 12
        assert served.get("retrieve_future_try_again", 0) == 0
    else:
        assert served.get("retrieve_futures", 0) == 0 and served["retrieve_future_payload"] == 12


@pytest.mark.slow
def test_real_sdk_decodes_the_default_router_bodies():
    """`hotpath router` with no flags (real mixed text, rendered as vLLM renders it) behind
    `hotpath serve`: the unmodified Tinker SDK gets every sample, with the exact tokens."""
    pytest.importorskip("tinker")
    if realtext.unavailable_reason("mixed"):
        pytest.skip(realtext.unavailable_reason("mixed"))
    scenario = presets.Scenario(num_requests=8, max_tokens=600, num_samples=2, client_processes=1,
                                timeout=120.0, router_body="mixed")  # fmt: skip
    with procs.stopped_at_exit() as started:
        router = procs.start_router([])
        started.append(router)
        server = procs.start_server(router.url)
        started.append(server)
        run = load.run_scenario(
            scenario, label="default", url=server.url, router_url=router.url,
            server_pid=server.pid, client="sdk", verify="exact", progress_bar=False,
        )  # fmt: skip
        served = watch.fetch_json(router.url + "/stats")
    assert run["completed"] == 8, run["examples"]
    assert run["failed"] == {} and run["tokens"] >= 8 * 600
    assert served["served"] >= 8 and served["rendered"] >= 1


@pytest.mark.slow
def test_compare_poll_counts_requests_per_result(tmp_path, capsys):
    """`--compare poll`: per-request polling, then session polling, same scenario; each side's
    HTTP requests counted by path. Session: one fetch per result and fewer session polls than
    results; request: no retrieve_futures at all."""
    path = tmp_path / "r.json"
    code = load.run(_args([
        "--num-requests", "96", "--client-processes", "2", "--compare", "poll", "--no-progress",
        "--router-mode", "latency", "--gen-seconds", "0.3", "--max-num-seqs", "16",
        "--verify", "exact", "--warmup", "0", "--report", str(path),
    ]))  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "poll requests/result" in out and "session-poll" in out
    request, session = (r["summary"] for r in json.loads(path.read_text())["runs"])
    assert request["label"] == "request-poll" and session["label"] == "session-poll"
    assert request["completed"] == session["completed"] == 96
    assert "/api/v1/retrieve_futures" not in request["requests"]
    assert request["requests"]["/api/v1/retrieve_future"] >= 96
    assert session["requests"]["/api/v1/retrieve_future"] == 96
    assert 1 <= session["requests"]["/api/v1/retrieve_futures"] < 96
    assert session["server_polls"].get("retrieve_future_try_again", 0) == 0


@pytest.mark.slow
def test_profile_writes_speedscope_and_svg(tmp_path):
    """`--profile PREFIX`: py-spy records the server during the run."""
    prefix = tmp_path / "prof"
    scenario = presets.Scenario(num_requests=200, client_processes=1, timeout=120.0)
    run = load.run_scenario(scenario, label="p", profile=prefix, progress_bar=False)
    assert run["completed"] == 200
    speedscope = prefix.with_name("prof.speedscope.json")
    assert speedscope.exists() and json.loads(speedscope.read_text())["profiles"]
    assert prefix.with_name("prof.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


@pytest.mark.slow
def test_realistic_bodies_from_two_router_workers():
    """vllm bodies from 2 router processes through the server: exact tokens, n=2."""
    scenario = presets.Scenario(
        num_requests=16, max_tokens=3000, num_samples=2, client_processes=1, distinct_prompts=4,
        router_body="vllm", router_workers=2, timeout=120.0,
    )  # fmt: skip
    run = load.run_scenario(scenario, label="vllm", verify="exact", progress_bar=False)
    assert run["completed"] == 16, run["examples"]
    assert run["router"]["workers"] == 2
    assert run["tokens"] >= 16 * 3000


@pytest.mark.slow
def test_latency_mode_queues_behind_the_engine():
    """Router latency mode through the server: at most max-num-seqs generate, all complete."""
    scenario = presets.Scenario(
        num_requests=48, client_processes=2, router_mode="latency", gen_seconds=0.2,
        max_num_seqs=6, timeout=120.0,
    )  # fmt: skip
    run = load.run_scenario(scenario, label="latency", warmup=0, progress_bar=False)
    assert run["completed"] == 48, run["examples"]
    assert run["router"]["peak_generating"] == 6
    assert run["router"]["peak_in_flight"] > 6  # the rest waited in the router's queue


@pytest.mark.parametrize("settle_seconds", [120.0, 0.0])
@pytest.mark.slow
def test_the_warm_ups_stored_results_are_waited_out_before_the_window(monkeypatch, settle_seconds):
    """After the warm-up the server still keeps its fetched results (for the retrieved TTL):
    `settle` waits until it stores less than SETTLE_BYTES (here 1: nothing), so the window's
    peak RSS is the run's own; --settle-seconds 0 starts the window at once."""
    monkeypatch.setattr(watch, "SETTLE_BYTES", 1)
    scenario = presets.Scenario(
        num_requests=8, max_tokens=64, client_processes=1, distinct_prompts=4, timeout=120.0,
        server_args=("--retrieved-ttl", "1"),
    )  # fmt: skip
    run = load.run_scenario(
        scenario, label="settle", settle_seconds=settle_seconds, progress_bar=False
    )
    assert run["completed"] == 8, run["examples"]
    settled = run["settle"]
    assert settled["stored_bytes_before"] > 0  # the warm-up's 4 results were still stored
    if settle_seconds:
        assert settled["stored_bytes_after"] == 0  # ... and released before the window
    else:
        assert settled["stored_bytes_after"] == settled["stored_bytes_before"]
