"""`python -m impl.probes.floors`: the floor of each stage a long result goes through, here.

For one realistic vLLM body (`--tokens`, 212000 by default: about 17 MB) and the
SampleResponse bytes it becomes, measures the CPU (thread CPU time, so other load on the
machine inflates it little) of each stage as the fetch-process design does it, beside the least
that stage can cost on this machine:

- receive: the kernel's copy of the body out of a loopback TCP socket into a kept buffer
  (`recv_into`, the floor) and into fresh 256 KiB `bytes` chunks (what an asyncio transport
  reads), which are then copied into one buffer;
- copy: a memcpy of the body into a buffer whose pages are already mapped (the floor), into a
  fresh buffer (`bytearray(n)`: page faults and zeroing) and a fresh buffer copied once more to
  `bytes`;
- decode: the decoder alone on the body (`--decode`, the picked one's default), from `bytes`
  and from a `memoryview` of a kept buffer (`impl.server.offloop.buffers`: the compiled
  decoders read it in place, the others copy it to bytes first);
- encode: the encoder alone (`--encode`) on the decoded completion;
- hand-over: the SampleResponse bytes through a Unix socket pair, received by an asyncio
  `StreamReader.readexactly` (what the server does) and by `recv_into` a kept buffer (floor);
- serve: one `sendall` of the SampleResponse bytes to a loopback TCP socket (the sender's CPU).

Each figure is the median of `--rounds` repetitions, in ms per body. A figure, not a test:
docs/offloop.md cites the table (figures in docs/measurements.md).

    python -m impl.probes.floors [--tokens 212000] [--rounds 15] [--decode NAME] [--encode NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable

from impl import registry
from impl.measure import render_table
from impl.server.offloop.buffers import BodyBuffers
from impl.server.offloop.children import return_big_buffers, socket_pair
from impl.server.offloop.decoding import DecodeJob, to_proto
from impl.workloads.synthetic import body_for

CHUNK = 256 << 10


def _cpu_ms(work: Callable[[], object], rounds: int) -> float:
    """Median thread CPU of `work` in ms over `rounds` calls (after one warm-up call)."""
    work()
    times = []
    for _ in range(rounds):
        started = time.thread_time()
        work()
        times.append(time.thread_time() - started)
    return statistics.median(times) * 1e3


def _sender(sock: socket.socket, data: bytes, rounds: int) -> threading.Thread:
    def send() -> None:
        for _ in range(rounds):
            sock.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def _receive(data: bytes, rounds: int, into: bool) -> float:
    """Receiver's CPU ms per body over loopback TCP: `recv_into` one kept buffer, or 256 KiB
    `bytes` chunks copied into a kept buffer."""
    sender, receiver = _tcp_pair()
    buffer = bytearray(len(data))
    view = memoryview(buffer)
    thread = _sender(sender, data, rounds + 1)

    def one() -> None:
        at = 0
        while at < len(data):
            if into:
                at += receiver.recv_into(view[at:], min(CHUNK, len(data) - at))
            else:
                chunk = receiver.recv(min(CHUNK, len(data) - at))
                view[at : at + len(chunk)] = chunk
                at += len(chunk)

    try:
        return _cpu_ms(one, rounds)
    finally:
        thread.join()
        view.release()
        sender.close()
        receiver.close()


def _hand_over(payload: bytes, rounds: int, stream: bool) -> float:
    """Receiver's CPU ms per SampleResponse through a Unix socket pair (the server's side)."""
    ours, theirs = socket_pair()
    thread = _sender(theirs, payload, rounds + 1)
    try:
        if not stream:
            view = memoryview(bytearray(len(payload)))

            def one() -> None:
                at = 0
                while at < len(payload):
                    at += ours.recv_into(view[at:])

            return _cpu_ms(one, rounds)

        async def run() -> float:
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=4 << 20)
            times = []
            for index in range(rounds + 1):
                started = time.thread_time()
                await reader.readexactly(len(payload))
                if index:
                    times.append(time.thread_time() - started)
            writer.close()
            return statistics.median(times) * 1e3

        return asyncio.run(run())
    finally:
        thread.join()
        ours.close()
        theirs.close()


def _serve(payload: bytes, rounds: int) -> float:
    """Sender's CPU ms per SampleResponse written with one `sendall` to loopback TCP."""
    sender, receiver = _tcp_pair()

    def drain() -> None:
        sink = bytearray(CHUNK)
        with receiver:
            while receiver.recv_into(sink):
                pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        return _cpu_ms(lambda: sender.sendall(payload), rounds)
    finally:
        sender.close()
        thread.join()


def rows(tokens: int, rounds: int, decode: str, encode: str) -> list[tuple[object, ...]]:
    body = body_for(tokens, kind="vllm")
    decoder, encoder = registry.create("decode", decode), registry.create("encode", encode)
    job = DecodeJob(None, 1, 0, False)
    payload = to_proto(decoder, encoder, body, job)[0]
    kept_view = BodyBuffers().take(len(body))  # as a fetch process keeps it: a NUL follows
    kept_view[:] = body

    def fresh_copy() -> None:
        buffer = bytearray(len(body))
        memoryview(buffer)[:] = body

    def fresh_copy_bytes() -> None:
        buffer = bytearray(len(body))
        memoryview(buffer)[:] = body
        bytes(buffer)

    def warm_copy() -> None:
        kept_view[:] = body

    completion = decoder.decode(body)
    ms = {
        "receive: recv_into a kept buffer (floor)": _receive(body, rounds, into=True),
        "receive: 256 KiB chunks, copied into a kept buffer": _receive(body, rounds, into=False),
        "copy: memcpy into mapped pages (floor)": _cpu_ms(warm_copy, rounds),
        "copy: into a fresh bytearray": _cpu_ms(fresh_copy, rounds),
        "copy: into a fresh bytearray, then bytes()": _cpu_ms(fresh_copy_bytes, rounds),
        f"decode: {decode} on bytes": _cpu_ms(lambda: decoder.decode(body), rounds),
        f"decode: {decode} on a kept buffer's view": _cpu_ms(
            lambda: decoder.decode(kept_view), rounds
        ),
        f"encode: {encode}": _cpu_ms(lambda: encoder.encode(completion), rounds),
        "hand-over: StreamReader.readexactly": _hand_over(payload, rounds, stream=True),
        "hand-over: recv_into a kept buffer (floor)": _hand_over(payload, rounds, stream=False),
        "serve: one sendall to loopback TCP": _serve(payload, rounds),
    }
    kept_view.release()
    out: list[tuple[object, ...]] = []
    for stage, value in ms.items():
        size = len(payload) if stage.startswith(("hand-over", "serve", "encode")) else len(body)
        out.append((stage, f"{size / 1e6:.2f}", f"{value:.2f}", f"{size / value / 1e6:.2f}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.probes.floors", description=__doc__)
    parser.add_argument("--tokens", type=int, default=212000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--decode", default="onepass_nogil_avx2")
    parser.add_argument("--encode", default="wire")
    args = parser.parse_args(argv)
    return_big_buffers()  # as in the fetch processes and the server: 1 MiB+ is its own mapping
    table = rows(args.tokens, args.rounds, args.decode, args.encode)
    print(f"one {args.tokens}-token vLLM body; median of {args.rounds} rounds, thread CPU")
    print(render_table(["stage", "MB", "CPU ms", "GB/s"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
