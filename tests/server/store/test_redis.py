"""The shared store against a real redis-server and a real valkey-server (`engine` runs each
test on both): two stores in one event loop stand for two processes (dedup, wake-ups, clocks,
caps, takeover), then real `hotpath serve` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import numpy as np
import pytest

from tests.support import engines
from tests.support.server import Api, grown, start_server
from tests.support.store_options import store_options

pytest.importorskip("redis", reason="the shared store needs redis-py: pip install 'hotpath[store]'")

from impl.encode import sample_pb2
from impl.server.job import Job
from impl.server.offloop.decoding import DecodeJob
from impl.server.store import DONE, FAILED, PENDING, Retention, StoreUnavailable
from impl.server.store.redis import embedded
from impl.server.store.redis.store import RedisStore
from impl.workloads import synthetic

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]
DELAY_BASE = 800_000_000  # tests/support/fake_vllm.py: seed DELAY_BASE + ms answers after ms


@pytest.fixture(scope="module", params=engines.params())
def engine(request):
    """Each engine-level test runs on Redis and on Valkey."""
    server = engines.start(request.param)
    yield server
    server.stop()


def _store(url: str, prefix: str, **overrides) -> RedisStore:
    options = store_options(prefix=prefix, **overrides)
    return RedisStore(url, Retention.take(options), **options)


def two_processes(engine, **overrides):
    """Two stores on one engine and key prefix, as two server processes would have."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    return _store(engine.url, prefix, **overrides), _store(engine.url, prefix, **overrides)


def run(coro):
    return asyncio.run(coro)


def on_two_processes(engine, test, **overrides) -> None:
    """`await test(a, b)` on `two_processes(engine, **overrides)`, both closed after it."""

    async def go():
        a, b = two_processes(engine, **overrides)
        try:
            await test(a, b)
        finally:
            await a.aclose()
            await b.aclose()

    run(go())


def test_a_record_made_in_one_process_is_seen_and_woken_in_another(engine):
    async def go(a, b):
        await a.open()
        await b.open()
        record = await a.create(("ss", 1), 2)
        seen = await b.get(record.request_id)
        assert seen.state == PENDING and seen.sequence_ids == record.sequence_ids
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: asyncio.ensure_future(a.complete(record, b"proto")))
        await b.wait(seen, 20)
        assert seen.state == DONE and seen.payload == b"proto"
        # woken by the publish, not by the end of the 20 s hold
        assert b.held_polls.counts["future"]["woken"] == 1
        assert b.held_polls.counts["future"]["hold_expired"] == 0
        await b.refresh()
        assert b.stats()["completed"] == 1 and b.stats()["pending"] == 0
        assert b.stats()["stored_bytes"] == len(b"proto")

    on_two_processes(engine, go)


def test_a_missed_wake_up_loses_nothing(engine):
    """No subscriber at all (open() not called): wait re-reads the record and sees the result."""

    async def go(a, b):
        record = await a.create(None, 1)
        seen = await b.get(record.request_id)
        await a.complete(record, b"late")
        await b.wait(seen, 5)  # published before b waited: the re-read after registering
        assert seen.state == DONE and seen.payload == b"late"
        other = await a.create(None, 1)
        seen = await b.get(other.request_id)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: asyncio.ensure_future(a.fail(other, "boom")))
        await b.wait(seen, 0.3)  # no listener: the re-read when the hold ends
        assert seen.state == FAILED and seen.error == "boom"

    on_two_processes(engine, go)


def test_dedup_is_atomic_across_processes(engine):
    async def go(a, b):
        made = await asyncio.gather(
            *(s.create(("ss", 7), 1) for s in (a, b) for _ in range(5)), return_exceptions=False
        )
        fresh = [r for r in made if r.fresh]
        assert len(fresh) == 1
        assert {r.request_id for r in made} == {fresh[0].request_id}
        found = await b.lookup(("ss", 7))
        assert found.request_id == fresh[0].request_id
        assert await b.lookup(("ss", 8)) is None

    on_two_processes(engine, go)


