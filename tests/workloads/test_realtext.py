"""The real-text body generator: vLLM's shape, its token strings and both servers' renderings.

Kinds that cannot be made here (no mistral-common, no orjson) skip with the install hint.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from impl import registry
from impl.workloads import realtext, synthetic, textsources, vocab

TEXT_KINDS = realtext.KINDS[1:]
REFERENCE = registry.create("decode", registry.reference("decode"))


def _skip(kind: str, how: str = "json") -> pytest.MarkDecorator:
    reason = realtext.unavailable_reason(kind, how)
    return pytest.mark.skipif(reason is not None, reason=str(reason))


def kinds(*renders: str) -> list:
    return [
        pytest.param(kind, how, id=f"{kind}-{how}", marks=_skip(kind, how))
        for kind in realtext.KINDS
        for how in renders or realtext.RENDERS
    ]


needs_vocab = pytest.mark.skipif(
    vocab.unavailable_reason() is not None, reason=str(vocab.unavailable_reason())
)
needs_orjson = _skip("synthetic", "orjson")


@pytest.mark.parametrize(("kind", "how"), kinds())
def test_seeded_and_deterministic(kind, how):
    """Same arguments, same bytes (cached or not); another seed, other bytes; ~60-110 B/token."""
    body = realtext.body_for(2048, kind=kind, render_as=how, n=2, seed=3)
    if kind != "synthetic":
        prompt = realtext.prompt_for(kind, 16, 3)
        again = realtext.answer(kind, how, prompt, n=2, max_tokens=2048, seed=3)
        assert again == body
    assert realtext.body_for(2048, kind=kind, render_as=how, n=2, seed=4) != body
    one = realtext.body_for(8192, kind=kind, render_as=how)
    assert 60 <= len(one) / 8192 <= 110, len(one) / 8192


def test_synthetic_json_is_the_original_vllm_body():
    """Datasets are append-only: `synthetic` in `json` is the old `vllm` body byte for byte."""
    for n, plp in ((1, None), (2, 2)):
        assert realtext.body_for(
            700, kind="synthetic", n=n, prompt_logprobs=plp
        ) == synthetic.body_for(700, kind="vllm", n=n, prompt_logprobs=plp)
    assert realtext.body_for(700, kind="minimal") == synthetic.body_for(700, kind="minimal")


@pytest.mark.filterwarnings("ignore:ORJSONResponse is deprecated")
@pytest.mark.parametrize(("kind", "how"), kinds("json", "orjson"))
def test_rendered_as_the_servers_render(kind, how):
    """json = Starlette's JSONResponse, orjson = FastAPI's ORJSONResponse of the same document."""
    responses = pytest.importorskip("fastapi.responses", reason="needs the server extra")
    body = realtext.body_for(1500, kind=kind, render_as=how, n=2, prompt_logprobs=2, seed=9)
    doc = json.loads(body)
    response = responses.JSONResponse if how == "json" else responses.ORJSONResponse
    if kind != "synthetic" or how == "orjson":  # the synthetic json body is hand-rendered
        assert response(doc).body == body
    shape = json.loads(synthetic.body_for(3, kind="vllm"))  # the same keys in the same order
    choice, like = doc["choices"][0], shape["choices"][0]
    assert list(doc) == list(shape) and list(doc["usage"]) == list(shape["usage"])
    assert list(choice) == list(like) and list(choice["logprobs"]) == list(like["logprobs"])


@needs_orjson
@pytest.mark.parametrize("kind", (*TEXT_KINDS, "synthetic"))
def test_renderings_differ_only_in_number_layout(kind):
    """Both parse to the same document; json writes -1.29e-05 where orjson writes -0.0000129."""
    if realtext.unavailable_reason(kind) is not None:
        pytest.skip(realtext.unavailable_reason(kind))
    plain = realtext.body_for(4096, kind=kind, render_as="json")
    fast = realtext.body_for(4096, kind=kind, render_as="orjson")
    assert json.loads(plain) == json.loads(fast) and plain != fast
    assert re.search(rb"[,\[]-\d\.\d+e-0[5-9][,\]]", plain)
    assert re.search(rb"[,\[]-0\.0000\d+[,\]]", fast) and re.search(
        rb"[,\[]-\d\.\d+e-[6-9][,\]]", fast
    )
    assert not re.search(rb"e-0\d", fast)


@needs_vocab
def test_multilingual_tokens_and_keys_carry_every_script():
    """CJK, Cyrillic, Greek and emoji in the `tokens` strings and in the top_logprobs keys."""
    doc = json.loads(realtext.body_for(20000, kind="multilingual"))
    logprobs = doc["choices"][0]["logprobs"]
    tokens = "".join(logprobs["tokens"])
    keys = "".join(k for entry in logprobs["top_logprobs"] for k in list(entry)[1:])
    scripts = {
        "CJK": "[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]",
        "Cyrillic": "[\u0400-\u04ff]",
        "Greek": "[\u0370-\u03ff]",
        "emoji": "[\U0001f300-\U0001faff\u2600-\u27bf]",
    }
    for name, pattern in scripts.items():
        assert re.search(pattern, tokens), f"no {name} in tokens"
        assert re.search(pattern, keys), f"no {name} in top_logprobs keys"


@needs_vocab
def test_code_has_an_escape_in_almost_every_line():
    """Newlines, quotes and backslashes: JSON escapes inside the tokens of nearly every line."""
    body = realtext.body_for(20000, kind="code")
    doc = json.loads(body)
    text = doc["choices"][0]["text"]
    escaped = sum(any(c in t for c in '\n"\\') for t in doc["choices"][0]["logprobs"]["tokens"])
    assert escaped >= 0.9 * text.count("\n") > 1000
    assert b'\\"' in body and b"\\\\" in body


@needs_vocab
def test_a_character_split_over_tokens_is_written_as_vllm_writes_it():
    """Byte-level pieces that are not UTF-8 alone: vLLM's _verify_tokens correction."""
    v = vocab.load()
    ids = v.encode("a 🙂 日本語").astype(np.int32)
    assert [v.pieces[i] for i in ids.tolist()][:4] == [b"a", b" \xf0\x9f", b"\x99", b"\x82"]
    size = len(ids)

    def strings(top_ids: list[int]) -> tuple[list[str], list[str | None]]:
        top = np.array(top_ids, dtype=np.int32)
        choice = realtext.TextChoice(
            ids, np.full(size, -3.0, np.float32), top, np.full(size, -1.0, np.float32), "length"
        )
        return realtext.vllm_strings(choice)

    # each sampled token is the top-1: its list is [t, t], the 2nd entry's correction wins
    assert strings([-1] * size) == (["a", "", " 🙙", "", " 日本", "語"], [None] * size)
    # another token is the top-1: the sampled one is corrected as the 1st of [t, top]
    other = [-1, int(v.encode(" b")[0]), int(v.encode("x")[0]), -1, -1, -1]
    assert strings(other) == (["a", "", "", "", " 日本", "語"], [None, " b", "x", None, None, None])


