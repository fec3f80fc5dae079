"""The asv suite's own rules (benchmarks/): n/a where a figure does not exist, budgets on cost.

asv records an exception raised in a benchmark's body as a failure (and `asv run` exits 2),
and NotImplementedError raised in `setup` as n/a; so a failure must mean something broke.
These tests drive the benchmarks through asv_runner's own discovery and setup, as `asv run`
does, without timing anything.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from asv_runner.discovery import get_benchmark_from_name

from impl import registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_pool  # noqa: E402 - the suite is imported from the repository


def asv_benchmark(name: str, params: tuple) -> object:
    """The asv_runner Benchmark `name` set to the combination `params` (as `asv run` sets it)."""
    benchmark = get_benchmark_from_name(str(ROOT / "benchmarks"), name)
    combos = list(itertools.product(*benchmark._params))
    benchmark.set_param_idx(combos.index(params))
    return benchmark


@pytest.mark.parametrize("implementation", registry.names("accesslog"))
def test_listener_track_is_na_without_a_listener(implementation):
    """track_listener_cpu_us: setup skips (n/a) every handler but queue; queue's setup runs it."""
    if registry.unavailable_reason("accesslog", implementation):
        pytest.skip(registry.unavailable_reason("accesslog", implementation))
    name = "bench_accesslog.AccessRecord.track_listener_cpu_us"
    benchmark = asv_benchmark(name, (implementation,))
    skipped = benchmark.do_setup()
    if not skipped:
        benchmark.do_teardown()
    assert skipped == (implementation != "queue")


def test_pool_budget_skips_a_predicted_long_burst(tmp_path):
    """A burst predicted (quadratically, from the smaller count) over budget is n/a, with why."""
    (tmp_path / "httpx-256.json").write_text(json.dumps({"wall_seconds": 1.0}))
    (tmp_path / "aiohttp-256.json").write_text(json.dumps({"wall_seconds": 0.1}))
    with pytest.raises(NotImplementedError, match=r"httpx: a burst of 1024 .* 16 s .* 5 s budget"):
        bench_pool.check_budget(str(tmp_path), "httpx", 1024, 5.0)
    bench_pool.check_budget(str(tmp_path), "aiohttp", 1024, 5.0)  # 1.6 s predicted: runs
    bench_pool.check_budget(str(tmp_path), "httpx", 256, 5.0)  # nothing smaller known: runs
    bench_pool.check_budget(str(tmp_path), "httpx2", 4096, 5.0)  # nothing known at all: runs


def test_pool_budget_uses_the_measured_growth(tmp_path):
    """With two smaller bursts the exponent is measured: linear growth 256 -> 1024 predicts 4x."""
    for count, wall in ((256, 0.5), (1024, 2.0)):
        (tmp_path / f"aiohttp-{count}.json").write_text(json.dumps({"wall_seconds": wall}))
    bench_pool.check_budget(str(tmp_path), "aiohttp", 4096, 8.5)  # predicted 8 s
    with pytest.raises(NotImplementedError, match="predicted to take 8 s"):
        bench_pool.check_budget(str(tmp_path), "aiohttp", 4096, 7.5)


def test_pool_budget_reads_only_its_own_bursts(tmp_path):
    """httpx's budget ignores httpx-aiohttp's bursts (whose file names start with "httpx-")."""
    (tmp_path / "httpx-256.json").write_text(json.dumps({"wall_seconds": 3.0}))
    for count in (256, 1024):
        (tmp_path / f"httpx-aiohttp-{count}.json").write_text(json.dumps({"wall_seconds": 0.2}))
    with pytest.raises(NotImplementedError, match=r"httpx: a burst of 1024 .* 48 s"):
        bench_pool.check_budget(str(tmp_path), "httpx", 1024, 5.0)
    with pytest.raises(NotImplementedError, match=r"httpx: a burst of 4096 .* 768 s"):
        bench_pool.check_budget(str(tmp_path), "httpx", 4096, 5.0)
    bench_pool.check_budget(str(tmp_path), "httpx-aiohttp", 4096, 5.0)  # 0.8 s predicted: runs


