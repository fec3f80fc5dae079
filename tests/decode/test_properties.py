"""Property tests: bodies generated from the vLLM grammar (valid and broken); every decoder
equals the reference, or every decoder raises DecodeError. Also: the fast paths really run."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impl import registry
from impl.decode import DecodeError
from impl.decode.parity import assert_same
from impl.workloads import synthetic

FAMILY = "decode"
DECODERS = {name: registry.create(FAMILY, name) for name in registry.available(FAMILY)}
REFERENCE = registry.reference(FAMILY)

FIELD_NAMES = ["token_ids", "token_logprobs", "logprobs", "choices", "index", "prompt_logprobs"]
texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(FIELD_NAMES).map(lambda name: f'"{name}":[1,2]'),
    st.sampled_from(["\\", '\\"', '"]}', "{[", "NaN", "Infinity", "é日本🙂", "\n\t"]),
)
int32s = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([-(2**31), 2**31 - 1, 0, 128009]),
)
float32s = st.floats(width=32, allow_nan=False, allow_infinity=False).map(float)
logprob_values = st.one_of(
    float32s,
    st.sampled_from([-9999.0, 0.0, -0.0, -3.630383071140386e-05]),
    st.none(),
    st.integers(-5, 0),
)
# Values the reference rejects, injected to check that everybody rejects them.
bad_tokens = st.sampled_from([True, 1.0, "7", 2**31, -(2**31) - 1, 2**64, None])
bad_logprobs = st.sampled_from(["x", True, [], {}, math.inf])


@st.composite
def choice(draw: Any, index: int) -> dict[str, Any]:
    n = draw(st.integers(0, 6))
    tokens = draw(st.lists(int32s, min_size=n, max_size=n))
    out: dict[str, Any] = {"index": index, "text": draw(texts)}
    form = draw(st.sampled_from(["list", "list", "null", "missing", "empty", "object-null"]))
    if form == "list":
        values = draw(st.lists(logprob_values, min_size=n, max_size=n))
        out["logprobs"] = {
            "text_offset": list(range(n)),
            "token_logprobs": values,
            "tokens": [draw(texts) for _ in range(n)],
            "top_logprobs": [{draw(texts): v if v is not None else -1.0} for v in values],
        }
    elif form == "null":
        out["logprobs"] = None
    elif form == "empty":
        out["logprobs"] = {"token_logprobs": []}
    elif form == "object-null":
        out["logprobs"] = {"token_logprobs": None}
    out["finish_reason"] = draw(st.sampled_from(["stop", "length", "abort", "repetition", None]))
    out["stop_reason"] = draw(st.one_of(st.none(), st.integers(0, 10), texts))
    if draw(st.booleans()) or n:
        out["token_ids"] = tokens
    return out


def prompt_logprobs(draw: Any, prompt: list[int], k: int) -> list[Any]:
    entries: list[Any] = [None]
    for token in prompt[1:]:
        if draw(st.integers(0, 5)) == 0:
            entries.append(None)
            continue
        entry = {
            str(token): {
                "logprob": draw(st.one_of(float32s, st.none())),
                "rank": draw(st.integers(1, 50)),
            }
        }
        for rank in draw(st.lists(st.integers(1, k + 1), max_size=k + 1)):
            entry[str(draw(st.integers(0, 200)))] = {"logprob": draw(float32s), "rank": rank}
        entries.append(entry)
    return entries


def render(value: Any, style: str, floats: str) -> str:
    """A tiny JSON writer: compact, spaced or pretty; floats as repr, %.17g or with 'E'."""
    sep, colon = {"compact": (",", ":"), "spaced": (", ", ": "), "pretty": (",\n  ", ": ")}[style]
    if isinstance(value, dict):
        items = [
            f"{json.dumps(k, ensure_ascii=False)}{colon}{render(v, style, floats)}"
            for k, v in value.items()
        ]
        return "{" + sep.join(items) + "}"
    if isinstance(value, list):
        return "[" + sep.join(render(v, style, floats) for v in value) + "]"
    if isinstance(value, float) and math.isfinite(value):
        if floats == "g17":
            text = f"{value:.17g}"
            return text if "e" in text or "." in text else repr(value)
        return repr(value).upper() if floats == "upper" else repr(value)
    return json.dumps(value, ensure_ascii=False)


@st.composite
def body(draw: Any, broken: bool) -> tuple[bytes, dict[str, Any]]:
    n = draw(st.integers(0, 4))
    order = draw(st.permutations(list(range(n))))
    choices = [draw(choice(index)) for index in order]
    kwargs: dict[str, Any] = {}
    if choices and draw(st.booleans()):
        k = draw(st.integers(0, 3))
        prompt = draw(st.lists(st.integers(0, 200), min_size=1, max_size=5))
        for c in choices:
            c["prompt_logprobs"] = prompt_logprobs(draw, prompt, k)
            c["prompt_token_ids"] = prompt
        if k:
            kwargs["topk_prompt_logprobs"] = k
    if choices and draw(st.booleans()):  # keys in another order
        choices = [dict(reversed(list(c.items()))) for c in choices]
    top: dict[str, Any] = {
        "id": "cmpl-x",
        "object": "text_completion",
        "choices": choices,
        "usage": None,
    }
    if broken:
        target = draw(st.sampled_from(choices)) if choices else None
        what = draw(st.sampled_from(["token", "logprob", "choices", "truncate", "literal"]))
        if what == "token" and target is not None:
            target.setdefault("token_ids", []).append(draw(bad_tokens))
        elif what == "logprob" and target is not None and isinstance(target.get("logprobs"), dict):
            target["logprobs"]["token_logprobs"] = [
                *target.get("token_ids", [])[:-1],
                draw(bad_logprobs),
            ]
        elif what == "choices":
            top["choices"] = draw(st.sampled_from([None, {}, "x", 1]))
    text = render(
        top,
        draw(st.sampled_from(["compact", "spaced", "pretty"])),
        draw(st.sampled_from(["repr", "g17", "upper"])),
    )
    raw = text.encode()
    if broken and what == "truncate":
        raw = raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    elif broken and what == "literal":
        raw = raw.replace(b"-9999.0", b"-Infinity").replace(b"null", b"NaN", 1)
    return raw, kwargs


def check_all(raw: bytes, kwargs: dict[str, Any]) -> None:
    try:
        want = DECODERS[REFERENCE].decode(raw, **kwargs)
    except DecodeError:
        want = None
    for name, decoder in DECODERS.items():
        if want is None:
            with pytest.raises(DecodeError):
                decoder.decode(raw, **kwargs)
        else:
            try:
                got = decoder.decode(raw, **kwargs)
            except DecodeError as exc:
                raise AssertionError(
                    f"{name} rejected a body the reference accepts: {exc}"
                ) from exc
            assert_same(got, want)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(body(broken=False))
@pytest.mark.heavy
def test_valid_bodies_decode_alike(case):
    check_all(*case)


@SETTINGS
@given(body(broken=True))
@pytest.mark.heavy
def test_broken_bodies_decode_alike_or_all_fail(case):
    check_all(*case)


@pytest.mark.parametrize("name", [n for n in DECODERS if n not in (REFERENCE, "auto")])
def test_fast_path_runs_on_vllm_bodies(name, monkeypatch):
    """On generator bodies no decoder hands over to the reference (its fast path really runs)."""
    calls = []
    module = sys.modules[type(DECODERS[name]).__module__]  # where its class calls `reference`
    monkeypatch.setattr(module, "reference", lambda *args: calls.append(args))
    for kind in ("minimal", "vllm"):
        for n, plp in ((1, None), (3, 2)):
            got = DECODERS[name].decode(
                synthetic.body_for(300, kind=kind, n=n, prompt_logprobs=plp, seed=n)
            )
            assert got is not None
            assert len(got.sequences) == n and np.all(got.sequences[0].logprobs <= 0)
    assert calls == []
