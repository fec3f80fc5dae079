"""Every decoder equals the reference on the seeded corpus (dtype, shape, bits, NaN positions)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import threading

import numpy as np
import pytest

from impl import registry
from impl.decode import Completion, parity
from impl.decode.parity import assert_same
from impl.workloads import realtext, synthetic
from tests.support.decode_corpus import Case, valid_cases

FAMILY = "decode"
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))


def decoder_params() -> list:
    """Every registered name; those that cannot run here are skipped with the reason."""
    return [
        pytest.param(
            name,
            id=name,
            marks=pytest.mark.skipif(
                registry.unavailable_reason(FAMILY, name) is not None,
                reason=str(registry.unavailable_reason(FAMILY, name)),
            ),
        )
        for name in registry.names(FAMILY)
    ]


@pytest.fixture(scope="module", params=decoder_params())
def decoder(request):
    return registry.create(FAMILY, request.param)


def assert_same_array(got: np.ndarray, want: np.ndarray, what: str) -> None:
    found = parity.array_difference(got, want, what)
    assert found is None, found


@pytest.mark.parametrize("case", valid_cases(), ids=lambda case: case.id)
@pytest.mark.heavy
def test_matches_reference(decoder, case: Case):
    assert_same(
        decoder.decode(case.body, **case.kwargs), REFERENCE.decode(case.body, **case.kwargs)
    )


#: (tokens, n, prompt logprobs k) of the real-text bodies; 262144 tokens for `mixed` only
REALTEXT_SHAPES = [(3000, 2, 3), (20000, 1, None)]


def realtext_params() -> list:
    """Every body kind x rendering x shape; those that cannot be made here skip with the hint."""
    params = []
    for kind in realtext.KINDS:
        for how in realtext.RENDERS:
            reason = realtext.unavailable_reason(kind, how)
            marks = pytest.mark.skipif(reason is not None, reason=str(reason))
            shapes = REALTEXT_SHAPES + ([(262144, 1, None)] if kind == "mixed" else [])
            for tokens, n, k in shapes:
                case = (kind, how, tokens, n, k)
                params.append(
                    pytest.param(case, id=f"{kind}-{how}-t{tokens}-n{n}-k{k}", marks=marks)
                )
    return params


@functools.cache
def realtext_case(case: tuple) -> tuple[bytes, dict, Completion]:
    """The body, decode arguments and the reference's result of one real-text case."""
    kind, how, tokens, n, k = case
    body = realtext.body_for(tokens, kind=kind, render_as=how, n=n, prompt_logprobs=k, seed=7)
    kwargs = {"topk_prompt_logprobs": k} if k else {}
    return body, kwargs, REFERENCE.decode(body, **kwargs)


@pytest.mark.parametrize("case", realtext_params())
@pytest.mark.heavy
def test_real_text_bodies_match_reference(decoder, case):
    """Real text through a real tokenizer, in both renderings: every decoder, bit for bit."""
    body, kwargs, want = realtext_case(case)
    assert_same(decoder.decode(body, **kwargs), want)


def test_reference_reads_generated_values_exactly():
    """The generator's arrays come back from the reference bit for bit (anchors the corpus)."""
    prompt = [128000, 5, 6, 7]
    for kind in ("minimal", "vllm"):
        choices = synthetic.generate(prompt, n=3, max_tokens=300, seed=11)
        got = REFERENCE.decode(synthetic.completion_body(choices, kind=kind, prompt_tokens=prompt))
        for seq, choice in zip(got.sequences, choices, strict=True):
            assert_same_array(seq.tokens, choice.tokens, "tokens")
            assert_same_array(seq.logprobs, choice.logprobs, "logprobs")
            assert seq.stop_reason == ("stop" if choice.finish_reason == "stop" else "length")