def test_forward_over_budget_is_na_and_its_teardown_passes(tmp_path):
    """asv calls teardown after an n/a setup too: it must not fail (that made the cell failed)."""
    (tmp_path / "httpx-256.json").write_text(json.dumps({"wall_seconds": 1.0}))
    suite = bench_pool.Forward()
    with pytest.raises(NotImplementedError, match="over the 2 s budget"):
        suite.setup(str(tmp_path), "httpx", 1024)
    suite.teardown(str(tmp_path), "httpx", 1024)


def test_instruction_counts_are_na_without_valgrind(monkeypatch):
    """Without Valgrind every instruction-count track is n/a (setup), with the install hint."""
    from impl.ci import gate_icount, icount

    monkeypatch.setattr(icount.shutil, "which", lambda name: None)
    for name, params in gate_icount.gated():
        benchmark = asv_benchmark(name, params)
        assert benchmark.do_setup() is True, params


def test_decode_kind_is_na_without_its_package(monkeypatch):
    """DecodeKind's params are the full tables; a kind that cannot be made here is n/a (with its
    hint), and one that can is set up with the body `common.kind_body` gives."""
    from benchmarks import common

    benchmark = asv_benchmark("bench_decode.DecodeKind.time_decode", ("json", "code", "orjson"))
    assert benchmark._params[1:] == [common.KINDS, common.RENDERS]
    monkeypatch.setattr(common.realtext, "unavailable_reason", lambda *_: "no tokenizer: pip it")
    assert benchmark.do_setup() is True
    with pytest.raises(NotImplementedError, match="no tokenizer: pip it"):
        common.kind_body("code", "orjson")


def test_kind_bodies_are_kept_on_disk(tmp_path, monkeypatch):
    """The first process generates a real-text body, the next ones read the same bytes."""
    from benchmarks import common

    if common.realtext.unavailable_reason("prose"):
        pytest.skip(common.realtext.unavailable_reason("prose"))
    monkeypatch.setattr(common, "CACHE", tmp_path)
    first = common.kind_body("prose", "json", 256)
    assert [p.name.split("-")[:3] for p in tmp_path.iterdir()] == [["prose", "json", "256"]]
    monkeypatch.setattr(common.realtext, "body_for", None)  # a second call must not generate
    assert common.kind_body("prose", "json", 256) == first


def test_gated_instruction_counts_exist():
    """The gate's instruction-count stage selects existing benchmarks and parameter values."""
    from impl.ci import gate_icount

    for name, params in gate_icount.gated():
        benchmark = asv_benchmark(name, params)
        assert benchmark.unit == "instructions"


def test_uvicorn_server_tracks_share_one_server_run(tmp_path, monkeypatch):
    """Both UvicornServer tracks read one run per handler; a run that lost lines fails both."""
    from benchmarks import bench_accesslog

    runs = []

    def fake_server_cost(name, n):
        runs.append((name, n))
        complete = name != "rich"
        return {"total_us": 30.0, "loop_us": 20.0, "lines": n, "complete": complete}

    monkeypatch.setattr(bench_accesslog, "server_cost", fake_server_cost)
    suite, cache = bench_accesslog.UvicornServer(), str(tmp_path)
    suite.setup(cache, "plain")
    assert suite.track_loop_cpu_us_per_request(cache, "plain") == 20.0
    assert suite.track_process_cpu_us_per_request(cache, "plain") == 30.0
    assert runs == [("plain", 5000)]
    suite.setup(cache, "rich")
    for track in (suite.track_loop_cpu_us_per_request, suite.track_process_cpu_us_per_request):
        with pytest.raises(RuntimeError, match="rich: 1000 lines, not all were logged"):
            track(cache, "rich")
    assert runs[1:] == [("rich", 1000)] * 2  # a failed run is not kept: the next track retries
