"""Packed bodies (vLLM's `packed_top_logprobs`): every decoder gives the Completion of the json
rendering of the same generation, and rejects a malformed packed block with DecodeError.

What a decoder checks of the block is impl/decode/_packed.py's rule (the reference's).
"""

from __future__ import annotations

import json

import pytest

from impl import registry
from impl.decode import DecodeError, _packed
from impl.decode.parity import assert_same
from impl.workloads import realtext
from tests.decode.test_parity import decoder_params
from tests.support.params import skipped_unless_available

FAMILY = "decode"
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))
COMPILED = ("simdjson_nogil", "onepass_nogil", "onepass_nogil_avx2")


@pytest.fixture(scope="module", params=decoder_params())
def decoder(request):
    return registry.create(FAMILY, request.param)


def _kinds() -> list:
    return skipped_unless_available(realtext.ROUTER_BODIES, realtext.unavailable_reason)


@pytest.mark.heavy
@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize(("tokens", "n", "k"), [(3000, 3, 2), (20000, 1, None)])
def test_packed_decodes_as_the_json_rendering(decoder, kind, tokens, n, k):
    """Same tokens, logprobs, stop reasons and prompt logprobs, bit for bit, from either
    rendering; the compiled decoders answer packed bodies on their own path."""
    args = dict(kind=kind, n=n, prompt_logprobs=k, seed=7)
    kwargs = {"topk_prompt_logprobs": k} if k else {}
    want = REFERENCE.decode(realtext.body_for(tokens, **args), **kwargs)
    body = realtext.body_for(tokens, render_as="packed", **args)
    assert_same(decoder.decode(body, **kwargs), want)
    if decoder.__module__.rsplit(".", 1)[-1] in COMPILED:
        assert decoder.fast_path(body, None, k or 0) is not None


def _block_body(edit) -> bytes:
    """A small packed body with choice 1's block edited by `edit(block)` (a dict, in place
    or returned); choice 0 stays valid."""
    doc = json.loads(realtext.body_for(40, kind="vllm", render_as="packed", n=2, seed=3))
    lp = doc["choices"][1]["logprobs"]
    block = lp["packed_top_logprobs"]
    got = edit(block)
    lp["packed_top_logprobs"] = block if got is None else got
    return json.dumps(doc, separators=(",", ":")).encode()


def _set(**members):
    return lambda block: block.update(members)


def _drop(name):
    return lambda block: block.pop(name)


def _b64(name, change):
    return lambda block: block.update({name: change(block[name])})


