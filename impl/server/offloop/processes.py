"""Decode worker processes: the body goes down a socket, SampleResponse bytes come back.

Each worker is `python -m impl.server.offloop.processes --decode NAME --encode NAME`, a child of
the server whose stdin and stdout are one end of a Unix socket pair (4 MiB socket buffers where
`net.core.wmem_max` allows). The loop only moves bytes: it writes the body as it is (no
pickling, no copy in Python: the transport writes from the bytes object) and reads the answer;
the worker receives the body straight into one bytes object (one kernel copy, `MSG_WAITALL`),
decodes and encodes it with its own decoder and encoder (the server's picks, so results are the
same bytes), writes back one frame and keeps no buffer between jobs. Decode workers run
`--decode-worker-nice` (10) lower than the server, so the loop gets a core first.

Why a socket pair: moving a 21.5 MB body cost the worker 10-15 ms of CPU through a pipe (1 MiB
pipe buffer) and 2.3-4 ms through the socket pair, 16-25 ms of wall time instead of 33-70 ms
(`python` reading what a forked writer wrote, this machine, loaded). Shared memory would add a
20 MB copy into the segment on the loop, holding the GIL; the socket needs none on the loop.

Frames: request = 4-byte meta length, meta (orjson: prompt tokens, n, top-k, include prompt
logprobs), 8-byte body length, body; answer = 1 byte (`o` ok, `e` error), 8-byte length, the
seconds decode and encode took (two doubles), payload (proto bytes, or orjson [failure class,
message]). A worker takes one job at a time, so a
worker that dies holds exactly one sample: that sample fails with a message saying so and the
worker is replaced. A worker exits when the server's end of the socket closes, so a server that
is killed leaves no orphan; on shutdown the server closes every socket, waits briefly, then
kills by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import sys
from typing import Any

import orjson

from impl.server.offloop.inline import Converted, DecodeJob, Inline, to_proto
from impl.server.upstream import UpstreamFailed

log = logging.getLogger("hotpath.server")

_META = struct.Struct("<I")
_LEN = struct.Struct("<Q")
_ANSWER = struct.Struct("<cQdd")  # ok/error, payload length, decode and encode seconds
_READY = b"hotpath-decode-worker ready\n"
_SOCKET_BUFFER = 4 << 20
_READ_LIMIT = 4 << 20  # StreamReader: pause reading past this, not every 128 KiB


def socket_pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
    return ours, theirs


async def start_worker(
    command: list[str], ready: bytes, what: str
) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader, asyncio.StreamWriter]:
    """Start `command` with one end of a Unix socket pair as its stdin and stdout and wait (60 s
    at most) for its `ready` line; RuntimeError, the process reaped, when it never says it."""
    ours, theirs = socket_pair()
    try:
        process = await asyncio.create_subprocess_exec(*command, stdin=theirs, stdout=theirs)
    finally:
        theirs.close()  # the child has its copy; EOF reaches it when ours closes
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
    try:
        line = await asyncio.wait_for(reader.readline(), 60)
    except (TimeoutError, ConnectionError):
        line = b""
    if line != ready:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        writer.close()
        await process.wait()
        raise RuntimeError(
            f"{what} {' '.join(command)} did not start (exit status "
            f"{process.returncode}; its error output is above)"
        )
    return process, reader, writer


async def wait_or_kill(process: asyncio.subprocess.Process, seconds: float) -> str:
    """Wait `seconds` for `process` to exit, then kill it; how it ended, in words."""
    try:
        code = await asyncio.wait_for(process.wait(), seconds)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        code = await process.wait()
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class WorkerDied(Exception):
    """The worker process exited (or its pipes broke) while it held a job."""


class _Worker:
    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.reader, self.writer = reader, writer

    async def run(self, body: bytes, job: DecodeJob) -> Converted:
        stdin, stdout = self.writer, self.reader
        meta = orjson.dumps([job.prompt_tokens, job.n, job.topk, job.include_prompt_logprobs])
        try:
            stdin.write(_META.pack(len(meta)) + meta + _LEN.pack(len(body)))
            stdin.write(body)
            await stdin.drain()
            kind, size, decode_seconds, encode_seconds = _ANSWER.unpack(
                await stdout.readexactly(_ANSWER.size)
            )
            payload = await stdout.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            raise WorkerDied(str(exc)) from None
        if kind == b"o":
            return payload, decode_seconds, encode_seconds
        failure_kind, message = orjson.loads(payload)
        raise UpstreamFailed(message, failure_kind)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def close(self) -> None:
        """Close the server's end: the worker reads EOF and exits after its current job."""
        self.writer.close()


