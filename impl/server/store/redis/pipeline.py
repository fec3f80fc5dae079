"""Auto-pipelining for the shared store: the commands a process issues in one event-loop
iteration go to the engine as one pipeline, one round trip.

Why: redis-py spends several times more client CPU on one command awaited on its own (taking
a pooled connection, a send, a read, handing it back) than per command inside a pipeline of 64
(docs/measurements.md). Under load the routes of many requests run in the same
loop iteration (one read of the sockets wakes them all), so their store calls can share one
send and one read: each call is queued, and a callback scheduled for the next iteration sends
the queue as a non-transactional pipeline and resolves every caller's future with its own reply
(or its own error). Calls that must be atomic together are one Lua script, so nothing here
relies on a MULTI. Scripts run by EVALSHA: they are loaded when the store opens, and a
NOSCRIPT reply (an engine restarted empty) loads them again and resends those calls once.

`round_trips` and `commands` count what went to the engine, so calls per result can be
counted rather than estimated. `fail_pending` fails every call queued or in flight at once (the
store's health check found the engine away: a stalled engine would never answer them), and
`settled` awaits several calls of one caller so that none of their errors goes unretrieved.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from redis.exceptions import NoScriptError


class AutoPipeline:
    """Queue commands; send each event-loop iteration's queue as one pipeline."""

    def __init__(self, client: Any, scripts: dict[str, str]) -> None:
        self.client = client
        self.texts = dict(scripts)
        self.shas = {
            name: hashlib.sha1(text.encode()).hexdigest() for name, text in scripts.items()
        }
        self.queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        #: batches on their way to the engine, by the task sending each
        self.sending: dict[asyncio.Task[None], list[tuple[tuple[Any, ...], Any]]] = {}
        self.round_trips = 0
        self.commands = 0

    async def load(self) -> None:
        """Load every script into the engine's cache (at open, and after NOSCRIPT)."""
        for text in self.texts.values():
            await self.client.script_load(text)

    def call(self, *command: Any) -> asyncio.Future[Any]:
        """`command`'s reply, sent with every other call of this loop iteration."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.queue:
            loop.call_soon(self._flush)
        self.queue.append((command, future))
        return future

    def script(self, name: str, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        return self.call("EVALSHA", self.shas[name], len(keys), *keys, *args)

    def _flush(self) -> None:
        batch, self.queue = self.queue, []
        if not batch:  # fail_pending emptied it
            return
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self.sending[task] = batch
        task.add_done_callback(lambda done: self.sending.pop(done, None))

    def fail_pending(self, error: Exception) -> None:
        """Fail every call queued or on its way with `error`; the sends are cancelled (redis-py
        drops a connection whose reply was not read)."""
        batches = [self.queue, *self.sending.values()]
        self.queue = []
        for batch in batches:
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        for task in list(self.sending):
            task.cancel()

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            replies = await self._execute([command for command, _ in batch])
            if any(isinstance(reply, NoScriptError) for reply in replies):
                await self.load()
                again = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
                for i, reply in zip(
                    again, await self._execute([batch[i][0] for i in again]), strict=True
                ):
                    replies[i] = reply
        except Exception as exc:  # the connection failed: every caller gets the error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # cancelled (shutdown): so are the callers
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            self.round_trips += 1
            self.commands += len(commands)
            return await pipe.execute(raise_on_error=False)


async def settled(*futures: asyncio.Future[Any]) -> list[Any]:
    """The results of `futures` once every one is done; the first error is raised then (the
    others' are retrieved, so none is logged as "never retrieved")."""
    results = await asyncio.gather(*futures, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results
