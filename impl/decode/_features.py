"""Cheap features of a vLLM body: which of a few classes it falls in, from samples of its bytes.

`auto` chooses a decoder per (feature class, size) where the measurements say the classes want
different decoders. Why it is cheap: it reads three windows of `WINDOW` bytes (the whole body
when that is shorter than three), at 1/4, 1/2 and 3/4 of the body, and only through C loops of
`bytes` (`isascii`, `count`, `translate`), never a Python loop per byte: the same small cost
whatever the body's size (`hotpath bench` measures it per body: the auto table's "class cost"),
negligible against decoding a 20 MB body. Not cheap against a few-KB body's decode: `auto`
computes the class only where its measurements show a faster decoder for some class by more
than what the class costs (`impl.decode.auto`). The windows sit where a logprobs body has its
numbers and token strings (`token_logprobs`, `top_logprobs` and its keys), not at its start
(the header and the `text`, a small part of the body) nor its end (`token_ids`).

The class is three words joined by "/":

- text: `nonascii` when at least `NONASCII_SHARE` of the sampled bytes are >= 0x80 (UTF-8 text
  beyond ASCII: multilingual tokens), else `ascii`;
- escapes: `escapes` when at least `ESCAPE_SHARE` of them are backslashes (`\\n`, `\\"` in code
  and prose tokens), else `plain`;
- numbers, from the first window with an exponent in it (at 1/4, a one-choice body's
  `token_logprobs`): `json` when it has one of Python's two-digit exponents (`e-05`; a quarter
  of vLLM's logprobs are below 1e-4), `orjson` when its exponents are all orjson's one-digit
  ones (`e-5`), `none` when no window has an exponent (a body without logprobs).

A packed body (vLLM's `packed_top_logprobs`) has no token strings or top_logprobs dicts where the
windows sit, only json numbers, `token_id:N` strings and base64: it is `ascii/plain/json`
whatever its text, which is what its decode sees.

A class is a guess from three 1 KB windows; a wrong one costs speed, never correctness (every
decoder `auto` may pick equals the reference). What a class costs is not assumed here: `hotpath
bench` records each measured body's class and its cost next to the decoders' costs, and
`impl.decode.auto` plans from those rows.
"""

from __future__ import annotations

#: bytes per window
WINDOW = 1024
#: share of sampled bytes >= 0x80 that makes the text `nonascii`
NONASCII_SHARE = 0.02
#: share of sampled bytes that are backslashes that makes a body `escapes`
ESCAPE_SHARE = 0.001
#: the class of a measurement row recorded without features (measurement files before them)
ANY = "any"
CLASSES = tuple(
    f"{text}/{escapes}/{numbers}"
    for text in ("ascii", "nonascii")
    for escapes in ("plain", "escapes")
    for numbers in ("json", "orjson", "none")
)
_HIGH = bytes(range(0x80, 0x100))


def windows(size: int) -> list[tuple[int, int]]:
    """(start, end) of the sampled windows of a body of `size` bytes: 3 x `WINDOW`, or all."""
    if size <= 3 * WINDOW:
        return [(0, size)]
    quarter, half = size // 4, WINDOW // 2
    return [(at - half, at + half) for at in (quarter, 2 * quarter, 3 * quarter)]


def classify(body: bytes) -> str:
    """The feature class of `body` (one of `CLASSES`)."""
    spans = windows(len(body))
    sampled = high = backslashes = 0
    for a, b in spans:
        part = body[a:b]
        sampled += len(part)
        if not part.isascii():
            high += len(part) - len(part.translate(None, _HIGH))
        backslashes += part.count(b"\\")
    numbers = "none"
    for start, end in spans:  # the first window with an exponent decides; find stops at a hit
        if body.find(b"e-0", start, end) >= 0:
            numbers = "json"
            break
        if body.find(b"e-", start, end) >= 0:
            numbers = "orjson"
            break
    text = "nonascii" if high and high >= NONASCII_SHARE * sampled else "ascii"
    escapes = "escapes" if backslashes and backslashes >= ESCAPE_SHARE * sampled else "plain"
    return f"{text}/{escapes}/{numbers}"
