"""The shared store's Lua scripts and the helpers around them (see redis_store.py).

Each script is one atomic change of a record and the structures that follow it (dedup key,
pending set, byte buckets, counters), so a change costs one round trip and no process sees half
of it. Keys are passed in KEYS except where a script derives a record key from a stored id
(LOOKUP, CREATE, the session scripts): it is built from a prefix passed in ARGV, which on a
Redis Cluster carries the slot group's hash tag (keys.py), so a script touches one slot only.
On a cluster the FINISH script publishes with SPUBLISH (sharded pub/sub, cluster.py).
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from impl.server.store import Key, StoreUnavailable

#: Stored-result bytes are counted per bucket of expiry deadlines this many seconds wide.
BUCKET_S = 5

# KEYS: dedup key (or a never-written placeholder), record, pending set, stats, the session's
# completion-log hash (redis_completions.py). ARGV: request id, n, key text ('' = none), lease
# deadline ms, router body, job options, record key prefix, clone, a new log's base position,
# owner (the caller NAME: field `o` of the record, and `o:<owner>` in stats counts its pending).
# Returns false when created, else {"<id> <n>", live} of the key's record.
CREATE = """
if ARGV[3] ~= '' then
  local existing = redis.call('GET', KEYS[1])
  if existing then
    local id = string.match(existing, '^(%S+)')
    local live = redis.call('EXISTS', ARGV[7] .. id)
    redis.call('HINCRBY', KEYS[4], live == 1 and 'deduplicated' or 'late_duplicates', 1)
    return {existing, live}
  end
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2])
  redis.call('HSETNX', KEYS[5], ARGV[8] .. ':b', ARGV[9])
  redis.call('HSETNX', KEYS[5], ARGV[8] .. ':h', ARGV[9])
  redis.call('HINCRBY', KEYS[5], ARGV[8] .. ':p', 1)
end
redis.call('HSET', KEYS[2], 's', 'pending', 'n', ARGV[2], 'k', ARGV[3],
  'jb', ARGV[5], 'jm', ARGV[6], 'o', ARGV[10])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'submitted', 1)
redis.call('HINCRBY', KEYS[4], 'o:' .. ARGV[10], 1)
return false
"""
# KEYS: dedup key, stats. Returns {"<id> <n>", exists} or false.
LOOKUP = """
local value = redis.call('GET', KEYS[1])
if not value then return false end
local id = string.match(value, '^(%S+)')
local exists = redis.call('EXISTS', ARGV[1] .. id)
redis.call('HINCRBY', KEYS[2], exists == 1 and 'deduplicated' or 'late_duplicates', 1)
return {value, exists}
"""
# KEYS: record, dedup key, pending, bytes, stats, payload, the session's completion-log hash
# and its clone's list (redis_completions.py); the owner's pending count in stats goes down.
# ARGV: id, state, error ('' when done), ttl ms, bucket, channel, size, clone, batch size, log
# list ttl ms, sampling session id. The payload itself is never a script argument: a 2 MB
# argument costs the engine a thousand times more inside EVALSHA than in a SET
# (docs/measurements.md), so `complete` SETs it (NX: the first generation's bytes stay) in the
# same MULTI as this script. The completion is appended to the log in the same script, with the
# engine's clock in ms (the batching rule reads when each arrived); the
# message names the target too when its held poll's answer becomes due.
# A result whose bytes are not there (the SET was refused: an engine at maxmemory takes a small
# script after refusing a 2 MB SET) is not finished: -1, and the forward stores it again. No
# record at all (an engine that lost it, a cluster's failover): -2, the store's to recover.
FINISH = """
if ARGV[2] == 'done' and redis.call('EXISTS', KEYS[6]) == 0 then return -1 end
local was = redis.call('HGET', KEYS[1], 's')
if was ~= 'pending' then
  redis.call('HINCRBY', KEYS[5], 'finished_twice', 1)
  if not was then return -2 end
  return 0
