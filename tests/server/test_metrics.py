"""GET /metrics: scraped with prometheus-client's own parser while a small load runs, the
figures move by exactly what the load did; failures are counted by class, 429s by limit, GC
pauses by generation; --no-metrics answers 404; the Grafana dashboard names only exported
metrics; two processes sharing PROMETHEUS_MULTIPROC_DIR are scraped as one.
"""

from __future__ import annotations

import gc
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.fake_vllm import (
    DELAY_BASE,
    SEED_422,
    SEED_500_ALWAYS,
    SEED_500_ONCE,
    SEED_CLOSE,
    SEED_HTML,
)
from tests.support.server import Api, start_server

pytestmark = pytest.mark.heavy

parser = pytest.importorskip(
    "prometheus_client.parser", reason="needs prometheus-client: pip install 'hotpath[server]'"
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "hotpath-server.json"
STEP = "hotpath_step_duration_seconds_count"
REQUESTS = "hotpath_http_request_duration_seconds_count"


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of GET /metrics, parsed by prometheus_client.parser: (name, labels) -> value."""
    import httpx

    response = httpx.get(url + "/metrics", timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in parser.text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def server(upstream):
    with start_server(upstream.url, "--poll-hold", "2") as process:
        yield process


def _sample(api: Api, ssid: str, seq_id: int, proto: bool) -> int:
    request_id = api.asample(ssid, seq_id, seed=seq_id).json()["request_id"]
    return api.result(request_id, proto=proto).status_code


@pytest.mark.slow
def test_figures_move_under_a_small_load(server, api):
    """24 samples (16 protobuf, 8 JSON polls) while another thread scrapes: every count moves
    by what the load did, and no counter ever goes down between scrapes."""
    picks = {f: p["name"] for f, p in api.healthz()["picks"].items()}
    ssid = api.sampling_session()
    before = scrape(server.url)
    held_before = api.healthz()["held_polls"]
    snapshots, done = [], threading.Event()

    def scraper() -> None:  # at least two scrapes, the first as the load starts
        while not done.is_set() or len(snapshots) < 2:
            snapshots.append(scrape(server.url))
            time.sleep(0.02)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda i: _sample(api, ssid, 1000 + i, i % 3 != 0), range(24)))
    finally:
        done.set()
        thread.join()
    after = scrape(server.url)
    held_after = api.healthz()["held_polls"]
    assert statuses == [200] * 24
    assert len(snapshots) >= 2, "the scraper saw nothing during the load"

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    asample = {"route": "/api/v1/asample", "method": "POST", "status": "200"}
    retrieve = {"route": "/api/v1/retrieve_future", "method": "POST", "status": "200"}
    assert moved(REQUESTS, **asample) == 24
    assert moved(REQUESTS, **retrieve) >= 24  # a poll may answer try_again first
    assert moved("hotpath_http_request_duration_seconds_sum", **asample) > 0
    bucket = "hotpath_http_request_duration_seconds_bucket"
    assert moved(bucket, **asample, le="+Inf") == 24
    for step, implementation in (
        ("upstream_wait", picks["pool"]),
        ("decode", picks["decode"]),
        ("encode", picks["encode"]),
        ("store", "memory"),
    ):
        labels = {"step": step, "implementation": implementation}
        assert moved(STEP, **labels) == 24, step
        assert moved("hotpath_step_duration_seconds_sum", **labels) > 0, step
    assert moved(STEP, step="serve", implementation="protobuf") == 16
    assert moved(STEP, step="serve", implementation="json") == 8
    for counter in ("submitted", "completed", "delivered"):
        assert moved(f"hotpath_store_{counter}_total") == 24, counter
    assert value(after, "hotpath_store_records", state="done") >= 24
    assert value(after, "hotpath_store_stored_bytes") > value(before, "hotpath_store_stored_bytes")
    assert value(after, "hotpath_store_outstanding") == 0
    assert moved("hotpath_event_loop_lag_seconds_count") >= 1  # sampled every 0.25 s
    for kind, reasons in held_after.items():  # the same counts as /healthz held_polls
        for reason, count in reasons.items():
            held = moved("hotpath_held_polls_total", kind=kind, reason=reason)
            assert held == count - held_before[kind][reason], (kind, reason)
    assert sum(held_after["future"].values()) > sum(held_before["future"].values())  # exercised
    intake = api.healthz()["intake"]  # the same counts as /healthz intake, which admitted all 24
    assert value(after, "hotpath_intake_admitted_total") == intake["admitted"]
    assert moved("hotpath_intake_admitted_total") == 24
    assert value(after, "hotpath_intake_deferred_total") == intake["deferred"]
    assert value(after, "hotpath_intake_waiting") == 0
    info = [dict(labels) for (name, labels) in after if name == "hotpath_build_info"]
    assert len(info) == 1
    assert {f: info[0][f"pick_{f}"] for f in picks} == picks
    assert value(after, "process_cpu_seconds_total") > 0
    for earlier, later in zip([before, *snapshots], [*snapshots, after], strict=True):
        for key, figure in earlier.items():
            if key[0].endswith(("_total", "_count", "_sum", "_bucket")):
                assert later.get(key, 0.0) >= figure, key


def test_routes_are_labelled_by_template_and_unknown_paths_stay_bounded(server, api):
    """A path parameter does not create a label value per id; unknown paths share one."""
    session = api.post("/api/v1/create_session", {"tags": [], "sdk_version": "test"})
    session_id = session.json()["session_id"]
    assert api.post(f"/api/v1/sessions/{session_id}/finish", {}).status_code == 200
    api.http.get("/no/such/path/1")
    api.http.get("/no/such/path/2")
    samples = scrape(server.url)
    routes = {dict(labels)["route"] for (name, labels) in samples if name == REQUESTS}
    assert "/api/v1/sessions/{session_id}/finish" in routes
    assert not any(session_id in route for route in routes)
    assert value(samples, REQUESTS, route="unmatched", method="GET", status="404") >= 2
    assert not any(route.startswith("/no/") for route in routes)


@pytest.mark.parametrize(
    ("seed", "kind"),
    [
        (SEED_HTML, "decode"),
        (SEED_500_ALWAYS, "http_5xx"),
        (SEED_422, "http_status"),
        (SEED_CLOSE, "read"),
    ],
)
def test_upstream_failures_are_counted_by_class(server, api, seed, kind):
    ssid = api.sampling_session()
    before = scrape(server.url)
    request_id = api.asample(ssid, 1, seed=seed).json()["request_id"]
    assert "error" in api.result(request_id, proto=False).json()
    after = scrape(server.url)
    name = "hotpath_upstream_failures_total"
    assert value(after, name, **{"class": kind}) - value(before, name, **{"class": kind}) == 1
    others = [k for k in ("decode", "http_5xx", "http_status", "read", "connect") if k != kind]
    for other in others:
        assert value(after, name, **{"class": other}) == value(before, name, **{"class": other})
    assert value(after, "hotpath_store_records", state="failed") >= 1


def test_a_retried_5xx_counts_a_retry_not_a_failure(server, api):
    ssid = api.sampling_session()
    before = scrape(server.url)
    prompt = [128000, 424242, 7]  # a prompt no other test sent: its first request gets the 500
    request_id = api.asample(ssid, 1, seed=SEED_500_ONCE, prompt=prompt).json()["request_id"]
    assert api.result(request_id).status_code == 200
    after = scrape(server.url)
    assert (
        value(after, "hotpath_upstream_retries_total")
        - value(before, "hotpath_upstream_retries_total")
        == 1
    )
    failures = [k for k in after if k[0] == "hotpath_upstream_failures_total"]
    assert all(after[k] == before.get(k, 0.0) for k in failures)


def test_429s_are_counted_by_limit(upstream):
    with start_server(upstream.url, "--max-outstanding", "2", "--poll-hold", "0") as server:
        api = Api(server.url)
        try:
            ssid = api.sampling_session()
            for seq_id in (1, 2):  # held pending by the upstream for 3 s
                assert api.asample(ssid, seq_id, seed=DELAY_BASE + 3000).status_code == 200
            refused = api.asample(ssid, 3, seed=1)
            assert refused.status_code == 429
            samples = scrape(server.url)
        finally:
            api.close()
    assert value(samples, "hotpath_backpressure_rejections_total", limit="outstanding") == 1
    assert value(samples, "hotpath_backpressure_rejections_total", limit="bytes") == 0
    assert value(samples, REQUESTS, route="/api/v1/asample", method="POST", status="429") == 1
    assert value(samples, "hotpath_store_outstanding") == 2
    assert value(samples, "hotpath_store_records", state="pending") == 2


def test_no_metrics_answers_404_and_still_serves(upstream):
    with start_server(upstream.url, "--no-metrics", "--poll-hold", "2") as server:
        api = Api(server.url)
        try:
            response = api.http.get("/metrics")
            ssid = api.sampling_session()
            status = _sample(api, ssid, 1, True)
        finally:
            api.close()
    assert response.status_code == 404
    assert "--no-metrics" in response.json()["detail"]
    assert status == 200


def test_gc_pauses_are_observed_by_generation():
    """In-process: the GC monitor's hook feeds gc_pause_seconds for each collection."""
    from impl.server.metrics import Metrics
    from impl.server.state import GcMonitor

    metrics = Metrics({"decode": "json", "encode": "wire", "pool": "httpx", "accesslog": "plain"})
    monitor = GcMonitor()
    monitor.observe = metrics.gc_pause
    monitor.start()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        monitor.stop()
    count = metrics.registry.get_sample_value
    assert count("hotpath_gc_pause_seconds_count", {"generation": "2"}) >= 1
    assert count("hotpath_gc_pause_seconds_count", {"generation": "0"}) >= 1
    assert count("hotpath_gc_pause_seconds_sum", {"generation": "2"}) > 0


def test_gc_snapshot_counts_frozen_objects_once(monkeypatch):
    """/healthz's GC snapshot does not walk the frozen generation on every call (the walk
    took 10-20 ms of the loop per probe under load); it reports the count taken at start-up."""
    from impl.server.state import GcMonitor

    calls = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: calls.append(1) or 12345)
    monitor = GcMonitor()
    monitor.start()
    try:
        snapshots = [monitor.snapshot() for _ in range(5)]
        monitor.count_frozen()  # what the server does once it froze its start-up objects
        snapshots += [monitor.snapshot() for _ in range(5)]
    finally:
        monitor.stop()
    assert len(calls) == 2
    assert all(s["frozen_objects"] == 12345 for s in snapshots)