def test_both_clocks_use_the_engines_expiry(engine):
    async def go(a, b):
        kept, taken = await a.create(("s", 1), 1), await a.create(("s", 2), 1)
        await a.complete(kept, b"k" * 10)
        await a.complete(taken, b"t" * 10)
        seen = await b.get(taken.request_id)
        await b.delivered(seen)  # the retrieved clock starts only when delivery is reported
        assert 0 < await a.client.pttl(f"{a.prefix}r:{taken.request_id}") <= 200
        assert 20_000 < await a.client.pttl(a._key(("s", 2))) <= 30_200  # dedup tombstone
        await asyncio.sleep(0.45)
        assert await b.get(kept.request_id) is None and await b.get(taken.request_id) is None
        assert await b.lookup(("s", 1)) is None  # expired undelivered: forgotten
        late = await b.lookup(("s", 2))  # delivered, then evicted: same request id
        assert late.request_id == taken.request_id
        await a.refresh()
        assert a.stats()["late_duplicates"] == 1

    on_two_processes(engine, go, completed_ttl=0.3, retrieved_ttl=0.2, dedup_ttl=30.0)


def test_caps_hold_across_processes(engine):
    async def go():
        a, b = two_processes(engine, max_outstanding=3, max_result_bytes=100)
        for i in range(3):
            await a.create(("s", i), 1)
        await b.refresh()
        assert "3 samples pending in the shared store (limit 3)" in b.pressure()
        c, d = two_processes(engine, max_outstanding=3, max_result_bytes=100)
        record = await c.create(None, 1)
        await c.complete(record, b"x" * 150)
        await d.refresh()
        assert "150 result bytes stored" in d.pressure()
        for store in (a, b, c, d):
            await store.aclose()

    run(go())


def test_a_lapsed_lease_is_taken_over_with_its_job(engine):
    async def go(a, b):
        job = Job(b'{"prompt":[1,2,3],"n":2}', DecodeJob([1, 2, 3], 2, 0, True), 4096)
        record = await a.create(("s", 1), 2, job)
        taken: list = []
        b.on_takeover = lambda rec, body, options: taken.append((rec, Job.unpack(body, options)))
        assert await b.take_over() == 0  # a's lease still runs
        await asyncio.sleep(0.3)  # a never renews: it "died"
        assert await b.take_over() == 1
        ((rec, again),) = taken
        assert rec.request_id == record.request_id and rec.key == ("s", 1)
        assert again == job
        await b.complete(rec, b"done")
        await a.complete(record, b"also")  # the dead process's late completion loses
        seen = await a.get(record.request_id)
        assert seen.payload == b"done"
        await a.refresh()
        assert a.stats()["takeovers"] == 1 and a.stats()["finished_twice"] == 1

    on_two_processes(engine, go, lease=0.2)


def test_an_unreachable_store_raises_store_unavailable(tmp_path):
    async def go():
        store = _store(f"unix://{tmp_path}/none.sock", "x:")
        with pytest.raises(StoreUnavailable, match=r"none\.sock"):
            await store.open()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await store.get("nope")
        await store.client.aclose()

    run(go())


# -- real server processes ---------------------------------------------------------------------


def _expected(seed: int, max_tokens: int = 8):
    return synthetic.generate([128000, 1, 2, 3], n=1, max_tokens=max_tokens, seed=seed)[0]


def _check(response, seed: int) -> None:
    assert response.status_code == 200, response.text
    message = sample_pb2.SampleResponse.FromString(response.content)
    got = np.frombuffer(message.sequences[0].tokens, dtype="<i4")
    assert got.tolist() == list(_expected(seed).tokens)


@pytest.mark.slow
def test_two_servers_on_one_store_answer_each_others_calls(engine, upstream):
    prefix = f"h{uuid.uuid4().hex[:8]}:"
    args = ("--store", engine.url, "--store-prefix", prefix)
    with start_server(upstream.url, *args) as one, start_server(upstream.url, *args) as two:
        first, second = Api(one.url), Api(two.url)
        try:
            ssid = first.sampling_session()  # created on one, used on the other
            submitted = second.asample(ssid, 0, seed=DELAY_BASE + 300)
            assert submitted.status_code == 200, submitted.text
            again = first.asample(ssid, 0, seed=DELAY_BASE + 300)  # dedup across processes
            assert again.json()["request_id"] == submitted.json()["request_id"]
            _check(first.result(submitted.json()["request_id"]), DELAY_BASE + 300)
            health = first.healthz()
            assert health["store_backend"]["kind"] == "redis"
            assert health["store_backend"]["address"] == engine.url
            assert health["store_backend"]["rtt_ms"] is not None
            assert health["process"]["pid"] == one.pid
            assert health["store"]["submitted"] == 1 and health["store"]["deduplicated"] == 1
            # the session protocol is offered on the shared store too
            assert health["session_poll"] == {"on": True, "why_off": None}
            config = first.post("/api/v1/client/config", {"sdk_version": "0.38.0"}).json()
            assert config["sample_use_retrieve_futures"] is True
            assert config["sample_join_sampling_session"] is True
        finally:
            first.close()
            second.close()