def test_parity_predicate_sees_every_kind_of_difference():
    """`impl.decode.parity` (used by tests, asv, perf and `hotpath bench`) says what differs."""
    body = (
        b'{"choices":[{"index":0,"token_ids":[1,2],"logprobs":{"token_logprobs":[0.0,-0.5]},'
        b'"finish_reason":"stop","prompt_token_ids":[5,6],'
        b'"prompt_logprobs":[null,{"6":{"logprob":-1.5,"rank":1}}]}]}'
    )
    want = REFERENCE.decode(body, topk_prompt_logprobs=1)
    assert parity.same(REFERENCE.decode(body, topk_prompt_logprobs=1), want)
    seq = want.sequences[0]

    def with_sequence(**changes) -> Completion:
        return dataclasses.replace(want, sequences=[dataclasses.replace(seq, **changes)])

    negative_zero = seq.logprobs.copy()
    negative_zero[0] = -0.0  # equal by ==, different bits
    cases = {
        "sequence 0 logprobs: differs from the reference near element 0": with_sequence(
            logprobs=negative_zero
        ),
        "sequence 0 tokens: dtype int64 != int32": with_sequence(
            tokens=seq.tokens.astype(np.int64)
        ),
        "sequence 0 tokens: shape (1,) != (2,)": with_sequence(tokens=seq.tokens[:1]),
        "sequence 0 stop_reason: 'length' != 'stop'": with_sequence(stop_reason="length"),
        "prompt_logprobs: None != present": dataclasses.replace(want, prompt_logprobs=None),
        "topk_prompt_logprobs: None != present": dataclasses.replace(
            want, topk_prompt_logprobs=None
        ),
        "0 sequences != 1": dataclasses.replace(want, sequences=[]),
    }
    for message, got in cases.items():
        assert parity.difference(got, want) == message
        assert not parity.same(got, want)
        with pytest.raises(AssertionError, match=re.escape(message)):
            assert_same(got, want)


def test_reference_semantics_by_hand():
    """Rules of the decode contract (docs/decode.md) against literal values, not a decoder."""
    body = (
        b'{"choices":[{"index":1,"token_ids":[7],"logprobs":null,"finish_reason":"stop_token"},'
        b'{"index":0,"token_ids":[1,2],"logprobs":{"token_logprobs":[null,-0.5]},'
        b'"finish_reason":"abort","prompt_token_ids":[5,6,7],'
        b'"prompt_logprobs":[null,{"6":{"logprob":-1.5,"rank":2},"9":{"logprob":-0.25,"rank":1}},'
        b'{"8":{"logprob":-2.0,"rank":1}}]}]}'
    )
    got = REFERENCE.decode(body, topk_prompt_logprobs=2)
    first, second = got.sequences
    assert first.tokens.tolist() == [1, 2] and first.logprobs.tolist() == [0.0, -0.5]
    assert first.stop_reason == "length" and second.stop_reason == "stop"
    assert second.logprobs.tolist() == [0.0]
    assert np.isnan(got.prompt_logprobs[[0, 2]]).all() and got.prompt_logprobs[1] == -1.5
    assert got.topk_prompt_logprobs.token_ids.tolist() == [[0, 0], [9, 6], [8, 0]]
    assert got.topk_prompt_logprobs.logprobs.tolist() == [
        [-99999.0, -99999.0],
        [-0.25, -1.5],
        [-2.0, -99999.0],
    ]


def test_results_survive_the_next_decode(decoder):
    """No result aliases parser memory (pysimdjson reuses its buffers on the next parse)."""
    first_body = synthetic.body_for(1000, kind="vllm", n=2, seed=1)
    first = decoder.decode(first_body)
    copy = [seq.logprobs.copy() for seq in first.sequences]
    for seed in range(3):
        decoder.decode(synthetic.body_for(1000, kind="vllm", n=2, seed=seed + 2))
    for seq, kept in zip(first.sequences, copy, strict=True):
        assert_same_array(seq.logprobs, kept, "kept logprobs")
    assert_same(first, REFERENCE.decode(first_body))


@pytest.mark.heavy
def test_threads_share_one_decoder(decoder):
    """One decoder object used from several threads at once gives the reference's results."""
    cases = [
        synthetic.body_for(2000, kind=kind, n=2, seed=s)
        for kind in ("minimal", "vllm")
        for s in (1, 2)
    ]
    want = [REFERENCE.decode(body) for body in cases]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                for body, expected in zip(cases, want, strict=True):
                    assert_same(decoder.decode(body), expected)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


