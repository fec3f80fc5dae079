"""msgspec typed decoding of only the fields the Completion needs.

A `msgspec.Struct` schema names `choices[].index/token_ids/finish_reason/prompt_*` and
`logprobs.token_logprobs`; msgspec validates the rest of the body while skipping it, without
building objects for tokens, top_logprobs or text. Token ids are range-checked by msgspec
itself (int32 bounds in the type); the number lists still become Python ints/floats before
numpy. Strict typing rejects some bodies the reference accepts (a non-string finish_reason,
`1e400` in a logprob); any msgspec error hands the body to the reference, which decides.
msgspec skips ignored values without the contract's limits: `check_depth` applies the nesting
limit, and a body that may hold an integer over MAX_INT_DIGITS digits goes to the reference.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Annotated, Any

import msgspec
import numpy as np

from impl.decode import Completion, Sequence, _packed
from impl.decode._common import (
    as_bytes,
    float32_checked,
    logprobs_from_list,
    prompt_arrays,
    reference,
    stop_reason,
)
from impl.decode._limits import check_depth, may_hold_long_integer

_NULL = msgspec.Raw(b"null")
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class Logprobs(msgspec.Struct):
    token_logprobs: list[float | None] | None = None
    packed_top_logprobs: Any = None  # vLLM's packed candidates: checked, not kept


class Choice(msgspec.Struct):
    index: int
    logprobs: Logprobs | None = None
    finish_reason: Any = None
    token_ids: list[Int32] | None = None
    prompt_logprobs: msgspec.Raw = _NULL
    prompt_token_ids: msgspec.Raw = _NULL


class Body(msgspec.Struct):
    choices: list[Choice]


class MsgspecDecoder:
    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(Body)

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        if may_hold_long_integer(body):  # msgspec skips such integers in ignored fields
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        try:
            doc = self._decoder.decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        check_depth(body)
        choices = sorted(doc.choices, key=lambda choice: choice.index)
        sequences = []
        for choice in choices:
            tokens = np.array(choice.token_ids or (), dtype=np.int32)
            values = choice.logprobs.token_logprobs if choice.logprobs is not None else None
            if choice.logprobs is not None:
                _packed.check(choice.logprobs.packed_top_logprobs, len(tokens), body)
            if values and None not in values and len(values) == len(tokens):
                logprobs = float32_checked(np.array(values, dtype=np.float64), body)
            else:
                logprobs = logprobs_from_list(values, len(tokens), body)
            sequences.append(Sequence(tokens, logprobs, stop_reason(choice.finish_reason)))
        if not choices or bytes(choices[0].prompt_logprobs) == b"null":
            return Completion(sequences)
        try:  # small: the prompt's entries, decoded as plain objects
            first = {
                "prompt_logprobs": msgspec.json.decode(choices[0].prompt_logprobs),
                "prompt_token_ids": msgspec.json.decode(choices[0].prompt_token_ids),
            }
        except msgspec.DecodeError:
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        return Completion(
            sequences, *prompt_arrays(first, body, prompt_tokens, topk_prompt_logprobs)
        )


def create() -> MsgspecDecoder:
    return MsgspecDecoder()
