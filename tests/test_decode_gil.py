"""Decoders that say they release the GIL (`releases_gil`) let another Python thread run.

The claim is measured as a ratio in one run, never as a time: a pure-Python counting loop in a
second thread counts while the main thread decodes a ~20 MB vLLM body over and over, once with
the decoder under test and once with a GIL-holding decoder; the counter's rate must be clearly
higher with the first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from test_decode_parity import assert_same

from impl import registry
from impl.decode import releases_gil
from impl.harness import bodies

FAMILY = "decode"
HOLDING = next(
    (name for name in ("simdjson", "orjson", "json") if name in registry.available(FAMILY)), "json"
)


def nogil_params() -> list:
    """Available decoders that release the GIL; absent `*_nogil` ones skip with their hint."""
    params = []
    for name in registry.names(FAMILY):
        reason = registry.unavailable_reason(FAMILY, name)
        if reason is None and releases_gil(registry.create(FAMILY, name)):
            params.append(pytest.param(name, id=name))
        elif reason is not None and name.endswith("_nogil"):
            params.append(pytest.param(name, id=name, marks=pytest.mark.skip(reason=reason)))
    return params


ROUNDS = 5  # the best of a few rounds (stopping at the first that passes): load only hurts it
MARGIN = 1.5  # nogil must give the counter this many times the rate the GIL-holding one gives


def counter_rate(work: Callable[[], object], seconds: float) -> float:
    """Counts per second of a pure-Python loop in a second thread while `work` repeats."""
    stop = [False]
    counted = [0]

    def count() -> None:
        n = 0
        while not stop[0]:
            n += 1
        counted[0] = n

    thread = threading.Thread(target=count)
    start = time.perf_counter()
    thread.start()
    while time.perf_counter() - start < seconds:
        work()
    stop[0] = True
    thread.join()
    return counted[0] / (time.perf_counter() - start)


@pytest.fixture(scope="module")
def big_body() -> bytes:
    body = bodies.body_for(262144, kind="vllm")
    assert len(body) > 19_000_000
    return body


def test_marker_says_who_releases_the_gil():
    assert releases_gil(registry.create(FAMILY, HOLDING)) is False
    assert releases_gil(object()) is False
    for name in registry.available(FAMILY):
        entry = registry.entry(FAMILY, name)
        if entry.module.endswith("nogil"):
            assert releases_gil(registry.create(FAMILY, name)) is True


@pytest.mark.parametrize("name", nogil_params())
def test_another_thread_runs_during_a_20mb_decode(name, big_body):
    decoder = registry.create(FAMILY, name)
    holding = registry.create(FAMILY, HOLDING)
    assert_same(decoder.decode(big_body), holding.decode(big_body))
    seconds = 0.6
    ratios = []
    for _ in range(ROUNDS):
        free = counter_rate(lambda: decoder.decode(big_body), seconds)
        held = counter_rate(lambda: holding.decode(big_body), seconds)
        ratios.append(free / max(held, 1.0))
        if ratios[-1] >= MARGIN:
            break
    assert max(ratios) >= MARGIN, (
        f"a Python thread ran only {max(ratios):.2f}x as fast during {name} as during "
        f"{HOLDING} (rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
    )


def test_auto_releases_the_gil_only_when_every_step_does():
    if "simdjson_nogil" not in registry.available(FAMILY):
        pytest.skip(str(registry.unavailable_reason(FAMILY, "simdjson_nogil")))
    only_nogil = [{"input": "big", "size_bytes": 10**6, "cost": {"simdjson_nogil": 1.0}}]
    mixed = [*only_nogil, {"input": "small", "size_bytes": 100, "cost": {"json": 1.0}}]
    assert releases_gil(registry.create(FAMILY, "auto", rows=only_nogil)) is True
    assert releases_gil(registry.create(FAMILY, "auto", rows=mixed)) is False