INVALID = {
    "not-an-object": lambda block: [block],
    "a-string": lambda block: "packed",
    "shape-rows": lambda block: block.update(shape=[block["shape"][0] - 1, 1]),
    "shape-k-0": lambda block: block.update(shape=[block["shape"][0], 0]),
    "shape-3-dims": lambda block: block.update(shape=[*block["shape"], 1]),
    "shape-bool": lambda block: block.update(shape=[block["shape"][0], True]),
    "shape-float": lambda block: block.update(shape=[block["shape"][0], 1.0]),
    "shape-missing": _drop("shape"),
    "shape-null": _set(shape=None),
    "ids-dtype": _set(token_ids_dtype="<i8"),
    "lps-dtype": _set(logprobs_dtype=">f4"),
    "dtype-missing": _drop("logprobs_dtype"),
    "ids-missing": _drop("token_ids_b64"),
    "lps-not-a-string": _set(logprobs_b64=[1, 2]),
    "ids-short": _b64("token_ids_b64", lambda s: s[:-4]),
    "lps-long": _b64("logprobs_b64", lambda s: s + "AAAA"),
    "ids-bad-char": _b64("token_ids_b64", lambda s: "*" + s[1:]),
    "ids-urlsafe": _b64("token_ids_b64", lambda s: "-" + s[1:]),
    "ids-inner-pad": _b64("token_ids_b64", lambda s: "=" + s[1:]),
    "lps-three-pads": _b64("logprobs_b64", lambda s: s[:-3] + "==="),
    "ids-unpadded": _b64("token_ids_b64", lambda s: s[:-1]),
    "ids-whitespace": _b64("token_ids_b64", lambda s: s[:8] + " " + s[9:]),
    "ids-non-ascii": _b64("token_ids_b64", lambda s: "é" + s[1:]),
    "k-2-for-k-1-bytes": lambda block: block.update(shape=[block["shape"][0], 2]),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_malformed_blocks_are_decode_errors(decoder, name):
    body = _block_body(INVALID[name])
    with pytest.raises(DecodeError, match="packed_top_logprobs"):
        REFERENCE.decode(body)
    with pytest.raises(DecodeError):
        decoder.decode(body)


def _raw(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) >= 1
    return body.replace(old, new)


def _escape_first(body: bytes, member: bytes) -> bytes:
    """The first character after `member` in every block written as a JSON \\u escape."""
    at = body.index(member) + len(member)
    return body.replace(member + body[at : at + 1], member + b"\\u%04x" % body[at])


def test_what_the_rule_leaves_alone_decodes_everywhere(decoder):
    """A null block, extra or reordered members, escaped strings that mean the same, a
    duplicated key whose last value is valid: the reference decodes them and so does every
    decoder (the compiled ones may hand the escaped ones to the reference)."""
    base = realtext.body_for(40, kind="vllm", render_as="packed", n=2, seed=3)
    bodies = [
        _raw(base, b'"packed_top_logprobs":{', b'"packed_top_logprobs":null,"x":{'),
        _block_body(_set(note="x")),
        _block_body(lambda block: dict(reversed(list(block.items())))),
        _raw(base, b'"token_ids_dtype":"<i4"', b'"token_ids_dtype":"\\u003ci4"'),
        _escape_first(base, b'"logprobs_b64":"'),
        _escape_first(base, b'"token_ids_b64":"').replace(b"/", b"\\/"),
        _raw(base, b'"shape":', b'"shape":[1],"shape":'),
        _raw(base, b'"packed_top_logprobs":{', b'"packed_top_logprobs":7,"packed_top_logprobs":{'),
    ]
    for body in bodies:
        want = REFERENCE.decode(body)
        assert_same(decoder.decode(body), want)


def test_base64_rule():
    assert _packed.base64_bytes("") == 0
    assert _packed.base64_bytes("AAAA") == 3 and _packed.base64_bytes("AA==") == 1
    assert _packed.base64_bytes("AAA=") == 2 and _packed.base64_bytes("+/09") == 3
    for bad in ("A", "AAA", "A===", "====", "AA=A", "AA-_", "AA A", "AAé=", None, 4):
        assert _packed.base64_bytes(bad) is None, bad


@pytest.mark.heavy
@pytest.mark.parametrize("name", COMPILED)
def test_compiled_decoders_are_not_slower_on_packed(name):
    """The packed body holds the json one's tokens and logprobs and fewer bytes: a compiled
    decoder takes it in no more time than the json body (best of 9, side by side in one
    process; measured about 0.6-0.8x, the bound leaves room for a shared machine)."""
    import timeit

    if registry.unavailable_reason(FAMILY, name):
        pytest.skip(str(registry.unavailable_reason(FAMILY, name)))
    if realtext.unavailable_reason("mixed"):
        pytest.skip(str(realtext.unavailable_reason("mixed")))
    decoder = registry.create(FAMILY, name)
    plain = realtext.body_for(65536, kind="mixed")
    packed = realtext.body_for(65536, kind="mixed", render_as="packed")
    json_time = packed_time = float("inf")
    for _ in range(9):  # interleaved, so a busy moment hits both
        json_time = min(json_time, timeit.timeit(lambda: decoder.decode(plain), number=3))
        packed_time = min(packed_time, timeit.timeit(lambda: decoder.decode(packed), number=3))
    assert packed_time <= 1.1 * json_time, (packed_time, json_time)
