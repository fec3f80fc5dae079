"""`hotpath bench` section for the encode family: Completion -> SampleResponse bytes, and JSON.

Per token count (`impl.measure.TOKENS`, one sequence): median time of each available
encoder, its ratio to the reference and parity (bytes equal to the reference's). Then the
proto -> legacy JSON derivations (parity = same parsed value as the reference, as float32).
The notes set the 262144-token encode against the fastest available decode of a realistic
262144-token vLLM body (`impl.workloads.synthetic.body_for`; the decode section's median when it ran
just before in this process, else measured here) and against `validated`.

Lengths: full = every `impl.measure.TOKENS`, median of 7 rounds >= 0.2 s; default =
`DEFAULT_TOKENS` (128/32768/262144), 5 rounds >= 0.1 s; quick = the same sizes (JSON derivation
up to 32768), 3 rounds >= 0.03 s.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from impl import registry
from impl.bench._common import Section
from impl.encode import JSON_IMPLEMENTATIONS, JSON_REFERENCE, json_implementation, samples
from impl.encode import json_unavailable_reason as _json_reason
from impl.measure import (
    DEFAULT_TOKENS,
    LARGEST_TOKENS,
    TOKENS,
    format_seconds,
    median_seconds,
    render_table,
)

FAMILY = "encode"


def _float32(value: Any) -> Any:
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, list):
        return [_float32(v) for v in value]
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    return value


def _encode_rows(sizes: tuple[int, ...], names: list[str], *, min_time: float, repeat: int):
    """Rows per (size, encoder), pick measurements, and the reference's bytes per size."""
    reference = registry.reference(FAMILY)
    encoders = {name: registry.create(FAMILY, name) for name in names}
    ref_encoder = encoders.get(reference)
    if ref_encoder is None and registry.unavailable_reason(FAMILY, reference) is None:
        ref_encoder = registry.create(FAMILY, reference)
    rows, measurements, encoded = [], [], {}
    for tokens in sizes:
        completion = samples.sized(tokens)
        expected = ref_encoder.encode(completion) if ref_encoder else None
        sized = []
        for name, encoder in encoders.items():
            out = encoder.encode(completion)
            seconds = median_seconds(
                lambda e=encoder, c=completion: e.encode(c), min_time=min_time, repeat=repeat
            )
            sized.append(
                {
                    "table": "encode",
                    "tokens": tokens,
                    "implementation": name,
                    "seconds": seconds,
                    "size_bytes": len(out),
                    "parity": None if expected is None else out == expected,
                }
            )
        ref_seconds = next((r["seconds"] for r in sized if r["implementation"] == reference), None)
        for row in sized:
            row["ratio"] = row["seconds"] / ref_seconds if ref_seconds else None
        cost = {r["implementation"]: r["seconds"] for r in sized if r["parity"] is not False}
        measurements.append(
            {"input": f"tokens-{tokens}", "size_bytes": sized[0]["size_bytes"], "cost": cost}
        )
        rows += sized
        if expected is not None:
            encoded[tokens] = expected
    return rows, measurements, encoded


def _json_rows(encoded: dict[int, bytes], *, min_time: float, repeat: int) -> list[dict]:
    names = [row.name for row in JSON_IMPLEMENTATIONS if _json_reason(row.name) is None]
    if JSON_REFERENCE not in names:
        return []
    rows = []
    for tokens, data in encoded.items():
        expected = _float32(json.loads(json_implementation(JSON_REFERENCE)(data)))
        ref_seconds = None
        for name in names:
            derive = json_implementation(name)
            parity = _float32(json.loads(derive(data))) == expected
            seconds = median_seconds(
                lambda d=derive, b=data: d(b), min_time=min_time, repeat=repeat
            )
            ref_seconds = seconds if name == JSON_REFERENCE else ref_seconds
            rows.append(
                {
                    "table": "json",
                    "tokens": tokens,
                    "implementation": name,
                    "seconds": seconds,
                    "parity": parity,
                }
            )
        for row in rows[-len(names) :]:
            row["ratio"] = row["seconds"] / ref_seconds if ref_seconds else None
    return rows