def test_generated_bodies_are_deterministic_and_vllm_shaped():
    """Seeded bodies: same bytes for the same arguments, ~76–102 bytes per token, compact."""
    assert synthetic.body_for(500, kind="vllm", n=2, seed=3) == synthetic.completion_body(
        synthetic.generate(
            [128000, *np.random.default_rng(3).integers(0, 128000, 15).tolist()],
            n=2,
            max_tokens=500,
            seed=3,
        ),
        kind="vllm",
        prompt_tokens=[128000, *np.random.default_rng(3).integers(0, 128000, 15).tolist()],
    )
    a = synthetic.generate([1, 2], n=2, max_tokens=50, seed=1)
    b = synthetic.generate([1, 2], n=2, max_tokens=50, seed=2)
    assert a[0].tokens.tobytes() != b[0].tokens.tobytes()
    body = synthetic.body_for(8192, kind="vllm")
    assert 76 <= len(body) / 8192 <= 102
    assert b'": ' not in body[:200] and b", " not in body[:200]
    doc = json.loads(body)
    choice = doc["choices"][0]
    assert list(choice)[:6] == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert list(choice["logprobs"]) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]


def test_generated_floats_are_python_reprs_of_float32():
    """Token logprobs are written as repr(float(float32)): exponent forms, 0.0 and -9999.0 occur."""
    body = synthetic.body_for(8192, kind="minimal").decode()
    start = body.index('"token_logprobs":[') + len('"token_logprobs":[')
    texts = body[start : body.index("]", start)].split(",")
    values = np.array([float(t) for t in texts]).astype(np.float32)
    assert texts == [repr(float(v)) for v in values]
    assert any("e-" in t for t in texts) and "0.0" in texts and "-9999.0" in texts


@pytest.mark.parametrize("k", [0, 3])
def test_generated_prompt_logprobs(k):
    """First entry null; the real token first; with k > 0 ranks 1..k all present."""
    body = json.loads(synthetic.body_for(4, kind="vllm", n=2, prompt_len=6, prompt_logprobs=k))
    first, second = body["choices"]
    assert first["prompt_logprobs"] == second["prompt_logprobs"]
    entries, prompt = first["prompt_logprobs"], first["prompt_token_ids"]
    assert entries[0] is None and len(entries) == len(prompt) == 6
    for entry, token in zip(entries[1:], prompt[1:], strict=True):
        assert next(iter(entry)) == str(token)
        ranks = sorted(item["rank"] for item in entry.values())
        if k:
            assert set(range(1, k + 1)) <= set(ranks) and len(entry) in (k, k + 1)
        else:
            assert len(entry) == 1


@pytest.mark.skipif(
    registry.unavailable_reason(FAMILY, "orjson") is not None, reason="needs orjson"
)
@pytest.mark.heavy
def test_auto_dispatches_by_measured_size():
    """auto: per size the cheapest measured candidate (never itself, never an unknown name)."""
    rows = [
        {"input": "small", "size_bytes": 1000, "cost": {"json": 1.0, "orjson": 2.0, "gone": 0.0}},
        {"input": "big", "size_bytes": 10**6, "cost": {"json": 9.0, "orjson": 1.0, "auto": 0.1}},
    ]
    auto = registry.create(FAMILY, "auto", rows=rows)
    assert [auto.choose(bytes(size)) for size in (10, 31_000, 32_000, 10**7)] == [
        "json",
        "json",
        "orjson",
        "orjson",
    ]
    calls = []
    for size in (10, 10**7):
        inner = auto.decoder_for(bytes(size))
        inner_decode = inner.decode
        inner.decode = lambda body, _d=inner_decode, **kw: calls.append(len(body)) or _d(body, **kw)
    small, big = synthetic.body_for(1, kind="minimal"), synthetic.body_for(100000, kind="minimal")
    assert len(small) < 31_000 < len(big)
    assert_same(auto.decode(small), REFERENCE.decode(small))
    assert_same(auto.decode(big), REFERENCE.decode(big))
    assert calls == [len(small), len(big)]


def test_auto_without_measurements_uses_the_preference_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTPATH_MEASUREMENTS", str(tmp_path / "none.json"))
    from impl.decode import PREFERENCE

    auto = registry.create(FAMILY, "auto")
    first = next(name for name in PREFERENCE if name in registry.available(FAMILY))
    assert auto.steps == [(1, first)]
