"""The shared store's engine memory: `maxmemory` with `noeviction`, sized from
`--max-result-bytes` on the embedded store. When results fill the engine, asample answers 503
(the engine refuses the write) or 429 (`--max-result-bytes` reached), and nothing stored is lost.
Against real redis-server and valkey-server processes with a small maxmemory."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

from impl.server.store import DONE, PENDING, Retention, StoreUnavailable
from impl.server.store.redis import embedded
from impl.server.store.redis.store import RedisStore
from tests.support import engines
from tests.support.server import Api, start_server

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT),
]
FULL_AT = 8 << 20  # the engine's maxmemory in these tests
PAYLOAD = 512 << 10
DELAY_BASE = 800_000_000  # tests/support/fake_vllm.py: seed DELAY_BASE + ms answers after ms


def _full_engine(name: str, size: int = FULL_AT) -> embedded.EmbeddedRedis:
    return engines.start(name, "--maxmemory", str(size), "--maxmemory-policy", "noeviction")


def _payload(i: int) -> bytes:
    return bytes([i % 251]) * PAYLOAD


@pytest.mark.parametrize("name", engines.params())
def test_a_full_engine_refuses_new_samples_and_keeps_every_stored_result(name: str) -> None:
    """Results of 512 KiB until the 8 MiB engine refuses one (a forward retries its finish),
    then small samples until it refuses those too: StoreUnavailable saying the store is full
    (asample answers 503). Every result stored before is still there, byte for byte
    (noeviction); a delivery on the full engine still starts its 0.3 s clock, and once those
    results expired the waiting finish lands and new samples are accepted again."""
    server = _full_engine(name)

    async def go() -> None:
        retention = Retention(60.0, 0.3, max_outstanding=100_000, max_result_bytes=1 << 40)
        store = RedisStore(server.url, retention, to_json=bytes, prefix="m:")
        await store.open()
        stored, waiting = [], None
        for i in range(200):
            record = await store.create(("s", i), 1)
            try:
                await store.complete(record, _payload(i))
            except StoreUnavailable as exc:
                assert "is full" in str(exc), exc
                waiting = (record, i)
                break
            stored.append(record)
        assert waiting is not None and 4 <= len(stored) < 16, len(stored)
        refused = None
        for seq in range(1000, 20_000):  # the room a 512 KiB result did not fit in
            try:
                await store.create(("s", seq), 1)
            except StoreUnavailable as exc:
                refused = exc
                break
        assert refused is not None and "is full" in str(refused), refused
        later = []  # a full engine stays at its limit: further samples keep being refused
        for seq in range(50_000, 70_000):
            try:
                await store.create(("s", seq), 1)
            except StoreUnavailable as exc:
                later.append(str(exc))
                if len(later) == 5:
                    break
        # not every one: room the engine's own buffers give back (the health check's connection,
        # the pipeline's buffers) lets small records in between refusals (on valkey-server under
        # load, 19 of the next 20 once); it neither evicts nor takes them all
        assert len(later) == 5 and all("is full" in e for e in later), later
        for i, record in enumerate(stored):  # nothing stored was lost
            got = await store.get(record.request_id)
            assert got is not None and got.state == DONE and got.payload == _payload(i)
        for record in stored:
            await store.delivered(record)
        ttl = await store.client.pttl(f"m:r:{stored[0].request_id}")
        assert 0 < ttl <= 300, ttl  # the retrieved clock started on the full engine
        await asyncio.sleep(0.5)
        record, i = waiting  # the finish that waited for room lands now
        assert (await store.get(record.request_id)).state == PENDING
        await store.complete(record, _payload(i))
        assert (await store.get(record.request_id)).payload == _payload(i)
        again = await store.create(("s", 60_000), 1)
        await store.complete(again, b"fits")
        assert (await store.get(again.request_id)).payload == b"fits"
        await store.aclose()

    try:
        asyncio.run(go())
    finally:
        server.stop()


def _sample(api: Api, ssid: str, seq: int, max_tokens: int):
    return api.asample(ssid, seq, seed=DELAY_BASE + seq, max_tokens=max_tokens)


@pytest.mark.slow
def test_asample_answers_503_when_the_engine_is_full_and_nothing_is_lost(upstream):
    """A real server on a 4 MiB engine (--max-result-bytes far above it): 16 results of
    ~256 KiB, not fetched, fill it (the finishes that do not fit wait), then small samples until
    asample answers 503 with Retry-After and the store's reason. Fetching the results that were
    stored starts their 1 s retrieved TTL; as they expire the waiting finishes land, and all 16
    results are served whole: none stored was lost, none computed was dropped. Then asample is
    accepted again.

    The test polls one result at a time, so each poll holds at most 1 s (`--poll-hold 1`):
    a finish lands only when an earlier result's expiry makes room, and in whichever order the
    waiting finishes retry, so a poll held the default 30 s on one that is not next would keep
    the test from fetching the one that landed (the SDK holds its polls side by side)."""
    server = _full_engine(engines.embedded_engine(), 4 << 20)
    args = ("--store", server.url, "--retrieved-ttl", "1", "--retry-after", "1")
    args += ("--poll-hold", "1")
    try:
        with start_server(upstream.url, *args) as process:
            api = Api(process.url)
            try:
                ssid = api.sampling_session()
                big = []
                for seq in range(16):
                    reply = _sample(api, ssid, seq, 32768)  # ~256 KiB of proto each
                    assert reply.status_code == 200, reply.text
                    big.append(reply.json()["request_id"])

                def settled(health: dict) -> bool:  # some stored, no body in flight
                    busy = health["offloop"]["body_budget"]["bodies"]
                    return health["store"]["completed"] >= 4 and not busy

                health = api.wait_healthz(settled, deadline=90)
                time.sleep(1.0)
                assert 4 <= health["store"]["completed"] < 16, health["store"]
                refused = None
                for seq in range(1000, 6000):  # fill the room a big result did not fit in
                    reply = _sample(api, ssid, seq, 4)
                    if reply.status_code != 200:
                        refused = reply
                        break
                assert refused is not None and refused.status_code == 503, refused
                assert refused.headers["Retry-After"] == "1" and "is full" in refused.text
                sizes = {}
                deadline = time.monotonic() + 90
                while len(sizes) < len(big) and time.monotonic() < deadline:
                    for request_id in big:
                        if request_id not in sizes:
                            got = api.retrieve(request_id)
                            if got.headers.get("content-type") == "application/x-protobuf":
                                sizes[request_id] = len(got.content)
                    time.sleep(0.2)
                assert len(sizes) == len(big), f"{len(sizes)} of {len(big)} results served"
                assert min(sizes.values()) > 250_000
                later = _sample(api, ssid, 9000, 16)
                assert later.status_code == 200, later.text
                assert api.result(later.json()["request_id"]).status_code == 200
            finally:
                api.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_asample_answers_429_at_max_result_bytes_before_the_engine_fills(upstream):
    """--max-result-bytes below the engine's room: asample answers 429 once the results stored
    in the shared store reach it (the engine never refuses), and the results are served."""
    server = engines.start(engines.embedded_engine(), *embedded.memory_options(2 << 20))
    prefix = f"q{uuid.uuid4().hex[:6]}:"
    args = ("--store", server.url, "--store-prefix", prefix, "--max-result-bytes", str(2 << 20))
    try:
        with start_server(upstream.url, *args) as process:
            api = Api(process.url)
            try:
                ssid = api.sampling_session()
                ids, refused = [], None
                for seq in range(20):
                    reply = _sample(api, ssid, seq, 65536)
                    if reply.status_code == 429:
                        refused = reply
                        break
                    assert reply.status_code == 200, reply.text
                    ids.append(reply.json()["request_id"])
                    assert api.result(ids[-1]).status_code == 200
                    time.sleep(0.25)  # the caps' view is refreshed every 0.2 s
                assert refused is not None and "result bytes stored in the shared store" in (
                    refused.text
                )
                assert all(api.retrieve(i).status_code == 200 for i in ids)
            finally:
                api.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_the_embedded_store_is_capped_from_max_result_bytes(upstream):
    """`--store embedded --max-result-bytes N`: the engine runs with maxmemory =
    embedded.maxmemory(N) (N plus a quarter, at least 256 MiB more) and noeviction."""
    with start_server(
        upstream.url, "--store", "embedded", "--max-result-bytes", str(64 << 20)
    ) as s:
        api = Api(s.url)
        try:
            address = api.healthz()["store_backend"]["address"]
        finally:
            api.close()
        client = redis.Redis(unix_socket_path=address.removeprefix("unix://"))
        try:
            config = client.config_get("maxmemory*")
        finally:
            client.close()
    assert int(config["maxmemory"]) == embedded.maxmemory(64 << 20) == (64 << 20) + (256 << 20)
    assert config["maxmemory-policy"] == "noeviction"
    assert embedded.maxmemory(4 << 30) == 5 << 30  # the default --max-result-bytes: 4 + 1 GiB
