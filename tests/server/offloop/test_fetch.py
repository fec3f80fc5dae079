"""Fetch processes (`--offloop fetch`): the router request is sent, and the body read, decoded and
encoded, by a fetch process; only SampleResponse bytes reach the server.

Every decoder gives the same outcome through a fetch process as through the loop's own pool and
inline decoding, good bodies and bad upstreams alike (same bytes, same failure message) against
the real stand-in upstream; a killed fetch process fails only the samples it held and is replaced;
a dead router fails the same way as inline; shutdown (graceful, or the server killed) leaves no
process behind. No timing assertions: how free the loop stays is measured by `hotpath loadtest
--preset probe-128x262k --compare inline` (and `--compare processes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from impl import registry
from impl.pool import PREFERENCE
from impl.server import offloop
from impl.server.budget import BodyBudget
from impl.server.forward import ForwardRunner
from impl.server.job import Job
from impl.server.offloop.decoding import DecodeJob, Decoding
from impl.server.upstream import UpstreamFailed
from tests.server.offloop.test_processes import _gone, _offloop_server, _process_pids
from tests.support import fake_vllm as fake
from tests.support.params import family_params
from tests.support.server import Api, start_upstream
from tests.support.wait import until

pytestmark = pytest.mark.heavy

POOL = next(name for name in PREFERENCE if registry.unavailable_reason("pool", name) is None)
PROMPT = [128000, 7, 8, 9, 10, 11]
GOOD = [  # (n, max_tokens, top-k prompt logprobs or None for none, seed)
    (1, 64, None, 1),
    (2, 300, None, 2),
    (1, 40, 0, 3),
    (3, 20, 2, 4),
]
FAULTS = [
    fake.SEED_HTML,
    fake.SEED_TRUNCATED,
    fake.SEED_500_ONCE,
    fake.SEED_500_ALWAYS,
    fake.SEED_CLOSE,
    fake.SEED_MISMATCH,
    fake.SEED_422,
]


def _job(n: int, max_tokens: int, topk: int | None, seed: int, prompt: list[int]) -> Job:
    """A router request built as `job.build_request` builds it."""
    body = {
        "model": "m", "prompt": prompt, "n": n, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "logprobs": 1, "return_token_ids": True, "max_tokens": max_tokens, "seed": seed,
    }  # fmt: skip
    if topk is not None:
        body["prompt_logprobs"] = topk
    keep = prompt if topk is not None else None
    return Job(orjson.dumps(body), DecodeJob(keep, n, topk or 0, topk is not None), 1 << 20)


async def _outcome(runner: ForwardRunner, job: Job) -> bytes | str:
    try:
        return await runner.result(job)
    except UpstreamFailed as exc:
        return f"{exc.kind}: {exc}"


def _runner(design: Decoding, url: str, pool_name: str = POOL) -> ForwardRunner:
    pool = registry.create(
        "pool", pool_name, max_connections=16, connect_timeout=5, read_timeout=30
    )
    budget = BodyBudget(64 << 20)
    return ForwardRunner(pool=pool, decoding=design, store=None, url=url, budget=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", family_params("decode"))
def test_fetch_processes_give_what_the_loop_gives(upstream, name):
    """Same bytes for good bodies, same message for every bad upstream and a dead router."""
    decoder = registry.create("decode", name)
    encoder = registry.create("encode", "wire")
    url = upstream.url + "/v1/completions"
    # each design gets its own prompt for SEED_500_ONCE (the upstream fails it once per prompt)
    jobs = [_job(n, m, k, seed, PROMPT) for n, m, k, seed in GOOD]

    def faults(once: list[int]) -> list[Job]:
        """The faults on PROMPT; SEED_500_ONCE on `once` (it fails once per prompt)."""
        return [_job(1, 16, None, s, once if s == fake.SEED_500_ONCE else PROMPT) for s in FAULTS]

    async def run() -> None:
        fetch = offloop.create(
            "fetch", decoder=decoder, encoder=encoder, decoder_name=name, encoder_name="wire",
            count=2, min_bytes=0, pool_name=POOL,
            pool_options={"max_connections": 8, "connect_timeout": 5, "read_timeout": 30},
        )  # fmt: skip
        await fetch.start()
        inline = _runner(offloop.Inline(decoder, encoder), url)
        fetched = _runner(fetch, url)
        dead = "http://127.0.0.1:1/v1/completions"
        try:
            prompt = [*PROMPT, 1000 + registry.names("decode").index(name)]
            want = [await _outcome(inline, job) for job in (*jobs, *faults(prompt))]
            want.append(await _outcome(_runner(offloop.Inline(decoder, encoder), dead), jobs[0]))
            got = await asyncio.gather(
                *(_outcome(fetched, job) for job in (*jobs, *faults([*prompt, 1])))
            )
            got.append(await _outcome(_runner(fetch, dead), jobs[0]))
            once = len(jobs) + FAULTS.index(fake.SEED_500_ONCE)
            for i, (a, b) in enumerate(zip(want, got, strict=True)):
                if i == once:  # retried once and served, each for its own prompt
                    assert isinstance(a, bytes) and isinstance(b, bytes)
                    continue
                assert a == b, (i, a if isinstance(a, str) else len(a))
            assert all(isinstance(w, bytes) for w in want[: len(jobs)])
            assert want[-1].startswith("connect: could not connect to the router")
            stats = fetch.stats()
            assert stats["offloop"] == len(got) and stats["inline"] == 0
            assert fetched.budget.stats()["bytes"] == 0 and fetched.budget.holders == 0
            # 500-once and 500-always were retried once each, as by the loop's own forwards
            assert fetched.attempts == inline.attempts == len(jobs) + len(FAULTS) + 2
        finally:
            await fetched.aclose()
            await inline.pool.aclose()

    asyncio.run(run())


def test_long_bodies_through_kept_buffers_give_what_the_loop_gives(upstream):
    """Bodies of 1 MiB and more, read by aiohttp into the fetch processes' kept buffers: the
    same bytes as the loop's, round after round (a reused buffer held an earlier body); a body
    cut short or closed mid-way fails alone, with the loop's message, and loses nothing else."""
    name = "json" if registry.unavailable_reason("decode", "onepass_nogil") else "onepass_nogil"
    decoder = registry.create("decode", name)  # a compiled one reads the buffers in place
    encoder = registry.create("encode", "wire")
    url = upstream.url + "/v1/completions"
    long = [_job(1, 30000, None, seed, PROMPT) for seed in (21, 22, 23)]
    broken = [_job(1, 30000, None, s, PROMPT) for s in (fake.SEED_TRUNCATED, fake.SEED_CLOSE)]

    async def run() -> None:
        fetch = offloop.create(
            "fetch", decoder=decoder, encoder=encoder, decoder_name=name, encoder_name="wire",
            count=1, min_bytes=0, pool_name="aiohttp",
            pool_options={"max_connections": 8, "connect_timeout": 5, "read_timeout": 30},
        )  # fmt: skip
        await fetch.start()
        inline = _runner(offloop.Inline(decoder, encoder), url, "aiohttp")  # the same messages
        fetched = _runner(fetch, url)
        try:
            want = [await _outcome(inline, job) for job in (*long, *broken)]
            assert all(isinstance(w, bytes) and len(w) > 0 for w in want[: len(long)])
            for _ in range(2):
                got = await asyncio.gather(*(_outcome(fetched, job) for job in (*long, *broken)))
                assert got == want
                assert [await _outcome(fetched, job) for job in long] == want[: len(long)]
            assert fetched.budget.stats()["bytes"] == 0 and fetched.budget.holders == 0
        finally:
            await fetched.aclose()
            await inline.pool.aclose()

    asyncio.run(run())