end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'sz', ARGV[7], 'b', ARGV[5])
local owner = redis.call('HGET', KEYS[1], 'o')
if owner and redis.call('HINCRBY', KEYS[5], 'o:' .. owner, -1) <= 0 then
  redis.call('HDEL', KEYS[5], 'o:' .. owner)
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'e', ARGV[3]) end
redis.call('HDEL', KEYS[1], 'jb', 'jm')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[6], ARGV[4])
local message = ARGV[1]
if redis.call('HGET', KEYS[1], 'k') ~= '' then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  local c = ARGV[8]
  if redis.call('HEXISTS', KEYS[7], c .. ':h') == 1 then
    local pending = redis.call('HINCRBY', KEYS[7], c .. ':p', -1)
    redis.call('HINCRBY', KEYS[7], c .. ':h', 1)
    local done = ARGV[2] == 'done'
    local t = redis.call('TIME')
    local n = redis.call('RPUSH', KEYS[8],
      ARGV[1] .. (done and ' finished ' .. ARGV[7] or ' failed 0') .. ' '
      .. (t[1] * 1000 + math.floor(t[2] / 1000)))
    redis.call('PEXPIRE', KEYS[8], ARGV[10])
    if n == 1 or n >= tonumber(ARGV[9]) or pending <= 0 then
      message = ARGV[1] .. ' ' .. c .. ' ' .. ARGV[11]
    end
  end
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], ARGV[5], ARGV[7])
redis.call('HINCRBY', KEYS[5], ARGV[2] == 'done' and 'completed' or 'failed', 1)
redis.call('PUBLISH', ARGV[6], message)
return 1
"""
# KEYS: record, dedup key, bytes, stats, payload. ARGV: retrieved ttl ms, key ttl ms, bucket.
# The PEXPIREs come first: an engine at maxmemory (noeviction) refuses a script whose first
# write may grow memory (HSET, HINCRBY) and lets the rest of a script through once it wrote, so a
# delivery still starts its clock, and frees the memory, when the engine is full.
DELIVERED = """
local state = redis.call('HGET', KEYS[1], 's')
if not state or state == 'pending' then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[5], ARGV[1])
if redis.call('HGET', KEYS[1], 'k') ~= '' then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
local size = tonumber(redis.call('HGET', KEYS[1], 'sz') or '0')
local old = redis.call('HGET', KEYS[1], 'b')
if old then redis.call('HINCRBY', KEYS[3], old, -size) end
redis.call('HINCRBY', KEYS[3], ARGV[3], size)
redis.call('HSET', KEYS[1], 'd', '1', 'b', ARGV[3])
redis.call('HINCRBY', KEYS[4], 'delivered', 1)
return 1
"""
# KEYS: record, bytes, stats. ARGV: json.
JSON = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local size = string.len(ARGV[1])
redis.call('HSET', KEYS[1], 'j', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'sz', size)
local bucket = redis.call('HGET', KEYS[1], 'b')
if bucket then redis.call('HINCRBY', KEYS[2], bucket, size) end
redis.call('HINCRBY', KEYS[3], 'json_derived', 1)
return 1
"""
# KEYS: pending, stats. ARGV: now ms, new lease deadline ms, most to claim.
CLAIM = """
local lapsed = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[3])
for _, id in ipairs(lapsed) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
if #lapsed > 0 then redis.call('HINCRBY', KEYS[2], 'takeovers', #lapsed) end
return lapsed
"""


def clients(url: str, connections: int) -> tuple[Any, Any]:
    """The request path's client and the control client (leases, takeover, counters)."""
    import redis.asyncio as redis

    # A blocking pool: beyond `connections` concurrent calls, a call waits for a connection
    # instead of failing (a busy pool is not an unavailable store); a call on a connection
    # gives up after 30 s (a stopped engine), a connect after 10 s (no accept).
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=connections,
        timeout=None,
        socket_connect_timeout=10.0,
        socket_timeout=30.0,
        driver_info=None,  # no CLIENT SETINFO per connection (and no package lookup)
    )
    # Lease renewal, takeover and the counters' refresh have their own connection: a pool
    # busy with large payloads must not delay a renewal past the lease (a takeover of a
    # forward that is still running generates the sample twice). Its calls give up after 5 s:
    # a stalled engine's answer is not awaited forever (whether the engine is there at all is
    # the health thread's to say, health.py).
    control = redis.Redis.from_url(
        url,
        single_connection_client=True,
        socket_connect_timeout=10.0,
        socket_timeout=5.0,
        driver_info=None,
    )
    return redis.Redis(connection_pool=pool), control


def address(url: str) -> str:
    """`url` without a password (what /healthz and logs show)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def guard(method: Callable) -> Callable:
    """`method`, failing at once with StoreUnavailable while the store's health says it is away,
    and turning engine errors into StoreUnavailable with the address and cause; either way the
    call is counted by operation (`StoreHealth.count`), never logged one by one (an error answer
    from an engine that is up, such as MISCONF on a full disk, is logged at most once a minute:
    `StoreHealth.refused`)."""
    op = method.__name__.lstrip("_")

    @functools.wraps(method)
    async def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        health = self.health
        if health.away is not None:
            health.count(op)
            raise StoreUnavailable(health.away)
        try:
            return await method(self, *args, **kwargs)
        except StoreUnavailable:  # failed by the health check while it waited (on_away)
            health.count(op)
            raise
        except (RedisError, OSError) as exc:
            if isinstance(exc, OutOfMemoryError):  # maxmemory, noeviction: nothing was written
                raise StoreUnavailable(
                    f"the shared store at {self.address} is full (its maxmemory; stored results "
                    f"are kept until they expire): {exc}"
                ) from exc
            if isinstance(exc, ResponseError):  # the engine is up and refused it (MISCONF...)
                health.refused(op, str(exc))
                raise StoreUnavailable(
                    f"the shared store at {self.address} refused the call: {exc}"
                ) from exc
            health.count(op)
            raise StoreUnavailable(
                f"the shared store at {self.address} is unavailable ({type(exc).__name__}: {exc})"
            ) from exc

    return guarded


def now_ms() -> int:
    return int(time.time() * 1000)


def bucket(deadline_ms: float) -> str:
    """The bytes bucket of a deadline: counted until the end of its BUCKET_S-second slot."""
    return str(int(deadline_ms // (BUCKET_S * 1000)) + 1)


def unkey(raw: bytes | None) -> Key | None:
    if not raw:
        return None
    session, seq = raw.decode().rsplit("\0", 1)
    return (session, int(seq))
