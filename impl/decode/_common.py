"""Helpers shared by the fast decoders: checked list -> numpy conversions and the fallback.

Every fast decoder follows one rule for exactness: when its own path meets anything it is not
sure about (its library rejects the body, an array is not purely numeric, a key is duplicated),
it hands the body to the reference (`impl.decode.json`), which either decodes it or raises the
right `DecodeError`. The conversions here reproduce the reference's per-element checks with
C-speed numpy and `set(map(type, ...))` scans.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from impl.decode import Completion, DecodeError, Sequence, TopK, _packed, decode_error
from impl.decode.json import INT32_MAX, INT32_MIN, JsonDecoder

_REFERENCE = JsonDecoder()
_NONE = type(None)
_EMPTY_I = np.zeros(0, dtype=np.int32)
_EMPTY_F = np.zeros(0, dtype=np.float32)


class Unsure(Exception):
    """A fast path cannot vouch for this body: the reference must decide."""


def as_bytes(body: Any) -> bytes:
    return body if type(body) is bytes else bytes(body)


def reference(body: bytes, prompt_tokens: Seq[int] | None, k: int) -> Completion:
    """The reference decoder: the fallback that decodes or raises the right `DecodeError`."""
    return _REFERENCE.decode(body, prompt_tokens=prompt_tokens, topk_prompt_logprobs=k)


_WS = b" \t\n\r"
_FEW = 64  # '[' bytes examined one by one before switching to the vectorised scan


def may_nest_arrays(body: bytes) -> bool:
    """False only if no JSON array in `body` (valid JSON) has an array among its elements.

    In valid JSON an array that is an element of an array starts with a `[` whose previous
    byte other than JSON whitespace is `[` or `,`. So if no `[` byte in the body (outside or
    inside strings) is preceded that way, no array holds an array: exact, not a heuristic.
    A `[` so preceded inside a string only makes the answer a conservative True.
    """
    find, at, seen = body.find, body.find(b"["), 0
    while at >= 0 and seen < _FEW:  # memchr: vLLM bodies hold a handful of '['
        j = at - 1
        while j >= 0 and body[j] in _WS:
            j -= 1
        if j >= 0 and body[j] in b"[,":
            return True
        at, seen = find(b"[", at + 1), seen + 1
    if at < 0:
        return False
    raw = np.frombuffer(body, dtype=np.uint8)
    before = np.flatnonzero(raw[at:] == ord("[")) + at - 1  # the byte before each '['
    while len(before):
        before = before[before >= 0]
        prev = raw[before]
        if np.any((prev == ord("[")) | (prev == ord(","))):
            return True
        ws = (prev == 32) | (prev == 9) | (prev == 10) | (prev == 13)
        before = before[ws] - 1  # walk back over whitespace, only where there is some
    return False


def stop_reason(finish: Any) -> str:
    return "stop" if finish in ("stop", "stop_token") else "length"


def tokens_from_list(values: Any, body: bytes) -> np.ndarray:
    """`token_ids` as a Python list (or None) -> int32, with the reference's checks."""
    if values is None:
        return _EMPTY_I
    if type(values) is not list:
        raise decode_error("'token_ids' is not a list", body)
    if not values:
        return _EMPTY_I
    if set(map(type, values)) != {int}:  # bool, float, str, ... are not token ids
        raise decode_error("a token id is not an integer", body)
    try:
        wide = np.array(values, dtype=np.int64)
    except OverflowError:
        raise decode_error("a token id is outside int32", body) from None
    return int32_checked(wide, body)


def int32_checked(wide: np.ndarray, body: bytes) -> np.ndarray:
    if len(wide) and (wide.min() < INT32_MIN or wide.max() > INT32_MAX):
        raise decode_error("a token id is outside int32", body)
    return wide.astype(np.int32)


def logprobs_from_list(values: Any, n_tokens: int, body: bytes) -> np.ndarray:
    """`token_logprobs` as a Python list (or None) -> float32, with the reference's checks."""
    if values is not None and type(values) is not list:
        raise decode_error("'token_logprobs' is not a list", body)
    if not values:
        if n_tokens:
            return np.zeros(n_tokens, dtype=np.float32)
        return _EMPTY_F
    if len(values) != n_tokens:
        raise decode_error(f"{len(values)} logprobs for {n_tokens} tokens", body)
    types = set(map(type, values))
    if not types <= {float, int, _NONE}:
        raise decode_error("a logprob is not a number", body)
    if _NONE in types:
        values = [0.0 if value is None else value for value in values]
    try:
        doubles = np.array(values, dtype=np.float64)
    except OverflowError:
        raise decode_error("a logprob is not a finite double", body) from None
    return float32_checked(doubles, body)


def float32_checked(doubles: np.ndarray, body: bytes) -> np.ndarray:
    """Finite doubles -> float32 (the one rounding step every decoder shares)."""
    if not np.isfinite(doubles).all():
        raise decode_error("a logprob is not a finite double", body)
    with np.errstate(over="ignore"):
        return doubles.astype(np.float32)


def prompt_arrays(
    first: dict, body: bytes, prompt_tokens: Seq[int] | None, k: int
) -> tuple[np.ndarray | None, TopK | None]:
    """Prompt logprobs from the first choice (a small dict); the reference's rules."""
    if first.get("prompt_logprobs") is None:
        return None, None
    return _REFERENCE._prompt(first, body, prompt_tokens, k)


def completion_from_document(
    doc: Any, body: bytes, prompt_tokens: Seq[int] | None, k: int
) -> Completion:
    """A parsed document (dicts and lists, as json/orjson/ujson give it) -> `Completion`."""
    if type(doc) is not dict or type(doc.get("choices")) is not list:
        raise decode_error("no 'choices' list at the top level", body)
    choices = doc["choices"]
    for choice in choices:
        if type(choice) is not dict:
            raise decode_error("a choice is not an object", body)
        if type(choice.get("index")) is not int:
            raise decode_error("a choice has no integer 'index'", body)
    choices = sorted(choices, key=lambda choice: choice["index"])
    sequences = []
    for choice in choices:
        tokens = tokens_from_list(choice.get("token_ids"), body)
        lp_obj = choice.get("logprobs")
        if lp_obj is not None and type(lp_obj) is not dict:
            raise decode_error("'logprobs' is not an object", body)
        values = None if lp_obj is None else lp_obj.get("token_logprobs")
        if lp_obj is not None:
            _packed.check(lp_obj.get(_packed.BLOCK), len(tokens), body)
        logprobs = logprobs_from_list(values, len(tokens), body)
        sequences.append(Sequence(tokens, logprobs, stop_reason(choice.get("finish_reason"))))
    if not choices:
        return Completion(sequences)
    return Completion(sequences, *prompt_arrays(choices[0], body, prompt_tokens, k))


__all__ = [
    "DecodeError",
    "Unsure",
    "as_bytes",
    "completion_from_document",
    "float32_checked",
    "int32_checked",
    "logprobs_from_list",
    "may_nest_arrays",
    "prompt_arrays",
    "reference",
    "stop_reason",
    "tokens_from_list",
]