@needs_vocab
def test_sampled_logprobs_follow_the_stated_mixture():
    """Mostly near 0, a tail below -10, exact 0.0 and -9999.0; the top-1 is never less likely."""
    choice = realtext.generate([1, 2, 3], kind="prose", n=1, max_tokens=200_000, seed=5)[0]
    lp = choice.logprobs
    assert lp.dtype == np.float32 and (lp <= 0).all()
    assert np.mean(lp > -0.05) > 0.5
    assert 0.015 < np.mean((lp < -10) & (lp > -9999)) < 0.04
    assert 0.03 < np.mean(lp == 0) < 0.05 and (lp == -9999.0).any()
    has_top = choice.top_ids >= 0
    assert (choice.top_logprobs[has_top] >= lp[has_top]).all()
    assert not has_top[lp > np.log(0.5)].any() and 0.1 < has_top.mean() < 0.4


@needs_vocab
@pytest.mark.parametrize("how", realtext.RENDERS)
def test_reference_reads_generated_values_exactly(how):
    """decode(body) gives back the generated tokens, logprobs and stop reasons bit for bit."""
    if realtext.unavailable_reason("mixed", how):
        pytest.skip(realtext.unavailable_reason("mixed", how))
    prompt = realtext.prompt_for("mixed", 12, 2)
    for kind in TEXT_KINDS:
        choices = realtext.generate(prompt, kind=kind, n=3, max_tokens=3000, seed=11)
        body = realtext.completion_body(choices, prompt_tokens=prompt, render_as=how)
        got = REFERENCE.decode(body)
        for seq, choice in zip(got.sequences, choices, strict=True):
            assert seq.tokens.tobytes() == choice.tokens.tobytes()
            assert seq.logprobs.tobytes() == choice.logprobs.tobytes()
            assert seq.stop_reason == ("stop" if choice.finish_reason == "stop" else "length")
        assert {c.finish_reason for c in choices[1:]} <= {"stop", "length"}


@needs_vocab
def test_text_offsets_text_and_prompt_logprobs():
    """text_offset adds up token lengths; text is the output decoded; prompt logprobs as vLLM."""
    body = realtext.body_for(3000, kind="mixed", n=2, prompt_logprobs=3, prompt_len=8, seed=1)
    first, second = json.loads(body)["choices"]
    lp = first["logprobs"]
    lengths = [len(t) for t in lp["tokens"]]
    assert lp["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]
    assert first["text"] == vocab.load().decode(first["token_ids"])
    assert first["prompt_logprobs"] == second["prompt_logprobs"]
    entries, prompt = first["prompt_logprobs"], first["prompt_token_ids"]
    assert entries[0] is None and len(entries) == len(prompt) == 8
    for entry, token in zip(entries[1:], prompt[1:], strict=True):
        assert next(iter(entry)) == str(token) and len(entry) in (3, 4)
        assert {1, 2, 3} <= {item["rank"] for item in entry.values()}
        assert all(isinstance(item["decoded_token"], str) for item in entry.values())


@needs_vocab
def test_text_sources_are_the_machine_s_own():
    """Code from this interpreter's stdlib, prose from its help topics, the shipped corpus."""
    assert textsources.count("code") > 300 and textsources.count("prose") > 50
    assert "def " in textsources.passage("code", 0) or "import" in textsources.passage("code", 0)
    assert textsources.count("multilingual") > 50
    assert all(len(textsources.passage("code", i)) <= textsources.CODE_PASSAGE for i in range(50))
    with pytest.raises(LookupError, match="known: code, prose, multilingual"):
        textsources.count("poetry")


def test_unknown_kinds_and_renderings_name_the_known_ones():
    with pytest.raises(LookupError, match="known: minimal, vllm, synthetic, prose"):
        realtext.unavailable_reason("poetry")
    with pytest.raises(LookupError, match="known: json, orjson"):
        realtext.unavailable_reason("mixed", "yaml")
    with pytest.raises(ValueError, match="kind must be one of prose"):
        realtext.generate([1], kind="synthetic", n=1, max_tokens=1, seed=0)