def test_small_expected_bodies_stay_on_the_loop(upstream):
    """Requests whose expected body is under --offloop-min-bytes use the loop's pool."""

    async def run() -> None:
        decoder = registry.create("decode", "json")
        encoder = registry.create("encode", "wire")
        fetch = offloop.create(
            "fetch", decoder=decoder, encoder=encoder, decoder_name="json", encoder_name="wire",
            count=1, min_bytes=2 << 20, pool_name=POOL, pool_options={},
        )  # fmt: skip
        await fetch.start()
        runner = _runner(fetch, upstream.url + "/v1/completions")
        inline = _runner(offloop.Inline(decoder, encoder), upstream.url + "/v1/completions")
        try:
            job = _job(1, 32, None, 5, PROMPT)  # expects 1 MiB: under the 2 MiB threshold
            assert await _outcome(runner, job) == await _outcome(inline, job)
            assert (fetch.stats()["inline"], fetch.stats()["offloop"]) == (1, 0)
        finally:
            await runner.aclose()

    asyncio.run(run())


def _fetch_server(upstream_url: str):
    return _offloop_server(upstream_url, design="fetch", count=2)


def test_healthz_and_metrics_show_the_fetch_design(upstream):
    with _fetch_server(upstream.url) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        offloop = api.healthz()["offloop"]
        assert offloop["design"] == "fetch" and offloop["reason"] == "--offloop (explicit)"
        assert len(offloop["pids"]) == 2 and offloop["nice"] == 0
        assert offloop["count"] == offloop["workers"] == 2  # "workers": its earlier name
        ids = [api.asample(ssid, i, seed=40 + i).json()["request_id"] for i in range(4)]
        for request_id in ids:
            result = api.result(request_id)
            assert result.headers["content-type"] == "application/x-protobuf", result.text
        assert api.healthz()["offloop"]["offloop"] == 4
        scrape = api.http.get("/metrics").text
        for step in ("upstream_wait", "decode", "encode"):
            line = next(
                x for x in scrape.splitlines()
                if x.startswith("hotpath_step_duration_seconds_count") and f'step="{step}"' in x
            )  # fmt: skip
            assert float(line.rsplit(" ", 1)[1]) == 4, line
        api.close()


