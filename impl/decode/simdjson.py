"""pysimdjson: the body is parsed into simdjson's tape; numeric arrays leave as buffers.

simdjson validates and indexes the whole body at SIMD speed without creating Python objects;
`Array.as_buffer(of_type="i"/"d")` copies a homogeneous numeric array straight into a buffer
that numpy wraps (int64 -> int32 after a range check, double -> float32). An array that is not
homogeneous (a null logprob, a bool or float among token ids) falls back to `as_list()` and
the shared checked conversion, for that array only. Caveats handled here:
- one parser per thread is reused; a parser invalidates its previous document, so no proxy
  outlives a call (results are numpy copies, errors are re-raised without the frames that
  hold proxies) and a parser that still has live proxies is replaced by a fresh one;
- `as_buffer` flattens nested arrays (`[[1],[2]]` reads as `[1,2]`, `[[1,2],[]]` too, so no
  count can tell): buffers are trusted only when `may_nest_arrays` proves that no array in the
  body holds an array (no `[` follows `[` or `,`; a memchr walk over the few `[`); otherwise both
  arrays take the exact `as_list()` path;
- simdjson returns the first of duplicated keys (the reference: the last) and accepts a UTF-8
  BOM; both, and every body simdjson rejects (`1e400`, integers beyond 64 bits, invalid UTF-8),
  go to the reference;
- simdjson stops at 1024 levels (a scalar counts as one more level than its array) and
  pysimdjson 7 has no option to lower that; so a body of 1 MB or more is parsed inside
  `1024 - MAX_DEPTH` one-element arrays, which makes simdjson itself refuse a body deeper than
  MAX_DEPTH (and, as a false alarm the reference then decodes, a body of exactly MAX_DEPTH with
  a scalar at the bottom); the wrappers cost one copy of the body. Each wrapper must hold
  exactly one element, or the body was not one value (`1], [2`): the reference decides.
  Smaller bodies get `check_depth` (a vectorised scan; a few `find`s when they hold no more
  than MAX_DEPTH brackets).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
import simdjson

from impl.decode import MAX_DEPTH, Completion, DecodeError, Sequence, _packed, decode_error
from impl.decode._common import (
    Unsure,
    as_bytes,
    float32_checked,
    int32_checked,
    logprobs_from_list,
    may_nest_arrays,
    prompt_arrays,
    reference,
    stop_reason,
    tokens_from_list,
)
from impl.decode._limits import check_depth

_WRAPPERS = 1024 - MAX_DEPTH
_OPEN, _CLOSE = b"[" * _WRAPPERS, b"]" * _WRAPPERS
_WRAP_FROM = 1 << 20  # bytes: smaller bodies take check_depth instead


def _unwrap(doc: Any) -> Any:
    """The body's value inside the wrappers; Unsure unless each wrapper holds exactly it."""
    for _ in range(_WRAPPERS):
        if len(doc) != 1:
            raise Unsure
        doc = doc[0]
    return doc


def _keys_unique(obj: Any) -> bool:
    keys = list(obj.keys())
    return len(keys) == len(set(keys))


def _tokens(value: Any, body: bytes, flat: bool) -> np.ndarray:
    if not isinstance(value, simdjson.Array):
        return tokens_from_list(value, body)  # None, or a scalar/object the checks reject
    if flat:  # no array nests, so as_buffer holds exactly one number per element
        try:
            wide = np.frombuffer(value.as_buffer(of_type="i"), dtype=np.int64)
        except (TypeError, ValueError):  # not all int64: bools, floats, strings, big ints
            wide = None
        if wide is not None:
            return int32_checked(wide, body)
    return tokens_from_list(value.as_list(), body)


def _logprobs(value: Any, n_tokens: int, body: bytes, flat: bool) -> np.ndarray:
    if isinstance(value, simdjson.Array) and len(value) == n_tokens and n_tokens and flat:
        try:
            doubles = np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # a null entry (or a non-number): per-array fallback
            doubles = None
        if doubles is None:
            return logprobs_from_list(value.as_list(), n_tokens, body)
        return float32_checked(doubles, body)
    if isinstance(value, simdjson.Array | simdjson.Object):
        value = value.as_list() if isinstance(value, simdjson.Array) else {}
    return logprobs_from_list(value, n_tokens, body)


