"""The shared store away, killed or stalled, under a real server: one error contract.

Every route that needs the store answers 503 JSON with Retry-After while it is away (never 500,
never plain text), the outage is logged once when it starts and once when it ends (with the
calls that failed, counted by operation on /healthz and /metrics), a stalled engine (SIGSTOP)
counts as away, and everything works again when the engine is back, with no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

import pytest

from tests.support.faults import OwnStore, bad_statuses, never_logged, server_on_own_store, statuses
from tests.support.server import Api, start_server
from tests.support.wait import until

pytest.importorskip("redis", reason="the shared store needs redis-py: pip install 'hotpath[store]'")

import redis

from impl.server.store import Retention, StoreUnavailable
from impl.server.store.redis import embedded
from impl.server.store.redis.pipeline import AutoPipeline, settled
from impl.server.store.redis.store import RedisStore

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]


def _store_calls(api: Api, session_id: str, ssid: str, request_id: str):
    """One request to every route that needs the store: (what, response)."""
    session = {"session_id": session_id}
    return [
        ("create_session", api.post("/api/v1/create_session", {"tags": []})),
        (
            "create_sampling_session",
            api.post(
                "/api/v1/create_sampling_session",
                {**session, "sampling_session_seq_id": 1, "base_model": "m"},
            ),
        ),
        (
            "join_sampling_session",
            api.post("/api/v1/join_sampling_session", {"sampling_session_id": ssid}),
        ),
        ("session_heartbeat", api.post("/api/v1/session_heartbeat", session)),
        ("asample", api.asample(ssid, 99, seed=3)),
        ("retrieve_future", api.retrieve(request_id)),
        (
            "retrieve_futures",
            api.post(
                "/api/v1/retrieve_futures",
                {"target": {"sampling_session_id": ssid}, "prev_cursor": 0, "timeout": 0},
            ),
        ),
        ("finish", api.post(f"/api/v1/sessions/{session_id}/finish", {})),
    ]


@pytest.mark.slow
def test_every_store_route_answers_503_json_while_the_store_is_killed(upstream, tmp_path):
    """kill -9 of the engine: each route answers 503 + Retry-After in the one error shape;
    /readyz 503 and /livez 200 meanwhile; when it is started again (same data), every route
    answers as before (four heartbeats in a row: 200, not one stale connection's error) and
    the sample accepted before is served. Logged once each way; no traceback."""
    with server_on_own_store(upstream.url, str(tmp_path), "--retry-after", "2") as own:
        engine = own.engine
        with contextlib.closing(Api(own.server.url)) as api:
            ssid = api.sampling_session()
            session_id = api.post("/api/v1/create_session", {"tags": []}).json()["session_id"]
            request_id = api.asample(ssid, 0, seed=7).json()["request_id"]
            assert api.result(request_id).status_code == 200
            engine.kill()
            why = until(lambda: api.http.get("/readyz").status_code == 503 and api.healthz())
            assert why["ready"] is False and "unavailable" in why["why_not_ready"][0]
            assert api.http.get("/livez").status_code == 200
            for name, response in _store_calls(api, session_id, ssid, request_id):
                assert response.status_code == 503, (name, response.text)
                assert response.headers["content-type"] == "application/json", name
                assert response.headers["retry-after"] == "2", name
                assert "shared store" in response.json()["detail"], name
                assert response.json()["detail"].endswith("retry later"), name
            engine.start()
            until(lambda: api.http.get("/readyz").status_code == 200)
            beats = [
                api.post("/api/v1/session_heartbeat", {"session_id": session_id}).status_code
                for _ in range(4)
            ]
            assert beats == [200] * 4
            assert api.result(request_id).status_code == 200  # kept on disk
            for name, response in _store_calls(api, session_id, ssid, request_id):
                assert response.status_code == 200, (name, response.text)
            backend = api.healthz()["store_backend"]
            assert backend["available"] and backend["outages"] == 1, backend
            calls = backend["unavailable_calls"]
            assert calls["create"] >= 1 and calls["heartbeat"] >= 1, calls
            counts = statuses(own.server.url)
            assert counts[503] >= 8 and not bad_statuses(counts), counts
    log = own.log
    assert log.count("is unavailable") == 1 and log.count("is back after") == 1, log


def test_a_stalled_store_is_away_and_comes_back(upstream, tmp_path):
    """SIGSTOP of the engine: no answer within --store-timeout (1 s) counts as away: /readyz
    503 and calls answer 503 at once (not after the engine's socket timeout); a poll already
    waiting on the engine is answered 503 too. SIGCONT: ready again, no restart."""
    with server_on_own_store(upstream.url, str(tmp_path)) as own:
        engine = own.engine
        with contextlib.closing(Api(own.server.url)) as api:
            ssid = api.sampling_session()
            session_id = api.post("/api/v1/create_session", {"tags": []}).json()["session_id"]
            engine.pause()
            health = until(lambda: api.http.get("/readyz").status_code == 503 and api.healthz())
            assert "not answered" in health["why_not_ready"][0] or "stalled" in str(health)
            # calls fail at once once the ping timed out (the health thread says away)
            until(lambda: api.healthz()["store_backend"]["away_s"] is not None)
            began = time.monotonic()
            refused = api.post("/api/v1/session_heartbeat", {"session_id": session_id})
            assert refused.status_code == 503 and "no answer within 1 s" in refused.text
            answered_in = time.monotonic() - began
            engine.resume()
            until(lambda: api.http.get("/readyz").status_code == 200)
            assert (
                api.post("/api/v1/session_heartbeat", {"session_id": session_id}).status_code == 200
            )
            request_id = api.asample(ssid, 0, seed=8).json()["request_id"]
            assert api.result(request_id).status_code == 200
            assert not bad_statuses(statuses(own.server.url))
    log = own.log
    assert "no answer within 1 s" in log
    print(f"a call while the store was stalled answered 503 in {answered_in * 1e3:.1f} ms")


def _store(url: str) -> RedisStore:
    retention = Retention(completed_ttl=60, retrieved_ttl=10, max_outstanding=100,
                          max_result_bytes=1 << 30)  # fmt: skip
    return RedisStore(url, retention, to_json=lambda b: b, prefix="f:", timeout=0.5)


def test_calls_in_flight_fail_when_the_store_stalls_and_no_error_goes_unretrieved(tmp_path):
    """In one process: a call sent to a stalled engine fails with StoreUnavailable as soon as
    the health thread calls the engine away (not after redis-py's 30 s socket timeout); later
    calls fail before they are sent; a finish whose payload SET fails leaves no 'exception
    never retrieved' (both of its calls are awaited)."""
    engine = OwnStore(str(tmp_path))
    unretrieved: list = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        store = _store(engine.url)
        await store.open()
        record = await store.create(("s", 1), 1)
        engine.pause()
        try:
            waiting = asyncio.ensure_future(store.get(record.request_id))
            with pytest.raises(StoreUnavailable, match="no answer within"):
                await asyncio.wait_for(waiting, 20)
            with pytest.raises(StoreUnavailable):
                await store.complete(record, b"payload")  # refused before it is sent
            assert store.health.failed["get"] == 1 and store.health.failed["finish"] == 1
        finally:
            engine.resume()
        while store.health.away is not None:
            await asyncio.sleep(0.05)
        await store.complete(record, b"payload")
        assert (await store.get(record.request_id)).payload == b"payload"
        await store.aclose()

    try:
        asyncio.run(go())
    finally:
        engine.stop()
    assert not unretrieved, unretrieved


def test_a_store_that_refuses_writes_is_logged_not_per_call_and_works_again(tmp_path, caplog):
    """An engine that is up but refuses writes (here `min-replicas-to-write 1` with no replica:
    NOREPLICAS; a full disk makes it answer MISCONF the same way) is not away: its ping answers,
    so no outage starts. Each refused call fails with StoreUnavailable carrying the engine's
    message and is counted on /healthz (`refused_calls`, `last_refusal`); the refusals are
    logged once, not per call (at most once a minute); when the engine writes again, so does
    the store, with no restart."""
    engine = OwnStore(str(tmp_path))
    control = redis.Redis.from_url(engine.url)

    async def go():
        store = _store(engine.url)
        await store.open()
        first = await store.create(("s", 1), 1)
        second = await store.create(("s", 2), 1)
        control.config_set("min-replicas-to-write", 1)
        try:
            for record in (first, second):
                with pytest.raises(StoreUnavailable, match="refused the call: NOREPLICAS"):
                    await store.complete(record, b"payload")
            described = store.health.describe()
            assert store.health.away is None and described["available"]
            assert described["refused_calls"] == 2, described
            assert "NOREPLICAS" in described["last_refusal"]
            assert described["unavailable_calls"] == {"finish": 2}
        finally:
            control.config_set("min-replicas-to-write", 0)
        await store.complete(first, b"payload")
        assert (await store.get(first.request_id)).payload == b"payload"
        await store.aclose()

    caplog.set_level(logging.WARNING, logger="hotpath.server")
    try:
        asyncio.run(go())
    finally:
        control.close()
        engine.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "hotpath.server"]
    refusals = [m for m in messages if "refused" in m]
    assert len(refusals) == 1, messages
    assert "refused 1 call(s)" in refusals[0] and "NOREPLICAS" in refusals[0], refusals
    assert not [m for m in messages if "until it is back" in m], messages  # no outage


def test_settled_retrieves_every_error():
    """`settled` awaits every call of a caller, raises the first error, and leaves none of the
    others unretrieved (what `_finish` and `_read` use)."""
    unretrieved: list = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        first.set_exception(ConnectionError("first"))
        second.set_exception(ConnectionError("second"))
        with pytest.raises(ConnectionError, match="first"):
            await settled(first, second)
        ok = loop.create_future()
        ok.set_result(1)
        assert await settled(ok) == [1]

    asyncio.run(go())
    import gc

    gc.collect()
    assert not unretrieved


def test_fail_pending_fails_queued_and_sent_calls():
    """AutoPipeline.fail_pending: every queued call and every call on its way gets the error."""

    class Stuck:
        def pipeline(self, transaction: bool):
            raise AssertionError("not reached")

    async def go():
        pipe = AutoPipeline(Stuck(), {})
        queued = pipe.call("GET", "k")
        pipe.fail_pending(StoreUnavailable("away"))
        with pytest.raises(StoreUnavailable, match="away"):
            await queued
        await asyncio.sleep(0)  # the flush scheduled for the failed call finds nothing

    asyncio.run(go())


def test_the_embedded_keeper_state_is_on_the_probes(upstream):
    """`--store embedded`: /healthz shows the keeper (running, pid); kill -9 of its
    redis-server: /readyz 503 while it is away, then 200 with one restart and the data kept."""
    with start_server(upstream.url, "--store", "embedded") as server:
        api = Api(server.url)
        try:
            ssid = api.sampling_session()
            request_id = api.asample(ssid, 0, seed=9).json()["request_id"]
            assert api.result(request_id).status_code == 200
            keeper = api.healthz()["store_backend"]["embedded"]
            assert keeper["state"] == "running" and keeper["restarts"] == 0, keeper
            os.kill(keeper["pid"], signal.SIGKILL)
            keeper = until(
                lambda: (
                    (k := api.healthz()["store_backend"]["embedded"])["restarts"] == 1
                    and k["state"] == "running"
                    and k
                )
            )
            assert keeper["last_exit"] == "killed by SIGKILL", keeper
            until(lambda: api.http.get("/readyz").status_code == 200)
            again = api.result(request_id)
            assert again.status_code == 200, again.text  # from its append-only file
        finally:
            api.close()
        log = server.stderr()
    assert "exited (killed by SIGKILL): starting it again" in log
    assert "the embedded store is back" in log
    assert not never_logged(log), never_logged(log)