def fastest_decode(tokens: int = LARGEST_TOKENS) -> tuple[str, float] | None:
    """(name, median seconds) of the fastest decoder that runs here on a realistic body.

    Taken from the decode section when it ran in this process (its parity-checked medians of
    the same `body_for(tokens)`), so `hotpath bench` does not time the same decodes twice.
    """
    decode_bench = sys.modules.get("impl.bench.decode")
    measured = getattr(decode_bench, "LAST_SECONDS", {}).get(f"vllm-{tokens}")
    if measured:
        name = min(measured, key=measured.__getitem__)
        return f"decode/{name} (decode section)", measured[name]
    from impl.workloads.synthetic import body_for

    body = body_for(tokens)
    screened = {}
    for name in registry.available("decode"):
        if name in (registry.reference("decode"), "auto"):
            continue  # the clear-not-fast reference is never the fastest; it takes seconds here
        try:
            decoder = registry.create("decode", name)
            start = time.perf_counter()
            decoder.decode(body)  # one call each screens out the slow ones
            screened[name] = (time.perf_counter() - start, decoder)
        except Exception:  # a decoder not written yet, or failing: not a candidate
            continue
    best = None
    for name in sorted(screened, key=lambda n: screened[n][0])[:2]:
        decoder = screened[name][1]
        seconds = median_seconds(lambda d=decoder: d.decode(body), min_time=0.3, repeat=3)
        if best is None or seconds < best[1]:
            best = (f"decode/{name}", seconds)
    if best is None:
        try:
            import orjson
        except ImportError:
            return None
        seconds = median_seconds(lambda: orjson.loads(body), min_time=0.3, repeat=3)
        best = ("orjson.loads alone (no decoder available)", seconds)
    return best


def _table(rows: list[dict], sizes: tuple[int, ...], with_size: bool) -> str:
    tables = []
    for tokens in sizes:
        sized = [r for r in rows if r["tokens"] == tokens]
        headers = ["implementation", "median", "× ref", "parity"] + (["bytes"] if with_size else [])
        body = [
            [
                r["implementation"],
                format_seconds(r["seconds"]),
                f"{r['ratio']:.2f}" if r.get("ratio") else "-",
                {True: "✓", False: "✗"}.get(r["parity"], "?"),
            ]
            + ([r["size_bytes"]] if with_size else [])
            for r in sized
        ]
        tables.append(f"{tokens} tokens\n{render_table(headers, body)}")
    return "\n\n".join(tables)


def run(quick: bool, full: bool = False) -> Section:
    sizes = TOKENS if full else DEFAULT_TOKENS
    min_time, repeat = (0.2, 7) if full else (0.03, 3) if quick else (0.1, 5)
    names = list(registry.available(FAMILY))
    rows, measurements, encoded = _encode_rows(sizes, names, min_time=min_time, repeat=repeat)
    if quick:  # the json reference is slow at 262144 tokens
        encoded = {tokens: data for tokens, data in encoded.items() if tokens <= 32768}
    json_rows = _json_rows(encoded, min_time=min_time, repeat=3 if quick else 5)
    table = (
        f"{_table(rows, sizes, True)}\n\nproto -> legacy JSON (parity: same parsed value as "
        f"{JSON_REFERENCE}, float32)\n\n{_table(json_rows, tuple(encoded), False)}"
    )
    notes = []
    largest = max(sizes)
    at_largest = {
        r["implementation"]: r["seconds"] for r in rows if r["tokens"] == largest and r["parity"]
    }
    if at_largest:
        best = min(at_largest, key=at_largest.__getitem__)
        if "validated" in at_largest:
            notes.append(
                f"{largest} tokens: {best} {format_seconds(at_largest[best])}, "
                f"{at_largest['validated'] / at_largest[best]:.0f}x faster than validated"
            )
        decode = fastest_decode(largest)
        if decode is not None:
            notes.append(
                f"{largest} tokens: {best} costs {100 * at_largest[best] / decode[1]:.1f}% of the "
                f"fastest decode of a realistic body ({decode[0]}: {format_seconds(decode[1])})"
            )
            rows.append(
                {
                    "table": "decode-comparison",
                    "tokens": largest,
                    "implementation": decode[0],
                    "seconds": decode[1],
                }
            )
    return Section(
        family=FAMILY,
        title="encode: Completion -> SampleResponse bytes (one sequence of N tokens)",
        table=table,
        rows=rows + json_rows,
        measurements=measurements,
        notes="\n".join(notes),
    )
