"""`hotpath bench` decode section: every decoder on seeded vLLM bodies, checked for parity.

Per generated-token count and body: each implementation's median time, MB/s, ratio to the
reference and to orjson, and parity (its Completion equals the reference's on the same body,
bit for bit). Each measured row records its body's feature class (`impl.decode._features`)
and what computing it cost; `auto` is measured last, built from this run's rows, and compared
with the fastest (its pick per row, by size and class, in its own table). With `full`, peak
memory of decoding the 262144-token vLLM body is measured per implementation in a fresh
subprocess (growth of the peak RSS, VmHWM, across the one decode, so C/C++ heaps such as
simdjson's parser count too). The measurement rows feed `impl.pick` and
`auto`; the medians stay in `LAST_SECONDS` for the encode section's comparison.

Bodies: the original two, `minimal` and `vllm` (= `synthetic` rendered as json; labels
`minimal-N`, `vllm-N`), and the body kinds of `impl.workloads.realtext` in both renderings
(`KIND-RENDER-N`, e.g. `mixed-orjson-262144`). A kind that cannot be made here is left out with
its install hint in the notes.

Lengths: full = 4 token counts x every body, 5 rounds; default = 128/32768/262144 x the
original two, every kind x rendering at 262144 and `mixed` in both at 128 and 32768, 5 rounds
(3 for a call of at least 0.1 s; one of at least 0.25 s is timed once, by the parity call), no
memory table; quick = 128 (minimal, vllm), vllm at 32768 and 262144 and `mixed` in both
renderings at 262144, 2 rounds (a call of at least 0.1 s is timed once: the parity call).
"""

from __future__ import annotations

import json
import sys
import timeit
from typing import Any

from impl import registry
from impl.bench._common import Section
from impl.bench.decode_timing import (
    SLOW_CALL,
    VERY_SLOW_CALL,
    features_seconds,
    paired,
    peak_memory,
    time_decoder,
)
from impl.decode import Completion
from impl.decode._features import classify
from impl.decode.parity import same
from impl.measure import DEFAULT_TOKENS, LARGEST_TOKENS, TOKENS, format_seconds, render_table
from impl.workloads import realtext

FAMILY = "decode"
KINDS = ("minimal", "vllm")
#: every kind x rendering but synthetic/json, which is the `vllm` body
TEXT_BODIES = tuple(
    (kind, how)
    for kind in realtext.KINDS
    for how in realtext.RENDERS
    if (kind, how) != ("synthetic", "json")
)
_ORIGINAL = tuple((n, kind, "json") for n in TOKENS for kind in KINDS)
FULL_INPUTS = _ORIGINAL + tuple((n, k, r) for n in TOKENS for k, r in TEXT_BODIES)
INPUTS = (
    tuple(row for row in _ORIGINAL if row[0] in DEFAULT_TOKENS)
    + tuple((n, "mixed", how) for n in DEFAULT_TOKENS[:-1] for how in realtext.RENDERS)
    + tuple((LARGEST_TOKENS, k, r) for k, r in TEXT_BODIES)
)
QUICK_INPUTS = (
    (128, "minimal", "json"),
    *((n, "vllm", "json") for n in DEFAULT_TOKENS),
    *((LARGEST_TOKENS, "mixed", how) for how in realtext.RENDERS),
)
MEMORY_TOKENS = LARGEST_TOKENS
#: label -> {implementation: median seconds} of the last `run` in this process.
LAST_SECONDS: dict[str, dict[str, float]] = {}