class Processes(Inline):
    """Bodies of `min_bytes` or more decode in `workers` worker processes, one job each."""

    name = "processes"

    def __init__(
        self,
        decoder: Any,
        encoder: Any,
        *,
        decoder_name: str,
        encoder_name: str,
        workers: int,
        min_bytes: int,
        nice: int = 0,
    ) -> None:
        super().__init__(decoder, encoder)
        self.command = [
            sys.executable, "-m", "impl.server.offloop.processes",
            "--decode", decoder_name, "--encode", encoder_name, "--nice", str(nice),
        ]  # fmt: skip
        self.nice = nice
        self.workers, self.min_bytes = workers, min_bytes
        self.idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self.alive: dict[int, _Worker] = {}
        self.replaced = 0
        self.died: list[str] = []
        self._spawning: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn() for _ in range(self.workers)))

    async def _spawn(self) -> None:
        worker = _Worker(*await start_worker(self.command, _READY, "decode worker"))
        self.alive[worker.pid] = worker
        self.idle.put_nowait(worker)

    def _replace(self) -> None:
        async def spawn() -> None:
            try:
                await self._spawn()
                self.replaced += 1
            except Exception:
                log.exception("could not replace a decode worker")

        if not self.closing:
            task = asyncio.get_running_loop().create_task(spawn())
            self._spawning.add(task)
            task.add_done_callback(self._spawning.discard)

    async def to_proto(self, body: bytes, job: DecodeJob) -> Converted:
        if len(body) < self.min_bytes:
            return await super().to_proto(body, job)
        self.offloop += 1
        worker = await self.idle.get()
        try:
            result = await worker.run(body, job)
        except WorkerDied:
            status = await self._reap(worker)
            message = (
                f"the decode worker (pid {worker.pid}) died while decoding this sample "
                f"({status}); only the samples it held failed, a new worker replaced it"
            )
            self.died.append(message)
            log.error("%s", message)
            self._replace()
            raise UpstreamFailed(message, "decode_worker") from None
        except BaseException:  # cancelled mid-frame: the pipe state is unknown, end it
            worker.kill()
            await asyncio.shield(self._reap(worker))
            self._replace()
            raise
        self.idle.put_nowait(worker)
        return result

    async def _reap(self, worker: _Worker) -> str:
        self.alive.pop(worker.pid, None)
        worker.close()
        return await wait_or_kill(worker.process, 5)

    async def aclose(self) -> None:
        self.closing = True
        await asyncio.gather(*self._spawning, return_exceptions=True)  # then end them too
        workers = list(self.alive.values())
        for worker in workers:
            worker.close()
        for worker in workers:
            await wait_or_kill(worker.process, 2)
        self.alive.clear()

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "workers": self.workers,
            "min_bytes": self.min_bytes,
            "nice": self.nice,
            "pids": sorted(self.alive),
            "idle": self.idle.qsize(),
            "replaced": self.replaced,
            "last_death": self.died[-1] if self.died else None,
        }


def _receive(channel: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes as one bytes object (MSG_WAITALL: the kernel copies the body once,
    straight into the object the decoder gets); None at EOF before the first byte."""
    data = channel.recv(size, socket.MSG_WAITALL) if size else b""
    if size and not data:
        return None
    while len(data) < size:  # MSG_WAITALL returns early only on a signal or EOF
        more = channel.recv(size - len(data), socket.MSG_WAITALL)
        if not more:
            raise EOFError(f"the server closed the socket after {len(data)} of {size} bytes")
        data += more
    return data


def _write_all(fd: int, *parts: bytes) -> None:
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


def main(argv: list[str] | None = None) -> int:
    """The worker loop: frames in on stdin, frames out on stdout, until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m impl.server.offloop.processes")
    parser.add_argument("--decode", required=True, help="decode implementation (registry name)")
    parser.add_argument("--encode", required=True, help="encode implementation (registry name)")
    parser.add_argument("--nice", type=int, default=0, help="added to this process's niceness")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)  # the server's loop answers first when both want a core
    from impl import registry

    out = os.dup(1)  # the answer channel; stray prints go to stderr, not into the frames
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the server's to handle
    decoder = registry.create("decode", args.decode)
    encoder = registry.create("encode", args.encode)
    channel = socket.socket(fileno=os.dup(0))
    _write_all(out, _READY)
    while True:
        head = _receive(channel, _META.size)
        if head is None:
            return 0
        meta = orjson.loads(_receive(channel, _META.unpack(head)[0]) or b"null")
        size = _LEN.unpack(_receive(channel, _LEN.size) or b"")[0]
        body = _receive(channel, size) or b""
        prompt_tokens, n, topk, include = meta
        decode_seconds = encode_seconds = 0.0
        try:
            job = DecodeJob(prompt_tokens, n, topk, include)
            payload, decode_seconds, encode_seconds = to_proto(decoder, encoder, body, job)
            kind = b"o"
        except UpstreamFailed as exc:
            payload, kind = orjson.dumps([exc.kind, str(exc)]), b"e"
        except Exception as exc:  # a bug: fail the sample, keep the worker
            message = f"internal server error: {type(exc).__name__}: {exc}"
            payload, kind = orjson.dumps(["internal", message]), b"e"
        del body
        _write_all(out, _ANSWER.pack(kind, len(payload), decode_seconds, encode_seconds), payload)
        del payload


if __name__ == "__main__":
    sys.exit(main())
