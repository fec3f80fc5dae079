"""Fetch processes: the router request goes down a socket, SampleResponse bytes come back.

With decode processes (`impl.server.offloop.processes`) the server's loop still receives every
body through its pool: on probe-128x262k that receive (the pool's completion and its copy of the
body) holds the loop longest of all it does (docs/measurements.md). Here each fetch process runs
its own event loop and its own pool (`--offloop-pool`, `impl.server.offloop.fetch_pool`: aiohttp
by default, measured leaner on long bodies than the pick made on small ones): the server sends
it the router request (a few KB of JSON) and what decoding needs, the process posts it
(`impl.server.upstream`: the same retry rule and messages as the loop's own forwards), reads the
body, decodes and encodes it with the server's picked decoder and encoder (the same bytes), and
answers with the SampleResponse bytes (several times smaller than the body). The body never enters
the server's process.

A process holds many requests at once (generations take long; the process's loop waits on all of
them), decodes one body at a time in its one decode thread (so with a decoder that releases the
GIL its loop keeps completing other receives meanwhile) and drops the decoded buffers once the
proto bytes are written. Long bodies are read into receive buffers the process keeps from body
to body (`impl.server.offloop.buffers`: no page faults, no copy to `bytes`); a body's buffer is
taken back once its decode thread is done with it. Requests go to the process with the fewest
in flight.
The server's `BodyBudget` still caps the body bytes held at once (`--max-body-bytes-in-flight`):
when a router answer's headers arrive, the process asks the server for its Content-Length (the
pool contract's `admit`) and reads the body only once the server granted it; until then the body
waits in the socket. Each process's pool gets an equal share of `--upstream-connections`.

Frames, server to process: `<cQII` then data: `r` request (job id, meta length, request length),
meta (orjson: url, prompt tokens, n, top-k, include prompt logprobs), the router request; `g`
grant (job id, 0, 0: the body of that job may be read). Process to server: `<Qc` (job id, kind)
then by kind: `a` admit `<Hq` (status, Content-Length or -1); `o` ok / `e` error `<QQBddd`
(payload length, body bytes, attempts, upstream/decode/encode seconds), payload (proto bytes, or
orjson [failure class, message]). A process that dies fails exactly the requests it held, with a
message saying so (not retried: the router may still be generating them), and is replaced. A
process exits when the server's end of its socket closes, so a killed server leaves no orphan;
on shutdown the server closes every socket, waits briefly, then kills by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from impl.pool import Admit
from impl.server.offloop.buffers import BodyBuffers
from impl.server.offloop.children import (
    Child,
    ChildDied,
    Children,
    failure_of,
    failure_payload,
    return_big_buffers,
)
from impl.server.offloop.decoding import Call, DecodeJob, Sampled, through_loop, to_proto
from impl.server.upstream import UpstreamFailed

_REQUEST = struct.Struct("<cQII")
_HEAD = struct.Struct("<Qc")
_ADMIT = struct.Struct("<Hq")
_RESULT = struct.Struct("<QQBddd")
_READY = b"hotpath-fetch-process ready\n"
_READ_LIMIT = 4 << 20
#: SO_RCVBUF of the fetch processes' router connections (the pool contract's `receive_buffer`;
#: the kernel doubles it). Autotuned, the receive buffer of a connection that had read 17 MB
#: bodies fast grew to several MB (tcp_rmem's max is 32 MiB here), and 256 answers waiting for
#: the body budget held 1.25 GB of the kernel's TCP memory on the server's side.
RECEIVE_BUFFER = 256 << 10


class _FetchProcess(Child):
    """The server's side of one fetch process: its process, socket and jobs in flight."""

    def __init__(self, process: asyncio.subprocess.Process, reader: Any, writer: Any) -> None:
        super().__init__(process, reader, writer)
        self.jobs: dict[int, asyncio.Future[Sampled]] = {}
        #: each job's `admit` (the server's BodyBudget), and the grants being waited for
        self.admits: dict[int, Admit] = {}
        self.granting: dict[int, asyncio.Task[None]] = {}
        self.listener: asyncio.Task[None] | None = None

    async def listen(self) -> None:
        """Resolve each job's future from its answer frame, until the socket ends."""
        reader = self.reader
        while True:
            job_id, kind = _HEAD.unpack(await reader.readexactly(_HEAD.size))
            if kind == b"a":
                status, length = _ADMIT.unpack(await reader.readexactly(_ADMIT.size))
                admit = self.admits.get(job_id)
                if admit is not None:
                    grant = self._grant(job_id, admit, status, None if length < 0 else length)
                    self.granting[job_id] = asyncio.get_running_loop().create_task(grant)
                continue
            size, body_bytes, attempts, up, dec, enc = _RESULT.unpack(
                await reader.readexactly(_RESULT.size)
            )
            payload = await reader.readexactly(size)
            future = self.jobs.pop(job_id, None)
            if future is None or future.done():
                continue  # its forward was cancelled (shutdown)
            failure = None
            if kind != b"o":
                failure, payload = failure_of(payload), b""
            future.set_result(Sampled(payload, failure, body_bytes, attempts, up, dec, enc))

    async def _grant(self, job_id: int, admit: Admit, status: int, length: int | None) -> None:
        """Wait for the budget, then tell the process it may read that job's body."""
        await admit(status, length)
        if job_id in self.jobs and not self.writer.is_closing():
            self.writer.write(_REQUEST.pack(b"g", job_id, 0, 0))

    async def forget(self, job_id: int) -> None:
        """The job is over: drop it, and stop waiting for its grant."""
        self.jobs.pop(job_id, None)
        self.admits.pop(job_id, None)
        grant = self.granting.pop(job_id, None)
        if grant is not None and not grant.done():
            grant.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await grant

    def ended(self) -> None:
        if self.listener is not None:
            self.listener.cancel()


