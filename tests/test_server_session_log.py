"""The per-session completion logs behind retrieve_futures, through the MemoryStore (an event
loop, no HTTP): cursor and trim, holds and batching, acks and the two retention clocks."""

from __future__ import annotations

import asyncio

from impl.server.completions import CLONE_BLOCK, target_of
from impl.server.store import MemoryStore

SS = "session-x:sample:0"
TARGET = (SS, 0)


def _store(**overrides) -> MemoryStore:
    options = {
        "completed_ttl": 60.0,
        "retrieved_ttl": 10.0,
        "max_outstanding": 1000,
        "max_result_bytes": 1 << 30,
        "to_json": lambda b: b"{}",
        "session_batch_wait": 0.0,
    }
    options.update(overrides)
    return MemoryStore(**options)


def run(coro):
    return asyncio.run(coro)


def test_target_is_the_clone_block_of_the_seq_id():
    assert target_of(SS, 5) == (SS, 0)
    assert target_of(SS, 3 * CLONE_BLOCK + 7) == (SS, 3)


def test_cursor_reports_each_completion_once_and_trims_what_was_seen():
    async def go():
        s = _store()
        s.start()
        a, b, c = [await s.create((SS, i), 1) for i in (1, 2, 3)]
        await s.complete(a, b"xx")
        await s.fail(b, "upstream said no")
        entries, cursor = await s.session_completions(TARGET, 0, 0)
        assert [(e.request_id, e.state, e.size) for e in entries] == [
            (a.request_id, "finished", 2),
            (b.request_id, "failed", 0),
        ]
        # The answer was lost: the same cursor gets the same completions again.
        again, cursor_again = await s.session_completions(TARGET, 0, 0)
        assert again == entries and cursor_again == cursor
        # The next cursor drops them; nothing new: the cursor stays.
        assert await s.session_completions(TARGET, cursor, 0) == ([], cursor)
        assert s.stats()["session_log_entries"] == 0
        await s.complete(c, b"yyy")
        entries, later = await s.session_completions(TARGET, cursor, 0)
        assert [e.request_id for e in entries] == [c.request_id] and later == cursor + 1
        s.close()

    run(go())


def test_clones_and_sessions_have_separate_logs():
    async def go():
        s = _store()
        s.start()
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
        s.close()

    run(go())


def test_unknown_cursor_is_none():
    async def go():
        s = _store()
        s.start()
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        _, cursor = await s.session_completions(TARGET, 0, 0)
        assert await s.session_completions(TARGET, cursor + 1, 0) is None  # never handed out
        assert await s.session_completions(TARGET, 12345, 0) is None  # an old server's
        assert await s.session_completions(TARGET, cursor, 0) == ([], cursor)
        # Another store (a restarted server) does not know this cursor either.
        fresh = _store()
        fresh.start()
        assert await fresh.session_completions(TARGET, cursor, 0) is None
        s.close()
        fresh.close()

    run(go())


def test_held_poll_answers_on_the_first_completion_or_after_the_hold():
    async def go():
        s = _store()
        s.start()
        loop = asyncio.get_running_loop()
        record = await s.create((SS, 1), 1)
        start = loop.time()
        assert await s.session_completions(TARGET, 0, 0.1) == ([], 0)
        assert loop.time() - start >= 0.1
        loop.call_later(0.05, lambda: asyncio.ensure_future(s.complete(record, b"x")))
        start = loop.time()
        entries, _ = await s.session_completions(TARGET, 0, 30)
        assert [e.request_id for e in entries] == [record.request_id]
        assert loop.time() - start < 10  # woken by the completion, not by the 30 s hold
        s.close()

    run(go())


