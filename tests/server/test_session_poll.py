"""The session protocol through the real server: client/config flags, retrieve_futures (cursor,
acks, holds, every error path), the metadata-first retrieve_future and join_sampling_session.

`hotpath serve` runs in a subprocess (on the memory store, then on an embedded redis-server)
against the stand-in upstream (tests/support/fake_vllm.py, whose `DELAY_BASE + ms` seeds answer
after `ms` milliseconds); the test talks HTTP to it.
"""

from __future__ import annotations

import time

import pytest

from tests.support.fake_vllm import DELAY_BASE, SEED_500_ALWAYS
from tests.support.server import Api, grown, start_server

pytestmark = pytest.mark.heavy

POLL = "/api/v1/retrieve_futures"


def _no_engine() -> str | None:
    from impl.server.store.redis import embedded

    try:
        import redis  # noqa: F401
    except ImportError:
        return "the shared store needs redis-py: pip install 'hotpath[store]'"
    return embedded.INSTALL_HINT if embedded.binary() is None else None


@pytest.fixture(scope="module", params=["memory", "embedded"])
def server(upstream, request):
    """The server on the memory store, and on the shared store (an embedded redis-server):
    every case below holds on both."""
    if request.param == "embedded" and (missing := _no_engine()):
        pytest.skip(missing)
    args = ("--poll-hold", "5", "--session-batch-wait", "0", "--metadata-first-bytes", "64")
    with start_server(upstream.url, *args, "--store", request.param) as process:
        yield process


def _poll(api: Api, ssid: str, cursor: int = 0, *, clone: int = 0, **fields):
    body = {
        "target": {
            "type": "sampling_session",
            "sampling_session_id": ssid,
            "cloned_sampler_id": clone,
        },
        "prev_cursor": cursor,
        **fields,
    }
    return api.post(POLL, body)


@pytest.mark.slow
def test_client_config_advertises_the_session_protocol(api, upstream):
    config = api.post("/api/v1/client/config", {"sdk_version": "0.38.0"}).json()
    assert config["sample_use_retrieve_futures"] is True
    assert config["sample_join_sampling_session"] is True
    for flags in (("--no-session-poll",), ("--baseline",)):
        with start_server(upstream.url, *flags) as other:
            off = Api(other.url)
            config = off.post("/api/v1/client/config", {"sdk_version": "0.38.0"}).json()
            assert config["sample_use_retrieve_futures"] is False, flags
            assert config["sample_join_sampling_session"] is False, flags
            off.close()


def test_poll_reports_completions_then_the_fetch_gets_the_payload(api):
    ssid = api.sampling_session()
    ids = [api.asample(ssid, i, seed=100 + i).json()["request_id"] for i in (1, 2)]
    failing = api.asample(ssid, 3, seed=SEED_500_ALWAYS).json()["request_id"]
    seen: dict[str, dict] = {}
    cursor = 0
    deadline = time.monotonic() + 30
    while len(seen) < 3 and time.monotonic() < deadline:
        reply = _poll(api, ssid, cursor)
        assert reply.status_code == 200, reply.text
        cursor = reply.json()["cursor"]
        seen.update({c["request_id"]: c for c in reply.json()["completions"]})
    assert set(seen) == {*ids, failing}
    assert seen[failing] == {"state": "failed", "request_id": failing}
    for request_id in ids:
        assert seen[request_id]["state"] == "finished"
        fetched = api.post(
            "/api/v1/retrieve_future",
            {"request_id": request_id, "allow_metadata_only": False},
            headers={"Accept": "application/x-protobuf"},
        )
        assert fetched.headers["content-type"] == "application/x-protobuf"
        assert len(fetched.content) == seen[request_id]["response_payload_uncompressed_size"]
    error = api.post(
        "/api/v1/retrieve_future", {"request_id": failing, "allow_metadata_only": True}
    )
    assert error.json()["category"] == "server" and error.json()["error"]
    # The next poll (cursor moved on) reports nothing again; timeout 0 answers at once.
    before = api.held_polls("session")
    reply = _poll(api, ssid, cursor, timeout=0)
    assert reply.json() == {"completions": [], "cursor": cursor}
    assert grown(before, api.held_polls("session")) == {"at_once": 1}  # not held for 5 s


