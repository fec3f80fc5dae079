"""Bad requests get a 4xx with a clear message and leave the server unaffected; schemathesis
checks the sampling endpoints against the app's own OpenAPI schema (bounded examples)."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from impl.accesslog._common import parse_line
from tests.support.server import API_KEY, Api, start_server, start_upstream

pytestmark = pytest.mark.heavy

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}


@pytest.fixture(scope="module")
def server():
    with start_upstream() as upstream, start_server(upstream.url, "--poll-hold", "0.2") as process:
        yield process


def _sample(ssid: str, **overrides):
    body = {
        "sampling_session_id": ssid,
        "seq_id": 1,
        "prompt": PROMPT,
        "sampling_params": {"max_tokens": 4, "seed": 1},
    }
    body.update(overrides)
    return body


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/asample",
        "/api/v1/retrieve_future",
        "/api/v1/retrieve_futures",
        "/api/v1/create_session",
        "/api/v1/client/config",
        "/api/v1/session_heartbeat",
        "/api/v1/join_sampling_session",
    ],
)
@pytest.mark.parametrize("key", [None, "sk-not-tinker", ""])
def test_api_key_must_start_with_tml(server, path, key):
    client = Api(server.url, api_key=key or "")
    if key is None:
        client.http.headers.pop("X-API-Key")
    response = client.post(path, {"request_id": "x", "session_id": "x", "sdk_version": "1"})
    assert response.status_code == 401
    assert "X-API-Key" in response.json()["detail"] and "tml-" in response.json()["detail"]
    client.close()


def test_bad_asample_bodies(api):
    ssid = api.sampling_session()
    cases = [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "malformed JSON"),
        (b"[]", 422, "Expected `object`"),
        (b'{"seq_id": 1}', 422, "sampling_session_id"),
    ]
    for raw, status, words in cases:
        response = api.http.post("/api/v1/asample", content=raw)
        assert response.status_code == status, (raw, response.text)
        assert words in response.json()["detail"], (raw, response.text)
    typed = [
        (_sample(ssid, num_samples="3"), 422, "$.num_samples"),
        (_sample(ssid, num_samples=0), 422, "$.num_samples"),
        (_sample(ssid, prompt={"chunks": []}), 422, "$.prompt.chunks"),
        (_sample(ssid, prompt={"chunks": [{"type": "image", "data": ""}]}), 422, "type"),
        (
            _sample(ssid, prompt={"chunks": [{"type": "encoded_text", "tokens": [-1]}]}),
            422,
            "$.prompt.chunks[0].tokens[0]",
        ),
        (_sample(ssid, sampling_params={"stop": ["a", 5]}), 422, "mixes strings and token ids"),
        (_sample(ssid, sampling_params={"top_p": 0}), 422, "$.sampling_params.top_p"),
        (_sample(ssid, topk_sample_logprobs=3), 422, "$.topk_sample_logprobs"),
        (_sample("nope"), 404, "unknown sampling_session_id"),
    ]
    for body, status, words in typed:
        response = api.post("/api/v1/asample", body)
        assert response.status_code == status, (body, response.text)
        assert words in response.json()["detail"], (body, response.text)


def test_oversized_body_is_413(api):
    """asample's cap is 12 bytes per --max-prompt-tokens (default 1 Mi) + --max-body-bytes."""
    body = b'{"sampling_session_id":"' + b"a" * (13 << 20) + b'"}'
    response = api.http.post("/api/v1/asample", content=body)
    assert response.status_code == 413
    assert "over 12648448 bytes" in response.json()["detail"]


def test_bad_other_bodies(api):
    cases = [
        ("/api/v1/retrieve_future", {}, 422, "request_id"),
        ("/api/v1/retrieve_future", {"request_id": 5}, 422, "$.request_id"),
        (
            "/api/v1/create_sampling_session",
            {"session_id": "nope", "sampling_session_seq_id": 0, "base_model": "m"},
            404,
            "unknown session_id",
        ),
        ("/api/v1/session_heartbeat", {"session_id": "nope"}, 404, "unknown session_id"),
        ("/api/v1/sessions/nope/finish", {}, 404, "unknown session_id"),
    ]
    for path, body, status, words in cases:
        response = api.post(path, body)
        assert response.status_code == status, (path, response.text)
        assert words in response.text, (path, response.text)
    response = api.http.post(
        "/api/v1/create_session", content=b"{oops", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert "malformed JSON body" in response.json()["detail"]


def test_server_unaffected_after_bad_requests(api):
    """After everything above (and schemathesis below), a normal sample still works."""
    ssid = api.sampling_session()
    reply = api.post("/api/v1/asample", _sample(ssid))
    assert reply.status_code == 200
    result = api.result(reply.json()["request_id"])
    assert result.headers["content-type"] == "application/x-protobuf"
    assert api.healthz()["status"] == "ok"


SCHEMA_PATHS = [
    "/api/v1/asample",
    "/api/v1/retrieve_future",
    "/api/v1/retrieve_futures",
    "/api/v1/join_sampling_session",
    "/api/v1/create_session",
    "/api/v1/create_sampling_session",
    "/api/v1/session_heartbeat",
]


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", SCHEMA_PATHS)
@pytest.mark.slow
def test_openapi_schema_conformance(api_schema, path, mode):
    """Generated bodies that fit the schema and bodies that do not: never a 5xx, always a
    documented status with a documented shape, invalid data rejected with a 4xx.

    schemathesis 4's pytest plugin (`from_fixture(...).parametrize()`) sets the private
    `node._nodeid`, which pytest 9 no longer has; so each operation's hypothesis strategy is
    driven here directly (same checks, `call_and_validate`)."""
    operation = api_schema[path]["POST"]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case):
        case.call_and_validate(headers={"X-API-Key": API_KEY})

    check()


def test_access_log_goes_through_the_picked_handler(server, api):
    """One access-log line per request, written by the picked handler (never `null`)."""
    health = api.healthz()
    assert health["picks"]["accesslog"]["name"] != "null"
    api.post("/api/v1/retrieve_future", {"request_id": "access-log-probe"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        facts = [parse_line(line) for line in list(server.lines)]
        if any(f and f.path == "/api/v1/retrieve_future" and f.status == 404 for f in facts):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"no access-log line for the probe in {server.lines[-5:]}")
    assert any(f and f.path == "/healthz" and f.method == "GET" and f.status == 200 for f in facts)


def test_client_and_session_routes(api):
    """client/config carries the configured cap; sessions live until finished."""
    config = api.post("/api/v1/client/config", {"sdk_version": "0.38.0"})
    assert config.status_code == 200
    assert config.json()["sample_max_concurrent_requests"] == 2000
    assert api.post("/api/v1/client/dynamic_config", {}).status_code == 200
    assert api.post("/api/v1/telemetry", {"events": []}).json() == {"status": "accepted"}
    session = api.post("/api/v1/create_session", {"tags": [], "sdk_version": "t"}).json()
    heartbeat = api.post("/api/v1/session_heartbeat", {"session_id": session["session_id"]})
    assert heartbeat.json() == {"type": "session_heartbeat"}
    body = {"session_id": session["session_id"], "sampling_session_seq_id": 3, "base_model": "m"}
    first = api.post("/api/v1/create_sampling_session", body).json()["sampling_session_id"]
    assert api.post("/api/v1/create_sampling_session", body).json()["sampling_session_id"] == first
    finish = api.post(f"/api/v1/sessions/{session['session_id']}/finish", {"reason": {}})
    assert finish.status_code == 200
    gone = api.post("/api/v1/asample", _sample(first))
    assert gone.status_code == 404
