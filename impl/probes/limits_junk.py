"""16 concurrent 30 MiB junk requests (8 asample, 8 retrieve_future) against `hotpath serve`.

Prints the statuses, the largest response, the growth of the server's peak RSS (VmHWM) and
whether a real sample still completes afterwards. Loopback only; both processes are stopped
by PID. Run from the repository root: `python -m impl.probes.limits_junk`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _server import API_KEY, Api, start_server, start_upstream

JUNK = b'{"request_id": "' + b"j" * (30 << 20) + b'"}'
PATHS = ["/api/v1/asample", "/api/v1/retrieve_future"] * 8


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc")


async def burst(url: str) -> tuple[list[httpx.Response], float]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        began = time.perf_counter()
        headers = {"X-API-Key": API_KEY}
        replies = await asyncio.gather(
            *(client.post(p, content=JUNK, headers=headers) for p in PATHS)
        )
        return replies, time.perf_counter() - began


def main() -> None:
    with start_upstream() as upstream, start_server(upstream.url) as server:
        api = Api(server.url)
        ssid = api.sampling_session()
        before = peak_rss_mb(server.pid)
        replies, took = asyncio.run(burst(server.url))
        after = peak_rss_mb(server.pid)
        print(
            f"statuses {sorted({r.status_code for r in replies})}, largest response "
            f"{max(len(r.content) for r in replies)} bytes, burst {took:.2f} s"
        )
        print(f"server peak RSS {before:.0f} -> {after:.0f} MB (+{after - before:.0f} MB)")
        reply = api.asample(ssid, 0, seed=1)
        result = api.result(reply.json()["request_id"])
        print(f"a sample afterwards: asample {reply.status_code}, result {result.status_code}")
        api.close()


if __name__ == "__main__":
    main()
