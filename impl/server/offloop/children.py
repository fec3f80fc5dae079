"""The server's side of off-loop child processes, shared by decode and fetch processes.

Each child is `python -m impl.server.offloop.<design> ...`, started with one end of a Unix
socket pair as its stdin and stdout (4 MiB socket buffers where `net.core.wmem_max` allows) and
ready once it printed its ready line on that socket. `Children` keeps `count` of them alive: a
child that died is reaped (its exit status in words) and replaced, unless the server is
shutting down; on shutdown every socket is closed (a child exits when it reads EOF), each child
gets 2 s, then it is killed by PID. What a child does with its socket (one job at a time, or
many) is the design's: `impl.server.offloop.processes`, `impl.server.offloop.fetch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import sys
from typing import Any

import orjson

from impl.server.offloop.decoding import Converted, DecodeJob, to_proto
from impl.server.upstream import UpstreamFailed

log = logging.getLogger("hotpath.server")

_SOCKET_BUFFER = 4 << 20
_READ_LIMIT = 4 << 20  # StreamReader: pause reading past this, not every 128 KiB


def socket_pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
    return ours, theirs


async def start_child(
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


def failure_payload(exc: Exception) -> bytes:
    """In a child: the answer payload of a sample that failed (UpstreamFailed says how; any
    other exception is a bug that fails the sample and keeps the child)."""
    if isinstance(exc, UpstreamFailed):
        return orjson.dumps([exc.kind, str(exc)])
    return orjson.dumps(["internal", f"internal server error: {type(exc).__name__}: {exc}"])


def failure_of(payload: bytes) -> UpstreamFailed:
    """In the server: the failure a child's error answer carries."""
    kind, message = orjson.loads(payload)
    return UpstreamFailed(message, kind)


#: glibc's mallopt parameter for the size from which an allocation is its own mapping
_M_MMAP_THRESHOLD = -3
_OWN_MAPPING_BYTES = 1 << 20


def return_big_buffers() -> None:
    """In a process holding big buffers (fetch and decode processes: bodies and their decoded
    arrays; the server: stored results): those of 1 MiB and more become their own mappings,
    given back to the OS when freed. glibc otherwise raises its mmap threshold to the largest
    block freed (up to 32 MiB), and later ones come from the heap, whose freed space stays in
    the RSS (docs/measurements.md, the headline entry, has the fetch processes' peaks with and
    without it). No effect off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _OWN_MAPPING_BYTES)


class ChildDied(Exception):
    """The child process exited (or its socket broke) while it held a job."""


class Child:
    """The server's side of one child: its process and its end of the socket."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.process, self.pid = process, process.pid
        self.reader, self.writer = reader, writer

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def close(self) -> None:
        """Close the server's end: the child reads EOF and exits after its current work."""
        self.writer.close()

    def ended(self) -> None:
        """The process has exited (shutdown): drop what still waits on its socket."""


class Children:
    """`count` child processes of one design, each replaced when it dies; `what` names one of
    them in messages ("decode process"), `ready` is the line it prints once it runs. Bodies
    under `min_bytes` convert on the loop (`convert_inline`). The designs built on it are
    `impl.server.offloop.decoding.Decoding`s (they add `name` and `sample`)."""

    what = "child process"
    ready = b""
    child_class: type[Child] = Child
    #: what each child runs: `python -m MODULE --decode NAME --encode NAME [options] --nice N`
    module = ""

    def __init__(
        self,
        decoder: Any,
        encoder: Any,
        *,
        decoder_name: str,
        encoder_name: str,
        count: int,
        min_bytes: int,
        nice: int = 0,
        options: tuple[str, ...] = (),
    ) -> None:
        self.decoder, self.encoder = decoder, encoder
        #: set when the server shuts down: no new processes
        self.closing = False
        #: bodies converted on the loop, and handed to a child
        self.inline = 0
        self.offloop = 0
        self.command = [
            sys.executable, "-m", self.module, "--decode", decoder_name,
            "--encode", encoder_name, *options, "--nice", str(nice),
        ]  # fmt: skip
        self.count, self.min_bytes, self.nice = count, min_bytes, nice
        self.alive: dict[int, Any] = {}
        self.replaced = 0
        self.died: list[str] = []
        self._spawning: set[asyncio.Task[None]] = set()
        #: set while at least one child is alive, and on shutdown
        self._joined = asyncio.Event()

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn() for _ in range(self.count)))

    async def convert_inline(self, body: bytes, job: DecodeJob) -> Converted:
        """A small body's SampleResponse bytes, on the loop (handing it over costs more)."""
        self.inline += 1
        return to_proto(self.decoder, self.encoder, body, job)

    async def _spawn(self) -> None:
        try:
            child = self.child_class(*await start_child(self.command, self.ready, self.what))
        except RuntimeError:
            if self.closing:
                return
            raise
        if self.closing:  # shut down while it started: end it at once
            child.kill()
            child.close()
            await child.process.wait()
            return
        self.alive[child.pid] = child
        self._joined.set()
        self.joined(child)

    def joined(self, child: Any) -> None:
        """`child` is alive and counted: start using it."""

    def _replace(self) -> None:
        """Start a child in place of one that died (not while shutting down)."""
        if self.closing:
            return
        task = asyncio.get_running_loop().create_task(self._respawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def _respawn(self) -> None:
        try:
            await self._spawn()
            self.replaced += 1
        except Exception:
            log.exception("could not replace a %s", self.what)

    def _died(self, message: str) -> None:
        self.died.append(message)
        log.error("%s", message)

    async def _reap(self, child: Child) -> str:
        self.alive.pop(child.pid, None)
        if not self.alive:
            self._joined.clear()
        child.close()
        return await wait_or_kill(child.process, 5)

    async def aclose(self) -> None:
        self.closing = True
        self._joined.set()
        await asyncio.gather(*self._spawning, return_exceptions=True)  # then end them too
        children = list(self.alive.values())
        for child in children:
            child.close()
        for child in children:
            await wait_or_kill(child.process, 2)
            child.ended()
        self.alive.clear()

    def _usage(self) -> dict[str, Any]:
        """The design's own figures for /healthz (after the pids)."""
        return {}

    def stats(self) -> dict[str, Any]:
        return {
            "inline": self.inline,
            "offloop": self.offloop,
            "count": self.count,
            "workers": self.count,  # its earlier name (/healthz readers of 0.1)
            "min_bytes": self.min_bytes,
            "nice": self.nice,
            "pids": sorted(self.alive),
            **self._usage(),
            "replaced": self.replaced,
            "last_death": self.died[-1] if self.died else None,
        }
