"""Bad upstreams: each such sample fails with a clear message on retrieve_future, every other
sample in the same run succeeds, and the server keeps answering /healthz.

The stand-in upstream (tests/support/fake_vllm.py) picks the misbehaviour from the request's seed;
the refused connection uses a port nothing listens on.
"""

from __future__ import annotations

import socket

import pytest

from tests.support import fake_vllm as fake
from tests.support.server import Api, start_server, start_upstream

pytestmark = pytest.mark.heavy

BAD = [  # (seed, words the failure message must contain, forwards the upstream must see)
    pytest.param(fake.SEED_HTML, ["unreadable", "Welcome to nginx"], 1, id="html-with-200"),
    pytest.param(fake.SEED_TRUNCATED, ["unreadable"], 1, id="truncated-json"),
    pytest.param(
        fake.SEED_CLOSE, ["after the request was sent", "not retried"], 1, id="closed-mid-body"
    ),
    pytest.param(fake.SEED_MISMATCH, ["unreadable"], 1, id="arrays-disagree"),
    pytest.param(fake.SEED_500_ALWAYS, ["HTTP 500", "after one retry"], 2, id="500-twice"),
    pytest.param(fake.SEED_422, ["HTTP 422", "max_tokens"], 1, id="422"),
]


@pytest.fixture(scope="module")
def stack():
    with start_upstream() as upstream, start_server(upstream.url, "--poll-hold", "2") as server:
        yield upstream, server


def _forwards(upstream, seed: int) -> int:
    return sum(1 for e in upstream.get("/sent") if e["request"].get("seed") == seed)


@pytest.mark.parametrize(("seed", "words", "forwards"), BAD)
def test_bad_upstream_fails_only_that_sample(stack, seed, words, forwards):
    upstream, server = stack
    api = Api(server.url)
    ssid = api.sampling_session()
    good_before = [api.asample(ssid, i, seed=100 + i, n=2) for i in range(3)]
    bad = api.asample(ssid, 10, seed=seed, n=2)
    good_after = [api.asample(ssid, 20 + i, seed=200 + i) for i in range(3)]
    assert bad.status_code == 200
    failed = api.result(bad.json()["request_id"])
    assert failed.status_code == 200
    assert failed.headers["content-type"] == "application/json"
    body = failed.json()
    assert body["category"] == "server"
    for word in words:
        assert word in body["error"], body["error"]
    for reply in good_before + good_after:
        result = api.result(reply.json()["request_id"])
        assert result.headers["content-type"] == "application/x-protobuf", result.text
    assert _forwards(upstream, seed) == forwards
    # The loop still answers, and no forward is left hanging on the bad upstream (a stuck
    # loop would leave /healthz unanswered: the client's 60 s timeout fails the test).
    health = api.wait_healthz(lambda h: h["forwards_in_flight"] == 0)
    assert health["status"] == "ok" and health["forwards_in_flight"] == 0, health
    api.close()


def test_500_then_success_is_retried(stack):
    upstream, server = stack
    api = Api(server.url)
    ssid = api.sampling_session()
    reply = api.asample(ssid, 1, seed=fake.SEED_500_ONCE, prompt=[9, 9, 9])
    result = api.result(reply.json()["request_id"])
    assert result.headers["content-type"] == "application/x-protobuf", result.text
    assert _forwards(upstream, fake.SEED_500_ONCE) == 2
    api.close()


def test_refused_connection():
    """Nothing listens at the router URL: the connect is retried once, then the sample fails."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with start_server(f"http://127.0.0.1:{port}") as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        reply = api.asample(ssid, 1, seed=1)
        body = api.result(reply.json()["request_id"]).json()
        assert body["category"] == "server"
        assert "could not connect to the router" in body["error"]
        assert "tried twice" in body["error"]
        health = api.healthz()
        assert health["forward_attempts"] == 2
        assert health["store"]["failed"] == 1
        api.close()
