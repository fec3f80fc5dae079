"""Per-session completion logs on the shared store: `retrieve_futures` on Redis/Valkey.

The facts and rules are those of the in-memory logs (`impl.server.store.completions`): per target
(sampling session, clone) a log of completions at consecutive positions, a cursor that drops
what the client has seen, acks that start the retrieved clock, batching while the target has
samples pending. Here the facts live in the engine, so a poll may land on any process, and a
cursor survives a restart of every process:

- `{p}sl:<sampling_session_id>` is a hash holding, per clone `c`, `c:b` (the log's base
  position), `c:h` (the newest position handed out) and `c:p` (samples pending). `create`
  writes base, head and pending in the same script that creates the record; finishing a
  session deletes the hash with the session (it lives exactly as long as the session does).
- `{p}sq:<clone>:<sampling_session_id>` is a list of `"<request_id> <state> <size> <ms>"` (ms:
  the engine's clock when it arrived, for batching), appended by the very script that
  finishes the record (`scripts.FINISH`), so a completion and its log entry are one atomic
  change. The first element sits at position `head - LLEN + 1`. The
  list expires with the longest retention clock after its last append: an entry is worth
  nothing once its record is gone.
- `ANSWER` (below) is one poll's read: it checks the cursor, trims what was seen, drops entries
  whose record was evicted from the front (the memory store's sweep), and says whether the
  answer is due (`hold_for`'s rule, on the engine's clock). A held poll registers its waiter
  first, then runs it; FINISH publishes the target on the store's channel when the answer may
  become due (the first completion, a full batch, or the last pending), and the poll runs it
  again when woken, when its filling batch may be due and when its hold ends, so a missed
  message delays an answer but never loses a completion.

Positions are below 2**53 (`cursor_base`): Lua reads numbers as doubles, and so do many
JSON readers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from impl.server.store import SESSION_ANSWER_LIMIT, Key
from impl.server.store.completions import (
    CLONE_BLOCK,
    PAUSE_FLOOR,
    PAUSE_INTERVALS,
    Entry,
    Target,
    cursor_base,
)
from impl.server.store.held import AT_ONCE, RELEASED, WOKEN, hold_until, settle
from impl.server.store.redis.keys import Space
from impl.server.store.redis.scripts import bucket, guard, now_ms

# KEYS: meta hash, list. ARGV: clone, cursor, limit, batch size, pause floor ms, batch wait
# ms, record key prefix, final (1: answer whatever there is), pause intervals. Returns -1 for
# an unknown cursor; {0} when there is nothing to answer yet; {1, ms} when a batch is filling
# (hold that much longer, then read again); else {2, new cursor, entry...}. The batching rule is
# `impl.server.store.completions.hold_for`, on the engine's clock (each entry ends with the ms
# it arrived, FINISH's TIME).
ANSWER = """
local c = ARGV[1]
local cursor = tonumber(ARGV[2])
local base = redis.call('HGET', KEYS[1], c .. ':b')
if not base then
  if cursor ~= 0 then return -1 end
  return {0}
end
base = tonumber(base)
local head = tonumber(redis.call('HGET', KEYS[1], c .. ':h'))
if cursor ~= 0 and (cursor < base or cursor > head) then return -1 end
local n = redis.call('LLEN', KEYS[2])
local first = head - n + 1
if n > 0 and cursor >= first then
  local seen = math.min(n, cursor - first + 1)
  redis.call('LTRIM', KEYS[2], seen, -1)
  first = first + seen
  n = n - seen
end
while n > 0 do
  local id = string.match(redis.call('LINDEX', KEYS[2], 0), '^(%S+)')
  if redis.call('EXISTS', ARGV[7] .. id) == 1 then break end
  redis.call('LPOP', KEYS[2])
  first = first + 1
  n = n - 1