def run(quick: bool, full: bool = False) -> Section:
    names = [name for name in registry.available(FAMILY) if name != "auto"]
    reference = registry.reference(FAMILY)
    decoders = {name: registry.create(FAMILY, name) for name in names}
    rows: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []
    expected: dict[str, Completion | None] = {}
    all_bests: dict[str, dict[str, float]] = {}
    LAST_SECONDS.clear()
    inputs, skipped = _runnable(QUICK_INPUTS if quick else FULL_INPUTS if full else INPUTS)
    bodies: dict[str, tuple[int, str, str, bytes]] = {}
    for tokens, kind, how in inputs:
        body = realtext.body_for(tokens, kind=kind, render_as=how)
        label = input_label(tokens, kind, how)
        bodies[label] = (tokens, kind, how, body)
        print(f"  {label} ({len(body) / 1e6:.2f} MB)", file=sys.stderr, flush=True)
        times, bests, results = {}, {}, {}
        for name in names:
            times[name], bests[name], results[name] = time_decoder(
                decoders[name], body, quick, full
            )
        want = expected[label] = results[reference]
        parity = {
            name: want is not None and results[name] is not None and same(results[name], want)
            for name in names
        }
        cost = {name: times[name] for name in names if parity[name]}
        measurements.append(
            {
                "input": label,
                "size_bytes": len(body),
                "features": classify(body),
                "features_seconds": features_seconds(body),
                "cost": cost,
            }
        )
        LAST_SECONDS[label] = cost
        for name in names:
            row = _row(label, tokens, kind, how, len(body), name, times, parity[name], reference)
            rows.append(_add_best(row, bests))
        all_bests[label] = bests
    # auto: built from this run's rows, then timed against the fastest in alternating rounds
    # (ratio = the median of the per-round ratios: dispatch cost + what noise remains).
    auto = registry.create(FAMILY, "auto", rows=measurements)
    auto_rows = []
    for row in measurements:
        tokens, kind, how, body = bodies[row["input"]]
        fastest = min(row["cost"], key=row["cost"].get)
        median, best, result = time_decoder(auto, body, quick, full)
        chosen = auto.choose(body)  # by size, and by the body's feature class where that pays
        # Against the very object auto delegates to: the difference is the dispatch alone.
        direct = auto.decoder_for(body) if chosen == fastest else decoders[fastest]
        seconds, beside, ratio = paired(auto, direct, body, quick)
        # what auto adds to the call it delegates: `bisect`, and the feature class where it counts
        dispatch = min(timeit.repeat(lambda b=body: auto.decoder_for(b), number=2000, repeat=5))
        dispatch /= 2000
        times = {**row["cost"], "auto": median}
        parity = result is not None and same(result, expected[row["input"]])
        auto_row = _row(
            row["input"], tokens, kind, how, len(body), "auto", times, parity, reference
        )
        rows.append(_add_best(auto_row, {**all_bests[row["input"]], "auto": best}))
        rows[-1]["auto_vs_fastest"] = ratio
        rows[-1]["auto_dispatch_seconds"] = dispatch
        rows[-1]["auto_pick"] = chosen
        rows[-1]["features"] = row["features"]
        auto_rows.append(
            [
                row["input"],
                row["features"],
                format_seconds(row["features_seconds"]),
                chosen,
                fastest,
                format_seconds(seconds),
                format_seconds(beside),
                f"{ratio:.3f}",
                format_seconds(dispatch),
            ]
        )
    memory_body = realtext.body_for(MEMORY_TOKENS, kind="vllm")
    memory = peak_memory([*names, "auto"], memory_body) if full else {}
    for name, peak in memory.items():
        for row in rows:
            if row["implementation"] == name and row["input"] == f"vllm-{MEMORY_TOKENS}":
                row["peak_memory_bytes"] = peak
    return Section(
        family=FAMILY,
        title=(
            "decode: vLLM /v1/completions body -> numpy "
            "(median per call; parity = equals the reference bit for bit)"
        ),
        table=_table(rows)
        + "\n\n"
        + render_table(
            [
                "input",
                "class",
                "class cost",
                "auto picks",
                "fastest",
                "auto (best)",
                "fastest (best)",
                "auto/fastest",
                "dispatch cost",
            ],
            auto_rows,
        )
        + "\n\n"
        + _memory_table(memory, len(memory_body)),
        rows=rows,
        measurements=measurements,
        notes=_notes(rows) + _kinds_note(rows, skipped) + _method(quick, full),
    )


def input_label(tokens: int, kind: str, how: str) -> str:
    """`minimal-N` / `vllm-N` for the original bodies (as recorded before), else KIND-RENDER-N."""
    if kind in KINDS and how == "json":
        return f"{kind}-{tokens}"
    return f"{kind}-{how}-{tokens}"


def _runnable(inputs: tuple) -> tuple[list[tuple[int, str, str]], dict[str, str]]:
    """The inputs that can be made here, and {kind/render: why not} for the others."""
    keep, skipped = [], {}
    for tokens, kind, how in inputs:
        reason = realtext.unavailable_reason(kind, how)
        if reason is None:
            keep.append((tokens, kind, how))
        else:
            skipped[f"{kind}/{how}"] = reason
    return keep, skipped


