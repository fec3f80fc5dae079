"""`python -m impl.probes.offloop`: what handing a body to a decode process costs the event loop.

For realistic vLLM bodies of several sizes, decodes the same body many times at once through
`inline` (on the loop) and through `processes` (decode processes,
`impl.server.offloop.processes`) and prints, per body: wall time, CPU of the loop's process
(what every other request waits behind) and CPU of the decode processes. Where the loop's CPU
of the two designs meet is the crossover below which a body is cheaper to decode inline
(`--offloop-min-bytes`).

    python -m impl.probes.offloop [--processes 1] [--decode simdjson] [--tokens 128,1024,...]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import psutil

from impl import pick, registry
from impl.measure import render_table
from impl.server.offloop.decoding import DecodeJob
from impl.server.offloop.inline import Inline
from impl.server.offloop.processes import DecodeProcesses
from impl.workloads import synthetic

DEFAULT_TOKENS = (128, 1024, 4096, 16384, 262144)


def _children_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children():
        times = child.cpu_times()
        total += times.user + times.system
    return total


async def _measure(
    design: Inline | DecodeProcesses, body: bytes, job: DecodeJob, count: int
) -> tuple[float, float, float]:
    """Per body: (wall s, loop-process CPU s, decode processes' CPU s) over `count` concurrent
    decodes."""
    await asyncio.gather(*(design.convert(body, job) for _ in range(2)))  # warm
    children, loop_cpu, wall = _children_cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(design.convert(body, job) for _ in range(count)))
    wall = time.perf_counter() - wall
    loop_cpu = time.process_time() - loop_cpu
    children = _children_cpu() - children
    return wall / count, loop_cpu / count, children / count


async def _run(args: argparse.Namespace) -> list[tuple[object, ...]]:
    decoder = registry.create("decode", args.decode)
    encoder = registry.create("encode", args.encode)
    processes = DecodeProcesses(
        decoder,
        encoder,
        decoder_name=args.decode,
        encoder_name=args.encode,
        count=args.processes,
        min_bytes=0,
    )
    await processes.start()
    rows = []
    try:
        for tokens in args.tokens:
            body = synthetic.body_for(tokens, kind="vllm")
            job = DecodeJob(None, 1, 0, False)
            count = max(8, min(2000, 3_000_000 // max(tokens, 1)))
            for design in (Inline(decoder, encoder), processes):
                wall, loop_cpu, child_cpu = await _measure(design, body, job, count)
                rows.append(
                    (
                        tokens,
                        f"{len(body) / 1e3:,.1f}",
                        design.name,
                        count,
                        f"{wall * 1e3:.3f}",
                        f"{loop_cpu * 1e3:.3f}",
                        f"{child_cpu * 1e3:.3f}",
                    )
                )
    finally:
        await processes.aclose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.probes.offloop", description=__doc__)
    parser.add_argument(
        "--processes",
        "--workers",
        type=int,
        default=1,
        help="decode processes (--workers: its earlier name)",
    )
    parser.add_argument("--decode", default=None, help="decoder (default: the server's pick)")
    parser.add_argument("--encode", default="wire", help="encoder")
    parser.add_argument(
        "--tokens",
        type=lambda text: [int(t) for t in text.split(",")],
        default=list(DEFAULT_TOKENS),
        help="comma-separated generated tokens per body (realistic logprobs=1 bodies)",
    )
    args = parser.parse_args(argv)
    if args.decode is None:
        args.decode = pick.pick("decode", None).name
    import uvloop

    rows = uvloop.run(_run(args))
    print(
        render_table(
            ["tokens", "body KB", "design", "bodies", "wall ms", "loop CPU ms", "processes CPU ms"],
            rows,
        )
    )
    print(f"decoder={args.decode} encoder={args.encode} processes={args.processes}; per body")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
