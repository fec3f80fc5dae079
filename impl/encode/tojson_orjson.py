"""Legacy JSON from stored SampleResponse bytes with a zero-copy wire reader + orjson.

Technique: `_common.read_fields` walks the wire bytes and hands out memoryview slices;
`np.frombuffer` views them without copying; orjson serializes the int32/float32 arrays
natively (`OPT_SERIALIZE_NUMPY`, C speed, NaN/±inf as null, shortest float32 repr). Only the
top-k rows become Python lists (their trailing padding is dropped row by row). Same JSON value
as the reference (`tokens` ints, floats equal as float32); see `impl.encode.tojson_json`.
Dependency: orjson (`hotpath[fast]`); no protobuf needed.
"""

from __future__ import annotations

import numpy as np
import orjson

from impl.encode._common import STOP_REASON_NAMES, read_fields, topk_rows

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _last(fields: dict, number: int, default=None):
    values = fields.get(number)
    return values[-1] if values else default


def proto_to_json(data: bytes) -> bytes:
    """Legacy JSON of SampleResponse bytes (shape: `impl.encode.tojson_json`)."""
    response = read_fields(memoryview(data))
    sequences = []
    for raw in response.get(1, ()):
        seq = read_fields(raw)
        code = _last(seq, 1, 0)
        if code not in STOP_REASON_NAMES:
            raise ValueError(f"unknown stop_reason enum value {code}")
        logprobs = _last(seq, 3)
        sequences.append(
            {
                "stop_reason": STOP_REASON_NAMES[code],
                "tokens": np.frombuffer(_last(seq, 2, b""), "<i4"),
                "logprobs": np.frombuffer(logprobs, "<f4") if logprobs else None,
            }
        )
    prompt = _last(response, 2)
    topk = None
    if 3 in response:
        matrix = read_fields(response[3][-1])
        n, k = _last(matrix, 4, 0), _last(matrix, 3, 0)
        if n and k:
            ids = np.frombuffer(_last(matrix, 1), "<i4").reshape(n, k)
            lps = np.frombuffer(_last(matrix, 2), "<f4").reshape(n, k)
            topk = topk_rows(ids, lps)
    return orjson.dumps(
        {
            "sequences": sequences,
            "prompt_logprobs": np.frombuffer(prompt, "<f4") if prompt else None,
            "topk_prompt_logprobs": topk,
        },
        option=_OPTIONS,
    )
