"""orjson.loads + numpy: the path real servers use today.

orjson builds the whole document as Python objects (every token string, every top_logprobs
dict, every float), then the numeric lists are converted with numpy. Fast JSON, but the
object graph dominates on realistic vLLM bodies (several objects per token).
orjson is stricter than the reference in places (it rejects `1e400` and lone surrogates,
and reads integers beyond 64 bits as floats, so an integer over MAX_INT_DIGITS digits is an
infinite double it rejects); when it rejects a body the reference decides. A document it parsed
that does not fit the contract goes to the reference too: a float where an integer must be
(`index`, `rank`, `prompt_token_ids`) may be an integer beyond 64 bits, which the reference
takes. Only bodies that end in `DecodeError` pay for the second parse. Its nesting limit is
1024 levels: `check_depth` applies the contract's.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import orjson

from impl.decode import Completion, DecodeError
from impl.decode._common import as_bytes, completion_from_document, reference
from impl.decode._limits import check_depth


class OrjsonDecoder:
    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        check_depth(body)  # orjson itself stops at 1024 levels, the contract at MAX_DEPTH
        try:
            return completion_from_document(doc, body, prompt_tokens, topk_prompt_logprobs)
        except DecodeError:  # maybe an integer beyond 64 bits that orjson read as a float
            return reference(body, prompt_tokens, topk_prompt_logprobs)


def create() -> OrjsonDecoder:
    return OrjsonDecoder()
