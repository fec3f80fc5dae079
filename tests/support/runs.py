"""A short load run for tests: a few samples from one client process, no warm-up, no progress
bar (the harness's own run, as `hotpath loadtest --url` makes it)."""

from __future__ import annotations

from typing import Any

from impl.harness import load, presets


def few_samples(
    url: str, *, tries: int, backoff_base: float, num_requests: int = 8, timeout: float = 60.0
) -> dict[str, Any]:
    """`num_requests` samples against the server at `url`, each tried up to `tries` times;
    the run dict (`failed`, `examples`, `retries`, ...)."""
    scenario = presets.Scenario(num_requests=num_requests, client_processes=1, timeout=timeout)
    return load.run_scenario(
        scenario,
        label="t",
        url=url,
        tries=tries,
        backoff_base=backoff_base,
        warmup=0,
        progress_bar=False,
    )
