"""How the decode section times one decoder on one body: median and best of timed rounds after
a parity call, two decoders in alternating rounds (auto against the decoder it picks), the
feature class's own cost, and one decode's peak memory in a fresh process.

`impl.bench.decode` runs these over every body and implementation and builds the tables.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any

from impl.decode import Completion, DecodeError
from impl.decode._features import classify

#: A call at least this long is timed over fewer rounds (its timer noise is already small).
SLOW_CALL = 0.1
#: ... and one at least this long (a Python parser on a 20 MB body) by the parity call alone
VERY_SLOW_CALL = 0.25


def time_decoder(
    decoder: Any, body: bytes, quick: bool, full: bool = False
) -> tuple[float, float, Completion | None]:
    """Median and best seconds per call of further calls, and the result (parity, warm-up)."""
    try:
        start = time.perf_counter()
        result = decoder.decode(body)
        first = time.perf_counter() - start
    except DecodeError:
        return float("nan"), float("nan"), None
    if (quick and first >= SLOW_CALL) or (not full and first >= VERY_SLOW_CALL):
        return first, first, result  # a slow call is timed once: the parity call itself
    number, rounds, min_time = 1, 2 if quick else 5, 0.01 if quick else 0.04
    while True:  # calls per round: enough for `min_time`, so small bodies are not all timer
        start = time.perf_counter()
        for _ in range(number):
            decoder.decode(body)
        elapsed = time.perf_counter() - start
        if elapsed >= min_time or number >= 1 << 16:
            break
        number *= 2
    samples = [elapsed / number]
    if samples[0] >= SLOW_CALL and not full:
        rounds = 1 if quick else 3
    for _ in range(rounds - 1):
        start = time.perf_counter()
        for _ in range(number):
            decoder.decode(body)
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples), min(samples), result


def paired(a: Any, b: Any, body: bytes, quick: bool) -> tuple[float, float, float]:
    """Best seconds per call of a.decode and b.decode, and the median of a/b per round.

    Rounds alternate which goes first; each round times both back to back, so a round's ratio
    is taken under the same conditions for both. On a shared machine the time per call drifts,
    so the ratio of the two bests moves even between two objects of one decoder, while the
    median of the per-round ratios stays close to 1 in the same runs (docs/measurements.md,
    the real-text decode entry).
    """
    number, rounds = 1, 5 if quick else 31
    while True:
        start = time.perf_counter()
        for _ in range(number):
            b.decode(body)
        if time.perf_counter() - start >= 0.005 or number >= 1 << 16:
            break
        number *= 2
    best = [float("inf"), float("inf")]
    ratios = []
    for round_ in range(rounds):
        took = [0.0, 0.0]
        for i in (0, 1) if round_ % 2 else (1, 0):
            start = time.perf_counter()
            for _ in range(number):
                (a, b)[i].decode(body)
            took[i] = (time.perf_counter() - start) / number
            best[i] = min(best[i], took[i])
        ratios.append(took[0] / took[1])
    return best[0], best[1], statistics.median(ratios)


def features_seconds(body: bytes) -> float:
    """Best seconds per `classify(body)`: what auto pays where the class decides its pick."""
    return min(timeit.repeat(lambda: classify(body), number=200, repeat=5)) / 200


_MEMORY_SCRIPT = """
import sys
from impl import registry

def peak():  # VmHWM: this process's peak RSS (ru_maxrss would include the parent's, from fork)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))

body = open(sys.argv[2], "rb").read()
decoder = registry.create("decode", sys.argv[1])
decoder.decode(b'{"choices":[{"index":0,"token_ids":[1],"logprobs":{"token_logprobs":[-1.0]}}]}')
before = peak()
result = decoder.decode(body)
print(peak() - before)
"""


def peak_memory(names: list[str], body: bytes) -> dict[str, int | None]:
    """Peak RSS growth (bytes) of one decode of `body`, each implementation in its own process."""
    out: dict[str, int | None] = {}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        for name in names:
            proc = subprocess.run(
                [sys.executable, "-c", _MEMORY_SCRIPT, name, f.name],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ},
            )
            out[name] = int(proc.stdout.strip()) if proc.returncode == 0 else None
    return out