def test_held_poll_answers_when_the_sample_completes(api):
    ssid = api.sampling_session()
    request_id = api.asample(ssid, 1, seed=DELAY_BASE + 800).json()["request_id"]
    started, before = time.monotonic(), api.held_polls("session")
    reply = _poll(api, ssid)
    assert [c["request_id"] for c in reply.json()["completions"]] == [request_id]
    assert time.monotonic() - started >= 0.5  # held while the sample ran
    # answered because the completion woke it, not because the 5 s hold ended
    assert grown(before, api.held_polls("session")) == {"woken": 1}


def test_empty_poll_is_held_then_answers_with_the_same_cursor(api):
    ssid = api.sampling_session()
    started, before = time.monotonic(), api.held_polls("session")
    reply = _poll(api, ssid, timeout=0.5)
    assert reply.json() == {"completions": [], "cursor": 0}
    assert time.monotonic() - started >= 0.5
    assert grown(before, api.held_polls("session")) == {"hold_expired": 1}


def test_ack_starts_the_retrieved_clock(upstream):
    """An acknowledged result is evicted after the retrieved TTL; one reported but never
    fetched nor acknowledged is kept (until the completed TTL)."""
    args = ("--retrieved-ttl", "0.3", "--completed-ttl", "60", "--session-batch-wait", "0")
    with start_server(upstream.url, *args) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        acked, kept = (api.asample(ssid, i, seed=200 + i).json()["request_id"] for i in (1, 2))
        api.wait_healthz(lambda h: h["store"]["completed"] == 2)
        cursor = _poll(api, ssid).json()["cursor"]
        reply = _poll(api, ssid, cursor, timeout=0, retrieved_request_ids=[acked, "unknown-id"])
        assert reply.status_code == 200
        health = api.healthz()
        assert health["store"]["acknowledged"] == 1 and health["store"]["delivered"] == 1
        time.sleep(0.6)
        assert api.retrieve(acked).status_code == 404
        assert api.retrieve(kept).status_code == 200
        api.close()


def test_metadata_first_answer(api):
    ssid = api.sampling_session()
    request_id = api.asample(ssid, 1, seed=300, max_tokens=32).json()["request_id"]
    proto = {"Accept": "application/x-protobuf"}
    body = {"request_id": request_id, "allow_metadata_only": True}
    first = api.post("/api/v1/retrieve_future", body, headers=proto)
    while first.json().get("type") == "try_again":
        first = api.post("/api/v1/retrieve_future", body, headers=proto)
    assert first.json()["status"] == "complete_metadata"
    payload = api.post(
        "/api/v1/retrieve_future", {**body, "allow_metadata_only": False}, headers=proto
    )
    assert payload.headers["content-type"] == "application/x-protobuf"
    assert first.json()["response_payload_size"] == len(payload.content) >= 64
    # The JSON form is announced with its own size.
    json_meta = api.post("/api/v1/retrieve_future", body).json()
    json_body = api.post("/api/v1/retrieve_future", {**body, "allow_metadata_only": False})
    assert json_meta["response_payload_size"] == len(json_body.content)
    # Below --metadata-first-bytes the payload comes at once.
    small = api.asample(ssid, 2, seed=301, max_tokens=1).json()["request_id"]
    answer = api.result(small)
    again = api.post(
        "/api/v1/retrieve_future", {"request_id": small, "allow_metadata_only": True}, headers=proto
    )
    assert (
        answer.headers["content-type"] == again.headers["content-type"] == "application/x-protobuf"
    )