def _kinds_note(rows: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    """Per body at the largest size: the fastest decoder's GB/s and the spread over bodies."""
    largest = [
        r
        for r in rows
        if r["tokens"] == LARGEST_TOKENS and r["parity"] and r["implementation"] != "auto"
        and r["body"] != "minimal"
    ]  # fmt: skip
    best: dict[str, dict[str, Any]] = {}
    for r in largest:
        if r["input"] not in best or r["seconds"] < best[r["input"]]["seconds"]:
            best[r["input"]] = r
    lines = [
        f"{label}: {r['implementation']} {r['mb_per_s'] / 1e3:.2f} GB/s"
        for label, r in sorted(best.items(), key=lambda item: -item[1]["mb_per_s"])
    ]
    out = f"\nFastest per body at {LARGEST_TOKENS} tokens (median): " + "; ".join(lines) + "."
    if skipped:
        out += "\nNot measured here: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    return out if lines or skipped else ""


def _method(quick: bool, full: bool) -> str:
    if full:
        return "\nMedian of 5 timed rounds per input (after one warm-up/parity call)."
    if quick:
        return (
            "\n--quick: median of 2 timed rounds after one warm-up/parity call; a call taking "
            f">= {SLOW_CALL:g} s is timed once (the parity call itself). `--full` for every size."
        )
    return (
        "\nMedian of 5 timed rounds per input after one warm-up/parity call (3 when one call "
        f"takes >= {SLOW_CALL:g} s; one taking >= {VERY_SLOW_CALL:g} s is timed once, by the "
        "parity call). `--full` adds 8192 tokens, every body at every size, 5 rounds "
        "everywhere and the peak-memory table."
    )


def _row(
    label: str,
    tokens: int,
    kind: str,
    how: str,
    size: int,
    name: str,
    times: dict[str, float],
    parity: bool,
    reference: str,
) -> dict[str, Any]:
    seconds = times[name]
    return {
        "input": label,
        "tokens": tokens,
        "body": kind,
        "render": how,
        "size_bytes": size,
        "implementation": name,
        "seconds": seconds,
        "mb_per_s": size / seconds / 1e6 if seconds == seconds else None,
        "vs_reference": times[reference] / seconds if reference in times else None,
        "vs_orjson": times["orjson"] / seconds if "orjson" in times else None,
        "parity": parity,
    }


def _add_best(row: dict[str, Any], bests: dict[str, float]) -> dict[str, Any]:
    """The best (minimum) call too: on a shared machine the median carries neighbours' load."""
    row["best_seconds"] = bests[row["implementation"]]
    if "orjson" in bests:
        row["best_vs_orjson"] = bests["orjson"] / row["best_seconds"]
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None and value == value else "-"

    body = [
        [
            r["input"],
            f"{r['size_bytes'] / 1e6:.2f} MB",
            r["implementation"],
            format_seconds(r["seconds"]),
            format_seconds(r["best_seconds"]),
            f"{r['mb_per_s']:.0f}" if r["mb_per_s"] else "-",
            ratio(r["vs_reference"]),
            ratio(r["vs_orjson"]),
            "✓" if r["parity"] else "✗",
        ]
        for r in rows
    ]
    return render_table(
        [
            "input",
            "size",
            "implementation",
            "median",
            "best",
            "MB/s",
            "vs ref",
            "vs orjson",
            "parity",
        ],
        body,
    )


def _memory_table(memory: dict[str, int | None], size: int) -> str:
    if not memory:
        return "(peak memory of one decode: measured with `hotpath bench --full`)"
    body = [
        [
            name,
            "-" if peak is None else f"{peak / 1e6:.1f} MB",
            "-" if peak is None else f"{peak / size:.2f}x",
        ]
        for name, peak in memory.items()
    ]
    return (
        f"peak memory of one decode of the vllm-{MEMORY_TOKENS} body ({size / 1e6:.1f} MB): "
        "growth of the peak RSS (VmHWM) in a fresh process\n"
        + render_table(["implementation", "peak growth", "x body"], body)
    )


def _notes(rows: list[dict[str, Any]]) -> str:
    target = [
        r
        for r in rows
        if r["input"] == f"vllm-{MEMORY_TOKENS}" and r["parity"] and r["implementation"] != "auto"
    ]
    if not target:
        return ""
    top = min(target, key=lambda r: r["seconds"])
    return (
        f"vllm-{MEMORY_TOKENS}: fastest {top['implementation']}, median "
        f"{format_seconds(top['seconds'])}: {top['vs_orjson']:.1f}x faster than the orjson path "
        f"by median, {top.get('best_vs_orjson', float('nan')):.1f}x by best call."
    )


if __name__ == "__main__":  # python -m impl.bench.decode [--quick | --full]
    section = run(quick="--quick" in sys.argv, full="--full" in sys.argv)
    print(section.title, section.table, section.notes, sep="\n\n")
    print(json.dumps(section.measurements, indent=1))
