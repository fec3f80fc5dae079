"""The reference decoder: stdlib `json` + numpy, written for clarity rather than speed.

It defines the decode semantics of docs/families.md; every other decoder is tested against it, and
they hand bodies their fast path cannot handle to it (so it is also the universal fallback).
Choices of this reference that the contract leaves open:
- the body is read as UTF-8 with invalid bytes tolerated (`surrogateescape`): decoders return
  no strings, so string contents are only checked against JSON's grammar;
- bodies nested deeper than `MAX_DEPTH` and integers of more than `MAX_INT_DIGITS` digits
  are rejected, wherever they are, whatever the call stack or `sys.int_max_str_digits`
  (`_limits.py`);
- NaN / Infinity literals are rejected; a number that overflows a double (`1e400`) is accepted
  where it is ignored, but not as a logprob (a logprob must be a finite double);
- a JSON `true`/`false` is not an integer (Python's `bool` is), so it is not a token id;
- `index` must be an integer; choices are ordered by it (stable for ties);
- prompt logprobs come from the first choice in index order; their length must equal the
  number of prompt tokens; a null `logprob` counts like a null position (NaN);
- a choice's `logprobs.packed_top_logprobs` (vLLM's packed candidates) is checked as
  `_packed.py` says, though nothing is read from it;
- top-k rows take the entries whose integer `rank` is 1..k, sorted by rank (ties keep body
  order), keys must be non-negative decimal token ids within int32.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np

from impl.decode import (
    TOPK_PAD_LOGPROB,
    TOPK_PAD_TOKEN,
    Completion,
    DecodeError,
    Sequence,
    TopK,
    _packed,
    decode_error,
)
from impl.decode._limits import LongInteger, bounded_int, check_depth, may_hold_long_integer

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class JsonDecoder:
    """`json.loads` into Python objects, then one checked element at a time into numpy."""

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = bytes(body)
        doc = self._parse(body)
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
            raise decode_error("no 'choices' list at the top level", body)
        choices = doc["choices"]
        for choice in choices:
            if not isinstance(choice, dict):
                raise decode_error("a choice is not an object", body)
            if not _is_int(choice.get("index")):
                raise decode_error("a choice has no integer 'index'", body)
        choices = sorted(choices, key=lambda choice: choice["index"])
        sequences = [self._sequence(choice, body) for choice in choices]
        if not choices or choices[0].get("prompt_logprobs") is None:
            return Completion(sequences)
        prompt_logprobs, topk = self._prompt(choices[0], body, prompt_tokens, topk_prompt_logprobs)
        return Completion(sequences, prompt_logprobs, topk)

    @staticmethod
    def _parse(body: bytes) -> Any:
        def reject_constant(name: str) -> None:
            raise decode_error(f"not JSON: the literal {name} is not allowed", body)

        check_depth(body)  # before parsing: the parser then never recurses deeper than this
        parse_int = bounded_int if may_hold_long_integer(body) else None
        try:
            return json.loads(
                body.decode("utf-8", "surrogateescape"),
                parse_constant=reject_constant,
                parse_int=parse_int,
            )
        except LongInteger as exc:
            raise decode_error(str(exc), body) from None
        except DecodeError:
            raise
        except (ValueError, RecursionError) as exc:
            raise decode_error(f"not JSON ({exc})", body) from None

    def _sequence(self, choice: dict, body: bytes) -> Sequence:
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = []
        if not isinstance(token_ids, list):
            raise decode_error("'token_ids' is not a list", body)
        for token in token_ids:
            if not _is_int(token):
                raise decode_error(f"token id {token!r} is not an integer", body)
            if not INT32_MIN <= token <= INT32_MAX:
                raise decode_error(f"token id {token} is outside int32", body)
        tokens = np.array(token_ids, dtype=np.int32)

        logprobs_obj = choice.get("logprobs")
        if logprobs_obj is not None and not isinstance(logprobs_obj, dict):
            raise decode_error("'logprobs' is not an object", body)
        values = None if logprobs_obj is None else logprobs_obj.get("token_logprobs")
        if values is not None and not isinstance(values, list):
            raise decode_error("'token_logprobs' is not a list", body)
        if logprobs_obj is not None:
            _packed.check(logprobs_obj.get(_packed.BLOCK), len(tokens), body)
        if not values and len(tokens):
            values = [0.0] * len(tokens)  # no logprobs requested: zeros
        values = values or []
        if len(values) != len(tokens):
            raise decode_error(f"{len(values)} logprobs for {len(tokens)} tokens", body)
        doubles = [0.0 if value is None else self._logprob(value, body) for value in values]
        with np.errstate(over="ignore"):
            logprobs = np.array(doubles, dtype=np.float64).astype(np.float32)

        finish = choice.get("finish_reason")
        return Sequence(tokens, logprobs, "stop" if finish in ("stop", "stop_token") else "length")

    @staticmethod
    def _logprob(value: Any, body: bytes) -> float:
        if not _is_number(value):
            raise decode_error(f"logprob {value!r} is not a number", body)
        try:
            result = float(value)
        except OverflowError:
            result = math.inf
        if not math.isfinite(result):
            raise decode_error(f"logprob {value!r} is not a finite double", body)
        return result

    def _prompt(
        self, choice: dict, body: bytes, prompt_tokens: Seq[int] | None, k: int
    ) -> tuple[np.ndarray, TopK | None]:
        entries = choice["prompt_logprobs"]
        if not isinstance(entries, list):
            raise decode_error("'prompt_logprobs' is not a list", body)
        if prompt_tokens is None:
            prompt_tokens = choice.get("prompt_token_ids")
            if not isinstance(prompt_tokens, list) or not all(map(_is_int, prompt_tokens)):
                raise decode_error("prompt logprobs without integer 'prompt_token_ids'", body)
        if len(entries) != len(prompt_tokens):
            raise decode_error(
                f"{len(entries)} prompt logprobs for {len(prompt_tokens)} prompt tokens", body
            )
        own = np.full(len(entries), np.nan, dtype=np.float64)
        top_ids = np.full((len(entries), max(k, 0)), TOPK_PAD_TOKEN, dtype=np.int32)
        top_lps = np.full((len(entries), max(k, 0)), TOPK_PAD_LOGPROB, dtype=np.float64)
        for i, (entry, token) in enumerate(zip(entries, prompt_tokens, strict=True)):
            if entry is None:
                continue
            if not isinstance(entry, dict):
                raise decode_error(f"prompt logprob entry {i} is not an object or null", body)
            value = entry.get(str(int(token)))
            if value is not None:
                own[i] = self._prompt_value(value, body)
            if k > 0:
                ranked = []
                for key, item in entry.items():
                    if not (
                        len(key) <= 10 and key.isascii() and key.isdigit() and int(key) <= INT32_MAX
                    ):
                        raise decode_error(f"prompt logprob key {key!r} is not a token id", body)
                    if not isinstance(item, dict) or not _is_int(item.get("rank")):
                        raise decode_error(f"prompt logprob {key!r} has no integer rank", body)
                    if 1 <= item["rank"] <= k:
                        ranked.append((item["rank"], int(key), self._prompt_value(item, body)))
                ranked.sort(key=lambda row: row[0])
                for j, (_, token_id, logprob) in enumerate(ranked[:k]):
                    top_ids[i, j], top_lps[i, j] = token_id, logprob
        with np.errstate(over="ignore"):
            topk = TopK(top_ids, top_lps.astype(np.float32)) if k > 0 else None
            return own.astype(np.float32), topk

    def _prompt_value(self, item: Any, body: bytes) -> float:
        if not isinstance(item, dict):
            raise decode_error("a prompt logprob is not an object", body)
        logprob = item.get("logprob")
        return math.nan if logprob is None else self._logprob(logprob, body)


def create() -> JsonDecoder:
    return JsonDecoder()
