"""What an answer waiting for the body budget costs, per pool implementation.

With the budget taken when an answer's headers arrive (docs/offloop.md), up to
`--upstream-connections` answers may wait unread at once; each holds what its pool read before
`admit` (the library's buffer of the body's start), in the process, and the rest stays in the
kernel's socket buffers. For each implementation, in a fresh process: `--answers` POSTs through
one forwarder to `hotpath router` answering `--mb` MB of filler, every `admit` held until all of
them waited `--seconds`, then the process's RSS growth per waiting answer; then every body is
read. Run: `python -m impl.probes.waiting_answers [--answers 64] [--mb 17]`.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

from impl import registry


async def _measure(name: str, url: str, answers: int, size: int, seconds: float) -> float:
    import psutil

    forwarder = registry.create("pool", name, max_connections=answers)
    gate = asyncio.Event()
    waiting = 0

    async def admit(status: int, length: int | None) -> None:
        nonlocal waiting
        waiting += 1
        await gate.wait()

    headers = {"X-Hotpath-Body-Bytes": str(size)}
    await forwarder.post(url, b"{}", {"X-Hotpath-Body-Bytes": "100"})  # warm the imports
    base = psutil.Process().memory_info().rss
    posts = [
        asyncio.ensure_future(forwarder.post(url, b"{}", headers, admit)) for _ in range(answers)
    ]
    while waiting < answers:
        await asyncio.sleep(0.05)
    await asyncio.sleep(seconds)
    grown = psutil.Process().memory_info().rss - base
    gate.set()
    replies = await asyncio.gather(*posts)
    assert all(len(reply.body) == size for reply in replies)
    await forwarder.aclose()
    return grown / answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m impl.probes.waiting_answers")
    parser.add_argument("--answers", type=int, default=64, help="answers waiting at once")
    parser.add_argument("--mb", type=float, default=17.0, help="each answer's size, MB")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long they all wait")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one implementation
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = int(args.mb * 1e6)
    if args.one:
        per = asyncio.run(_measure(args.one, args.url, args.answers, size, args.seconds))
        print(f"{per / 1e6:.3f}")
        return 0
    from impl.harness.procs import start_router

    print(f"{args.answers} answers of {args.mb:g} MB waiting in admit: RSS growth per answer")
    with start_router(["--mode", "instant", "--body-bytes", "256"]) as router:
        for name in registry.available("pool"):
            command = [sys.executable, "-m", "impl.probes.waiting_answers", "--one", name]
            command += ["--url", router.url + "/v1/completions", "--answers", str(args.answers)]
            command += ["--mb", str(args.mb), "--seconds", str(args.seconds)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            figure = done.stdout.strip() or done.stderr.strip()[-200:]
            print(f"  {name:14} {figure} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