class FetchProcesses(Children):
    """Requests expecting `min_bytes` or more of body are fetched, decoded and encoded by
    `count` processes; smaller ones go through the loop's pool and decode inline."""

    name = "fetch"
    what = "fetch process"
    ready = _READY
    child_class = _FetchProcess
    module = "impl.server.offloop.fetch"

    def __init__(
        self,
        decoder: Any,
        encoder: Any,
        *,
        pool_name: str,
        pool_options: dict[str, Any],
        count: int,
        **common: Any,
    ) -> None:
        """`common`: the other keywords of `Children` (decoder and encoder names, ...)."""
        options = {**pool_options, "receive_buffer": RECEIVE_BUFFER}
        if "max_connections" in options:  # the cap is shared out, not multiplied
            options["max_connections"] = max(1, -(-options["max_connections"] // count))
        from impl.server import upstream

        pool = (
            "--pool", pool_name, "--pool-options", orjson.dumps(options).decode(),
            "--upstream-logprobs", upstream.logprobs(),
        )  # fmt: skip
        super().__init__(decoder, encoder, count=count, options=pool, **common)
        self.pool_name = pool_name
        self._ids = itertools.count(1)

    def joined(self, child: _FetchProcess) -> None:
        child.listener = asyncio.get_running_loop().create_task(self._listen(child))

    async def _listen(self, child: _FetchProcess) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, OSError):
            await child.listen()
        if self.closing:
            return
        status = await self._reap(child)
        message = (
            f"the fetch process (pid {child.pid}) died while it held this sample ({status}); "
            f"only the {len(child.jobs)} sample(s) it held failed (not retried: the router "
            "may still be generating them), a new one replaced it"
        )
        self._died(message)
        for future in child.jobs.values():
            if not future.done():
                future.set_exception(ChildDied(message))
        child.jobs.clear()
        self._replace()

    async def sample(self, call: Call) -> Sampled:
        """A request expecting `min_bytes` or more of body through a fetch process; a smaller
        one through the loop's pool, converted on the loop."""
        if call.expected_bytes < self.min_bytes:
            return await through_loop(call, self.convert_inline)
        return await self._fetch(call.url, call.request, call.job, call.hold)

    async def _fetch(self, url: str, request: bytes, job: DecodeJob, admit: Admit) -> Sampled:
        """`request` sent, its body read (once `admit` granted it), decoded and encoded by the
        fetch process with the fewest requests in flight."""
        self.offloop += 1
        while not self.alive:  # every process died at once: wait for a replacement
            if self.closing:
                raise UpstreamFailed("the server shut down before the sample was sent", "shutdown")
            await self._joined.wait()
        child = min(self.alive.values(), key=lambda c: len(c.jobs))
        job_id = next(self._ids)
        future: asyncio.Future[Sampled] = asyncio.get_running_loop().create_future()
        child.jobs[job_id] = future
        child.admits[job_id] = admit
        meta = orjson.dumps([url, job.prompt_tokens, job.n, job.topk, job.include_prompt_logprobs])
        try:
            child.writer.write(_REQUEST.pack(b"r", job_id, len(meta), len(request)) + meta)
            child.writer.write(request)
            await child.writer.drain()
            return await future
        except (ConnectionError, BrokenPipeError) as exc:  # died before the listener saw it
            return await _died(future, exc)
        except ChildDied as exc:
            raise UpstreamFailed(str(exc), "decode_worker") from None
        finally:
            await child.forget(job_id)

    def _usage(self) -> dict[str, Any]:
        in_flight = {str(pid): len(c.jobs) for pid, c in sorted(self.alive.items())}
        return {"pool": self.pool_name, "in_flight": in_flight}


async def _died(future: asyncio.Future[Sampled], exc: BaseException) -> Sampled:
    """A write to a dead process: its listener fails the future with the full message."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), 10)
    except ChildDied as died:
        raise UpstreamFailed(str(died), "decode_worker") from None
    except TimeoutError:
        raise UpstreamFailed(f"the fetch process's socket failed: {exc}", "decode_worker") from None


# -- the fetch process ------------------------------------------------------------------------


async def _job(parts: dict[str, Any], meta: bytes, request: bytes, admit: Admit) -> tuple[Any, ...]:
    """One router request through this process's pool (`admit`: ask the server for the body's
    budget): the answer's fields after the job id."""
    from impl.server import upstream

    url, prompt_tokens, n, topk, include = orjson.loads(meta)
    attempts = 0
    body_bytes = 0
    upstream_seconds = decode_seconds = encode_seconds = 0.0
    kept: memoryview | None = None

    def attempt(number: int) -> None:
        nonlocal attempts
        attempts = number

    try:
        started = time.perf_counter()
        try:
            reply = await upstream.post(parts["pool"], url, request, attempt, admit)
        finally:
            upstream_seconds = time.perf_counter() - started
        body_bytes = len(reply.body)
        if isinstance(reply.body, memoryview):
            kept = reply.body  # a kept receive buffer (impl.server.offloop.buffers)
        body = upstream.body_of(reply)
        del reply
        job = DecodeJob(prompt_tokens, n, topk, include)
        payload, decode_seconds, encode_seconds = await asyncio.get_running_loop().run_in_executor(
            parts["decode_thread"], to_proto, parts["decoder"], parts["encoder"], body, job
        )
        del body
        kind = b"o"
    except Exception as exc:  # UpstreamFailed, or a bug: fail the sample, keep the process
        payload, kind = failure_payload(exc), b"e"
    # the decode thread is done with the body (a cancelled job skips this: it may still read)
    if kept is not None:
        parts["buffers"].give(kept)
    timings = (upstream_seconds, decode_seconds, encode_seconds)
    return kind, payload, body_bytes, attempts, timings


