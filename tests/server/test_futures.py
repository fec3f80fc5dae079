"""The future store through the real server: lost responses, dedup, holds, JSON, retention, 429.

Each test runs `hotpath serve` in a subprocess against the stand-in upstream
(tests/support/fake_vllm.py, whose `DELAY_BASE + ms` seeds answer after `ms` milliseconds) and
talks HTTP to it.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson
import pytest

import impl.encode
from impl.encode import sample_pb2
from impl.workloads import synthetic
from tests.support.fake_vllm import DELAY_BASE
from tests.support.server import API_KEY, Api, grown, start_server

pytestmark = pytest.mark.heavy


def _forwards(upstream, seed: int) -> int:
    return sum(1 for e in upstream.get("/sent") if e["request"].get("seed") == seed)


def _abandoned_poll(url: str, request_id: str) -> socket.socket:
    """A retrieve_future request on a raw socket whose reader will go away (the SDK's timeout)."""
    parts = urlsplit(url)
    body = orjson.dumps({"request_id": request_id})
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(
        b"POST /api/v1/retrieve_future HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nAccept: application/x-protobuf\r\n"
        + f"X-API-Key: {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@pytest.mark.parametrize(
    ("mode", "retry_status"),
    [pytest.param("fast", 200, id="fixed"), pytest.param("baseline", 404, id="baseline-loses-it")],
)
@pytest.mark.slow
def test_lost_response_chain(upstream, mode, retry_status):
    """A poll abandoned before its result is sent must not start the retrieved-TTL clock: the
    retry gets the result. With --baseline semantics (clock started when the response is
    built) the same chain ends in 404: the test can tell the two apart."""
    args = ["--poll-hold", "10", "--completed-ttl", "60", "--retrieved-ttl", "0.5"]
    if mode == "baseline":
        args.append("--baseline")
    with start_server(upstream.url, *args) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        seed = DELAY_BASE + 1500  # the upstream answers after 1.5 s
        request_id = api.asample(ssid, 1, seed=seed).json()["request_id"]
        sock = _abandoned_poll(server.url, request_id)
        time.sleep(0.4)  # the poll is held by now
        sock.close()  # the client gives up during the hold
        health = api.wait_healthz(lambda h: h["store"]["completed"] == 1)
        assert health["store"]["completed"] == 1
        time.sleep(1.2)  # > retrieved TTL: had the clock started, the result is gone now
        retry = api.retrieve(request_id)
        assert retry.status_code == retry_status, retry.text
        if retry_status == 200:
            assert retry.headers["content-type"] == "application/x-protobuf"
            response = sample_pb2.SampleResponse.FromString(retry.content)
            want = synthetic.generate([128000, 1, 2, 3], n=1, max_tokens=8, seed=seed)[0]
            assert np.array_equal(np.frombuffer(response.sequences[0].tokens, "<i4"), want.tokens)
            assert api.healthz()["store"]["delivered"] == 1  # only the retry was delivered
        api.close()


@pytest.fixture(scope="module")
def server(upstream):
    with start_server(upstream.url, "--poll-hold", "1") as process:
        yield process


def test_duplicate_asample_forwards_once(upstream, api):
    """The same (sampling_session_id, seq_id) twice, and twice at once: one forward, one id."""
    ssid = api.sampling_session()
    seed = DELAY_BASE + 300
    first = api.asample(ssid, 7, seed=seed).json()
    again = api.asample(ssid, 7, seed=seed).json()

    async def concurrent():
        async with httpx.AsyncClient(base_url=api.url, headers={"X-API-Key": API_KEY}) as client:
            body = {
                "sampling_session_id": ssid,
                "seq_id": 8,
                "num_samples": 2,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
                "sampling_params": {"max_tokens": 4, "seed": seed + 1},
            }
            replies = await asyncio.gather(
                *(client.post("/api/v1/asample", json=body) for _ in range(5))
            )
            return [r.json() for r in replies]

    burst = asyncio.run(concurrent())
    assert first == again
    assert len(first["sample_sequence_ids"]) == 1
    assert len({r["request_id"] for r in burst}) == 1
    assert len(burst[0]["sample_sequence_ids"]) == 2
    assert api.result(first["request_id"]).status_code == 200
    assert api.result(burst[0]["request_id"]).status_code == 200
    assert _forwards(upstream, seed) == 1
    assert _forwards(upstream, seed + 1) == 1
    # A retried asample after completion still gets the stored future, not a new forward.
    assert api.asample(ssid, 7, seed=seed).json() == first
    assert _forwards(upstream, seed) == 1


def test_poll_hold_then_try_again(api):
    """A pending poll is held for --poll-hold (1 s here), then answered try_again."""
    ssid = api.sampling_session()
    request_id = api.asample(ssid, 1, seed=DELAY_BASE + 4000).json()["request_id"]
    start, before = time.monotonic(), api.held_polls("future")
    response = api.retrieve(request_id)
    assert response.status_code == 200
    assert response.json() == {"type": "try_again"}
    assert time.monotonic() - start >= 0.9  # held, not answered at once
    assert grown(before, api.held_polls("future")) == {"hold_expired": 1}


def test_held_poll_wakes_on_completion(upstream):
    """A held poll answers with the result as soon as it completes, not at the end of the hold."""
    with start_server(upstream.url, "--poll-hold", "25") as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        request_id = api.asample(ssid, 1, seed=DELAY_BASE + 500).json()["request_id"]
        before = api.held_polls("future")
        response = api.retrieve(request_id)
        assert response.headers["content-type"] == "application/x-protobuf"
        # answered because the completion woke it, not because the 25 s hold ended
        assert grown(before, api.held_polls("future")) == {"woken": 1}
        api.close()


def test_unknown_request_id_is_404(api):
    response = api.retrieve("no-such-request")
    assert response.status_code == 404
    assert "unknown request_id" in response.json()["detail"]


def test_json_derived_once_for_concurrent_polls(api):
    """Legacy JSON clients get the JSON form of the stored proto, derived once (here a >1 MB
    payload, converted in a worker thread while 8 polls wait on the same result)."""
    ssid = api.sampling_session()
    seed, max_tokens = 4242, 140_000  # 8 bytes/token of proto: over the 1 MiB thread threshold
    request_id = api.asample(ssid, 3, seed=seed, max_tokens=max_tokens).json()["request_id"]
    proto = api.result(request_id).content
    before = api.healthz()["store"]["json_derived"]

    async def polls():
        async with httpx.AsyncClient(
            base_url=api.url, headers={"X-API-Key": API_KEY}, timeout=60
        ) as client:
            return await asyncio.gather(
                *(
                    client.post("/api/v1/retrieve_future", json={"request_id": request_id})
                    for _ in range(8)
                )
            )

    replies = asyncio.run(polls())
    assert {r.headers["content-type"] for r in replies} == {"application/json"}
    assert len({r.content for r in replies}) == 1
    assert api.healthz()["store"]["json_derived"] == before + 1
    data = replies[0].json()
    assert data == orjson.loads(impl.encode.proto_to_json(proto))
    want = synthetic.generate([128000, 1, 2, 3], n=1, max_tokens=max_tokens, seed=seed)[0]
    assert data["sequences"][0]["tokens"] == want.tokens.tolist()
    assert np.array_equal(np.array(data["sequences"][0]["logprobs"], np.float32), want.logprobs)


@pytest.mark.slow
def test_retention_evicts_and_frees_bytes(upstream):
    """Undelivered results go after --completed-ttl, delivered ones after --retrieved-ttl;
    stored bytes return to zero without any further request touching them."""
    args = ("--completed-ttl", "4", "--retrieved-ttl", "1", "--poll-hold", "5")
    with start_server(upstream.url, *args) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        kept = api.asample(ssid, 1, seed=11, max_tokens=64).json()["request_id"]
        taken = api.asample(ssid, 2, seed=12, max_tokens=64).json()["request_id"]
        health = api.wait_healthz(lambda h: h["store"]["completed"] == 2)["store"]
        assert health["records"] == 2 and health["stored_bytes"] > 0
        assert api.result(taken).status_code == 200
        assert api.result(taken, proto=False).status_code == 200  # JSON bytes counted too
        health = api.wait_healthz(lambda h: h["store"]["records"] == 1, deadline=10)["store"]
        assert health["records"] == 1 and health["stored_bytes"] > 0  # delivered one went first
        assert api.retrieve(taken).status_code == 404
        health = api.wait_healthz(lambda h: h["store"]["records"] == 0, deadline=10)["store"]
        assert health["records"] == 0
        assert health["stored_bytes"] == 0
        assert health["evicted"] == 2
        assert api.retrieve(kept).status_code == 404
        # Expired undelivered: the same seq_id is a new sample now (a new forward, a new id).
        assert api.asample(ssid, 1, seed=11, max_tokens=64).json()["request_id"] != kept
        # Delivered, then evicted: the key still answers with its id and nothing is generated.
        forwards = _forwards(upstream, 12)
        assert api.asample(ssid, 2, seed=12, max_tokens=64).json()["request_id"] == taken
        assert _forwards(upstream, 12) == forwards
        assert api.healthz()["store"]["late_duplicates"] == 1
        api.close()


@pytest.mark.slow
def test_backpressure_429(upstream):
    """Beyond --max-result-bytes stored or --max-outstanding pending, asample answers 429 with
    Retry-After; a duplicate of an existing sample still gets its future."""
    args = (
        "--max-outstanding",
        "2",
        "--max-result-bytes",
        "1",
        "--completed-ttl",
        "3",
        "--retrieved-ttl",
        "3",
        "--retry-after",
        "3",
    )
    with start_server(upstream.url, *args) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        done = api.asample(ssid, 1, seed=1).json()["request_id"]
        assert api.result(done).status_code == 200
        refused = api.asample(ssid, 2, seed=2)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        assert "result bytes stored" in refused.json()["detail"]
        api.wait_healthz(lambda h: h["store"]["stored_bytes"] == 0, deadline=10)
        slow = [api.asample(ssid, 10 + i, seed=DELAY_BASE + 2000 + i) for i in range(2)]
        assert [r.status_code for r in slow] == [200, 200]
        refused = api.asample(ssid, 20, seed=3)
        assert refused.status_code == 429
        assert "samples pending" in refused.json()["detail"]
        assert api.asample(ssid, 10, seed=DELAY_BASE + 2000).json() == slow[0].json()
        api.close()


@pytest.mark.slow
def test_shutdown_answers_held_polls(upstream):
    """SIGTERM while a poll is held: the poll is answered (try_again) and the server exits."""
    with start_server(upstream.url, "--poll-hold", "25", "--shutdown-timeout", "5") as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        request_id = api.asample(ssid, 1, seed=DELAY_BASE + 30000).json()["request_id"]

        async def held_then_sigterm():
            async with httpx.AsyncClient(base_url=api.url, headers={"X-API-Key": API_KEY},
                                         timeout=60) as client:  # fmt: skip
                poll = asyncio.ensure_future(
                    client.post("/api/v1/retrieve_future", json={"request_id": request_id})
                )
                await asyncio.sleep(0.5)
                server.process.terminate()
                return await poll

        response = asyncio.run(held_then_sigterm())
        assert response.status_code == 200 and response.json() == {"type": "try_again"}
        # uvicorn re-raises the captured SIGTERM once shut down: exit by that signal is clean.
        assert server.process.wait(20) in (0, -signal.SIGTERM)
        api.close()