def test_busy_session_is_answered_in_batches():
    """While other samples of the session are pending, completions are collected for the batch
    wait after the previous answer; once none is pending, the answer goes at once."""

    async def go():
        s = _store(session_batch_wait=0.3)
        s.start()
        loop = asyncio.get_running_loop()
        records = [await s.create((SS, i), 1) for i in range(4)]
        await s.complete(records[0], b"x")
        first, cursor = await s.session_completions(TARGET, 0, 5)  # no previous answer: at once
        assert len(first) == 1
        for i, record in enumerate(records[1:3]):
            loop.call_later(
                0.02 * (i + 1), lambda r=record: asyncio.ensure_future(s.complete(r, b"x"))
            )
        started = loop.time()
        batch, cursor = await s.session_completions(TARGET, cursor, 5)
        waited = loop.time() - started
        assert [e.request_id for e in batch] == [r.request_id for r in records[1:3]]
        assert 0.2 <= waited < 4  # held for the batch wait, not answered per completion
        loop.call_later(0.02, lambda: asyncio.ensure_future(s.complete(records[3], b"x")))
        last, _ = await s.session_completions(TARGET, cursor, 5)  # the last pending one
        assert [e.request_id for e in last] == [records[3].request_id]
        s.close()

    run(go())


def test_full_batch_is_answered_before_the_batch_wait():
    async def go():
        s = _store(session_batch_wait=30.0, session_batch_size=3)
        s.start()
        loop = asyncio.get_running_loop()
        records = [await s.create((SS, i), 1) for i in range(5)]
        await s.complete(records[0], b"x")
        _, cursor = await s.session_completions(TARGET, 0, 60)  # the first answer: at once
        for i, record in enumerate(records[1:4]):
            loop.call_later(
                0.02 * (i + 1), lambda r=record: asyncio.ensure_future(s.complete(r, b"x"))
            )
        started = loop.time()
        batch, _ = await s.session_completions(TARGET, cursor, 60)
        assert [e.request_id for e in batch] == [r.request_id for r in records[1:4]]
        assert loop.time() - started < 10  # three waiting: answered, not held for 30 s
        s.close()

    run(go())


def test_wake_all_releases_held_session_polls():
    async def go():
        s = _store()
        s.start()
        await s.create((SS, 1), 1)
        poll = asyncio.ensure_future(s.session_completions(TARGET, 0, 30))
        await asyncio.sleep(0.05)
        assert not poll.done()
        s.wake_all()
        assert await asyncio.wait_for(poll, 5) == ([], 0)
        s.close()

    run(go())


def test_ack_starts_the_retrieved_clock_of_own_completed_records_only():
    async def go():
        s = _store(completed_ttl=60.0, retrieved_ttl=0.1)
        s.start()
        mine = await s.create((SS, 1), 1)
        pending = await s.create((SS, 2), 1)
        theirs = await s.create(("other", 1), 1)
        await s.complete(mine, b"x")
        await s.complete(theirs, b"x")
        ids = [mine.request_id, pending.request_id, theirs.request_id, "never-submitted"]
        assert await s.acknowledge(TARGET, ids) == 1
        assert await s.acknowledge(TARGET, ids) == 0  # re-sent ack: the clock does not move
        assert s.counts["acknowledged"] == 1 and mine.delivered and not theirs.delivered
        await asyncio.sleep(0.15)
        assert await s.get(mine.request_id) is None  # retrieved TTL passed
        assert await s.get(theirs.request_id) is theirs  # another session's ack never touches it
        assert await s.get(pending.request_id) is pending
        s.close()

    run(go())


def test_reported_but_never_fetched_expires_by_the_completed_ttl():
    async def go():
        s = _store(completed_ttl=0.1, retrieved_ttl=60.0)
        s.start()
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        entries, _ = await s.session_completions(TARGET, 0, 0)
        assert [e.request_id for e in entries] == [record.request_id]
        await asyncio.sleep(0.15)
        assert await s.get(record.request_id) is None
        s.sweep()
        assert s.stats()["session_log_entries"] == 0  # its completion left the log too
        s.close()

    run(go())


def test_logs_of_clones_that_never_sampled_are_dropped():
    async def go():
        s = _store()
        s.start()
        for clone in range(1, 50):  # polls for clones that never submitted anything
            assert await s.session_completions((SS, clone), 0, 0) == ([], 0)
        record = await s.create((SS, 1), 1)
        await s.complete(record, b"x")
        s.sweep()
        assert s.stats()["session_logs"] == 1  # only the log that has handed out a cursor
        s.close()

    run(go())