def test_a_killed_fetch_process_fails_only_its_samples_and_is_replaced(upstream):
    with _fetch_server(upstream.url) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        victim, survivor = _process_pids(api)
        os.kill(victim, signal.SIGSTOP)  # it will hold what it is given until killed
        try:
            # held 1 s upstream, so each new sample goes to the process with fewer in flight
            seeds = [fake.DELAY_BASE + 1000 + i for i in range(6)]
            ids = [api.asample(ssid, i, seed=s).json()["request_id"] for i, s in enumerate(seeds)]
            until(lambda: api.healthz()["offloop"]["offloop"] == 6, "six samples handed over")
            held = api.healthz()["offloop"]["in_flight"][str(victim)]
            assert held == 3
        finally:
            os.kill(victim, signal.SIGKILL)
        outcomes = [api.result(request_id) for request_id in ids]
        failed = [
            r.json() for r in outcomes if r.headers["content-type"] != "application/x-protobuf"
        ]
        assert len(failed) == held  # the survivor's samples completed
        for failure in failed:
            assert failure["category"] == "server"
            assert f"fetch process (pid {victim}) died" in failure["error"]
            assert "SIGKILL" in failure["error"] and "replaced" in failure["error"]
        pids = until(lambda: len(_process_pids(api)) == 2 and _process_pids(api), "a new process")
        assert survivor in pids and victim not in pids and _gone(victim)
        assert api.healthz()["offloop"]["replaced"] == 1
        again = api.result(api.asample(ssid, 9, seed=59).json()["request_id"])
        assert again.headers["content-type"] == "application/x-protobuf", again.text
        api.close()


def test_a_dead_router_fails_the_sample_as_inline_does():
    with start_upstream() as upstream:
        dead = upstream.url
    with _fetch_server(dead) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        failure = api.result(api.asample(ssid, 1, seed=1).json()["request_id"]).json()
        assert failure["category"] == "server"
        assert failure["error"].startswith(f"could not connect to the router at {dead}")
        assert api.healthz()["offloop"]["offloop"] == 1
        api.close()


@contextlib.contextmanager
def _fetches_in_flight(upstream, count: int) -> Iterator[tuple[Any, list[int]]]:
    """A fetch-design server with `count` samples held 5 s upstream, in flight in its fetch
    processes; yields the server and those processes' pids (the server is stopped after)."""
    server = _fetch_server(upstream.url)
    try:
        api = Api(server.url)
        ssid = api.sampling_session()
        pids = _process_pids(api)
        for i in range(count):
            api.asample(ssid, i, seed=fake.DELAY_BASE + 5000 + i)
        until(lambda: api.healthz()["offloop"]["offloop"] == count, f"{count} handed over")
        api.close()
        yield server, pids
    finally:
        server.stop()


def _exit(pids: list[int]) -> None:
    for pid in pids:
        until(lambda pid=pid: _gone(pid), f"fetch process {pid} to exit", 10)


def test_shutdown_with_fetches_in_flight_leaves_no_process(upstream):
    with _fetches_in_flight(upstream, 4) as (server, pids):  # in flight when the server stops
        os.kill(server.pid, signal.SIGTERM)
        assert server.process.wait(60) in (0, -signal.SIGTERM)  # 60 s: a hang guard only
        assert "Traceback" not in server.stderr(), server.stderr()
        _exit(pids)


def test_a_killed_server_leaves_no_fetch_process(upstream):
    with _fetches_in_flight(upstream, 1) as (server, pids):
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(10)
        _exit(pids)  # each reads EOF on its socket and exits


@pytest.mark.slow
def test_loadtest_compares_fetch_with_decode_processes(tmp_path, capsys):
    """`hotpath loadtest --compare processes`: both designs, same implementations, exact results;
    bodies of 16384 tokens (expected ~1.5 MiB) go to the fetch processes."""
    import argparse

    from impl.harness import load

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    path = tmp_path / "r.json"
    code = load.run(parser.parse_args([
        "--num-requests", "8", "--client-processes", "1", "--max-tokens", "16384", "--body", "vllm",
        "--server-arg=--offloop=fetch", "--compare", "processes", "--verify", "exact",
        "--no-progress", "--report", str(path),
    ]))  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    runs = orjson.loads(path.read_bytes())["runs"]
    assert [r["summary"]["label"] for r in runs] == ["processes", "picked"]
    assert [r["healthz"]["offloop"]["design"] for r in runs] == ["processes", "fetch"]
    assert all(r["summary"]["completed"] == 8 for r in runs)
    assert runs[0]["summary"]["picks"] == runs[1]["summary"]["picks"]
    assert runs[1]["healthz"]["offloop"]["offloop"] >= 8  # warm-up samples come on top