async def _serve(args: argparse.Namespace) -> int:
    import socket

    from impl import registry
    from impl.server import upstream

    upstream.set_logprobs(args.upstream_logprobs)
    parts = {
        "decoder": registry.create("decode", args.decode),
        "encoder": registry.create("encode", args.encode),
        "pool": registry.create("pool", args.pool, **orjson.loads(args.pool_options)),
        # one body decoded at a time, off this loop: with a decoder that releases the GIL the
        # loop keeps completing the other bodies' receives meanwhile
        "decode_thread": ThreadPoolExecutor(1, thread_name_prefix="hotpath-fetch-decode"),
    }
    parts["buffers"] = BodyBuffers()
    if hasattr(parts["pool"], "buffers"):  # the pool reads long bodies into kept buffers
        parts["pool"].buffers = parts["buffers"]
    channel = socket.socket(fileno=os.dup(0))
    reader, writer = await asyncio.open_unix_connection(sock=channel, limit=_READ_LIMIT)
    writer.write(_READY)
    tasks: set[asyncio.Task[None]] = set()
    grants: dict[int, asyncio.Future[None]] = {}

    async def run(job_id: int, meta: bytes, request: bytes) -> None:
        async def admit(status: int, length: int | None) -> None:
            granted = grants[job_id] = asyncio.get_running_loop().create_future()
            asked = _ADMIT.pack(status, -1 if length is None else length)
            writer.write(_HEAD.pack(job_id, b"a") + asked)
            try:
                await granted
            finally:
                grants.pop(job_id, None)

        kind, payload, body_bytes, attempts, timings = await _job(parts, meta, request, admit)
        writer.write(_HEAD.pack(job_id, kind))
        writer.write(_RESULT.pack(len(payload), body_bytes, attempts, *timings))
        writer.write(payload)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    try:
        while True:
            try:
                head = await reader.readexactly(_REQUEST.size)
                kind, job_id, meta_size, size = _REQUEST.unpack(head)
                if kind == b"g":
                    granted = grants.get(job_id)
                    if granted is not None and not granted.done():
                        granted.set_result(None)
                    continue
                meta = await reader.readexactly(meta_size)
                request = await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return 0  # the server closed its end (shutdown, or it died)
            task = asyncio.get_running_loop().create_task(run(job_id, meta, request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(parts["pool"].aclose(), 1)
        parts["decode_thread"].shutdown(wait=False, cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    """The fetch process: frames in and out on its stdin socket until the server closes it."""
    parser = argparse.ArgumentParser(prog="python -m impl.server.offloop.fetch")
    parser.add_argument("--decode", required=True, help="decode implementation (registry name)")
    parser.add_argument("--encode", required=True, help="encode implementation (registry name)")
    parser.add_argument("--pool", required=True, help="pool implementation (registry name)")
    parser.add_argument("--pool-options", default="{}", help="the pool contract's options (JSON)")
    parser.add_argument("--upstream-logprobs", default="json", help="the server's (json, ...)")
    parser.add_argument("--nice", type=int, default=0, help="added to this process's niceness")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)  # the server's loop answers first when both want a core
    return_big_buffers()
    os.dup2(2, 1)  # stray prints go to stderr, not into the frames (the socket is fd 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the server's to handle
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
