"""How far this machine's own speed moves while nothing else of ours runs, beside a decode's.

On a shared virtual machine a fixed piece of work does not take a fixed time: the host's other
guests (one on the sibling hyperthread of our core, say) and its clock move it, and no change
to our code shows in that. This probe times, step after step, (a) a fixed computation that
stays in the core's caches (numpy sums of a 32 KB array: no memory traffic, no allocation, no
interpreter in its inner loop) and, right after it, (b) one decode of a real-text body at
TOKENS by DECODER. Each series is printed as min, quartiles, max and median/min, with the
correlation of the two across steps. When (b)'s median/min is about (a)'s and the two move
together, a decode's spread (the gap between a bench row's median and its best call) is the
machine's, not the decoder's: a median measured there is the machine's state at that moment.

    python -m impl.probes.machine_noise [--steps 120] [--decoder onepass_nogil_avx2]
        [--kind code] [--render json] [--tokens 262144]

Cited by docs/native.md (how noisy the machine is); its figures are in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from impl import registry
from impl.workloads import realtext

#: sums of the 32 KB array per step of (a): a few milliseconds on a 2.5 GHz core
SUMS = 2000


def spread(seconds: list[float]) -> str:
    """min, quartiles and max in ms, and median/min."""
    q1, median, q3 = statistics.quantiles(seconds, n=4)
    low, high = min(seconds), max(seconds)
    figures = " ".join(f"{value * 1e3:7.2f}" for value in (low, q1, median, q3, high))
    return f"{figures}   {median / low:5.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="steps, each (a) then (b)")
    parser.add_argument("--decoder", default="onepass_nogil_avx2", help="a decode family name")
    parser.add_argument("--kind", default="code", choices=realtext.KINDS)
    parser.add_argument("--render", default="json", choices=realtext.RENDERS)
    parser.add_argument("--tokens", type=int, default=262144)
    args = parser.parse_args()
    reason = registry.unavailable_reason("decode", args.decoder)
    if reason is not None:
        raise SystemExit(f"{args.decoder}: {reason}")
    decoder = registry.create("decode", args.decoder)
    body = realtext.body_for(args.tokens, kind=args.kind, render_as=args.render)
    array = np.random.default_rng(0).random(4096)  # 32 KB
    decoder.decode(body)
    fixed, decode = [], []
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.steps} steps", flush=True)
    for _ in range(args.steps):
        start = time.perf_counter()
        for _ in range(SUMS):
            array.sum()
        fixed.append(time.perf_counter() - start)
        start = time.perf_counter()
        decoder.decode(body)
        decode.append(time.perf_counter() - start)
    label = f"{args.decoder}, {args.kind}-{args.render}-{args.tokens} ({len(body) / 1e6:.1f} MB)"
    print(f"{'ms':52} {'min':>7} {'q1':>7} {'median':>7} {'q3':>7} {'max':>7}   med/min")
    print(f"{'(a) the fixed computation':52} {spread(fixed)}")
    print(f"{'(b) ' + label:52} {spread(decode)}")
    print(f"correlation of (a) and (b) across steps: {statistics.correlation(fixed, decode):.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
