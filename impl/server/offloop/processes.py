"""Decode processes: the body goes down a socket, SampleResponse bytes come back.

Each process is `python -m impl.server.offloop.processes --decode NAME --encode NAME`, a child of
the server whose stdin and stdout are one end of a Unix socket pair (4 MiB socket buffers where
`net.core.wmem_max` allows). The loop only moves bytes: it writes the body as it is (no
pickling, no copy in Python: the transport writes from the bytes object) and reads the answer;
the process receives the body straight into one bytes object (one kernel copy, `MSG_WAITALL`),
decodes and encodes it with its own decoder and encoder (the server's picks, so results are the
same bytes), writes back one frame and keeps no buffer between jobs. Decode processes run
`--offloop-nice` (10) lower than the server, so the loop gets a core first.

Why a socket pair: moving a long body through it costs the receiving process a fraction of the
CPU and wall time a pipe (1 MiB pipe buffer) does (`python` reading what a forked writer wrote;
docs/measurements.md). Shared memory would add a
20 MB copy into the segment on the loop, holding the GIL; the socket needs none on the loop.

Frames: request = 4-byte meta length, meta (orjson: prompt tokens, n, top-k, include prompt
logprobs), 8-byte body length, body; answer = 1 byte (`o` ok, `e` error), 8-byte length, the
seconds decode and encode took (two doubles), payload (proto bytes, or orjson [failure class,
message]). A process takes one job at a time, so a
process that dies holds exactly one sample: that sample fails with a message saying so and the
process is replaced. A process exits when the server's end of the socket closes, so a server that
is killed leaves no orphan; on shutdown the server closes every socket, waits briefly, then
kills by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import struct
import sys
from typing import Any

import orjson

from impl.server.offloop.children import (
    Child,
    ChildDied,
    Children,
    failure_of,
    failure_payload,
    return_big_buffers,
)
from impl.server.offloop.decoding import Call, Converted, DecodeJob, Sampled, through_loop, to_proto
from impl.server.upstream import UpstreamFailed

_META = struct.Struct("<I")
_LEN = struct.Struct("<Q")
_ANSWER = struct.Struct("<cQdd")  # ok/error, payload length, decode and encode seconds
_READY = b"hotpath-decode-process ready\n"


class _DecodeProcess(Child):
    """The server's side of one decode process: one job at a time."""

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
            raise ChildDied(str(exc)) from None
        if kind == b"o":
            return payload, decode_seconds, encode_seconds
        raise failure_of(payload)


class DecodeProcesses(Children):
    """Bodies of `min_bytes` or more decode in `count` decode processes, one job each."""

    name = "processes"
    what = "decode process"
    ready = _READY
    child_class = _DecodeProcess
    module = "impl.server.offloop.processes"

    def __init__(self, decoder: Any, encoder: Any, **common: Any) -> None:
        """`common`: the keywords of `Children` (decoder and encoder names, count, ...)."""
        super().__init__(decoder, encoder, **common)
        self.idle: asyncio.Queue[_DecodeProcess] = asyncio.Queue()

    def joined(self, child: _DecodeProcess) -> None:
        self.idle.put_nowait(child)

    async def sample(self, call: Call) -> Sampled:
        return await through_loop(call, self.convert)

    async def convert(self, body: bytes, job: DecodeJob) -> Converted:
        """One body the loop received to SampleResponse bytes, in a decode process from
        `min_bytes` on (UpstreamFailed: why not)."""
        if len(body) < self.min_bytes:
            return await self.convert_inline(body, job)
        self.offloop += 1
        child = await self.idle.get()
        try:
            result = await child.run(body, job)
        except ChildDied:
            status = await self._reap(child)
            message = (
                f"the decode process (pid {child.pid}) died while decoding this sample "
                f"({status}); only the samples it held failed, a new one replaced it"
            )
            self._died(message)
            self._replace()
            raise UpstreamFailed(message, "decode_worker") from None
        except BaseException:  # cancelled mid-frame: the pipe state is unknown, end it
            child.kill()
            await asyncio.shield(self._reap(child))
            self._replace()
            raise
        self.idle.put_nowait(child)
        return result

    def _usage(self) -> dict[str, Any]:
        return {"idle": self.idle.qsize()}


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
    """The decode process loop: frames in on stdin, frames out on stdout, until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m impl.server.offloop.processes")
    parser.add_argument("--decode", required=True, help="decode implementation (registry name)")
    parser.add_argument("--encode", required=True, help="encode implementation (registry name)")
    parser.add_argument("--nice", type=int, default=0, help="added to this process's niceness")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)  # the server's loop answers first when both want a core
    return_big_buffers()
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
        except Exception as exc:  # UpstreamFailed, or a bug: fail the sample, keep the process
            payload, kind = failure_payload(exc), b"e"
        del body
        _write_all(out, _ANSWER.pack(kind, len(payload), decode_seconds, encode_seconds), payload)
        del payload


if __name__ == "__main__":
    sys.exit(main())
