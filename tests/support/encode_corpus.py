"""The encode family's test corpus and comparison helpers (shared by the encode test modules).

The Completions themselves come from `impl.encode.samples` (seeded, built from numpy arrays),
so the benchmarks and `hotpath bench` use the very same inputs.
"""

from __future__ import annotations

import math

import numpy as np

from impl.decode import TOPK_PAD_LOGPROB, TOPK_PAD_TOKEN, Completion
from impl.encode import JSON_IMPLEMENTATIONS, json_unavailable_reason, samples
from tests.support.params import family_params, skipped_unless_available

CORPUS: dict[str, Completion] = samples.corpus()
CASES = list(CORPUS)


def encoder_params() -> list:
    """Every registered encoder, reference first; unavailable ones skipped with their hint."""
    return family_params("encode")


def json_params() -> list:
    """Every registered proto->JSON derivation; unavailable ones skipped with their hint."""
    return skipped_unless_available(
        [row.name for row in JSON_IMPLEMENTATIONS], json_unavailable_reason
    )


def as_float32(value: object) -> object:
    """A parsed JSON value with every float rounded to float32 (ints, None, str unchanged)."""
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, list | tuple):
        return [as_float32(v) for v in value]
    if isinstance(value, dict):
        return {k: as_float32(v) for k, v in value.items()}
    return value


def _floats(arr: np.ndarray) -> list:
    return [float(v) if math.isfinite(v) else None for v in arr.tolist()]


def expected_json(completion: Completion) -> dict:
    """The legacy JSON value for a Completion, written out plainly (loops, no vectorization)."""
    sequences = [
        {
            "stop_reason": seq.stop_reason,
            "tokens": [int(t) for t in seq.tokens],
            "logprobs": _floats(seq.logprobs) if len(seq.logprobs) else None,
        }
        for seq in completion.sequences
    ]
    prompt = completion.prompt_logprobs
    topk = completion.topk_prompt_logprobs
    rows = None
    if topk is not None and topk.token_ids.size:
        rows = []
        for ids, lps in zip(topk.token_ids.tolist(), topk.logprobs.tolist(), strict=True):
            cells = [[t, lp] for t, lp in zip(ids, lps, strict=True)]
            if cells[0] == [TOPK_PAD_TOKEN, TOPK_PAD_LOGPROB]:  # the SDK's rule: rank 1 padded
                rows.append(None)
                continue
            while cells[-1] == [TOPK_PAD_TOKEN, TOPK_PAD_LOGPROB]:
                cells.pop()
            rows.append([[t, lp if math.isfinite(lp) else None] for t, lp in cells])
    return as_float32(
        {
            "sequences": sequences,
            "prompt_logprobs": _floats(prompt) if prompt is not None and len(prompt) else None,
            "topk_prompt_logprobs": rows,
        }
    )


def same_float32(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality of two float32 arrays (NaN equals NaN of the same payload)."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a32.shape == b32.shape and bool(np.array_equal(a32.view(np.uint32), b32.view(np.uint32)))
