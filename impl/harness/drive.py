"""Run a load's client processes and merge what they report: the process side of `loadtest`.

`client_configs` splits a scenario into one `ClientConfig` per client process (interleaved
indices, its own 127.0.0.x source address, its share of the concurrency); `drive` spawns one
process per config, releases them together once all are ready, shows progress, and bounds the
run (the client processes' own `--timeout`, then a hard stop a minute later); `merge` adds
their results up, counting a client process that returned nothing as `client_crash` for its share.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import time
from collections import Counter
from typing import Any

from impl.harness import presets
from impl.harness.client.config import ClientConfig


def client_configs(
    url: str,
    scenario: presets.Scenario,
    *,
    seed: int = 0,
    verify: str = "count",
    tries: int = 16,
    backoff_base: float = 0.25,
    warmup: int = 1,
) -> list[ClientConfig]:
    """One config per client process: interleaved request indices, own address, own share."""
    count = max(1, min(scenario.client_processes, scenario.num_requests, 250))

    def share(total: int, w: int) -> int:
        return max(1, total // count + (1 if w < total % count else 0))

    return [
        ClientConfig(
            url=url,
            indices=(w, scenario.num_requests, count),
            prompt_tokens=scenario.prompt_tokens,
            max_tokens=scenario.max_tokens,
            num_samples=scenario.num_samples,
            concurrency=share(scenario.concurrency, w),
            max_outstanding=share(scenario.max_outstanding, w),
            distinct_prompts=scenario.distinct_prompts,
            seed=seed,
            poll_timeout=scenario.poll_timeout,
            tries=tries,
            backoff_base=backoff_base,
            timeout=scenario.timeout,
            source_address=f"127.0.0.{2 + w}",
            warmup=warmup * max(1, scenario.router_workers),
            verify=verify,
            router_body=scenario.router_body,
            poll=scenario.poll,
            nice=scenario.load_nice,
        )
        for w in range(count)
    ]


def _client_main(config: ClientConfig, client: str, progress: Any, go: Any, results: Any) -> None:
    try:
        if config.nice:
            os.nice(config.nice)
        if client == "sdk":
            from impl.harness.client.real_sdk import run_sdk_client_process as runner
        else:
            from impl.harness.client.sdk_shaped import run_client_process as runner
        result = runner(config, progress, go)
    except BaseException as exc:  # reported, never hidden
        result = {"crashed": f"{type(exc).__name__}: {exc}"}
    results.put(result)


def drive(
    configs: list[ClientConfig],
    *,
    client: str = "http",
    label: str = "",
    progress_bar: bool = True,
    on_go: Any = None,
) -> dict[str, Any]:
    """Run the client processes (spawned processes) to the end; merge what they collected."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    results: Any = ctx.Queue()
    counters = [ctx.Array("q", 3, lock=False) for _ in configs]  # completed, failed, ready
    processes = [
        ctx.Process(target=_client_main, args=(c, client, counters[i], go, results), daemon=True)
        for i, c in enumerate(configs)
    ]
    try:
        for process in processes:
            process.start()
        total = sum(len(range(*c.indices)) for c in configs)
        timeout = max(c.timeout for c in configs)
        setup_deadline = time.monotonic() + 300  # sessions and warm-up
        while sum(c[2] for c in counters) < len(configs) and time.monotonic() < setup_deadline:
            if results.qsize() if hasattr(results, "qsize") else False:
                break  # a client process failed before it was ready
            time.sleep(0.02)
        if on_go is not None:
            on_go()
        started = time.monotonic()
        go.set()
        bar = _progress(total, label) if progress_bar else None
        collected: list[dict[str, Any]] = []
        hard_stop = started + timeout + 60
        while len(collected) < len(processes) and time.monotonic() < hard_stop:
            try:
                collected.append(results.get(timeout=0.25))
            except queue.Empty:
                if not any(w.is_alive() for w in processes) and results.empty():
                    break
            done = sum(c[0] + c[1] for c in counters)
            if bar is not None and done != bar.n:
                bar.n = done
                bar.set_postfix(failed=sum(c[1] for c in counters), refresh=False)
                bar.refresh()
        wall = time.monotonic() - started
        if bar is not None:
            bar.close()
        for process in processes:
            process.join(5)  # a client process still alive after it is killed below
        return merge(collected, total=total, wall=wall)
    finally:  # interrupted (SIGINT/SIGTERM) or done: no client process outlives the run
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def _progress(total: int, label: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=label or "samples", unit="res", file=sys.stderr, mininterval=0.5)


def merge(parts: list[dict[str, Any]], *, total: int, wall: float) -> dict[str, Any]:
    """One run's numbers from its client processes' results (a crashed one's share counts as
    failed)."""
    failed: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    polls: set[str] = set()
    examples: dict[str, str] = {}
    latencies: list[float] = []
    completed = result_bytes = tokens = 0
    cpu = 0.0
    warm_done, warm_failed = 0, Counter()
    for part in parts:
        if "crashed" in part:
            examples.setdefault("client_crash", part["crashed"])
            continue
        completed += part["completed"]
        failed.update(part["failed"])
        retries.update(part["retries"])
        requests.update(part.get("requests", {}))
        if "poll" in part:
            polls.add(part["poll"])
        latencies.extend(part["latencies"])
        result_bytes += part["result_bytes"]
        tokens += part["tokens"]
        cpu += part.get("cpu_seconds", 0.0)
        warm_done += part.get("warmup", {}).get("completed", 0)
        warm_failed.update(part.get("warmup", {}).get("failed", {}))
        for kind, message in part["examples"].items():
            examples.setdefault(kind, message)
    missing = total - completed - sum(failed.values())
    if missing > 0:
        failed["client_crash"] += missing
        examples.setdefault("client_crash", "a client process returned no result")
    return {
        "requested": total,
        "completed": completed,
        "failed": dict(failed),
        "retries": dict(retries),
        "requests": dict(requests),
        "poll": "/".join(sorted(polls)),
        "examples": examples,
        "latencies": latencies,
        "result_bytes": result_bytes,
        "tokens": tokens,
        "wall_seconds": wall,
        "client_cpu_seconds": round(cpu, 2),
        "warmup": {"completed": warm_done, "failed": dict(warm_failed)},
    }
