"""Off-loop decoding: every decoder's bytes through decode processes and threads equal the
reference's; a killed decode process fails only the sample it held and is replaced; the body
budget holds bodies (one larger than the cap goes alone), never requests, in each design;
shutdown with work in flight leaves no
process behind and does not hang.

No timing assertions: how free the loop stays is measured by `hotpath loadtest --preset
probe-128x262k --compare inline` and `hotpath bench`, not here.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from impl import registry
from impl.decode import Completion, releases_gil
from impl.server import offloop
from impl.server.budget import Admission, BodyBudget
from impl.server.offloop.decoding import DecodeJob, to_proto
from impl.server.offloop.processes import DecodeProcesses
from impl.server.upstream import UpstreamFailed
from tests.support import decode_corpus
from tests.support import fake_vllm as fake
from tests.support.params import family_params
from tests.support.server import Api, start_server, start_upstream
from tests.support.wait import until

pytestmark = pytest.mark.heavy

REFERENCE_DECODER = registry.create("decode", registry.reference("decode"))
REFERENCE_ENCODER = registry.create("encode", registry.reference("encode"))
CASES = [c for c in decode_corpus.valid_cases(large=False) if "-t" in c.id][:8]
INVALID = [
    (name, body)
    for name, body in decode_corpus._invalid()
    if name in ("html-200", "empty", "truncated-half", "nan-logprob")
]


def _job(case: decode_corpus.Case, n: int) -> DecodeJob:
    topk = case.kwargs.get("topk_prompt_logprobs", 0)
    return DecodeJob(None, n, topk, include_prompt_logprobs=True)


def _n(case: decode_corpus.Case) -> int:
    completion: Completion = REFERENCE_DECODER.decode(case.body, **case.kwargs)
    return len(completion.sequences)


def _expected(body: bytes, job: DecodeJob) -> bytes | str:
    try:
        return to_proto(REFERENCE_DECODER, REFERENCE_ENCODER, body, job)[0]
    except UpstreamFailed as exc:
        return str(exc)


async def _through(design: offloop.Inline, body: bytes, job: DecodeJob) -> bytes | str:
    try:
        payload, decode_seconds, encode_seconds = await design.convert(body, job)
        assert decode_seconds > 0 and encode_seconds > 0  # the steps' times come back too
        return payload
    except UpstreamFailed as exc:
        return str(exc)


@pytest.mark.parametrize("name", family_params("decode"))
def test_decode_processes_give_the_reference_bytes(name):
    """Valid bodies: the reference's exact bytes; bad bodies: the inline path's own message."""

    async def run() -> None:
        decoder = registry.create("decode", name)
        encoder = registry.create("encode", "wire")
        design = DecodeProcesses(
            decoder, encoder, decoder_name=name, encoder_name="wire", count=2, min_bytes=0
        )
        await design.start()
        try:
            jobs = [(case.body, _job(case, _n(case))) for case in CASES]
            got = await asyncio.gather(*(_through(design, body, job) for body, job in jobs))
            for case, (body, job), result in zip(CASES, jobs, got, strict=True):
                assert result == _expected(body, job), case.id
            wrong_n = DecodeJob(None, 3, 0, False)
            assert "returned 1 choices for n=3" in await _through(design, CASES[0].body, wrong_n)
            for bad_name, body in INVALID:
                job = DecodeJob(None, 1, 0, False)
                inline = await _through(offloop.Inline(decoder, encoder), body, job)
                assert isinstance(inline, str) and "unreadable" in inline
                assert await _through(design, body, job) == inline, bad_name
            assert design.stats()["offloop"] == len(jobs) + 1 + len(INVALID)
            assert design.stats()["inline"] == 0
        finally:
            await design.aclose()

    asyncio.run(run())


class _GilFreeStandIn:
    """Stands in for a decoder that releases the GIL (the reference, marked as one)."""

    releases_gil = True

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def decode(self, body, **kwargs):
        import threading

        self.threads.add(threading.current_thread().name)
        return REFERENCE_DECODER.decode(body, **kwargs)


def test_threads_give_the_same_bytes_for_a_gil_releasing_decoder():
    """auto picks fetch processes for every decoder (measured: the freest loop); threads are there
    when asked for, and give the same bytes."""
    stand_in = _GilFreeStandIn()
    design, reason = offloop.choose("auto", "stand-in", stand_in, baseline=False)
    assert design == "fetch" and "releases the GIL" in reason and "probe-128x262k" in reason
    design, reason = offloop.choose("auto", "json", REFERENCE_DECODER, baseline=False)
    assert design == "fetch" and "holds the GIL" in reason
    assert offloop.choose("auto", "json", stand_in, baseline=True)[0] == "inline"
    assert offloop.choose("threads", "json", stand_in, baseline=False)[0] == "threads"

    async def run() -> None:
        threads = offloop.create(
            "threads",
            decoder=stand_in,
            encoder=REFERENCE_ENCODER,
            decoder_name="stand-in",
            encoder_name="protobuf",
            count=2,
            min_bytes=1024,
        )
        await threads.start()
        try:
            for case in CASES:
                job = _job(case, _n(case))
                assert await _through(threads, case.body, job) == _expected(case.body, job)
            stats = threads.stats()
            small = sum(len(c.body) < 1024 for c in CASES)
            assert (stats["inline"], stats["offloop"]) == (small, len(CASES) - small)
            assert any(t.startswith("hotpath-decode") for t in stand_in.threads)
        finally:
            await threads.aclose()

    asyncio.run(run())


def test_body_budget_is_fifo_and_lets_one_oversized_body_through_alone():
    async def run() -> None:
        budget = BodyBudget(100)
        await budget.acquire(60)
        order: list[str] = []

        async def take(name: str, size: int) -> None:
            await budget.acquire(size)
            order.append(name)

        tasks = [
            asyncio.create_task(take("big", 500)),  # larger than the cap: waits to be alone
            asyncio.create_task(take("small", 10)),  # fits, but waits behind big (FIFO)
        ]
        await asyncio.sleep(0)
        assert order == [] and budget.stats()["waiting"] == 2
        budget.release(60)
        await asyncio.sleep(0)
        assert order == ["big"] and budget.used == 500
        budget.release(500)
        await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert order == ["big", "small"]
        cancelled = asyncio.create_task(take("never", 95))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert budget.stats()["waiting"] == 0
        assert budget.settle(10, 30) == 30 and budget.used == 30
        budget.release(30)
        assert (budget.used, budget.holders, budget.peak) == (0, 0, 500)

    asyncio.run(run())


def test_an_admission_takes_the_length_while_reading_and_gives_it_back():
    """The pool contract's `admit`: the Content-Length (the expected size without one),
    a second answer (the retry after a 5xx) first returns the first one's share, `settle` keeps
    the size read, `release` ends the hold once (an empty body too)."""

    async def run() -> None:
        budget = BodyBudget(1000)
        admission = Admission(budget, expected=300)
        await admission(200, 100)
        assert (budget.used, budget.holders) == (100, 1)
        await admission(500, None)  # a retried answer without Content-Length
        assert (budget.used, budget.holders) == (300, 1)
        admission.settle(250)
        assert budget.used == 250
        admission.release()
        admission.release()
        assert (budget.used, budget.holders) == (0, 0)
        empty = Admission(budget, expected=0)
        await empty(200, 0)
        assert budget.holders == 1
        empty.release()
        assert (budget.used, budget.holders, budget.peak) == (0, 0, 300)

    asyncio.run(run())


def _process_pids(api: Api) -> list[int]:
    return api.healthz()["offloop"]["pids"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _offloop_server(upstream_url: str, *extra: str, design: str = "processes", count: int = 1):
    """`hotpath serve` whose off-loop `design` (`count` processes) takes every body."""
    return start_server(
        upstream_url,
        "--poll-hold", "1", "--offloop", design, "--offloop-count", str(count),
        "--offloop-min-bytes", "0", "--decode", "json", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_a_killed_decode_process_fails_only_its_sample_and_is_replaced():
    with start_upstream() as upstream, _offloop_server(upstream.url) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        assert api.healthz()["offloop"]["design"] == "processes"
        (pid,) = _process_pids(api)
        os.kill(pid, signal.SIGSTOP)  # the process will hold the next sample until killed
        try:
            held = api.asample(ssid, 1, seed=11).json()["request_id"]
            until(lambda: api.healthz()["offloop"]["offloop"] == 1, "the held sample")
            queued = api.asample(ssid, 2, seed=12).json()["request_id"]
            until(lambda: len(upstream.get("/sent")) == 2, "the second forward")
        finally:
            os.kill(pid, signal.SIGKILL)
        failed = api.result(held).json()
        assert failed["category"] == "server"
        assert f"decode process (pid {pid}) died" in failed["error"]
        assert "SIGKILL" in failed["error"] and "replaced" in failed["error"]
        result = api.result(queued)  # waited for a process: served by the replacement
        assert result.headers["content-type"] == "application/x-protobuf", result.text
        (new_pid,) = until(lambda: _process_pids(api), "the replacement process")
        assert new_pid != pid and _gone(pid)
        assert api.healthz()["offloop"]["replaced"] == 1
        again = api.asample(ssid, 3, seed=13).json()["request_id"]
        result = api.result(again)
        assert result.headers["content-type"] == "application/x-protobuf", result.text
        api.close()


@pytest.mark.parametrize("design", ["inline", "processes", "fetch"])
def test_the_body_budget_holds_bodies_not_requests(design: str) -> None:
    """With a 1 KiB budget every body is larger than the cap: bodies are read one at a time
    (budget peak 1), yet all four requests reach the upstream at once (its peak in flight 4):
    the budget is taken when an answer arrives, not before the request is sent."""
    with (
        start_upstream() as upstream,
        _offloop_server(
            upstream.url, "--max-body-bytes-in-flight", "1024", design=design
        ) as server,
    ):
        api = Api(server.url)
        ssid = api.sampling_session()
        seeds = [fake.DELAY_BASE + 500 + i for i in range(4)]  # each held 0.5 s upstream
        ids = [api.asample(ssid, i, seed=s, max_tokens=64).json()["request_id"] for i, s in
               enumerate(seeds)]  # fmt: skip
        for request_id in ids:
            result = api.result(request_id)
            assert result.headers["content-type"] == "application/x-protobuf", result.text
        health = api.healthz()
        budget = health["offloop"]["body_budget"]
        assert health["offloop"]["design"] == design
        assert budget["peak_bodies"] == 1  # never two bodies held at once
        assert budget["bodies"] == 0 and budget["bytes"] == 0
        assert upstream.get("/stats")["peak_in_flight"] == 4  # all requests sent at once
        api.close()


def test_shutdown_with_work_in_flight_leaves_no_process_and_does_not_hang():
    with start_upstream() as upstream:
        server = _offloop_server(upstream.url, count=2)
        try:
            api = Api(server.url)
            ssid = api.sampling_session()
            pids = _process_pids(api)
            assert len(pids) == 2
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)  # both hold a sample when the server stops
            for i in range(3):
                api.asample(ssid, i, seed=30 + i)
            until(lambda: api.healthz()["offloop"]["offloop"] == 3, "three samples handed over")
            assert api.healthz()["offloop"]["idle"] == 0  # two held, one waiting for a process
            api.close()
            os.kill(server.pid, signal.SIGTERM)
            # uvicorn re-raises the SIGTERM it handled once shut down; 60 s is a hang guard
            assert server.process.wait(60) in (0, -signal.SIGTERM)
            errors = server.stderr()
            assert "Traceback" not in errors, errors
            for pid in pids:
                assert _gone(pid), f"decode process {pid} outlived the server"
        finally:
            server.stop()


@pytest.mark.parametrize("name", family_params("decode"))
def test_threads_give_the_reference_bytes_for_every_gil_free_decoder(name):
    decoder = registry.create("decode", name)
    if not releases_gil(decoder):
        pytest.skip(f"{name} holds the GIL: threads are not its design")

    async def run() -> None:
        threads = offloop.Threads(decoder, REFERENCE_ENCODER, count=2, min_bytes=0)
        try:
            jobs = [(case.body, _job(case, _n(case))) for case in CASES]
            got = await asyncio.gather(*(_through(threads, body, job) for body, job in jobs))
            for case, (body, job), result in zip(CASES, jobs, got, strict=True):
                assert result == _expected(body, job), case.id
            assert threads.stats()["offloop"] == len(jobs)
        finally:
            await threads.aclose()

    asyncio.run(run())
