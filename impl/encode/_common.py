"""Shared by the encoders and the JSON derivations: input checks, wire constants, a wire reader.

`check(completion)` is the one validation every encoder runs before producing any byte: it
returns the buffers as contiguous little-endian int32 / float32 arrays (no copy when they
already are, which is what every decoder returns) or raises `ValueError` saying what is wrong.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from impl.decode import TOPK_PAD_LOGPROB, TOPK_PAD_TOKEN, Completion

#: SampledSequence.stop_reason enum values (STOP is proto3's default and is never written).
STOP_REASONS: dict[str, int] = {"stop": 0, "length": 1}
STOP_REASON_NAMES: dict[int, str] = {code: name for name, code in STOP_REASONS.items()}

INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")


class Checked(NamedTuple):
    """A validated Completion: (stop code, tokens, logprobs) per sequence, optional extras."""

    sequences: list[tuple[int, np.ndarray, np.ndarray]]
    prompt_logprobs: np.ndarray | None
    topk: tuple[np.ndarray, np.ndarray] | None  # token_ids [n, k] int32, logprobs [n, k] float32


def _array(value: object, label: str, index: int, dtype: np.dtype, ndim: int) -> np.ndarray:
    """`value` as a contiguous `dtype` array; `label.format(index)` names it in errors."""
    if (
        type(value) is np.ndarray
        and (value.dtype is dtype or value.dtype == dtype)
        and value.ndim == ndim
        and value.flags.c_contiguous
    ):
        return value  # what every decoder returns: nothing to check or convert
    what = label.format(index)
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-D, got shape {arr.shape}")
    if dtype.kind == "i":
        if arr.dtype.kind not in "iu" and arr.size:
            raise ValueError(f"{what} must hold integers, got dtype {arr.dtype}")
        if arr.dtype != dtype and arr.size:
            info = np.iinfo(dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise ValueError(f"{what} has values outside int32")
    elif arr.dtype.kind not in "fiu" and arr.size:
        raise ValueError(f"{what} must hold numbers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def check(completion: Completion) -> Checked:
    """The Completion's buffers, ready to write; `ValueError` before any byte if malformed."""
    sequences = []
    for i, seq in enumerate(completion.sequences):
        code = STOP_REASONS.get(seq.stop_reason)  # type: ignore[call-overload]
        if code is None:
            raise ValueError(
                f"sequence {i}: unknown stop reason {seq.stop_reason!r}; "
                f"expected one of {', '.join(STOP_REASONS)}"
            )
        tokens = _array(seq.tokens, "sequence {} tokens", i, INT32, 1)
        logprobs = _array(seq.logprobs, "sequence {} logprobs", i, FLOAT32, 1)
        if len(tokens) != len(logprobs):
            raise ValueError(f"sequence {i}: {len(tokens)} tokens but {len(logprobs)} logprobs")
        sequences.append((code, tokens, logprobs))
    prompt = completion.prompt_logprobs
    if prompt is not None:
        prompt = _array(prompt, "prompt_logprobs", 0, FLOAT32, 1)
    topk = completion.topk_prompt_logprobs
    if topk is not None:
        ids = _array(topk.token_ids, "topk_prompt_logprobs.token_ids", 0, INT32, 2)
        lps = _array(topk.logprobs, "topk_prompt_logprobs.logprobs", 0, FLOAT32, 2)
        if ids.shape != lps.shape:
            raise ValueError(
                f"topk_prompt_logprobs: token_ids {ids.shape} but logprobs {lps.shape}"
            )
        return Checked(sequences, prompt, (ids, lps))
    return Checked(sequences, prompt, None)


_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def read_fields(data: memoryview) -> dict[int, list[int | memoryview]]:
    """Top-level fields of one message: number -> values (varints, or zero-copy slices)."""
    fields: dict[int, list[int | memoryview]] = {}
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 2:
            size, pos = _read_varint(data, pos)
            value = data[pos : pos + size]
            pos += size
        elif wire_type in (1, 5):  # fixed64 / fixed32: not in SampleResponse, skipped
            pos += 8 if wire_type == 1 else 4
            continue
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type} at byte {pos}")
        fields.setdefault(number, []).append(value)
    if pos != end:
        raise ValueError("truncated protobuf message")
    return fields


def topk_rows(token_ids: np.ndarray, logprobs: np.ndarray) -> list[list[list] | None]:
    """Top-k rows as the SDK's `topk_to_lists` gives them: a row whose rank-1 cell is padding
    is None; otherwise its trailing padding cells are dropped. Values as float32 -> float."""
    n, k = token_ids.shape
    if n == 0 or k == 0:
        return []
    pad = (token_ids == TOPK_PAD_TOKEN) & (logprobs == np.float32(TOPK_PAD_LOGPROB))
    # keep[i] = index past the last non-padding cell of row i (0 for a fully padded row)
    keep = np.where(pad.all(axis=1), 0, k - np.argmin(pad[:, ::-1], axis=1)).tolist()
    first_pad = pad[:, 0].tolist()
    ids = token_ids.tolist()
    lps = logprobs.tolist()
    rows: list[list[list] | None] = []
    for i in range(n):
        if first_pad[i]:
            rows.append(None)
        else:
            rows.append(
                [list(cell) for cell in zip(ids[i][: keep[i]], lps[i][: keep[i]], strict=True)]
            )
    return rows