# -- the Grafana dashboard ---------------------------------------------------------------------

_PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "topk", "bottomk", "clamp_min", "clamp_max", "delta", "deriv", "time", "vector", "scalar",
    "label_replace", "abs", "offset", "bool", "max_over_time", "avg_over_time", "le",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (labels, functions, keywords removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word = match.group(0)
        if word in _PROMQL_WORDS or re.fullmatch(r"e\d*|Inf|NaN", word):
            continue
        rest = expr[match.end() :].lstrip()
        if rest.startswith("("):  # a function call
            continue
        names.add(word)
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]


def test_the_query_parser_finds_metric_names():
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(hotpath_x_bucket{route=~"/a.*"}[5m])))'
        " / ignoring(le) sum(rate(hotpath_y_total[1m])) * 1e3"
    )
    assert metric_names(expr) == {"hotpath_x_bucket", "hotpath_y_total"}


def test_every_dashboard_panel_queries_metrics_the_server_exports(server, api):
    """Each panel has a query, and every metric name a query reads is in a real scrape."""
    ssid = api.sampling_session()
    _sample(api, ssid, 1, True)
    exported = {name for name, _ in scrape(server.url)}
    board = json.loads(DASHBOARD.read_text())
    assert board["panels"], "the dashboard has no panels"
    for panel in board["panels"]:
        if panel.get("type") == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
    missing = {
        (title, name)
        for title, expr in dashboard_queries()
        for name in metric_names(expr)
        if name not in exported
    }
    assert not missing, f"dashboard queries name metrics the server does not export: {missing}"
    assert "bogus_metric_total" not in exported  # the check above can fail


# -- several processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_sharing_a_multiprocess_dir_are_scraped_as_one(upstream, tmp_path):
    """prometheus-client's multiprocess mode: either process's /metrics sums both."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    with (
        start_server(upstream.url, "--poll-hold", "2", env=env) as first,
        start_server(upstream.url, "--poll-hold", "2", env=env) as second,
    ):
        counts = {first.url: 3, second.url: 2}
        for url, n in counts.items():
            api = Api(url)
            try:
                ssid = api.sampling_session()
                for seq_id in range(n):
                    assert _sample(api, ssid, seq_id, True) == 200
            finally:
                api.close()
        time.sleep(1.5)  # each process copies its store counts into its files every second
        scraped = [scrape(first.url), scrape(second.url)]
    for samples in scraped:
        route = {"route": "/api/v1/asample", "method": "POST", "status": "200"}
        assert value(samples, REQUESTS, **route) == 5
        decode = [k for k in samples if k[0] == STEP and dict(k[1]).get("step") == "decode"]
        assert sum(samples[k] for k in decode) == 5
        assert value(samples, "hotpath_store_submitted_total") == 5
