"""The shared store's health: is the engine answering, and what failed while it was not.

A thread pings the engine every `interval` seconds on a connection of its own, with a blocking
socket and a `timeout` (1 s): the engine is *away* when a ping fails (refused, reset, an error
such as LOADING) or gets no answer within the timeout (a stalled engine: SIGSTOP, a swap
storm), and back at the first ping that answers. A thread, not a task: the event loop's timers
fire late whenever the loop is busy (a large decode, a GC pause), so a ping timed on the loop
would call a healthy engine away under load; the thread's socket timeout sees only the engine.

What the rest of the store does with it (`impl.server.store.redis.scripts.guard`):
- while away, every store call fails at once with `StoreUnavailable` (503 + Retry-After on
  every route) instead of waiting for a connection or a socket timeout; when the engine goes
  away, the calls already sent are failed too (`on_away`); when it is back, the idle pooled
  connections are dropped before calls resume (`on_back`), so no call meets a connection the
  old engine closed;
- every call that failed or was refused is counted by operation (`/healthz` → `store_backend`,
  `/metrics` → `hotpath_store_unavailable_total{op}`), and the outage is logged twice: once when
  it starts (with the first error) and once when it ends (how long, and the counts), never per
  request;
- `/readyz` asks `reason()`, which also answers "away" once the last answer is older than the
  timeout, so readiness turns within `timeout` of a stall even while a ping is still waiting;
- an engine that is up but refuses a call with an error answer (MISCONF: it cannot write its
  append-only file, a full disk; NOREPLICAS; READONLY) is not away (its ping answers) and the
  refusal lasts as long as its cause: each such call answers 503 with the engine's message, is
  counted, and is logged at the first and then at most once a minute with the count since
  (`refused`); /healthz shows the count and the last message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("hotpath.server")

#: refused calls (an error answer from an engine that is up) are logged at most this often
REFUSAL_LOG_S = 60.0


class StoreHealth:
    """The shared store's availability as the ping thread sees it, and the failed calls."""

    def __init__(self, url: str, address: str, *, timeout: float = 1.0, interval: float = 0.2):
        self.url = url
        self.address = address
        self.timeout = timeout
        self.interval = interval
        #: why the store is away (set on the event loop), or None while it answers
        self.away: str | None = None
        #: monotonic time of the ping thread's last answered ping
        self.last_answer = time.monotonic()
        self.away_since: float | None = None
        self.outages = 0
        #: calls that failed or were refused while the store was away, by operation (ever)
        self.failed: Counter[str] = Counter()
        self._outage_failed: Counter[str] = Counter()
        #: calls the engine refused with an error answer while up (ever), and the last message
        self.refused_calls = 0
        self.last_refusal: str | None = None
        self._refusal_logged: tuple[float, int] | None = None  # when, and the count then
        #: called on the loop when the store goes away / comes back (the store's hooks)
        self.on_away: Callable[[str], None] | None = None
        self.on_back: Callable[[], Awaitable[None]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_away = False  # the thread's own view, to post each change once
        self._pending: set[asyncio.Task[None]] = set()

    # -- the ping thread -------------------------------------------------------------------
    def start(self) -> None:
        """Start pinging (call on the event loop the store serves)."""
        self._loop = asyncio.get_running_loop()
        self.last_answer = time.monotonic()  # the store just answered `open`'s first reads
        self._thread = threading.Thread(target=self._run, name="hotpath-store-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1.0)

    def _connect(self) -> Any:
        """The ping thread's own client (blocking sockets, `timeout`)."""
        import redis

        return redis.Redis.from_url(
            self.url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            driver_info=None,
        )

    def _ping(self, client: Any) -> Any:
        """One ping (a cluster's health pings every primary); the client to use next."""
        client.ping()
        return client

    def _reset(self, client: Any) -> Any:
        """After a failed ping: drop its connections; the client to use next."""
        client.connection_pool.disconnect()
        return client

    def _run(self) -> None:
        import redis

        client = self._connect()
        try:
            while not self._stop.wait(self.interval):
                try:
                    client = self._ping(client)
                except (redis.RedisError, OSError) as exc:
                    with contextlib.suppress(redis.RedisError, OSError):
                        client = self._reset(client)
                    if isinstance(exc, redis.TimeoutError):
                        why = f"no answer within {self.timeout:g} s (stalled?)"
                    else:
                        why = f"{type(exc).__name__}: {exc}"
                    self._post(f"the shared store at {self.address} is unavailable ({why})")
                else:
                    self.last_answer = time.monotonic()
                    self._post(None)
        finally:
            client.close()

    def _post(self, reason: str | None) -> None:
        """Hand a change of state to the event loop (once per change)."""
        if (reason is not None) == self._seen_away:
            return
        self._seen_away = reason is not None
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            if reason is None:
                loop.call_soon_threadsafe(self._back_task)
            else:
                loop.call_soon_threadsafe(self._went_away, reason)

    # -- on the event loop -----------------------------------------------------------------
    def _back_task(self) -> None:
        task = asyncio.get_running_loop().create_task(self._came_back())
        self._pending.add(task)  # a task needs a reference until it is done
        task.add_done_callback(self._pending.discard)

    def _went_away(self, reason: str) -> None:
        if self.away is not None:
            return
        self.away, self.away_since = reason, time.monotonic()
        self.outages += 1
        self._outage_failed.clear()
        log.warning("%s; store calls answer 503 until it is back", reason)
        if self.on_away is not None:
            self.on_away(reason)

    async def _came_back(self) -> None:
        if self.away is None:
            return
        if self.on_back is not None:
            await self.on_back()  # before any call may run again
        if self._seen_away:  # away again while the pool was reset: stays away
            return
        away = time.monotonic() - (self.away_since or time.monotonic())
        counts = ", ".join(f"{op} {n}" for op, n in sorted(self._outage_failed.items()))
        log.warning(
            "the shared store at %s is back after %.1f s; calls failed meanwhile: %s",
            self.address,
            away,
            counts or "none",
        )
        self.away = self.away_since = None

    def count(self, op: str) -> None:
        """A store call `op` failed or was refused because the store is away."""
        self.failed[op] += 1
        self._outage_failed[op] += 1

    def refused(self, op: str, error: str) -> None:
        """A store call `op` got an error answer from an engine that is up (`error`, the
        engine's message): counted as a failed call, and logged at the first and then at most
        once every REFUSAL_LOG_S seconds, with the count since the previous message."""
        self.count(op)
        self.refused_calls += 1
        self.last_refusal = error
        now = time.monotonic()
        logged = self._refusal_logged
        if logged is None or now - logged[0] >= REFUSAL_LOG_S:
            since = self.refused_calls - (logged[1] if logged else 0)
            log.warning(
                "the shared store at %s refused %d call(s) since the last message, the latest "
                "(%s) with: %s; such calls answer 503 for as long as the engine refuses them",
                self.address,
                since,
                op,
                error,
            )
            self._refusal_logged = (now, self.refused_calls)

    def reason(self) -> str | None:
        """Why the store cannot serve now (away, or no answer for over `timeout`), or None."""
        if self.away is not None:
            return self.away
        silent = time.monotonic() - self.last_answer
        if silent > self.timeout:
            return f"the shared store at {self.address} has not answered for {silent:.1f} s"
        return None

    def describe(self) -> dict[str, Any]:
        """What /healthz shows under `store_backend`."""
        return {
            "available": self.reason() is None,
            "error": self.reason(),
            "away_s": round(time.monotonic() - self.away_since, 1) if self.away_since else None,
            "outages": self.outages,
            "unavailable_calls": dict(self.failed),
            "refused_calls": self.refused_calls,
            "last_refusal": self.last_refusal,
            "timeout_s": self.timeout,
        }
