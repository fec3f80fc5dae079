"""The old path, kept as the slow end of the comparison: Python lists, pydantic, then protobuf.

Technique: every buffer becomes a Python list (`tolist()`, one object per token), a pydantic
model validates them field by field (the response model a server builds and dumps as
JSON in the baseline configuration), and the protobuf messages are built back from the validated
lists through `np.array(...).tobytes()`. Per-token objects are created, validated and converted
back: that is what made per-result re-encoding cost milliseconds. Output bytes equal the reference's
(float32 -> Python float -> float32 is exact; NaN prompt positions travel as None and come
back as NaN, the canonical quiet NaN the decoders produce).
Dependencies: pydantic, protobuf (`hotpath[encode]`).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel

from impl.decode import Completion
from impl.encode import sample_pb2
from impl.encode._common import STOP_REASONS, check


class SequenceModel(BaseModel):
    stop_reason: Literal["stop", "length"]
    tokens: list[int]
    logprobs: list[float]


class TopKModel(BaseModel):
    length: int
    k: int
    rows: list[list[tuple[int, float]]]  # dense: every row holds k cells, padding included


class ResponseModel(BaseModel):
    sequences: list[SequenceModel]
    prompt_logprobs: list[float | None] | None = None
    topk_prompt_logprobs: TopKModel | None = None


def _to_model(completion: Completion) -> ResponseModel:
    checked = check(completion)
    reasons = {code: name for name, code in STOP_REASONS.items()}
    prompt = None
    if checked.prompt_logprobs is not None:
        prompt = [None if math.isnan(v) else v for v in checked.prompt_logprobs.tolist()]
    topk = None
    if checked.topk is not None:
        ids, lps = checked.topk
        rows = [
            list(zip(a, b, strict=True)) for a, b in zip(ids.tolist(), lps.tolist(), strict=True)
        ]
        topk = {"length": ids.shape[0], "k": ids.shape[1], "rows": rows}
    return ResponseModel.model_validate(
        {
            "sequences": [
                {"stop_reason": reasons[code], "tokens": t.tolist(), "logprobs": lp.tolist()}
                for code, t, lp in checked.sequences
            ],
            "prompt_logprobs": prompt,
            "topk_prompt_logprobs": topk,
        }
    )


class ValidatedEncoder:
    """`encode(completion) -> bytes` through a validated pydantic model."""

    def encode(self, completion: Completion) -> bytes:
        model = _to_model(completion)
        response = sample_pb2.SampleResponse()
        for seq in model.sequences:
            out = response.sequences.add()
            out.stop_reason = STOP_REASONS[seq.stop_reason]
            out.tokens = np.array(seq.tokens, dtype="<i4").tobytes()
            out.logprobs = np.array(seq.logprobs, dtype="<f4").tobytes()
        if model.prompt_logprobs is not None:
            values = [math.nan if v is None else v for v in model.prompt_logprobs]
            response.prompt_logprobs = np.array(values, dtype="<f4").tobytes()
        if model.topk_prompt_logprobs is not None:
            topk = model.topk_prompt_logprobs
            out = response.topk_prompt_logprobs
            out.SetInParent()
            cells = [cell for row in topk.rows for cell in row]
            out.token_ids = np.array([c[0] for c in cells], dtype="<i4").tobytes()
            out.logprobs = np.array([c[1] for c in cells], dtype="<f4").tobytes()
            out.k, out.length = topk.k, topk.length
        return response.SerializeToString()


def create() -> ValidatedEncoder:
    return ValidatedEncoder()
