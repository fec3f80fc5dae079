"""Each record and session belongs to the caller NAME that made it, on the memory store and on
the shared store (real redis-server and valkey-server): the owner survives a read from another
process and a takeover, each owner's pending samples are counted (the per-caller share), and
every id is random (no counter, >= 96 bits)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import uuid

import pytest

from impl.server.job import Job
from impl.server.offloop.decoding import DecodeJob
from impl.server.sessions import Sessions
from impl.server.store import Retention
from impl.server.store.memory import MemoryStore
from impl.server.store.redis import embedded
from tests.support import engines
from tests.support.store_options import store_options

pytestmark = pytest.mark.heavy


def run(coro):
    return asyncio.run(coro)


def random_bits(token: str) -> int:
    """The bits an id's url-safe base64 carries (raises if it is not such base64)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == token
    return len(raw) * 8


def test_the_memory_store_keeps_the_owner_and_counts_each_owners_pending():
    async def go():
        options = store_options()
        store = MemoryStore(Retention.take(options), **options)
        store.start()
        a1 = await store.create(("ss-a", 1), 1, None, "alice")
        a2 = await store.create(("ss-a", 2), 1, None, "alice")
        b1 = await store.create(("ss-b", 1), 1, None, "bob")
        assert (await store.get(a1.request_id)).owner == "alice"
        assert (await store.get(b1.request_id)).owner == "bob"
        assert store.outstanding_of("alice") == 2 and store.outstanding_of("bob") == 1
        await store.complete(a1, b"x")
        await store.fail(a2, "boom")
        assert store.outstanding_of("alice") == 0
        assert store.outstanding_by_owner() == {"bob": 1}
        ids = [a1.request_id, a2.request_id, b1.request_id]
        assert len(set(ids)) == 3 and all(random_bits(i) >= 96 for i in ids)
        store.close()

    run(go())


def test_memory_sessions_answer_another_owner_as_unknown():
    async def go():
        sessions = Sessions()
        session = await sessions.create("alice")
        assert session.startswith("session-") and random_bits(session[8:]) >= 96
        assert await sessions.create_sampling(session, 0, "m", "bob") is None
        sampling = await sessions.create_sampling(session, 0, "m", "alice")
        assert sampling == f"{session}:sample:0"
        assert await sessions.base_model(sampling, "bob") is None
        assert await sessions.base_model(sampling, "alice") == "m"
        assert await sessions.join(sampling, "bob") is None
        assert await sessions.join(sampling, "alice") == 1
        assert not await sessions.heartbeat(session, "bob")
        assert not await sessions.finish(session, "bob")
        assert await sessions.heartbeat(session, "alice")
        assert await sessions.finish(session, "alice")

    run(go())


shared = pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT)


@pytest.fixture(scope="module", params=engines.params())
def engine(request):
    pytest.importorskip("redis", reason="the shared store needs redis-py")
    server = engines.start(request.param)
    yield server
    server.stop()


def _two(engine, **overrides):
    from impl.server.store.redis.store import RedisStore

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    stores = []
    for _ in range(2):
        options = store_options(prefix=prefix, **overrides)
        stores.append(RedisStore(engine.url, Retention.take(options), **options))
    return stores


@shared
def test_the_shared_store_keeps_the_owner_across_processes_and_counts_pending(engine):
    async def go():
        a, b = _two(engine)
        await a.open()
        await b.open()
        r1 = await a.create(("ss-a", 1), 1, None, "alice")
        r2 = await a.create(("ss-b", 1), 1, None, "bob")
        assert a.outstanding_of("alice") == 1  # counted here before any refresh
        seen = await b.get(r1.request_id)
        assert seen.owner == "alice" and (await b.get(r2.request_id)).owner == "bob"
        await b.refresh()
        assert b.outstanding_by_owner() == {"alice": 1, "bob": 1}
        assert "o:alice" not in b.stats() and "alice" not in str(b.stats())
        await b.complete(seen, b"done")
        await a.refresh()
        assert a.outstanding_by_owner() == {"bob": 1}
        assert all(random_bits(r.request_id) >= 96 for r in (r1, r2))
        for store in (a, b):
            await store.aclose()

    run(go())


@shared
def test_a_taken_over_record_keeps_its_owner_and_its_count(engine):
    async def go():
        a, b = _two(engine, lease=0.2)
        job = Job(b'{"prompt":[1,2,3],"n":1}', DecodeJob([1, 2, 3], 1, 0, True), 4096)
        record = await a.create(("s", 1), 1, job, "carol")
        taken: list = []
        b.on_takeover = lambda rec, body, options: taken.append(rec)
        await asyncio.sleep(0.3)  # a never renews: it "died"
        assert await b.take_over() == 1
        ((rec,),) = [taken]
        assert rec.request_id == record.request_id
        assert rec.owner == "carol"  # a finish that writes it again keeps it carol's
        await b.complete(rec, b"done")
        seen = await b.get(record.request_id)
        assert seen.owner == "carol" and seen.payload == b"done"
        await b.refresh()
        assert b.outstanding_of("carol") == 0 and b.stats()["takeovers"] == 1
        for store in (a, b):
            await store.aclose()

    run(go())


@shared
def test_shared_sessions_answer_another_owner_as_unknown(engine):
    async def go():
        from impl.server.store.redis.sessions import RedisSessions

        a, b = _two(engine)
        await a.open()
        await b.open()
        here, there = RedisSessions(a), RedisSessions(b)
        session = await here.create("alice")
        assert random_bits(session.removeprefix("session-")) >= 96
        assert await there.create_sampling(session, 0, "m", "bob") is None
        sampling = await there.create_sampling(session, 0, "m", "alice")
        assert sampling is not None
        assert await here.base_model(sampling, "bob") is None  # a cache miss here, then owned
        assert await here.base_model(sampling, "alice") == "m"
        assert await there.join(sampling, "bob") is None
        assert await there.join(sampling, "alice") == 1
        assert not await here.heartbeat(session, "bob")
        assert not await here.finish(session, "bob")
        assert await there.heartbeat(session, "alice")
        assert await there.finish(session, "alice")
        assert not await here.heartbeat(session, "alice")  # gone for its owner too
        for store in (a, b):
            await store.aclose()

    run(go())


def test_ids_never_count():
    """Consecutive ids share no prefix a counter would leave (and os.urandom is their source)."""
    from impl.server.store import ids as id_module
    from impl.server.store.ids import new_id

    ids = [new_id() for _ in range(200)]
    assert len(set(ids)) == 200 and len({i[0] for i in ids}) > 20  # not one prefix
    shared = [
        sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(x, y, strict=True)))
        for x, y in itertools.pairwise(ids)
    ]
    assert max(shared) < 6  # 6 equal base64 characters in a row: 1 in 2**36 per pair
    assert id_module.random_bytes is os.urandom
    try:
        id_module.random_bytes = bytes
        assert new_id() == "A" * 22  # the bytes come from random_bytes, read at each call
    finally:
        id_module.random_bytes = os.urandom
