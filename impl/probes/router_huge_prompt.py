"""Render latency of the fake router (`hotpath router --body vllm`) before and after one request
with a 2M-token prompt: the body cache must not make every later render pay for that prompt.

Prints the median latency of 30 small requests before and after, and of `/stats`. Loopback
only; the router is stopped by PID. Run: `python -m impl.probes.router_huge_prompt`.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request

from impl.harness import procs


def post_ms(url: str, body: bytes) -> float:
    request = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()
    return (time.perf_counter() - began) * 1e3


def small(seed: int) -> bytes:
    return json.dumps({"prompt": [1, 2, 3, seed], "max_tokens": 16, "seed": seed}).encode()


def main() -> None:
    router = procs.start_router(["--body", "vllm"])
    try:
        before = [post_ms(router.url, small(i)) for i in range(30)]
        huge = {"prompt": list(range(2_000_000)), "max_tokens": 1, "seed": 1}
        huge_ms = post_ms(router.url, json.dumps(huge).encode())
        after = [post_ms(router.url, small(1000 + i)) for i in range(30)]
        began = time.perf_counter()
        with urllib.request.urlopen(router.url + "/stats", timeout=60) as response:
            response.read()
        stats_ms = (time.perf_counter() - began) * 1e3
        print(
            f"small renders: median {statistics.median(before):.1f} ms before, "
            f"{statistics.median(after):.1f} ms after (max {max(after):.1f}); "
            f"the 2M-token request {huge_ms:.0f} ms; /stats {stats_ms:.1f} ms"
        )
    finally:
        router.stop()


if __name__ == "__main__":
    main()