end
if n == 0 then return {0} end
local limit = tonumber(ARGV[3])
local pending = tonumber(redis.call('HGET', KEYS[1], c .. ':p') or '0')
local batch = math.min(limit, tonumber(ARGV[4]))
if ARGV[8] ~= '1' and pending > 0 and n < batch and n >= 2 then
  local oldest = string.match(redis.call('LINDEX', KEYS[2], 0), '^%S+ %S+ %S+ (%d+)$')
  local newest = string.match(redis.call('LINDEX', KEYS[2], -1), '^%S+ %S+ %S+ (%d+)$')
  if oldest and newest then
    oldest, newest = tonumber(oldest), tonumber(newest)
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    local pause = math.max(ARGV[9] * (newest - oldest) / (n - 1), tonumber(ARGV[5]))
    local stop = math.min(newest + pause, oldest + tonumber(ARGV[6]))
    if now < stop then return {1, stop - now} end
  end
end
local entries = redis.call('LRANGE', KEYS[2], 0, limit - 1)
local out = {2, first + #entries - 1}
for _, entry in ipairs(entries) do out[#out + 1] = entry end
return out
"""

# KEYS: bytes, stats. ARGV: record key prefix, dedup key prefix, sampling session id, clone,
# retrieved ttl ms, key ttl ms, bucket, request id... Each completed record of the target not
# yet delivered starts its retrieved clock (the DELIVERED script's change); returns how many.
ACKNOWLEDGE = """
local started = 0
for i = 8, #ARGV do
  local record = ARGV[1] .. ARGV[i]
  local state, key, delivered, size, old = unpack(
    redis.call('HMGET', record, 's', 'k', 'd', 'sz', 'b'))
  if state and state ~= 'pending' and not delivered and key and key ~= '' then
    local session, seq = string.match(key, '^(.*)%z(%d+)$')
    if session == ARGV[3] and math.floor(tonumber(seq) / 1000000000) == tonumber(ARGV[4]) then
      redis.call('PEXPIRE', record, ARGV[5])  -- first: a full engine still lets it through
      redis.call('PEXPIRE', ARGV[2] .. 'p:' .. ARGV[i], ARGV[5])
      redis.call('PEXPIRE', ARGV[2] .. 'k:' .. seq .. ':' .. session, ARGV[6])
      size = tonumber(size or '0')
      if old then redis.call('HINCRBY', KEYS[1], old, -size) end
      redis.call('HINCRBY', KEYS[1], ARGV[7], size)
      redis.call('HSET', record, 'd', '1', 'b', ARGV[7])
      started = started + 1
    end
  end
end
if started > 0 then
  redis.call('HINCRBY', KEYS[2], 'delivered', started)
  redis.call('HINCRBY', KEYS[2], 'acknowledged', started)
end
return started
"""


#: the scripts the store loads for its session logs (name -> text)
SCRIPTS = {"answer": ANSWER, "acknowledge": ACKNOWLEDGE}


class RedisSessionLogs:
    """The completion logs of a RedisStore: its scripts, and this process's held polls."""

    def __init__(self, store: Any, batch_wait: float, batch_size: int) -> None:
        self.store = store
        self.batch_wait_ms = int(batch_wait * 1000)
        self.pause_floor_ms = max(1, round(PAUSE_FLOOR * 1000))
        self.batch_size = max(batch_size, 1)
        self.base = cursor_base()
        #: target -> this process's held polls, woken by the target's "due" messages
        self.waiters: dict[Target, list[asyncio.Future[str]]] = {}
        self.released = False  # shutdown: held polls answer at once

    def meta_key(self, sampling_session_id: str) -> str:
        return self.store._space_for(sampling_session_id).meta(sampling_session_id)

    def list_key(self, target: Target) -> str:
        return self.store._space_for(target[0]).log(target)

    def wake(self, target: Target, reason: str = WOKEN) -> None:
        for waiter in self.waiters.get(target, ()):
            settle(waiter, reason)

    def wake_all(self) -> None:
        """Every held poll re-reads (shutdown, or the subscriber (re)connected)."""
        for target in list(self.waiters):
            self.wake(target, RELEASED)

    def release(self) -> None:
        self.released = True
        self.wake_all()

    async def answer(
        self, target: Target, cursor: int, hold: float, limit: int
    ) -> tuple[list[Entry], int] | None:
        """See `FutureStore.session_completions`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold
        space = self.store._space_for(target[0])
        keys = [space.meta(target[0]), space.log(target)]
        # what released the last wait: why this poll answers now
        reason = RELEASED if self.released else AT_ONCE
        while True:
            final = self.released or loop.time() >= deadline
            waiter = loop.create_future()
            waiters = self.waiters.setdefault(target, [])
            waiters.append(waiter)  # registered before the read: no message falls between
            try:
                found = await self.store.pipe.script(
                    "answer",
                    keys,
                    [
                        target[1],
                        cursor,
                        limit,
                        self.batch_size,
                        self.pause_floor_ms,
                        self.batch_wait_ms,
                        space.records,
                        int(final),
                        PAUSE_INTERVALS,
                    ],
                )
                if found == -1:
                    if not await self.store.cursor_in_doubt():
                        return None
                    found = [0]  # maybe one a lost primary handed out: nothing yet
                if found[0] == 2:  # {2, new cursor, entries...}: the last is at the cursor
                    self.store.held_polls.count("session", reason)
                    last, raws = int(found[1]), found[2:]
                    first = last - len(raws) + 1
                    return [_entry(first + i, raw) for i, raw in enumerate(raws)], last
                if final:
                    self.store.held_polls.count("session", reason)
                    return [], cursor
                until = deadline
                if found[0] == 1:  # a batch is filling: read again in found[1] ms
                    until = min(deadline, loop.time() + int(found[1]) / 1000 + 0.001)
                if loop.time() < until:
                    reason = await hold_until(waiter, until, deadline)
            finally:
                waiters.remove(waiter)
                if not waiters:
                    del self.waiters[target]

    async def acknowledge(self, target: Target, request_ids: Iterable[str]) -> int:
        """See `FutureStore.acknowledge`: one script for every id of the poll."""
        store = self.store
        space = store._space_for(target[0])
        ids = store._ids_in(space, request_ids)
        if not ids:
            return 0
        return int(
            await store.pipe.script(
                "acknowledge",
                [space.bytes, space.stats],
                [
                    space.records,
                    space.prefix,
                    target[0],
                    target[1],
                    store.retrieved_ms,
                    store.retrieved_ms + store.dedup_ms,
                    store.retrieved_bucket(),
                    *ids,
                ],
            )
        )


class SessionPolling:
    """The store's side of retrieve_futures (a mixin of RedisStore)."""

    session_logs: RedisSessionLogs
    retrieved_ms: int

    def _log_keys(self, key: Key | None, space: Space) -> list[str]:
        """The completion-log hash and list of `key`'s target, in `space` (placeholders
        without a key)."""
        if key is None:
            return [space.no_key, space.no_key]
        return [space.meta(key[0]), space.log((key[0], key[1] // CLONE_BLOCK))]

    def _ids_in(self, space: Space, request_ids: Iterable[str]) -> list[str]:
        """The ids whose records could live in `space` (all of them on one engine)."""
        return list(request_ids)

    def retrieved_bucket(self) -> str:
        """The bytes bucket of a retrieved clock started now."""
        return bucket(now_ms() + self.retrieved_ms)

    @guard
    async def session_completions(
        self, target: Target, cursor: int, hold: float, *, limit: int = SESSION_ANSWER_LIMIT
    ) -> tuple[list[Entry], int] | None:
        return await self.session_logs.answer(target, cursor, hold, limit)

    @guard
    async def acknowledge(self, target: Target, request_ids: Iterable[str]) -> int:
        return await self.session_logs.acknowledge(target, request_ids)


def _entry(position: int, raw: bytes) -> Entry:
    """An answered entry: `"<request_id> <state> <size> <ms it arrived>"` (the ms is read by
    ANSWER only; an entry written before it was added has three fields)."""
    request_id, state, size = raw.decode().split(" ")[:3]
    return Entry(position, request_id, state, int(size))
