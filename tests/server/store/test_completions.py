"""The per-session completion logs behind retrieve_futures, through each store (an event loop,
no HTTP): cursor and trim, holds and batching, acks and the two retention clocks. Every case
runs on the MemoryStore and on the RedisStore against a real redis-server (the embedded one),
where the log lives in the engine."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from impl.server.store import Retention, StoreUnavailable
from impl.server.store.completions import CLONE_BLOCK, PAUSE_FLOOR, hold_for, target_of
from impl.server.store.memory import MemoryStore
from impl.server.store.redis import embedded

pytestmark = pytest.mark.heavy

SS = "session-x:sample:0"
TARGET = (SS, 0)
NEEDS_ENGINE = pytest.mark.skipif(embedded.binary() is None, reason=embedded.INSTALL_HINT)
STORES = ["memory", pytest.param("redis", marks=NEEDS_ENGINE)]
#: a case about several processes: the shared store only
SHARED_ONLY = [NEEDS_ENGINE, pytest.mark.parametrize("make", ["redis"], indirect=True)]


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip(
        "redis", reason="the shared store needs redis-py: pip install 'hotpath[store]'"
    )
    server = embedded.start()
    yield server
    server.stop()


@pytest.fixture(params=STORES)
def make(request):
    """`make(**overrides)`: an unopened store of the parametrised kind (redis: a fresh key
    prefix per test on the module's engine; `prefix=` shares one between two stores)."""
    kind = request.param
    url = request.getfixturevalue("engine").url if kind == "redis" else None
    prefix = f"t{uuid.uuid4().hex[:8]}:"

    def make_store(**overrides):
        options = {
            "completed_ttl": 60.0,
            "retrieved_ttl": 10.0,
            "max_outstanding": 1000,
            "max_result_bytes": 1 << 30,
            "to_json": lambda b: b"{}",
            "session_batch_wait": 0.0,
        }
        options.update(overrides)
        retention = Retention.take(options)
        if kind == "memory":
            return MemoryStore(retention, **options)
        from impl.server.store.redis.store import RedisStore

        options.setdefault("prefix", prefix)
        return RedisStore(url, retention, **options)

    make_store.kind = kind
    return make_store


async def _opened(make, **overrides):
    store = make(**overrides)
    await store.open()
    return store


async def _stats(store) -> dict:
    if hasattr(store, "refresh"):
        await store.refresh()
    return store.stats()


def run(coro):
    return asyncio.run(coro)


async def _within(seconds: float, coro):
    """`coro`'s result; past `seconds` the test fails with every task's stack printed (what
    each one waits on), instead of waiting for pytest's timeout, which shows threads only."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        for other in asyncio.all_tasks():
            other.print_stack()
        task.cancel()
        pytest.fail(f"not done within {seconds:g} s; every task's stack is printed above")
    return task.result()


async def _retried(call, retries: dict[str, int], what: str):
    """`await call()`, tried again 0.1 s after each StoreUnavailable (as the forward's
    `Forwarder._settle` and the SDK, on a 503, do), counted in `retries[what]`."""
    while True:
        try:
            return await call()
        except StoreUnavailable:
            retries[what] += 1
            await asyncio.sleep(0.1)


def _reasons(store, kind: str = "session") -> dict[str, int]:
    """Why the store's held polls of `kind` answered so far (`impl.server.store.held`)."""
    return dict(store.held_polls.counts[kind])


def _since(before: dict[str, int], store, kind: str = "session") -> dict[str, int]:
    """The reasons counted since `before` (only those that grew)."""
    now = _reasons(store, kind)
    return {reason: now[reason] - before[reason] for reason in now if now[reason] > before[reason]}


def test_target_is_the_clone_block_of_the_seq_id():
    assert target_of(SS, 5) == (SS, 0)
    assert target_of(SS, 3 * CLONE_BLOCK + 7) == (SS, 3)


def test_cursor_reports_each_completion_once_and_trims_what_was_seen(make):
    async def go():
        s = await _opened(make)
        a, b, c = [await s.create((SS, i), 1) for i in (1, 2, 3)]
        await s.complete(a, b"xx")
        await s.fail(b, "upstream said no")
        entries, cursor = await s.session_completions(TARGET, 0, 0)
        assert [(e.request_id, e.state, e.size) for e in entries] == [
            (a.request_id, "finished", 2),
            (b.request_id, "failed", 0),
        ]
        assert [e.position for e in entries] == [cursor - 1, cursor]
        # The answer was lost: the same cursor gets the same completions again.
        again, cursor_again = await s.session_completions(TARGET, 0, 0)
        assert again == entries and cursor_again == cursor
        # The next cursor drops them; nothing new: the cursor stays.
        assert await s.session_completions(TARGET, cursor, 0) == ([], cursor)
        assert await s.session_completions(TARGET, 0, 0) == ([], 0)  # dropped for good
        await s.complete(c, b"yyy")
        entries, later = await s.session_completions(TARGET, cursor, 0)
        assert [e.request_id for e in entries] == [c.request_id] and later == cursor + 1
        assert cursor < 2**53  # exact as a double (JSON readers, the shared store's Lua)
        await s.aclose()

    run(go())


def test_clones_and_sessions_have_separate_logs(make):
    async def go():
        s = await _opened(make)
        original = await s.create((SS, 1), 1)
        clone = await s.create((SS, 2 * CLONE_BLOCK + 1), 1)
        other = await s.create(("other", 1), 1)
        for record in (original, clone, other):
            await s.complete(record, b"x")
        assert [e.request_id for e in (await s.session_completions(TARGET, 0, 0))[0]] == [
            original.request_id
        ]
        clone_entries, _ = await s.session_completions((SS, 2), 0, 0)
        assert [e.request_id for e in clone_entries] == [clone.request_id]
        await s.aclose()

    run(go())


def test_unknown_cursor_is_none(make):
    async def go():
        s = await _opened(make)
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        _, cursor = await s.session_completions(TARGET, 0, 0)
        assert await s.session_completions(TARGET, cursor + 1, 0) is None  # never handed out
        assert await s.session_completions(TARGET, 12345, 0) is None  # an old server's
        assert await s.session_completions((SS, 5), cursor, 0) is None  # another clone's
        assert await s.session_completions(TARGET, cursor, 0) == ([], cursor)
        if make.kind == "memory":
            # Another store (a restarted server) does not know this cursor either.
            fresh = await _opened(make)
            assert await fresh.session_completions(TARGET, cursor, 0) is None
        else:
            # Every process restarted: the log is in the engine, the cursor still counts.
            await s.aclose()
            fresh = await _opened(make)
            assert await fresh.session_completions(TARGET, cursor, 0) == ([], cursor)
            later = await fresh.create((SS, 2), 1)
            await fresh.complete(later, b"y")
            entries, moved = await fresh.session_completions(TARGET, cursor, 0)
            assert [e.request_id for e in entries] == [later.request_id]
            assert moved == cursor + 1
            # An engine without this store's data (another prefix) does not know it.
            elsewhere = await _opened(make, prefix=f"o{uuid.uuid4().hex[:8]}:")
            assert await elsewhere.session_completions(TARGET, cursor, 0) is None
            await elsewhere.aclose()
        await s.aclose()
        await fresh.aclose()

    run(go())


def test_held_poll_answers_on_the_first_completion_or_after_the_hold(make):
    async def go():
        s = await _opened(make)
        loop = asyncio.get_running_loop()
        record = await s.create((SS, 1), 1)
        start, before = loop.time(), _reasons(s)
        assert await s.session_completions(TARGET, 0, 0.1) == ([], 0)
        assert loop.time() - start >= 0.1
        assert _since(before, s) == {"hold_expired": 1}
        loop.call_later(0.05, lambda: asyncio.ensure_future(s.complete(record, b"x")))
        before = _reasons(s)
        entries, _ = await s.session_completions(TARGET, 0, 30)
        assert [e.request_id for e in entries] == [record.request_id]
        assert _since(before, s) == {"woken": 1}  # by the completion, not by the 30 s hold
        await s.aclose()

    run(go())


def test_hold_for_answers_at_once_when_no_batch_is_filling():
    """The batching rule on given times (seconds): one completion waiting, nothing more
    pending, or a full batch answer at once; two or more arriving faster than polls carry them
    hold until they pause (four times their mean interval) or the batch wait after the
    oldest."""
    assert hold_for(1, 10, 32, 5.0, 5.0, 5.0, 0.25) == 0  # one waiting: nothing to batch
    assert hold_for(5, 0, 32, 5.0, 5.004, 5.005, 0.25) == 0  # the last pending is here
    assert hold_for(32, 10, 32, 5.0, 5.031, 5.032, 0.25) == 0  # a full batch
    assert hold_for(4, 10, 3, 5.0, 5.003, 5.004, 0.25) == 0  # `limit` below the batch size
    # Two arrived 10 ms apart, a millisecond ago: hold until 40 ms after the newest.
    assert hold_for(2, 10, 32, 5.0, 5.010, 5.011, 0.25) == pytest.approx(0.039)
    assert hold_for(2, 10, 32, 5.0, 5.010, 5.050, 0.25) == 0  # they paused: answer
    # A steady stream 2 ms apart is held to the batch wait after the oldest at most.
    assert hold_for(20, 10, 32, 5.0, 5.038, 5.039, 0.25) == pytest.approx(0.007)
    assert hold_for(31, 10, 32, 4.8, 5.049, 5.0495, 0.25) == pytest.approx(0.0005)
    assert hold_for(31, 10, 32, 4.7, 5.049, 5.0495, 0.25) == 0  # past the batch wait
    # Several in the same loop turn (no interval): the pause floor, not zero.
    assert hold_for(3, 10, 32, 5.0, 5.0, 5.0, 0.25) == pytest.approx(PAUSE_FLOOR)
    assert hold_for(3, 10, 32, 5.0, 5.0, 5.0, 0.0) == 0  # batch wait 0: never batch


def test_idle_session_completions_are_answered_at_once(make):
    """A poll held when a completion arrives answers it at once (`woken`), and a poll that
    finds one completion waiting answers at once (`at_once`): one poll per completion, even with
    other samples pending and a long batch wait."""

    async def go():
        s = await _opened(make, session_batch_wait=30.0)
        loop = asyncio.get_running_loop()
        records = [await s.create((SS, i), 1) for i in range(6)]  # 6 pending: a busy session
        cursor, before = 0, _reasons(s)
        for record in records[:4]:
            loop.call_later(0.01, lambda r=record: asyncio.ensure_future(s.complete(r, b"x")))
            entries, cursor = await s.session_completions(TARGET, cursor, 30)
            assert [e.request_id for e in entries] == [record.request_id]
        assert _since(before, s) == {"woken": 4}
        await s.complete(records[4], b"x")
        before = _reasons(s)
        entries, cursor = await s.session_completions(TARGET, cursor, 30)
        assert [e.request_id for e in entries] == [records[4].request_id]
        assert _since(before, s) == {"at_once": 1}
        await s.aclose()

    run(go())


def test_busy_session_polls_carry_batches(make):
    """Completions arriving faster than polls carry them (one every ~1 ms, each poll's answer
    taking ~5 ms to come back as the next poll) are batched: at most 0.1 polls per completion.
    Unbatched, each poll would carry what arrived in its ~5 ms round trip (~128 polls); batched,
    21 were measured on both stores, 34 on redis at load 6 (a loaded machine stretches the
    producer's 1 ms sleeps into pauses, and a pause closes a batch), so the bound sits between.

    The producer and the poller behave as the server's forward and the SDK do when the shared
    store blinks: a StoreUnavailable call is tried again after a pause (`Forwarder._settle`; the
    SDK retries a 503), counted and shown if the test fails. A producer that stops with another
    error fails the test with that error, and an empty answer once every completion was stored
    (a 30 s hold that found nothing) fails it as lost completions, instead of polling on; and
    if it is not done in 150 s (it takes ~1.5 s), it fails showing where each task waits."""

    async def go():
        s = await _opened(make, session_batch_wait=30.0)
        count = 640
        records = [await s.create((SS, i), 1) for i in range(count + 1)]  # one stays pending
        retried = {"complete": 0, "poll": 0}

        async def produce():
            for record in records[:count]:
                await _retried(lambda r=record: s.complete(r, b"x"), retried, "complete")
                await asyncio.sleep(0.001)

        producer = asyncio.ensure_future(produce())
        cursor, seen, polls, before = 0, 0, 0, _reasons(s)
        while seen < count:
            if producer.done():
                producer.result()  # the producer's own error, if it stopped with one
            entries, cursor = await _retried(
                lambda c=cursor: s.session_completions(TARGET, c, 30), retried, "poll"
            )
            polls += 1
            seen += len(entries)
            if not entries and producer.done():
                health = getattr(s, "health", None)
                pytest.fail(
                    f"{count - seen} of {count} completions were never answered (a held poll "
                    f"found nothing after all were stored); retried {retried}, store calls "
                    f"refused {dict(health.failed) if health else {}}, "
                    f"reasons {_since(before, s)}"
                )
            await asyncio.sleep(0.005)  # the answer on its way, the next poll on its way back
        await producer
        assert seen == count
        assert polls <= 0.1 * count, (polls, _since(before, s), retried)
        assert _since(before, s).get("hold_expired", 0) == 0  # never held for the 30 s hold
        await s.aclose()

    run(_within(150, go()))


def test_filling_batch_closes_when_completions_pause_or_fill(make):
    """Two completions waiting with more pending start a batch; it is answered once they
    pause (`batch_deadline`, long before the 30 s hold and batch wait) or once it is full
    (`woken` by the completion that fills it)."""

    async def go():
        s = await _opened(make, session_batch_wait=30.0, session_batch_size=3)
        loop = asyncio.get_running_loop()
        records = [await s.create((SS, i), 1) for i in range(8)]
        await s.complete(records[0], b"x")
        await asyncio.sleep(0.2)  # 200 ms apart: a pause is 800 ms
        await s.complete(records[1], b"x")
        before = _reasons(s)
        entries, cursor = await s.session_completions(TARGET, 0, 30)
        assert [e.request_id for e in entries] == [r.request_id for r in records[:2]]
        assert _since(before, s) == {"batch_deadline": 1}
        # Two more 100 ms apart (a pause is 400 ms), then the third fills the batch of 3.
        await s.complete(records[2], b"x")
        await asyncio.sleep(0.1)
        await s.complete(records[3], b"x")
        loop.call_later(0.01, lambda: asyncio.ensure_future(s.complete(records[4], b"x")))
        before = _reasons(s)
        entries, cursor = await s.session_completions(TARGET, cursor, 30)
        assert [e.request_id for e in entries] == [r.request_id for r in records[2:5]]
        assert _since(before, s) == {"woken": 1}
        await s.aclose()

    run(go())


def test_an_answer_carries_at_most_limit_completions(make):
    async def go():
        s = await _opened(make)
        records = [await s.create((SS, i), 1) for i in range(5)]
        for record in records:
            await s.complete(record, b"x")
        first, cursor = await s.session_completions(TARGET, 0, 5, limit=2)
        assert [e.request_id for e in first] == [r.request_id for r in records[:2]]
        rest, _ = await s.session_completions(TARGET, cursor, 5, limit=8)
        assert [e.request_id for e in rest] == [r.request_id for r in records[2:]]
        await s.aclose()

    run(go())


def test_wake_all_releases_held_session_polls(make):
    async def go():
        s = await _opened(make)
        await s.create((SS, 1), 1)
        poll = asyncio.ensure_future(s.session_completions(TARGET, 0, 30))
        await asyncio.sleep(0.05)
        assert not poll.done()
        before = _reasons(s)
        s.wake_all()
        s.close()
        assert await poll == ([], 0)  # released: not held for the 30 s hold (counted below)
        assert _since(before, s) == {"released": 1}
        await s.aclose()

    run(go())


def test_ack_starts_the_retrieved_clock_of_own_completed_records_only(make):
    async def go():
        s = await _opened(make, completed_ttl=60.0, retrieved_ttl=0.1)
        mine = await s.create((SS, 1), 1)
        pending = await s.create((SS, 2), 1)
        theirs = await s.create(("other", 1), 1)
        clone = await s.create((SS, CLONE_BLOCK + 1), 1)
        for record in (mine, theirs, clone):
            await s.complete(record, b"x")
        ids = [r.request_id for r in (mine, pending, theirs, clone)] + ["never-submitted"]
        assert await s.acknowledge(TARGET, ids) == 1
        assert await s.acknowledge(TARGET, ids) == 0  # re-sent ack: the clock does not move
        stats = await _stats(s)
        assert stats["acknowledged"] == 1 and stats["delivered"] == 1
        await asyncio.sleep(0.25)
        assert await s.get(mine.request_id) is None  # retrieved TTL passed
        for kept in (theirs, clone, pending):  # never touched by this target's ack
            assert (await s.get(kept.request_id)).request_id == kept.request_id
        await s.aclose()

    run(go())


def test_reported_but_never_fetched_expires_by_the_completed_ttl(make):
    async def go():
        s = await _opened(make, completed_ttl=0.1, retrieved_ttl=60.0)
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        entries, _ = await s.session_completions(TARGET, 0, 0)
        assert [e.request_id for e in entries] == [record.request_id]
        await asyncio.sleep(0.25)
        assert await s.get(record.request_id) is None
        # its completion left the log too
        assert await s.session_completions(TARGET, 0, 0) == ([], 0)
        await s.aclose()

    run(go())


def test_logs_of_clones_that_never_sampled_leave_nothing(make):
    async def go():
        s = await _opened(make)
        for clone in range(1, 50):  # polls for clones that never submitted anything
            assert await s.session_completions((SS, clone), 0, 0) == ([], 0)
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        if make.kind == "memory":
            s.sweep()
            assert s.stats()["session_logs"] == 1  # only the log that has handed out a cursor
        else:
            fields = await s.client.hkeys(s.session_logs.meta_key(SS))
            assert {f.decode().split(":")[0] for f in fields} == {"0"}
        await s.aclose()

    run(go())


@SHARED_ONLY[0]
@SHARED_ONLY[1]
def test_two_processes_share_one_log(make):
    """Completions made in one process are polled in another; the cursor one process handed
    out continues in the other, and a held poll there wakes on the completion."""

    async def go():
        a = await _opened(make)
        b = await _opened(make)
        loop = asyncio.get_running_loop()
        first, second = await a.create((SS, 1), 1), await a.create((SS, 2), 1)
        await a.complete(first, b"x")
        entries, cursor = await b.session_completions(TARGET, 0, 0)
        assert [e.request_id for e in entries] == [first.request_id]
        loop.call_later(0.1, lambda: asyncio.ensure_future(a.complete(second, b"yy")))
        before = _reasons(b)
        entries, later = await b.session_completions(TARGET, cursor, 30)
        assert [(e.request_id, e.size) for e in entries] == [(second.request_id, 2)]
        assert later == cursor + 1
        assert _since(before, b) == {"woken": 1}  # by a's message, not held for the 30 s
        assert await a.session_completions(TARGET, later, 0) == ([], later)
        assert await a.acknowledge(TARGET, [second.request_id]) == 1
        assert await b.acknowledge(TARGET, [second.request_id]) == 0
        await a.aclose()
        await b.aclose()

    run(go())


@SHARED_ONLY[0]
@SHARED_ONLY[1]
def test_a_missed_wake_up_never_loses_a_completion(make):
    """No subscriber (the store never opened), so no message wakes the held poll; it re-reads
    when its hold ends and answers the completion."""

    async def go():
        a = await _opened(make)
        deaf = make()  # not opened: no subscriber
        record = await a.create((SS, 1), 1)
        asyncio.get_running_loop().call_later(
            0.05, lambda: asyncio.ensure_future(a.complete(record, b"x"))
        )
        before = _reasons(deaf)
        entries, _ = await deaf.session_completions(TARGET, 0, 0.5)
        assert [e.request_id for e in entries] == [record.request_id]
        assert _since(before, deaf) == {"hold_expired": 1}  # re-read when the hold ended
        await a.aclose()
        await deaf.aclose()

    run(go())
