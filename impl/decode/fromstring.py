"""Locate the numeric arrays in the raw bytes and parse only those with numpy.

Technique (`_scan.py`: simdjson's "stage 1" in numpy): one table lookup over the body finds quotes,
backslashes, brackets and the capitals that start NaN / Infinity; escaped quotes are removed,
so string spans are exact; brackets outside strings give depths and matching pairs (checked
to be balanced and of the same kind). Each object or array on the path to the data (the top
object, `choices`, each choice, its `logprobs`) is turned into a small *skeleton* — its own
bytes with every nested array/object replaced by a placeholder `[i]` — and parsed by the
stdlib; so keys are real keys (not text inside a string), in any order, with any whitespace,
duplicates resolved as the reference does. `token_ids` and `token_logprobs` are validated
against JSON's number grammar with vectorised checks and parsed by numpy; an array that is
not plain compact numbers (a null, whitespace, nesting) is parsed alone by the stdlib.
Anything else it cannot vouch for (NaN/Infinity outside strings, unbalanced or mismatched
brackets, a top level that is not an object, nesting deeper than MAX_DEPTH, a run of digits
longer than MAX_INT_DIGITS) goes to the reference.

Bytes it skips (token strings, top_logprobs, text_offset, usage) are still validated, so it
rejects exactly what the reference rejects: `Index` checks every escape and raw control byte,
and `check_skipped` proves each unparsed value valid JSON, the small ones with the stdlib and
the big ones vectorised (strings cut to one byte, allowed class pairs, key/comma context from
the bracket tree, literals and the number grammar); a big value with whitespace outside its
strings (pretty-printed) is handed to the stdlib instead (exact, slower). Cost: on the
262144-token vLLM body, much of it top_logprobs, this proof is a large share of the decode;
minimal bodies have nothing big to skip.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from impl.decode import Completion, Sequence, _packed
from impl.decode._common import (
    Unsure,
    as_bytes,
    float32_checked,
    int32_checked,
    logprobs_from_list,
    prompt_arrays,
    reference,
    stop_reason,
    tokens_from_list,
)
from impl.decode._limits import may_hold_long_integer
from impl.decode._numbers import parse_floats, parse_ints
from impl.decode._scan import Index, check_skipped, ref


class FromstringDecoder:
    def decode(
        self, body: bytes, *, prompt_tokens: Seq[int] | None = None, topk_prompt_logprobs: int = 0
    ) -> Completion:
        body = as_bytes(body)
        if may_hold_long_integer(body):  # its number checks take integers of any length
            return reference(body, prompt_tokens, topk_prompt_logprobs)
        try:
            return self._fast(body, prompt_tokens, topk_prompt_logprobs)
        except Unsure:
            return reference(body, prompt_tokens, topk_prompt_logprobs)

    def _fast(self, body: bytes, prompt_tokens: Seq[int] | None, k: int) -> Completion:
        index = Index(body)
        top = index.skeleton(0) if index.byte[0] == ord("{") else None
        choices_at = ref(index, top.get("choices"), ord("[")) if type(top) is dict else None
        if choices_at is None:
            raise Unsure
        choices = []
        for item in index.skeleton(choices_at):
            at = ref(index, item, ord("{"))
            choice = index.skeleton(at) if at is not None else None
            if choice is None or type(choice.get("index")) is not int:
                raise Unsure
            choices.append(choice)
        choices.sort(key=lambda choice: choice["index"])
        sequences = [self._sequence(index, choice) for choice in choices]
        if not choices or choices[0].get("prompt_logprobs") is None:
            check_skipped(index)
            return Completion(sequences)
        first = {}
        for key in ("prompt_logprobs", "prompt_token_ids"):
            value = choices[0].get(key)
            first[key] = index.value(value[0]) if type(value) is list else value
        prompt = prompt_arrays(first, body, prompt_tokens, k)
        check_skipped(index)
        return Completion(sequences, *prompt)

    def _sequence(self, index: Index, choice: dict) -> Sequence:
        body = index.body
        ids = choice.get("token_ids")
        at = ref(index, ids, ord("["))
        if at is None:  # null, a scalar or an object: the shared checks decide
            tokens = tokens_from_list(index.value(ids[0]) if type(ids) is list else ids, body)
        else:
            content = index.flat(at)
            wide = parse_ints(content) if content is not None else None
            tokens = (
                tokens_from_list(index.value(at), body)
                if wide is None
                else int32_checked(wide, body)
            )
            index.seen.add(at)  # checked whole: by the number grammar or the stdlib
        lp_obj = choice.get("logprobs")
        if lp_obj is not None:
            at = ref(index, lp_obj, ord("{"))
            lp_obj = index.skeleton(at) if at is not None else lp_obj
            if type(lp_obj) is not dict:
                raise Unsure
            block = lp_obj.get(_packed.BLOCK)
            at = ref(index, block, ord("{"))
            _packed.check(index.value(at) if at is not None else block, len(tokens), body)
        values = None if lp_obj is None else lp_obj.get("token_logprobs")
        at = ref(index, values, ord("["))
        if at is None:
            raw = index.value(values[0]) if type(values) is list else values
            logprobs = logprobs_from_list(raw, len(tokens), body)
        else:
            content = index.flat(at)
            doubles = parse_floats(content) if content is not None else None
            if doubles is None or len(doubles) == 0 or len(doubles) != len(tokens):
                logprobs = logprobs_from_list(index.value(at), len(tokens), body)
            else:
                logprobs = float32_checked(doubles, body)
            index.seen.add(at)
        return Sequence(tokens, logprobs, stop_reason(choice.get("finish_reason")))


def create() -> FromstringDecoder:
    return FromstringDecoder()
