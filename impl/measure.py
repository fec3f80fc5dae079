"""Timing, plain-text tables and the environment record: shared by everything that measures.

`hotpath bench`, the load harness's report, `hotpath profile`, the CI tools and the server's
start-up calibration all use these; the module imports only the standard library, so any of
them can depend on it without depending on each other.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Generated tokens per result that the benchmarks, `hotpath bench`, the profiles and the CI
#: gate measure at: a short answer, then long outputs up to a realistic 262144-token vLLM body.
#: Append-only, so results stay comparable across commits.
TOKENS = (128, 8192, 32768, 262144)
#: the largest: what the profiles and the gate decode and encode
LARGEST_TOKENS = TOKENS[-1]
#: the default `hotpath bench` run: every size but 8192 (`--full` adds it)
DEFAULT_TOKENS = tuple(n for n in TOKENS if n != 8192)

_VERSIONED = (
    "numpy",
    "orjson",
    "ujson",
    "msgspec",
    "pysimdjson",
    "protobuf",
    "pydantic",
    "httpx",
    "aiohttp",
    "httpx2",
    "httpx-aiohttp",
    "pyqwest",
    "pyreqwest",
    "rich",
    "picologging",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "tinker",
)


def environment() -> dict[str, Any]:
    """Python, CPU, library versions and git SHA: what produced a set of figures."""
    versions = {}
    for dist in _VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    with contextlib.suppress(ImportError):  # the simdjson the compiled decoder was built with
        from impl.decode import _simdjson_nogil

        versions["libsimdjson"] = _simdjson_nogil.SIMDJSON_VERSION
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = None
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "git_sha": sha,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def median_seconds(
    fn: Callable[[], object],
    *,
    min_time: float = 0.2,
    repeat: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time of one call of `fn`, over `repeat` rounds of at least `min_time` each.

    `clock` is wall time by default; `time.thread_time` counts only the calling thread's CPU.
    """
    fn()  # warm up
    number = 1
    while True:
        start = clock()
        for _ in range(number):
            fn()
        elapsed = clock() - start
        if elapsed >= min_time / repeat or number >= 1 << 20:
            break
        number *= 2
    samples = [elapsed / number]
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat - 1):
            start = clock()
            for _ in range(number):
                fn()
            samples.append((clock() - start) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(samples)


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned columns (left-aligned first column)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells[1:])
    return "\n".join(out)
