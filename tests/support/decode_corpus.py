"""Seeded decode corpus for the parity and error tests: valid bodies and invalid ones.

Valid bodies come from `impl.workloads.synthetic` (minimal and realistic vLLM, n = 1..4, 0..262144
tokens, prompt logprobs k = 0 and k > 0), the real-shaped body in tests/fixtures (see
docs/vllm-body.md) and hand-built bodies for the edge cases of the decode contract
(docs/families.md). Invalid bodies must make every decoder raise `DecodeError`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from impl.workloads import synthetic

FIXTURES = Path(__file__).parents[1] / "fixtures"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Case:
    id: str
    body: bytes
    kwargs: dict[str, Any] = field(default_factory=dict)


def choice(index: int = 0, **fields: Any) -> dict[str, Any]:
    """A vLLM-ordered choice; `fields` override (or, with value ..., drop) keys."""
    base: dict[str, Any] = {
        "index": index,
        "text": " a b",
        "logprobs": {
            "text_offset": [0, 2],
            "token_logprobs": [-0.5, -1.25],
            "tokens": [" a", " b"],
            "top_logprobs": [{" a": -0.5}, {" b": -1.25, " c": -0.25}],
        },
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": [64, 65],
        "prompt_logprobs": None,
        "prompt_token_ids": [1, 2, 3],
    }
    base.update(fields)
    return {key: value for key, value in base.items() if value is not ...}


def doc(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": list(choices),
        **top,
    }


def dumps(value: Any, **kwargs: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), **kwargs).encode()


PROMPT_K = [  # a prompt_logprobs list with k=2 shaped like vLLM's (real token first)
    None,
    {
        "2": {"logprob": -3.5, "rank": 7, "decoded_token": "x"},
        "9": {"logprob": -0.1, "rank": 1},
        "8": {"logprob": -0.7, "rank": 2},
    },
    {"8": {"logprob": -0.25, "rank": 2}, "3": {"logprob": -0.125, "rank": 1}},
]


def _hand_built() -> list[Case]:
    tricky_text = 'say "token_ids":[1,2] and \\"token_logprobs\\":[0.5], {"choices":[]} ]}'
    lp = {"token_logprobs": [-0.5, -1.25]}
    decoy_logprobs = {
        "token_ids": [5],
        "token_logprobs": [-1.0, -2.0],
        "top_logprobs": [{'"token_ids":[9]': -1.0}, {"]}": -2.0}],
    }
    decoy_choice = choice(
        logprobs=decoy_logprobs, kv_transfer_params={"token_ids": [9, 9], "choices": [1]}
    )
    cases = [
        ("null-logprob-entries", doc(choice(logprobs={"token_logprobs": [None, -1.0]}))),
        ("logprobs-null", doc(choice(logprobs=None))),
        ("logprobs-missing", doc(choice(logprobs=...))),
        ("token-logprobs-null", doc(choice(logprobs={"token_logprobs": None}))),
        ("token-logprobs-empty", doc(choice(logprobs={"token_logprobs": []}))),
        ("no-tokens", doc(choice(token_ids=[], logprobs={"token_logprobs": []}))),
        ("token-ids-null", doc(choice(token_ids=None, logprobs=None))),
        ("token-ids-missing", doc(choice(token_ids=..., logprobs=None))),
        (
            "special-floats",
            doc(
                choice(
                    token_ids=list(range(8)),
                    logprobs={
                        "token_logprobs": [
                            -9999.0,
                            -3.630383071140386e-05,
                            0.0,
                            -0.0,
                            -1e-45,
                            0,
                            -1,
                            -3.4e39,
                        ]
                    },
                )
            ),
        ),
        ("int32-limits", doc(choice(token_ids=[INT32_MIN, INT32_MAX, 0, -1], logprobs=None))),
        (
            "choices-out-of-order",
            doc(
                choice(2, token_ids=[7], logprobs=None),
                choice(0),
                choice(1, token_ids=[], logprobs=None),
            ),
        ),
        ("no-choices", doc()),
        ("unicode-and-escapes", doc(choice(text='é 日本 🙂 \\ " \n \t \u0001 \ud7ff'))),
        ("field-names-in-text", doc(choice(text=tricky_text), choice(1, text=tricky_text))),
        ("text-ends-in-backslash", doc(choice(text="abc\\"), choice(1, text='\\\\"'))),
        ("decoys", doc(decoy_choice, kv_transfer_params={"choices": {"token_ids": [3]}})),
        ("ignored-odd-numbers", doc(choice(), created=2**70, usage={"x": 1e300, "y": -(2**80)})),
        (
            "prompt-k0",
            doc(choice(prompt_logprobs=[None, {"2": {"logprob": -1.5}}, {"3": {"logprob": None}}])),
        ),
        (
            "prompt-k0-missing-key",
            doc(choice(prompt_logprobs=[None, {"7": {"logprob": -1.5}}, None])),
        ),
        ("prompt-k2", doc(choice(prompt_logprobs=PROMPT_K), choice(1, prompt_logprobs=PROMPT_K))),
    ]
    out = [Case(name, dumps(value)) for name, value in cases]
    out += [
        Case(
            "prompt-k2-topk",
            dumps(doc(choice(prompt_logprobs=PROMPT_K))),
            {"topk_prompt_logprobs": 2},
        ),
        Case(
            "prompt-k2-topk3",
            dumps(doc(choice(prompt_logprobs=PROMPT_K))),
            {"topk_prompt_logprobs": 3},
        ),
        Case(
            "prompt-tokens-arg",
            dumps(doc(choice(prompt_logprobs=PROMPT_K))),
            {"prompt_tokens": [1, 9, 8]},
        ),
        Case(
            "duplicate-keys",
            dumps(doc(choice(), choice(1)))
            .replace(b'"token_ids":[64,65]', b'"token_ids":[1],"token_ids":[64,65]')
            .replace(b'"choices":', b'"choices":[],"choices":'),
        ),
        Case("pretty-printed", json.dumps(doc(choice(), choice(1)), indent=2).encode()),
        Case("spaces-after-colon", json.dumps(doc(choice(), choice(1))).encode()),
        Case("keys-reordered", dumps(doc(*[dict(reversed(choice(i).items())) for i in range(2)]))),
        Case("ascii-escaped", json.dumps(doc(choice(text='é 🙂 "x"')), ensure_ascii=True).encode()),
        Case("lone-surrogate-in-text", dumps(doc(choice(text="x"))).replace(b'"x"', b'"\\ud800"')),
        Case("invalid-utf8-in-text", dumps(doc(choice(text="x"))).replace(b'"x"', b'"\xff\xfe"')),
        Case("huge-exponent-ignored", dumps(doc(choice()))[:-1] + b',"usage":{"x":1e400}}'),
        Case("minus-zero-int-logprob", dumps(doc(choice(logprobs=lp))).replace(b"-0.5", b"-0")),
        Case(
            "exponent-forms",
            dumps(doc(choice(logprobs=lp)))
            .replace(b"-0.5", b"-5E-1")
            .replace(b"-1.25", b"-125e-2"),
        ),
        # integers beyond 64 bits where the contract reads integers: the reference takes them
        # (orjson reads them as floats: issue 27)
        Case("index-beyond-64-bits", dumps(doc(choice(2**64), choice(-(2**64)), choice(1)))),
        Case(
            "rank-beyond-64-bits",
            dumps(
                doc(choice(prompt_logprobs=[None, {"2": {"logprob": -1.5, "rank": 2**64}}, None]))
            ),
            {"topk_prompt_logprobs": 2},
        ),
        Case(
            "prompt-id-beyond-64-bits",
            dumps(
                doc(
                    choice(
                        prompt_token_ids=[1, 2**64, 3],
                        prompt_logprobs=[None, {str(2**64): {"logprob": -1.5, "rank": 1}}, None],
                    )
                )
            ),
        ),
        Case("fixture-n2", (FIXTURES / "vllm-completion-n2-logprobs.json").read_bytes()),
        Case(
            "fixture-n2-topk1",
            (FIXTURES / "vllm-completion-n2-logprobs.json").read_bytes(),
            {"topk_prompt_logprobs": 1},
        ),
    ]
    return out


def _generated(large: bool) -> list[Case]:
    out = []
    for kind in ("minimal", "vllm"):
        for n, tokens, plp in (
            (1, 0, None),
            (1, 1, 0),
            (2, 128, 3),
            (3, 128, None),
            (4, 8192, 0),
            (1, 8192, 2),
        ):
            body = synthetic.body_for(tokens, kind=kind, n=n, prompt_logprobs=plp, seed=n + tokens)
            kwargs = {"topk_prompt_logprobs": plp} if plp else {}
            out.append(Case(f"{kind}-n{n}-t{tokens}-p{plp}", body, kwargs))
    if large:
        out.append(Case("vllm-n1-t262144", synthetic.body_for(262144, kind="vllm")))
        out.append(Case("minimal-n2-t262144", synthetic.body_for(262144, kind="minimal", n=2)))
    return out


@cache
def valid_cases(large: bool = True) -> tuple[Case, ...]:
    return (*_hand_built(), *skipped_region_valid_cases(), *_generated(large))


def _invalid() -> list[tuple[str, bytes]]:
    good = dumps(doc(choice(), choice(1)))
    real = synthetic.body_for(128, kind="vllm", n=2, prompt_logprobs=2)
    sub = good.replace
    return [
        ("html-200", b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
        ("empty", b""),
        ("whitespace", b"  \n"),
        ("truncated-half", real[: len(real) // 2]),
        ("truncated-last-byte", real[:-1]),
        ("truncated-in-number", real[: real.index(b'"token_logprobs":[') + 25]),
        ("nan-logprob", sub(b"-0.5", b"NaN")),
        ("infinity-logprob", sub(b"-0.5", b"Infinity")),
        ("minus-infinity-in-top-logprobs", sub(b'{" a":-0.5}', b'{" a":-Infinity}')),
        ("nan-in-ignored-field", good[:-1] + b',"usage":{"x":NaN}}'),
        ("string-token-id", sub(b"[64,65]", b'[64,"65"]')),
        ("float-token-id", sub(b"[64,65]", b"[64,65.0]")),
        ("bool-token-id", sub(b"[64,65]", b"[64,true]")),
        ("token-id-above-int32", sub(b"[64,65]", b"[64,2147483648]")),
        ("token-id-below-int32", sub(b"[64,65]", b"[64,-2147483649]")),
        ("token-id-beyond-64-bits", sub(b"[64,65]", b"[64,18446744073709551616]")),
        ("leading-zero-token-id", sub(b"[64,65]", b"[64,065]")),
        ("string-logprob", sub(b"-0.5,-1.25", b'-0.5,"x"')),
        ("bool-logprob", sub(b"-0.5,-1.25", b"-0.5,false")),
        ("object-logprob", sub(b"-0.5,-1.25", b"-0.5,{}")),
        ("overflowing-logprob", sub(b"-0.5,-1.25", b"-0.5,-1e400")),
        ("logprob-count-mismatch", sub(b"-0.5,-1.25", b"-0.5")),
        ("choices-object", dumps({"choices": {"0": choice()}})),
        ("choices-null", dumps({"choices": None})),
        ("choices-missing", dumps({"id": "x"})),
        ("top-level-array", dumps([doc(choice())])),
        ("top-level-null", b"null"),
        ("choice-not-object", dumps(doc(choice(), [1, 2]))),
        ("index-missing", dumps(doc(choice(index=...)))),
        ("index-string", dumps(doc(choice(index="0")))),
        ("index-bool", dumps(doc(choice(index=False)))),
        ("logprobs-list", dumps(doc(choice(logprobs=[-0.5, -1.25])))),
        ("token-logprobs-object", dumps(doc(choice(logprobs={"token_logprobs": {"0": -0.5}})))),
        ("token-ids-object", dumps(doc(choice(token_ids={"0": 1})))),
        ("nested-empty-logprob", dumps(doc(choice(logprobs={"token_logprobs": [[], -1.0]})))),
        ("trailing-comma", sub(b"[64,65]", b"[64,65,]")),
        ("trailing-garbage", good + b"x"),
        ("two-documents", good + good),
        ("mismatched-brackets", sub(b"[64,65]", b"[64,65}")),
        ("utf8-bom", b"\xef\xbb\xbf" + good),
        ("deep-nesting", good[:-1] + b',"x":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("prompt-logprobs-object", dumps(doc(choice(prompt_logprobs={"1": None})))),
        ("prompt-entry-string", dumps(doc(choice(prompt_logprobs=[None, "x", None])))),
        ("prompt-length-mismatch", dumps(doc(choice(prompt_logprobs=[None])))),
        (
            "prompt-logprob-string",
            dumps(doc(choice(prompt_logprobs=[None, {"2": {"logprob": "x"}}, None]))),
        ),
        (
            "prompt-without-token-ids",
            dumps(doc(choice(prompt_logprobs=[None, None, None], prompt_token_ids=None))),
        ),
    ]


#: Invalid bodies that need the topk_prompt_logprobs argument to be noticed.
INVALID_TOPK = [
    (
        "topk-rank-string",
        dumps(doc(choice(prompt_logprobs=[None, {"2": {"logprob": -1, "rank": "1"}}, None]))),
    ),
    (
        "topk-key-not-a-token",
        dumps(doc(choice(prompt_logprobs=[None, {"x": {"logprob": -1, "rank": 1}}, None]))),
    ),
]


def _nested(ids: list, lps: list | None = None) -> bytes:
    return dumps(
        doc(choice(token_ids=ids, logprobs=None if lps is None else {"token_logprobs": lps}))
    )


@cache
def _big_body() -> bytes:
    """A vLLM body whose skipped values (text_offset, tokens, top_logprobs) exceed 16 KiB."""
    return synthetic.body_for(4096, kind="vllm", seed=11)


def _insert(body: bytes, after: bytes, text: bytes) -> bytes:
    at = body.index(after) + len(after)
    return body[:at] + text + body[at:]


def _flattened() -> list[tuple[str, bytes]]:
    big = _big_body()
    ids_at = big.index(b'"token_ids":[') + len(b'"token_ids":[')
    lps_at = big.index(b'"token_logprobs":[') + len(b'"token_logprobs":[')
    comma_ids, comma_lps = big.index(b",", ids_at + 2000), big.index(b",", lps_at + 2000)
    return [
        ("nested-token-ids", _nested([[64], [65]])),
        ("nested-logprobs", _nested([64, 65], [[-0.5], [-1.0]])),
        ("nested-token-ids-uneven", _nested([[64, 65], []])),
        ("nested-token-ids-uneven-2", _nested([[], [64, 65]])),
        ("nested-token-ids-first", _nested([[64], 65])),
        ("nested-token-ids-last", _nested([64, [65]])),
        ("nested-token-ids-deep", _nested([[[64]], [65]])),
        ("nested-logprobs-first", _nested([64, 65], [[-0.5], -1.0])),
        ("nested-logprobs-last", _nested([64, 65], [-0.5, [-1.0]])),
        ("nested-logprobs-uneven", _nested([64, 65], [[-0.5, -1.0], []])),
        ("nested-token-ids-spaced", _nested([64, 65]).replace(b"[64,65]", b"[ [64], 65]")),
        ("nested-token-ids-newline", _nested([64, 65]).replace(b"[64,65]", b"[64,\n\t[65]]")),
        (
            "big-nested-token-id",
            big[:comma_ids] + b",[" + big[comma_ids + 1 :].replace(b",", b"],", 1),
        ),
        (
            "big-nested-logprob",
            big[:comma_lps] + b",[" + big[comma_lps + 1 :].replace(b",", b"],", 1),
        ),
    ]


#: Nested arrays that pysimdjson's as_buffer flattens to one number per element.
INVALID_FLATTENED = _flattened()

#: Malformed values (scalars, strings, structure) that the fast path does not consume.
BAD_VALUES = [
    b"01", b"-01", b"-", b"1.", b".5", b"+1", b"0x1", b"nul", b"tru", b"falsey", b"nulll", b"1e",
    b"1e+", b"--1", b"1.2.3", b"1e5e5", b"1e5.0", b"1-2", b"t", b"x", b"'x'", b'"\x01"',
    b'"a\tb"', b'"\\x"', b'"\\u12"', b"[1,]", b"[,1]", b'{"a"}', b'{"a":1,}', b"{1:2}",
    b'["a":1]', b'{"a":1 "b":2}', b"[1 2]", b'{"a":1,2}', b'[1,"a":2]', b'{"a"::1}',
    b'{"a":"b":1}', b"[1,,2]", b'{,"a":1}', b"1 2", b"\xff",
]  # fmt: skip


def _in_skipped_regions() -> list[tuple[str, bytes]]:
    small = dumps(doc(choice(), choice(1), usage={"prompt_tokens": 1}))
    out = [
        ("bad-literal-in-top-logprobs", small.replace(b'{" a":-0.5}', b'{" a":tru}')),
        ("leading-zero-in-text-offset", small.replace(b"[0,2]", b"[0,02]", 1)),
    ]
    places = {  # where a bad value goes: inside each kind of skipped value
        "text-offset": (b'"text_offset":[', b"%s,"),
        "tokens": (b'"tokens":[', b"%s,"),
        "top-logprobs": (b'"top_logprobs":[{', b'"k":%s,'),
        "top-logprobs-element": (b'"top_logprobs":[', b"%s,"),
        "usage": (b'"usage":{', b'"x":%s,'),
    }
    for size, body in (("small", small), ("big", _big_body())):
        for place, (after, template) in places.items():
            for number, value in enumerate(BAD_VALUES):
                name = f"{size}-{place}-{number}-{value[:8].decode('latin-1')!r}"
                out.append((name, _insert(body, after, template % value)))
    return out


#: Malformed values in regions `fromstring` skips: every decoder rejects them.
INVALID_IN_SKIPPED_REGION = _in_skipped_regions()

#: Every kind of JSON value in the big skipped regions: every decoder accepts these.
GOOD_VALUES = (
    b'{"a":true,"b":[1,{"c":null}],"d":{},"e":[],"f":"x\\"y\\u00e9\\\\","g":-0,'
    b'"h":1E+2,"i":0.5e-3,"j":false,"k":[[],[[1]]],"l":-12.5E-7,"m":1e400,"n":"","o":0}'
)


def skipped_region_valid_cases() -> list[Case]:
    big = _big_body()
    return [
        Case("big-top-logprobs-every-value", _insert(big, b'"top_logprobs":[', GOOD_VALUES + b",")),
        Case("big-tokens-every-value", _insert(big, b'"tokens":[', GOOD_VALUES + b",true,")),
        Case("big-text-offset-every-number", _insert(big, b'"text_offset":[', b"-0,1E+2,0.5e-3,")),
        Case("big-usage-every-value", _insert(big, b'"usage":{', b'"x":%s,' % GOOD_VALUES)),
    ]


@cache
def invalid_cases() -> tuple[Case, ...]:
    cases = [Case(name, body) for name, body in _invalid()]
    cases += [Case(name, body, {"topk_prompt_logprobs": 1}) for name, body in INVALID_TOPK]
    return tuple(cases)


def mutants(seed: int, count: int, base: bytes, alphabet: bytes) -> Iterator[bytes]:
    """Seeded random edits (1-3 deletions, insertions or replacements from `alphabet`) of a
    compact JSON value: near-valid inputs for the decoders' validity checks."""
    rng = random.Random(seed)
    for _ in range(count):
        value = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(value))
            edit = rng.randrange(3)
            if edit == 0:
                del value[at]
            elif edit == 1:
                value.insert(at, rng.choice(alphabet))
            else:
                value[at] = rng.choice(alphabet)
        yield bytes(value)
