"""The load report's per-step split: /metrics text (from a real Metrics registry) parsed with
prometheus-client's parser, differenced over a window, and rendered for one or two runs."""

from __future__ import annotations

from types import MappingProxyType

import pytest

pytest.importorskip(
    "prometheus_client", reason="needs prometheus-client: pip install 'hotpath[server]'"
)

from prometheus_client import generate_latest

from impl.harness import report, steps
from impl.server.callers import Callers
from impl.server.intake import Intake
from impl.server.store.held import HeldPolls

PICKS = {"decode": "simdjson", "encode": "wire", "pool": "pyreqwest", "accesslog": "queue"}


def _exposition(metrics) -> str:
    metrics.sync(_State())
    return generate_latest(metrics.registry).decode()


class _State:
    class store:
        @staticmethod
        def stats():
            return {"records": 0, "pending": 0}

        @staticmethod
        def describe():
            return {"kind": "memory"}

        @staticmethod
        def unavailable():
            return None

        @staticmethod
        def outstanding_by_owner():
            return {}

        held_polls = HeldPolls()

    http_refused = MappingProxyType({})  # nothing refused

    class settings:
        worker_index = 0

    class forwards:
        tasks = ()

    class sessions:
        @staticmethod
        def stats():
            return {"sampling_sessions": 0}

    intake = Intake(16)
    callers = Callers(None, max_outstanding=16)  # the open mode: no key file


def test_split_is_what_ran_between_two_scrapes():
    from impl.server.metrics import Metrics

    metrics = Metrics(PICKS)
    metrics.decode(0.5)  # before the window: not counted
    before = steps.parse(_exposition(metrics))
    for _ in range(4):
        metrics.upstream_wait(0.25)
        metrics.decode(0.002)
        metrics.encode(0.001)
    metrics.serve["protobuf"](0.003)
    metrics.serve["json"](0.007)
    rows = steps.split(before, steps.parse(_exposition(metrics)))
    assert [(r["step"], r["implementation"], r["count"]) for r in rows] == [
        ("upstream_wait", "pyreqwest", 4),
        ("decode", "simdjson", 4),
        ("encode", "wire", 4),
        ("serve", "json", 1),
        ("serve", "protobuf", 1),
    ]  # result order; store never ran, so it is left out
    by = {(r["step"], r["implementation"]): r for r in rows}
    assert by[("upstream_wait", "pyreqwest")]["seconds"] == pytest.approx(1.0)
    assert by[("decode", "simdjson")]["mean_ms"] == pytest.approx(2.0)
    assert steps.per_result_ms(rows)["serve"] == pytest.approx(5.0)


def test_no_metrics_gives_no_rows_and_says_why():
    assert steps.split(None, None) == []
    assert "--no-metrics" in steps.table([("picked", [])])


def test_parse_ignores_other_families():
    text = "# TYPE other_seconds histogram\nother_seconds_count 3.0\nother_seconds_sum 1.0\n"
    assert steps.parse(text) == {}


def test_compare_table_shows_both_runs_and_the_ratio():
    def rows(decode_ms: float, name: str) -> list[dict]:
        return [{"step": "decode", "implementation": name, "count": 10,
                 "seconds": decode_ms / 100, "mean_ms": decode_ms}]  # fmt: skip

    text = steps.table([("baseline", rows(30.0, "json")), ("picked", rows(3.0, "simdjson"))])
    line = next(line for line in text.splitlines() if line.startswith("decode"))
    assert "30 ms (json)" in line and "3 ms (simdjson)" in line and "10.0x" in line


def test_the_load_report_carries_the_split():
    run = {"label": "picked", "wall_seconds": 1.0, "completed": 1, "steps": [
        {"step": "decode", "implementation": "simdjson", "count": 1, "seconds": 0.001,
         "mean_ms": 1.0}]}  # fmt: skip
    summary = report.summarize(run)
    assert summary["steps"] == run["steps"]
    assert "decode" in report.render_run(summary)
    data = report.report_json([run])
    assert data["runs"][0]["summary"]["steps"] == run["steps"]
