"""Decoders that say they release the GIL (`releases_gil`) let another Python thread run.

Asserted by counting, not timing: with the interpreter's forced thread switching turned off
(`sys.setswitchinterval` far longer than the test), a second thread can take the GIL only when
the thread holding it gives it up. That thread counts the turns it gets while the main thread
is inside a decode of a ~20 MB vLLM body: a decoder that releases the GIL lets it in (at least
one turn within a bounded number of decodes), work that holds the GIL (stdlib `json.loads`, a
pure-Python loop) gets exactly none. How much the other thread keeps of its rate is a figure,
not a test: `python -m impl.probes.gil_share` measures it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable

import pytest

from impl import registry
from impl.decode import releases_gil
from impl.workloads import synthetic
from tests.decode.test_parity import assert_same

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


MAX_DECODES = 200  # a released GIL is taken within the first few; load only delays it
FORCED_SWITCH_OFF = 100.0  # seconds: longer than any run of this test


def turns_taken(work: Callable[[], object], *, repeats: int, until: int | None = None) -> int:
    """Turns a second thread got while `work` ran (up to `repeats` times, or until it got
    `until` turns), with forced switching off: only a voluntary release of the GIL lets it in."""
    state = {"inside": False, "stop": False, "turns": 0}

    def other() -> None:
        while not state["stop"]:
            if state["inside"]:
                state["turns"] += 1
            time.sleep(0)  # gives the GIL back, so the main thread always gets it again

    previous = sys.getswitchinterval()
    sys.setswitchinterval(FORCED_SWITCH_OFF)
    thread = threading.Thread(target=other)
    thread.start()
    try:
        for _ in range(repeats):
            state["inside"] = True
            work()
            state["inside"] = False
            if until is not None and state["turns"] >= until:
                break
    finally:
        state["stop"] = True
        sys.setswitchinterval(previous)
        thread.join()
    return state["turns"]


@pytest.fixture(scope="module")
def big_body() -> bytes:
    body = synthetic.body_for(262144, kind="vllm")
    assert len(body) > 19_000_000
    return body


def test_marker_says_who_releases_the_gil():
    assert releases_gil(registry.create(FAMILY, HOLDING)) is False
    assert releases_gil(object()) is False
    for name in registry.available(FAMILY):
        entry = registry.entry(FAMILY, name)
        if entry.module.endswith("nogil"):
            assert releases_gil(registry.create(FAMILY, name)) is True


@pytest.mark.heavy
def test_work_that_holds_the_gil_gives_no_turn(big_body):
    """The counting method itself: GIL-holding work of the same size lets no turn in."""
    assert turns_taken(lambda: json.loads(big_body), repeats=3) == 0
    assert turns_taken(lambda: sum(range(2_000_000)), repeats=3) == 0


@pytest.mark.parametrize("name", nogil_params())
@pytest.mark.heavy
def test_another_thread_runs_during_a_20mb_decode(name, big_body):
    decoder = registry.create(FAMILY, name)
    holding = registry.create(FAMILY, HOLDING)
    assert_same(decoder.decode(big_body), holding.decode(big_body))
    turns = turns_taken(lambda: decoder.decode(big_body), repeats=MAX_DECODES, until=1)
    assert turns >= 1, f"no other thread ran during {MAX_DECODES} decodes by {name}"


def test_auto_releases_the_gil_only_when_every_step_does():
    if "simdjson_nogil" not in registry.available(FAMILY):
        pytest.skip(str(registry.unavailable_reason(FAMILY, "simdjson_nogil")))
    only_nogil = [{"input": "big", "size_bytes": 10**6, "cost": {"simdjson_nogil": 1.0}}]
    mixed = [*only_nogil, {"input": "small", "size_bytes": 100, "cost": {"json": 1.0}}]
    assert releases_gil(registry.create(FAMILY, "auto", rows=only_nogil)) is True
    assert releases_gil(registry.create(FAMILY, "auto", rows=mixed)) is False