def test_error_paths(api):
    ssid = api.sampling_session()
    unknown = _poll(api, "no-such-session")
    assert unknown.status_code == 404 and "no-such-session" in unknown.json()["detail"]
    bad_cursor = _poll(api, ssid, 12345)
    assert bad_cursor.status_code == 410 and "12345" in bad_cursor.json()["detail"]
    cases = [
        ({"target": {"type": "model", "sampling_session_id": ssid}}, 422, "target.type"),
        ({"target": {"sampling_session_id": ssid}, "prev_cursor": -1}, 422, "prev_cursor"),
        ({"target": {"sampling_session_id": ssid}, "timeout": -1}, 422, "timeout"),
        ({"target": {"sampling_session_id": ssid}, "retrieved_request_ids": "x"}, 422, "retrieved"),
        ({"prev_cursor": 0}, 422, "target"),
    ]
    for body, status, words in cases:
        reply = api.post(POLL, body)
        assert reply.status_code == status and words in reply.json()["detail"], (body, reply.text)
    garbage = api.http.post(POLL, content=b"{nope", headers={"Content-Type": "application/json"})
    assert garbage.status_code == 400 and "malformed JSON" in garbage.json()["detail"]


def test_join_sampling_session_hands_out_clone_ids(api):
    ssid = api.sampling_session()
    join = {"sampling_session_id": ssid, "type": "join_sampling_session"}
    counters = [api.post("/api/v1/join_sampling_session", join).json() for _ in range(3)]
    assert counters == [{"type": "join_sampling_session", "client_counter": i} for i in (1, 2, 3)]
    unknown = api.post("/api/v1/join_sampling_session", {"sampling_session_id": "nope"})
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    # A clone's samples are reported to the clone's poller only.
    clone_seq = 2 * 1_000_000_000 + 1
    request_id = api.asample(ssid, clone_seq, seed=400).json()["request_id"]
    reply = _poll(api, ssid, clone=2)
    assert [c["request_id"] for c in reply.json()["completions"]] == [request_id]
    assert _poll(api, ssid, timeout=0).json()["completions"] == []


def test_one_bound_for_seq_ids_across_routes(api):
    """What asample accepts, retrieve_futures can poll: seq_id up to SEQ_ID_MAX is accepted and
    its completion is reported to its clone (SEQ_ID_MAX // 1_000_000_000, the largest clone
    the poll accepts); one more is refused by asample (422) as by the poll (its clone, too)."""
    from impl.server.schemas import CLONE_MAX, SEQ_ID_MAX

    assert CLONE_MAX == SEQ_ID_MAX // 1_000_000_000
    ssid = api.sampling_session()
    request_id = api.asample(ssid, SEQ_ID_MAX, seed=5).json()["request_id"]
    reply = _poll(api, ssid, clone=CLONE_MAX)
    assert reply.status_code == 200, reply.text
    assert [c["request_id"] for c in reply.json()["completions"]] == [request_id]
    refused = api.asample(ssid, SEQ_ID_MAX + 1, seed=5)
    assert refused.status_code == 422 and "seq_id" in refused.json()["detail"], refused.text
    assert _poll(api, ssid, clone=CLONE_MAX + 1).status_code == 422
    assert api.asample(ssid, 10**30, seed=5).status_code == 422  # the case


def test_the_ids_the_server_makes_pass_its_smallest_id_limit(upstream):
    """--max-id-length at its minimum (64): the longest ids this server hands out (a sampling
    session of the largest seq id the schema allows) pass every route's check."""
    from impl.server.limits import MIN_ID_LENGTH
    from impl.server.schemas import SAFE_INT_MAX

    with start_server(upstream.url, "--max-id-length", str(MIN_ID_LENGTH)) as server:
        api = Api(server.url)
        try:
            session = api.post("/api/v1/create_session", {"tags": []}).json()["session_id"]
            made = api.post(
                "/api/v1/create_sampling_session",
                {"session_id": session, "sampling_session_seq_id": SAFE_INT_MAX,
                 "base_model": "m"},
            )  # fmt: skip
            ssid = made.json()["sampling_session_id"]
            assert len(ssid) <= MIN_ID_LENGTH
            request_id = api.asample(ssid, 1, seed=6).json()["request_id"]
            assert api.result(request_id).status_code == 200
            assert _poll(api, ssid, timeout=0).status_code == 200
            joined = api.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid})
            assert joined.status_code == 200
            beat = api.post("/api/v1/session_heartbeat", {"session_id": session})
            assert beat.status_code == 200
        finally:
            api.close()
