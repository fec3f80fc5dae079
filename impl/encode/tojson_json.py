"""Legacy JSON from stored SampleResponse bytes with protobuf + stdlib json; the reference.

Technique: parse with the generated `sample_pb2` messages, turn each buffer into Python lists
(`np.frombuffer(...).tolist()`), build the legacy dict, `json.dumps`. One Python object per
token: clear rather than fast; it defines the JSON every other derivation must match.

The JSON says what the SDK's proto decoder (`tinker.proto.response_conv`) makes of the same
bytes, so a JSON client and a proto client see the same result:
- `stop_reason` is `"stop"` or `"length"` (the SDK's `StopReason` strings);
- `tokens` a list of ints; `logprobs` a list of floats, or null when the field is absent or
  empty (the SDK gives `logprobs_np=None` for empty bytes, i.e. for an empty sequence);
- `prompt_logprobs` null when absent or empty, else one float or null (NaN) per position;
- `topk_prompt_logprobs` null when absent or when the matrix has no rows or k = 0; else one
  entry per prompt position: null where the rank-1 cell is padding (token 0, -99999.0),
  otherwise `[[token, logprob], ...]` with the trailing padding cells dropped (rank padding);
- non-finite floats (NaN, ±inf) are null: JSON has no literal for them.
Floats are written as the float32 value widened to float64 (`-0.10000000149011612`);
other derivations may write the shortest float32 repr: parity is by parsed value as float32.
Dependency: protobuf (`hotpath[encode]`).
"""

from __future__ import annotations

import json
import math

import numpy as np

from impl.encode import sample_pb2
from impl.encode._common import STOP_REASON_NAMES, topk_rows


def _floats(data: bytes) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in np.frombuffer(data, "<f4").tolist()]


def proto_to_json(data: bytes) -> bytes:
    """Legacy JSON of SampleResponse bytes (see the module docstring for the shape)."""
    response = sample_pb2.SampleResponse.FromString(data)
    sequences = []
    for seq in response.sequences:
        if seq.stop_reason not in STOP_REASON_NAMES:
            raise ValueError(f"unknown stop_reason enum value {seq.stop_reason}")
        sequences.append(
            {
                "stop_reason": STOP_REASON_NAMES[seq.stop_reason],
                "tokens": np.frombuffer(seq.tokens, "<i4").tolist(),
                "logprobs": _floats(seq.logprobs) if seq.logprobs else None,
            }
        )
    prompt = _floats(response.prompt_logprobs) if response.prompt_logprobs else None
    topk = None
    if response.HasField("topk_prompt_logprobs"):
        matrix = response.topk_prompt_logprobs
        n, k = matrix.length, matrix.k
        if n and k:
            ids = np.frombuffer(matrix.token_ids, "<i4").reshape(n, k)
            lps = np.frombuffer(matrix.logprobs, "<f4").reshape(n, k)
            topk = topk_rows(ids, lps)
            for row in topk:
                for cell in row or ():
                    if not math.isfinite(cell[1]):
                        cell[1] = None
    return json.dumps(
        {"sequences": sequences, "prompt_logprobs": prompt, "topk_prompt_logprobs": topk},
        allow_nan=False,
    ).encode()
