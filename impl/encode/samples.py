"""Seeded Completions for the encode family's tests and benchmarks, built from numpy arrays.

Built directly (not by decoding bodies) so the encode family can be tested on its own. Named
edge cases (`corpus()`) plus realistic sizes (`sized(tokens)`). Append-only: change a case's
name when changing its content, so benchmark history stays comparable.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from impl.decode import TOPK_PAD_LOGPROB, TOPK_PAD_TOKEN, Completion, Sequence, TopK
from impl.measure import TOKENS

SEED = 20261129


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([SEED, *key])


def _sequence(rng: np.random.Generator, n: int, stop_reason: str = "length") -> Sequence:
    tokens = rng.integers(0, 151_936, n, dtype=np.int32)
    logprobs = (-rng.exponential(1.5, n)).astype(np.float32)
    return Sequence(tokens, logprobs, stop_reason)  # type: ignore[arg-type]


def _prompt(rng: np.random.Generator, n: int) -> np.ndarray:
    values = (-rng.exponential(3.0, n)).astype(np.float32)
    if n:
        values[0] = np.nan  # the first prompt token never has a logprob
        values[rng.random(n) < 0.05] = np.nan
    return values


def _topk(rng: np.random.Generator, n: int, k: int) -> TopK:
    ids = rng.integers(1, 151_936, (n, k), dtype=np.int32)
    lps = np.sort(-rng.exponential(2.0, (n, k)).astype(np.float32), axis=1)[:, ::-1].copy()
    if n and k:
        kept = rng.integers(0, k + 1, n)  # ranks present per row; 0 = a fully padded row
        kept[0] = 0
        kept[-1] = k
        pad = np.arange(k) >= kept[:, None]
        ids[pad] = TOPK_PAD_TOKEN
        lps[pad] = TOPK_PAD_LOGPROB
    return TopK(ids, lps)


@cache
def sized(tokens: int) -> Completion:
    """One sequence of `tokens` tokens (stop reason "length"): the benchmark input."""
    return Completion([_sequence(_rng(1, tokens), tokens, "length")])


@cache
def corpus() -> dict[str, Completion]:
    """Named Completions covering the wire format's edge cases, and the benchmark sizes."""
    rng = _rng(2)
    special = _sequence(rng, 6, "stop")
    special.tokens[:] = [0, 1, 127, 128, 2**31 - 1, 151_935]
    special.logprobs[:] = [0.0, -0.0, -1e-45, -np.inf, -99999.0, np.float32(-0.1)]
    cases = {
        "no-sequences": Completion([]),
        "n1-stop": Completion([_sequence(rng, 40, "stop")]),
        "n1-empty-stop": Completion([_sequence(rng, 0, "stop")]),
        "n1-empty-length": Completion([_sequence(rng, 0, "length")]),
        "n4-mixed-with-empty": Completion(
            [
                _sequence(rng, 17, "stop"),
                _sequence(rng, 0, "stop"),
                _sequence(rng, 300, "length"),
                _sequence(rng, 0, "length"),
            ]
        ),
        # Lengths around the 1/2-byte varint boundary of the sequence and field sizes.
        "varint-boundaries": Completion(
            [_sequence(rng, n, "stop" if n % 2 else "length") for n in (1, 14, 15, 16, 31, 32, 33)]
        ),
        "special-values": Completion([special]),
        "prompt-nan": Completion([_sequence(rng, 50, "stop")], prompt_logprobs=_prompt(rng, 200)),
        "prompt-empty": Completion(
            [_sequence(rng, 5, "length")], prompt_logprobs=np.zeros(0, np.float32)
        ),
        "prompt-topk-padded": Completion(
            [_sequence(rng, 64, "stop"), _sequence(rng, 33, "length")],
            prompt_logprobs=_prompt(rng, 120),
            topk_prompt_logprobs=_topk(rng, 120, 5),
        ),
        "topk-k1": Completion(
            [_sequence(rng, 8, "stop")],
            prompt_logprobs=_prompt(rng, 30),
            topk_prompt_logprobs=_topk(rng, 30, 1),
        ),
        "topk-all-padded": Completion(
            [_sequence(rng, 3, "stop")],
            prompt_logprobs=np.full(4, np.nan, np.float32),
            topk_prompt_logprobs=TopK(
                np.full((4, 3), TOPK_PAD_TOKEN, np.int32),
                np.full((4, 3), TOPK_PAD_LOGPROB, np.float32),
            ),
        ),
        "topk-no-rows": Completion(
            [_sequence(rng, 3, "length")],
            prompt_logprobs=np.zeros(0, np.float32),
            topk_prompt_logprobs=TopK(np.zeros((0, 4), np.int32), np.zeros((0, 4), np.float32)),
        ),
        "topk-k0": Completion(
            [_sequence(rng, 2, "stop")],
            prompt_logprobs=_prompt(rng, 6),
            topk_prompt_logprobs=TopK(np.zeros((6, 0), np.int32), np.zeros((6, 0), np.float32)),
        ),
        "n8-prompt-topk": Completion(
            [
                _sequence(rng, int(n), "stop" if n % 3 else "length")
                for n in rng.integers(0, 2000, 8)
            ],
            prompt_logprobs=_prompt(rng, 1000),
            topk_prompt_logprobs=_topk(rng, 1000, 20),
        ),
    }
    cases.update({f"tokens-{n}": sized(n) for n in TOKENS})
    return cases
