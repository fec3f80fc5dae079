"""One asample as the router request: its JSON body, what decoding needs, its expected size.

`build_request` turns a validated `AsampleRequest` into the router's JSON (prompt token ids,
`logprobs: 1` as an integer, `return_token_ids: true`, prompt_logprobs when asked, stop strings
or stop token ids) and a `Job`: that body, the `DecodeJob` of the answer and the answer's
expected size (`expected_body_bytes`, an upper estimate the body budget reserves for an answer
without a Content-Length). A shared store keeps a job's body and options (`Job.pack`) so that
another process can take the forward over (`Job.unpack`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from impl.server.offloop.decoding import DecodeJob
from impl.server.schemas import AsampleRequest


class SampleRejected(ValueError):
    """The request is valid JSON of the right shape but cannot be forwarded (a 422)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """What a forward needs (the request body lives here, never in the store)."""

    body: bytes
    decode: DecodeJob
    #: bytes the router's answer is expected to take (reserved in the BodyBudget)
    expected_bytes: int

    def pack(self) -> tuple[bytes, str]:
        """The router body and options as a shared store keeps them (for a takeover)."""
        decode = self.decode
        keep = int(decode.prompt_tokens is not None)
        options = f"{decode.n} {decode.topk} {int(decode.include_prompt_logprobs)} {keep}"
        return self.body, f"{options} {self.expected_bytes}"

    @classmethod
    def unpack(cls, body: bytes, options: str) -> Job:
        """The Job `pack` kept, for the process taking a record over."""
        n, topk, include, keep, expected = (int(part) for part in options.split(" "))
        prompt = orjson.loads(body)["prompt"] if keep else None
        return cls(body, DecodeJob(prompt, n, topk, bool(include)), expected)


def build_request(request: AsampleRequest, model: str) -> Job:
    """The router request for a validated asample (SampleRejected for unsupported options)."""
    chunks = request.prompt.chunks
    tokens = chunks[0].tokens if len(chunks) == 1 else [t for c in chunks for t in c.tokens]
    params = request.sampling_params
    topk = request.topk_prompt_logprobs
    include = bool(request.prompt_logprobs)
    body: dict[str, Any] = {
        "model": model,
        "prompt": tokens,
        "n": request.num_samples,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": 1,
        "return_token_ids": True,
    }
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if include or topk:
        body["prompt_logprobs"] = topk
    stop = params.stop
    if isinstance(stop, str):
        body["stop"] = [stop]
    elif stop is not None:
        if all(isinstance(s, str) for s in stop):
            body["stop"] = stop
        elif all(isinstance(s, int) for s in stop):
            body["stop_token_ids"] = stop
            if not stop:  # the SDK's `stop=[]`: no stop tokens at all, EOS included
                body["ignore_eos"] = True
        else:
            raise SampleRejected("sampling_params.stop mixes strings and token ids")
    # The prompt is kept only when the decoder needs it (prompt logprobs are keyed by token).
    keep = tokens if include or topk else None
    decode = DecodeJob(keep, request.num_samples, topk, include)
    expected = expected_body_bytes(
        request.num_samples, params.max_tokens, len(tokens), topk, include or bool(topk)
    )
    return Job(orjson.dumps(body), decode, expected)


#: A logprobs=1 vLLM body takes ~82 bytes per generated token (token id, logprob, the top-1
#: entry with its decoded text); prompt logprobs ~40 per prompt token plus ~45 per top-k entry.
BYTES_PER_TOKEN = 96
BYTES_PER_PROMPT_TOKEN = 48
BYTES_PER_TOPK_ENTRY = 64
BODY_OVERHEAD = 2048
#: vLLM's completions default when max_tokens is not given.
DEFAULT_MAX_TOKENS = 16


def expected_body_bytes(
    n: int, max_tokens: int | None, prompt_len: int, topk: int, prompt_logprobs: bool
) -> int:
    """An upper estimate of the router's body size, reserved before the request is sent."""
    tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    size = BODY_OVERHEAD + n * (tokens * BYTES_PER_TOKEN + 512)
    if prompt_logprobs:
        size += prompt_len * (BYTES_PER_PROMPT_TOKEN + topk * BYTES_PER_TOPK_ENTRY)
    return size
