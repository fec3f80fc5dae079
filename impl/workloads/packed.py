"""vLLM's packed completion logprobs: the `packed` rendering of every body kind.

A vLLM that knows `packed_top_logprobs` answers a `/v1/completions` request that sets it (with
`logprobs` > 0 and `return_tokens_as_token_ids: true`) with the candidates of each choice as
two base64 strings instead of `top_logprobs` dicts (docs/vllm-body.md): per choice,
`logprobs` becomes `{"text_offset", "token_logprobs", "tokens": ["token_id:N", ...],
"top_logprobs": [], "packed_top_logprobs": {"shape": [tokens, k], "token_ids_dtype": "<i4",
"logprobs_dtype": "<f4", "token_ids_b64", "logprobs_b64"}}`, the arrays raw little-endian
row-major bytes without a header. `text_offset` adds up the lengths of the `token_id:N`
strings, as vLLM does. Everything else in the body (text, token ids, prompt logprobs, usage)
is the JSON rendering's.

`packed_body` turns the `json` rendering of a generation into its packed rendering, given the
generation's top-1 candidates (k = 1: the bodies are logprobs=1), so both renderings carry the
same tokens and the same sampled logprobs, digit for digit (`text_candidates` and
`synthetic_candidates` are a generation's top-1 entries, those its json body lists).
`request_error` is the check vLLM's `CompletionRequest` makes of a packed request, and
`error_body` its 400 answer.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from impl.workloads import synthetic

#: What vLLM refuses a packed request for (its CompletionRequest validation).
_CONFLICTS = ("echo", "use_beam_search", "logprob_token_ids")


def wants_packed(request: dict[str, Any]) -> bool:
    """True when the request asks for packed logprobs (`packed_top_logprobs: true`)."""
    return request.get("packed_top_logprobs") is True


def request_error(request: dict[str, Any]) -> str | None:
    """Why vLLM refuses this packed request, or None when it qualifies (or is not packed)."""
    if not wants_packed(request):
        return None
    logprobs = request.get("logprobs")
    if type(logprobs) is not int or logprobs < 1:
        return "packed_top_logprobs requires logprobs > 0"
    if request.get("return_tokens_as_token_ids") is not True:
        return "packed_top_logprobs requires return_tokens_as_token_ids=true"
    for name in _CONFLICTS:
        if request.get(name):
            return f"packed_top_logprobs does not support {name}"
    return None


def error_body(message: str) -> bytes:
    """vLLM's 400 answer to a request its validation refuses (an OpenAI-style error)."""
    error = {"message": message, "type": "Bad Request", "param": None, "code": 400}
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(values.tobytes()).decode("ascii")


def logprobs_object(
    tokens: np.ndarray, token_logprobs: list[float], ids: np.ndarray, values: np.ndarray
) -> dict[str, Any]:
    """One choice's packed `logprobs` object: `ids`/`values` are its [tokens, k] candidates."""
    names = [f"token_id:{t}" for t in tokens.tolist()]
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(names) else lengths
    ids = np.ascontiguousarray(ids, dtype="<i4")
    values = np.ascontiguousarray(values, dtype="<f4")
    if ids.ndim != 2 or ids.shape != values.shape or len(ids) != len(names):
        raise ValueError(f"candidates of shape {ids.shape} and {values.shape} for {len(names)}")
    return {
        "text_offset": offsets.tolist(),
        "token_logprobs": [max(v, -9999.0) for v in token_logprobs],
        "tokens": names,
        "top_logprobs": [],
        "packed_top_logprobs": {
            "shape": [len(names), ids.shape[1]],
            "token_ids_dtype": "<i4",
            "logprobs_dtype": "<f4",
            "token_ids_b64": _b64(ids),
            "logprobs_b64": _b64(values),
        },
    }


def packed_body(json_body: bytes, candidates: list[tuple[np.ndarray, np.ndarray]]) -> bytes:
    """The packed rendering of a `json` rendering, with each choice's [tokens, k] candidate
    ids and float32 logprobs (in the body's choice order); rendered as Starlette does."""
    doc = json.loads(json_body)
    choices = doc["choices"]
    if len(choices) != len(candidates):
        raise ValueError(f"{len(candidates)} candidate arrays for {len(choices)} choices")
    for choice, (ids, values) in zip(choices, candidates, strict=True):
        tokens = np.asarray(choice["token_ids"], dtype=np.int32)
        lp = (choice.get("logprobs") or {}).get("token_logprobs") or [0.0] * len(tokens)
        choice["logprobs"] = logprobs_object(tokens, lp, ids, values)
    return json.dumps(
        doc, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def text_candidates(choice: Any) -> tuple[np.ndarray, np.ndarray]:
    """A real-text choice's top-1 candidates as [tokens, 1] ids and float32 logprobs."""
    has_top = choice.top_ids >= 0
    ids = np.where(has_top, choice.top_ids, choice.tokens).astype(np.int32)
    values = np.where(has_top, choice.top_logprobs, choice.logprobs).astype(np.float32)
    return ids[:, None], values[:, None]


def synthetic_candidates(choice: synthetic.GeneratedChoice) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic choice's top-1 candidates (those its `vllm` body lists) as [tokens, 1]."""
    alt_ids, other, alt_values = synthetic.top1(choice)
    ids = choice.tokens.astype(np.int32)
    values = choice.logprobs.astype(np.float32)
    ids[other], values[other] = alt_ids[other], alt_values
    return ids[:, None], values[:, None]
