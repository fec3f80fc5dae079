"""How much of its solo rate a pure-Python thread keeps while the main thread decodes 20 MB.

A counting loop runs in a second thread for `SECONDS` while the main thread (a) sleeps (the
solo rate), (b) decodes the 262144-token vLLM body (21.5 MB) over and over with each decoder
that releases the GIL (`onepass_nogil`, `onepass_nogil_avx2`, `simdjson_nogil`), (c) does the
same with a GIL-holding decoder (`simdjson`, else `orjson`). Rounds alternate them; the medians
are printed as fractions of the solo rate. On a machine with a free second core the GIL-free
decoders should leave the counter most of its rate; a GIL-holding one leaves it what the
interpreter's 5 ms switch interval allows. Run: `python -m impl.probes.gil_share [ROUNDS]` (a
figure, not a test: tests/decode/test_gil.py asserts the claim by counting the turns another
thread gets while the GIL is released, with forced switching off).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable

from impl import registry
from impl.decode import releases_gil
from impl.workloads.synthetic import body_for

SECONDS = 1.0


def counter_rate(work: Callable[[], object] | None) -> float:
    """Counts per second of a pure-Python loop in a second thread while `work` repeats."""
    stop = False
    counted = 0

    def count() -> None:
        nonlocal counted
        n = 0
        while not stop:
            n += 1
        counted = n

    thread = threading.Thread(target=count)
    start = time.perf_counter()
    thread.start()
    while time.perf_counter() - start < SECONDS:
        if work is None:
            time.sleep(0.01)
        else:
            work()
    stop = True
    thread.join()
    return counted / (time.perf_counter() - start)


def main(rounds: int = 5) -> int:
    available = registry.available("decode")
    decoders = {name: registry.create("decode", name) for name in available if name != "auto"}
    free = {name: decoder for name, decoder in decoders.items() if releases_gil(decoder)}
    if not free:
        print(registry.unavailable_reason("decode", "onepass_nogil"))
        return 2
    holding_name = next(n for n in ("simdjson", "orjson", "json") if n in available)
    holding = decoders[holding_name]
    body = body_for(262144, kind="vllm")
    runs: dict[str, list[float]] = {"solo": [], **{name: [] for name in free}, holding_name: []}
    for _ in range(rounds):
        runs["solo"].append(counter_rate(None))
        for name, decoder in free.items():
            runs[name].append(counter_rate(lambda decoder=decoder: decoder.decode(body)))
        runs[holding_name].append(counter_rate(lambda: holding.decode(body)))
    solo = statistics.median(runs["solo"])
    print(f"{len(body) / 1e6:.1f} MB body, {rounds} rounds of {SECONDS:.0f} s each")
    for name, rates in runs.items():
        share = statistics.median(rates) / solo
        spread = ", ".join(f"{rate / solo:.0%}" for rate in rates)
        print(f"  main thread: {name:15} counter keeps {share:.0%} of its solo rate ({spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