def _poll(api: Api, ssid: str, cursor: int, **fields):
    body = {"target": {"sampling_session_id": ssid}, "prev_cursor": cursor, **fields}
    reply = api.post("/api/v1/retrieve_futures", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.slow
def test_a_session_cursor_continues_on_another_process_and_after_a_restart(engine, upstream):
    """asample on one server, retrieve_futures on the other: the cursor one handed out
    continues on the other, a held poll there answers when the first completes a sample, an
    ack on either starts the retrieved clock; then both stop and a new server continues the
    same cursor (the log is in the engine). Unknown cursor: 410; unknown session: 404."""
    prefix = f"c{uuid.uuid4().hex[:8]}:"
    args = ("--store", engine.url, "--store-prefix", prefix, "--session-batch-wait", "0")
    with start_server(upstream.url, *args) as one, start_server(upstream.url, *args) as two:
        first, second = Api(one.url), Api(two.url)
        try:
            ssid = first.sampling_session()
            done = first.asample(ssid, 1, seed=21).json()["request_id"]
            first.wait_healthz(lambda h: h["store"]["completed"] >= 1)
            reply = _poll(second, ssid, 0)
            assert [c["request_id"] for c in reply["completions"]] == [done]
            cursor = reply["cursor"]
            later = first.asample(ssid, 2, seed=DELAY_BASE + 700).json()["request_id"]
            before = second.held_polls("session")
            reply = _poll(second, ssid, cursor, retrieved_request_ids=[done])
            assert [c["request_id"] for c in reply["completions"]] == [later]
            # woken by the first process's completion, not answered when the 30 s hold ended
            assert grown(before, second.held_polls("session")) == {"woken": 1}
            assert reply["cursor"] == cursor + 1
            cursor = reply["cursor"]
            assert _poll(first, ssid, cursor, timeout=0) == {"completions": [], "cursor": cursor}
            gone = first.post(
                "/api/v1/retrieve_futures",
                {"target": {"sampling_session_id": ssid}, "prev_cursor": cursor + 5},
            )
            assert gone.status_code == 410, gone.text
            unknown = first.post(
                "/api/v1/retrieve_futures",
                {"target": {"sampling_session_id": "nope"}, "prev_cursor": 0},
            )
            assert unknown.status_code == 404, unknown.text
            _check(first.result(later), DELAY_BASE + 700)
            _check(first.result(done), 21)  # acked (by the poll on two): still kept
        finally:
            first.close()
            second.close()
    with start_server(upstream.url, *args) as again:
        api = Api(again.url)
        try:
            assert _poll(api, ssid, cursor, timeout=0) == {"completions": [], "cursor": cursor}
            third = api.asample(ssid, 3, seed=23).json()["request_id"]
            reply = _poll(api, ssid, cursor)
            assert [c["request_id"] for c in reply["completions"]] == [third]
            assert reply["cursor"] == cursor + 1
            store = api.healthz()["store"]
            assert store["acknowledged"] == 1 and store["delivered"] == 3, store
        finally:
            api.close()


def _pids(process, tries: int = 200) -> set[int]:
    """The worker pids /healthz reports over fresh connections (the kernel spreads them)."""
    seen: set[int] = set()
    for _ in range(tries):
        seen.add(process.get("/healthz")["process"]["pid"])
        if len(seen) > 1:
            break
    return seen


def _retrying(call, deadline: float = 60.0):
    """`call()`, again after a connection error (a worker was killed under a kept-alive one)
    or a 503 (the store is still away), as the SDK retries them."""
    import httpx

    end = time.monotonic() + deadline
    while True:
        try:
            response = call()
            if response.status_code != 503 or time.monotonic() > end:
                return response
        except httpx.TransportError:
            if time.monotonic() > end:
                raise
        time.sleep(0.1)


@pytest.mark.slow
def test_workers_share_one_port_and_survive_the_loss_of_one(upstream):
    """--workers 2 with no --store: an embedded redis-server; one worker is killed (SIGKILL)
    while forwards are in flight and every sample still completes, exactly."""
    with start_server(upstream.url, "--workers", "2", "--store-lease", "1") as server:
        pids = _pids(server)
        assert len(pids) == 2 and server.pid not in pids
        health = server.get("/healthz")
        assert health["store_backend"]["kind"] == "redis"
        assert health["store_backend"]["address"].startswith("unix://")
        socket_path = health["store_backend"]["address"][len("unix://") :]
        assert os.path.exists(socket_path)
        clients = [Api(server.url) for _ in range(8)]  # connections spread over both workers
        try:
            ssid = clients[0].sampling_session()
            seeds = {}
            for i in range(32):
                seed = DELAY_BASE + 1500 + i
                response = clients[i % 8].asample(ssid, i, seed=seed)
                assert response.status_code == 200, response.text
                seeds[response.json()["request_id"]] = seed
            victim = next(  # a worker with forwards in flight (they last 1.5 s)
                h["process"]["pid"]
                for h in (server.get("/healthz") for _ in range(200))
                if h["forwards_in_flight"] > 0
            )
            os.kill(victim, signal.SIGKILL)  # mid-flight: its forwards never finish there
            for k, (request_id, seed) in enumerate(seeds.items()):
                api = clients[k % 8]
                response = _retrying(lambda a=api, r=request_id: a.result(r))
                assert response.status_code == 200, (request_id, response.text)
                _check(response, seed)
            survivor = Api(server.url)
            health = survivor.wait_healthz(
                lambda h: h["process"]["pid"] != victim and h["store"]["completed"] == 32
            )
            survivor.close()
            store = health["store"]
            assert 1 <= store["takeovers"] <= 32, health  # the victim's forwards, no more
            assert store["completed"] == 32 and store["pending"] == 0, health
        finally:
            for api in clients:
                api.close()
    assert not os.path.exists(socket_path)  # the embedded store stopped with the server


def test_while_the_store_is_away_calls_get_503_and_nothing_accepted_is_lost(upstream, tmp_path):
    """The engine stops (its data on disk: appendonly) with a forward in flight; asample and
    retrieve_future answer 503 + Retry-After; when it is back, the server recovers by itself
    and the sample accepted before completes."""
    durable = ("--appendonly", "yes", "--appendfsync", "always")
    engine = embedded.start(directory=str(tmp_path), extra=durable)
    try:
        with start_server(upstream.url, "--store", engine.url, "--retry-after", "2") as server:
            api = Api(server.url)
            try:
                ssid = api.sampling_session()
                accepted = api.asample(ssid, 0, seed=DELAY_BASE + 1500).json()["request_id"]
                engine.stop(keep=True)
                refused = api.asample(ssid, 1, seed=5)
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "2"
                assert "shared store" in refused.json()["detail"]
                assert "retry later" in refused.json()["detail"]
                assert api.retrieve(accepted).status_code == 503
                health = api.wait_healthz(lambda h: not h["store_backend"]["available"])
                assert health["store_backend"]["error"]
                time.sleep(1.5)  # the forward finishes while the store is away
                engine = embedded.start(directory=str(tmp_path), extra=durable)
                _check(_retrying(lambda: api.result(accepted)), DELAY_BASE + 1500)
                health = api.wait_healthz(lambda h: h["store_backend"]["available"])
                assert health["store_backend"]["available"]
                assert api.asample(ssid, 1, seed=5).status_code == 200
            finally:
                api.close()
    finally:
        engine.stop()


@pytest.mark.slow
def test_results_and_pending_samples_survive_a_restart_of_the_server(engine, upstream):
    """Stop the only server (SIGTERM) with one sample done and one still forwarding; a new
    server on the same store serves the first and takes the second over (its lease released)."""
    prefix = f"r{uuid.uuid4().hex[:8]}:"
    args = ("--store", engine.url, "--store-prefix", prefix, "--shutdown-timeout", "1")
    with start_server(upstream.url, *args) as first:
        api = Api(first.url)
        ssid = api.sampling_session()
        done = api.asample(ssid, 0, seed=11).json()["request_id"]
        _check(api.result(done), 11)
        pending = api.asample(ssid, 1, seed=DELAY_BASE + 3000).json()["request_id"]
        api.close()
    with start_server(upstream.url, *args) as second:
        api = Api(second.url)
        try:
            _check(api.result(done), 11)
            _check(api.result(pending), DELAY_BASE + 3000)
            health = api.healthz()
            assert health["store"]["takeovers"] == 1 and health["store"]["submitted"] == 2
        finally:
            api.close()


@pytest.mark.slow
def test_loadtest_kills_one_worker_and_reports_every_sample(tmp_path, capsys):
    """`hotpath loadtest --server-workers 2 --kill-one-at`: the victim and the takeovers are in
    the report, and every sample completed exactly; `--compare memory` runs one process first."""
    import argparse
    import json

    from impl.harness import load

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    path = tmp_path / "r.json"
    code = load.run(parser.parse_args([
        "--num-requests", "64", "--workers", "1", "--router-mode", "latency",
        "--gen-seconds", "1.5", "--max-num-seqs", "64", "--server-workers", "2",
        "--server-arg=--store-lease=1", "--kill-one-at", "0.3", "--compare", "memory",
        "--verify", "exact", "--no-progress", "--report", str(path),
    ]))  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert [r["summary"]["label"] for r in data["runs"]] == ["memory", "2x auto"]
    assert all(r["summary"]["completed"] == 64 for r in data["runs"])
    assert data["runs"][0]["fault"] is None
    fault = data["runs"][1]["fault"]
    assert fault["killed_pid"] and fault["its_forwards_in_flight"] is not None, fault
    assert fault["store_takeovers"] is not None and fault["store_pending"] == 0, fault
    assert data["runs"][1]["healthz"]["store_backend"]["kind"] == "redis"
    assert "kill-one-at" in out


@pytest.mark.slow
def test_workers_and_the_embedded_store_stop_when_the_supervisor_is_killed(upstream):
    """SIGKILL of the supervisor leaves no worker or redis-server behind (parent-death signal)."""
    import psutil

    with start_server(upstream.url, "--workers", "2") as server:
        children = psutil.Process(server.pid).children()
        assert len(children) == 3  # two workers and the embedded redis-server
        os.kill(server.pid, signal.SIGKILL)
        _gone, alive = psutil.wait_procs(children, timeout=30)
        for orphan in alive:  # the test failed: leave nothing behind
            orphan.kill()
        assert not alive, [p.pid for p in alive]


def test_calls_of_one_loop_iteration_share_one_round_trip(engine):
    """The auto-pipeline: 64 concurrent creates are one round trip; a failing command fails
    only its own caller; scripts flushed from the engine are loaded again."""

    async def go():
        a, _ = two_processes(engine, max_outstanding=1000)
        await a.pipe.load()
        before = a.pipe.round_trips
        made = await asyncio.gather(*(a.create(("p", i), 1) for i in range(64)))
        assert a.pipe.round_trips - before == 1 and len({r.request_id for r in made}) == 64
        await a.client.rpush(a.prefix + "a-list", "x")
        wrong, right = await asyncio.gather(
            a.pipe.call("HGET", a.prefix + "a-list", "f"),
            a.get(made[0].request_id),
            return_exceptions=True,
        )
        assert "WRONGTYPE" in str(wrong) and right.request_id == made[0].request_id
        await a.client.script_flush()
        await a.complete(made[0], b"after a flush")  # NOSCRIPT: loaded again, sent again
        assert (await a.get(made[0].request_id)).payload == b"after a flush"
        await a.aclose()

    run(go())


def test_store_calls_per_result_are_counted():
    """`impl.probes.store_calls`: 6 commands per result on the request path (create, payload
    SET + finish, HMGET + GET, delivered), sharing round trips when concurrent."""
    from impl.probes import store_calls

    server = embedded.start()
    try:
        alone = run(store_calls.measure(server.url, "request", 64, 1))
        together = run(store_calls.measure(server.url, "session", 256, 64))
    finally:
        server.stop()
    assert alone["commands_per_result"] == 6 and alone["round_trips_per_result"] == 4
    assert together["commands_per_result"] < 6.5  # plus the session polls and acks
    assert together["round_trips_per_result"] < 0.5  # 64 concurrent calls: one round trip