def _plain(value: Any) -> Any:
    """A small simdjson value as the stdlib would give it (Unsure for duplicated keys)."""
    if isinstance(value, simdjson.Object):
        if not _keys_unique(value):
            raise Unsure
        return value.as_dict()
    return value.as_list() if isinstance(value, simdjson.Array) else value


def _convert(doc: Any, body: bytes, prompt_tokens: Seq[int] | None, k: int) -> Completion:
    if not isinstance(doc, simdjson.Object) or not _keys_unique(doc):
        raise Unsure
    choices = doc.get("choices")
    if not isinstance(choices, simdjson.Array):
        raise decode_error("no 'choices' list at the top level", body)
    objects = list(choices)
    for choice in objects:
        if not isinstance(choice, simdjson.Object):
            raise decode_error("a choice is not an object", body)
        if not _keys_unique(choice):
            raise Unsure
        index = choice.get("index")
        if type(index) is not int:
            raise decode_error("a choice has no integer 'index'", body)
    objects.sort(key=lambda choice: choice["index"])
    flat = not may_nest_arrays(body)  # as_buffer is exact only when no array nests
    sequences = []
    for choice in objects:
        tokens = _tokens(choice.get("token_ids"), body, flat)
        lp_obj = choice.get("logprobs")
        if lp_obj is not None and not isinstance(lp_obj, simdjson.Object):
            raise decode_error("'logprobs' is not an object", body)
        if lp_obj is not None and not _keys_unique(lp_obj):
            raise Unsure
        values = None if lp_obj is None else lp_obj.get("token_logprobs")
        if lp_obj is not None:
            _packed.check(_plain(lp_obj.get(_packed.BLOCK)), len(tokens), body)
        sequences.append(
            Sequence(
                tokens,
                _logprobs(values, len(tokens), body, flat),
                stop_reason(choice.get("finish_reason")),
            )
        )
    if not objects or objects[0].get("prompt_logprobs") is None:
        return Completion(sequences)
    first = {}
    for key in ("prompt_logprobs", "prompt_token_ids"):
        value = objects[0].get(key)
        first[key] = value.as_list() if isinstance(value, simdjson.Array) else value
    if isinstance(first["prompt_logprobs"], simdjson.Object):
        raise decode_error("'prompt_logprobs' is not a list", body)
    if isinstance(first["prompt_token_ids"], simdjson.Object):
        first["prompt_token_ids"] = {}  # rejected by the reference's rule, like any non-list
    return Completion(sequences, *prompt_arrays(first, body, prompt_tokens, k))


class SimdjsonDecoder:
    def __init__(self) -> None:
        self._local = threading.local()

    def _parser(self) -> simdjson.Parser:
        parser = getattr(self._local, "parser", None)
        if parser is None:
            parser = self._local.parser = simdjson.Parser()
        return parser

    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        if body[:3] == b"\xef\xbb\xbf":
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        try:
            return self._decode(body, prompt_tokens, topk_prompt_logprobs)
        except DecodeError as exc:
            raise exc.with_traceback(None) from None  # drop the frames that hold proxies
        except Unsure:
            return reference(body, prompt_tokens, topk_prompt_logprobs)

    def _decode(self, body: bytes, prompt_tokens: Seq[int] | None, k: int) -> Completion:
        wrapped = len(body) >= _WRAP_FROM
        if not wrapped:
            check_depth(body)
        data = b"".join((_OPEN, body, _CLOSE)) if wrapped else body
        try:
            doc = self._parser().parse(data)
        except RuntimeError:  # a proxy of the previous document is still alive somewhere
            self._local.parser = None
            try:
                doc = self._parser().parse(data)
            except (ValueError, RuntimeError, UnicodeDecodeError):
                raise Unsure from None
        except (ValueError, UnicodeDecodeError):  # not JSON to simdjson: the reference decides
            raise Unsure from None
        try:
            if wrapped:
                doc = _unwrap(doc)
            return _convert(doc, body, prompt_tokens, k)
        finally:
            del doc


def create() -> SimdjsonDecoder:
    return SimdjsonDecoder()
