"""The decode family's one definition of "equal to the reference": bit for bit.

Two Completions are the same when they have the same number of sequences, and every array
(tokens, logprobs, prompt logprobs, top-k token ids and logprobs) has the same dtype, the same
shape and the same bytes: -0.0, NaN positions and float32 rounding all count; so do the stop
reasons and which optional parts are present. The parity tests, the asv and pytest-benchmark
suites and `hotpath bench` all use this one predicate.
"""

from __future__ import annotations

import numpy as np

from impl.decode import Completion


def array_difference(got: np.ndarray, want: np.ndarray, what: str = "array") -> str | None:
    """What first differs between two arrays (dtype, shape, then bytes), or None if the same."""
    if got.dtype != want.dtype:
        return f"{what}: dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"{what}: shape {got.shape} != {want.shape}"
    if got.tobytes() != want.tobytes():
        flat_got = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
        flat_want = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
        first = int(np.flatnonzero(flat_got != flat_want)[0]) // got.itemsize
        return f"{what}: differs from the reference near element {first}"
    return None


def _optional_difference(got: np.ndarray | None, want: np.ndarray | None, what: str) -> str | None:
    if got is None or want is None:
        return None if got is want else f"{what}: {_presence(got)} != {_presence(want)}"
    return array_difference(got, want, what)


def _presence(value: object) -> str:
    return "None" if value is None else "present"


def difference(got: Completion, want: Completion) -> str | None:
    """What first differs between `got` and the reference result `want`, or None if the same."""
    if len(got.sequences) != len(want.sequences):
        return f"{len(got.sequences)} sequences != {len(want.sequences)}"
    for i, (g, w) in enumerate(zip(got.sequences, want.sequences, strict=True)):
        found = array_difference(g.tokens, w.tokens, f"sequence {i} tokens")
        found = found or array_difference(g.logprobs, w.logprobs, f"sequence {i} logprobs")
        if found:
            return found
        if g.stop_reason != w.stop_reason:
            return f"sequence {i} stop_reason: {g.stop_reason!r} != {w.stop_reason!r}"
    found = _optional_difference(got.prompt_logprobs, want.prompt_logprobs, "prompt_logprobs")
    if found:
        return found
    g_topk, w_topk = got.topk_prompt_logprobs, want.topk_prompt_logprobs
    if g_topk is None or w_topk is None:
        if g_topk is w_topk:
            return None
        return f"topk_prompt_logprobs: {_presence(g_topk)} != {_presence(w_topk)}"
    return array_difference(
        g_topk.token_ids, w_topk.token_ids, "topk token_ids"
    ) or array_difference(g_topk.logprobs, w_topk.logprobs, "topk logprobs")


def same(got: Completion, want: Completion) -> bool:
    """True when `got` equals `want` bit for bit (see the module docstring)."""
    return difference(got, want) is None


def assert_same(got: Completion, want: Completion) -> None:
    """AssertionError saying what differs, for tests."""
    found = difference(got, want)
    if found is not None:
        raise AssertionError(found)
