"""`auto`: the body's feature class from its bytes, and the plan per (class, size) from rows.

Rows in, picks out: every plan here comes from rows with made-up costs, never from timings.
"""

from __future__ import annotations

import json

import pytest

from impl import pick, registry
from impl.decode import _features
from impl.decode._features import ANY, CLASSES, classify
from impl.decode.auto import AutoDecoder, segments
from impl.decode.parity import assert_same
from impl.workloads import realtext, synthetic

FAMILY = "decode"
REFERENCE = registry.create(FAMILY, registry.reference(FAMILY))
AVAILABLE = [name for name in registry.available(FAMILY) if name != "auto"]
needs_orjson = pytest.mark.skipif(
    "orjson" not in AVAILABLE, reason=str(registry.unavailable_reason(FAMILY, "orjson"))
)


def text_params(tokens: int) -> list:
    """Every real-text kind x rendering; those that cannot be made here skip with the hint."""
    return [
        pytest.param(
            (kind, how, tokens),
            id=f"{kind}-{how}-{tokens}",
            marks=pytest.mark.skipif(
                realtext.unavailable_reason(kind, how) is not None,
                reason=str(realtext.unavailable_reason(kind, how)),
            ),
        )
        for kind in realtext.KINDS
        for how in realtext.RENDERS
    ]


def text_body(case: tuple) -> bytes:
    kind, how, tokens = case
    return realtext.body_for(tokens, kind=kind, render_as=how, seed=7)


@pytest.mark.parametrize("case", text_params(600) + text_params(20000))
@pytest.mark.heavy
def test_class_of_real_text(case):
    """Numbers follow the rendering, non-ASCII the multilingual text, escapes real text;
    a packed body samples as the ASCII json numbers and `token_id:N` strings it is made of."""
    kind, how, _ = case
    if how == "packed":
        assert classify(text_body(case)) == "ascii/plain/json"
        return
    text, escapes, numbers = classify(text_body(case)).split("/")
    assert numbers == how
    if kind == "multilingual":
        assert text == "nonascii"
    elif kind != "mixed":  # mixed is multilingual a fifth of the time: either
        assert text == "ascii"
    if kind == "synthetic":
        assert escapes == "plain"
    elif kind in ("prose", "code"):
        assert escapes == "escapes"


@pytest.mark.heavy
def test_class_of_two_choice_bodies_with_prompt_logprobs():
    """Windows that miss the numbers (choice 1's text) do not decide the number layout."""
    for how in ("json", "orjson"):
        if realtext.unavailable_reason("prose", how):
            pytest.skip(str(realtext.unavailable_reason("prose", how)))
        body = realtext.body_for(3000, kind="prose", render_as=how, n=2, prompt_logprobs=3, seed=7)
        assert classify(body) == f"ascii/escapes/{how}"


def test_class_of_made_up_bodies():
    """Each word of the class from bytes built to have (or lack) exactly that feature."""
    assert classify(b"") == "ascii/plain/none"
    assert classify(synthetic.body_for(1, kind="minimal")) == "ascii/plain/none"
    assert classify(b'{"a":[-1.5e-05,-2.0]}') == "ascii/plain/json"
    assert classify(b'{"a":[-1.5e-5,-2.0]}') == "ascii/plain/orjson"
    assert classify('{"a":"日本語"}'.encode()) == "nonascii/plain/none"
    assert classify(b'{"a":"\\n\\"x\\""}') == "ascii/escapes/none"
    assert classify(b'{"a":"' + "é".encode() + b"x" * 500 + b'"}') == "ascii/plain/none"
    assert {classify(b) for b in (b"", b"\\" * 5000, b"e-5" * 3000)} <= set(CLASSES)


def test_windows_sample_at_most_three_kilobytes_wherever_the_body_is_long():
    """A long body is read in three WINDOW-byte windows at 1/4, 1/2, 3/4; a short one whole."""
    window = _features.WINDOW
    assert _features.windows(3 * window) == [(0, 3 * window)]
    spans = _features.windows(10**7)
    assert [b - a for a, b in spans] == [window] * 3
    assert [(a + b) // 2 for a, b in spans] == [10**7 // 4, 10**7 // 2, 3 * 10**7 // 4]
    # bytes outside the windows never change the class: only sampled bytes are read
    body = bytearray(b"x" * 100_000)
    body[:1000] = "日本".encode() * 166
    assert classify(bytes(body)) == "ascii/plain/none"
    assert sum(b - a for a, b in _features.windows(len(body))) == 3 * window


def row(size: int, cls: str | None, **cost: float) -> dict:
    out = {"input": f"{cls}-{size}", "size_bytes": size, "cost": cost}
    if cls is not None:
        out["features"] = cls
    return out


JSON_CLS, ORJSON_CLS = "ascii/plain/json", "ascii/plain/orjson"


@needs_orjson
def test_plan_picks_per_class_where_rows_say_so():
    """Two classes measured fastest with different decoders: each body goes to its class's."""
    rows = [
        row(1000, JSON_CLS, json=1.0, orjson=2.0),
        row(2000, ORJSON_CLS, json=2.0, orjson=1.0),
    ]
    auto = AutoDecoder(rows)
    synthetic_json = synthetic.body_for(600, kind="vllm")
    assert classify(synthetic_json) == JSON_CLS
    orjson_rendered = (
        b'{"choices":[{"index":0,"token_ids":[1],"logprobs":{"token_logprobs":[-1e-5]}}]}'
    )
    assert classify(orjson_rendered) == ORJSON_CLS
    for body, want in ((synthetic_json, "json"), (orjson_rendered, "orjson")):
        assert auto.choose(body) == want
        assert auto.decoder_for(body) is auto._decoders[want]
        assert_same(auto.decode(body), REFERENCE.decode(body))


@needs_orjson
def test_unmeasured_class_falls_back_to_the_size_plan():
    """A class never measured takes the all-rows pick at its size."""
    rows = [
        row(1000, JSON_CLS, json=1.0, orjson=2.0),
        row(10**6, ORJSON_CLS, json=2.0, orjson=1.0),
    ]
    auto = AutoDecoder(rows)
    small = '{"a":"日本語"}'.encode() * 10
    big = small * (10**6 // len(small) + 1)
    assert classify(small) == classify(big) == "nonascii/plain/none"
    assert auto.choose(small) == auto.steps[0][1] == "json"
    assert auto.choose(big) == auto.steps[-1][1] == "orjson"


@needs_orjson
def test_a_class_speaks_for_sizes_near_its_rows_only():
    """A class measured at 1 MB only does not decide for a 1 KB body (REACH)."""
    rows = [
        row(1000, None, json=1.0, orjson=2.0),
        row(10**6, None, json=1.0, orjson=2.0),
        row(10**6 + 1, ORJSON_CLS, json=2.0, orjson=1.0),
    ]
    cut = [s for s in segments(rows, AVAILABLE) if s.by_class]
    assert len(cut) == 1 and cut[0].by_class == {ORJSON_CLS: "orjson"}
    assert 10**6 / 8 < cut[0].lower < 10**6


def test_no_split_within_margin_or_when_the_class_costs_more_than_it_saves():
    """The class is computed only where a faster pick repays it: never for noise."""
    close = [
        row(1000, JSON_CLS, json=1.0, orjson=1.01),
        row(2000, ORJSON_CLS, json=1.0, orjson=0.995),
    ]
    assert all(not s.by_class for s in segments(close, AVAILABLE))
    costly = [
        row(1000, JSON_CLS, json=1e-5, orjson=2e-5),
        {**row(2000, ORJSON_CLS, json=2e-5, orjson=1e-5), "features_seconds": 2e-5},
    ]
    assert all(not s.by_class for s in segments(costly, AVAILABLE))


@needs_orjson
def test_no_split_when_it_raises_the_worst_ratio():
    """Computing the class costs every body of the segment: split only if the worst ratio falls."""

    def plan(other_class_seconds: float) -> list:
        return segments(
            [
                {**row(1000, JSON_CLS, json=1.0, orjson=1.1), "features_seconds": 0.001},
                {
                    **row(1000, ORJSON_CLS, json=0.5, orjson=0.01),
                    "features_seconds": other_class_seconds,
                },
            ],
            AVAILABLE,
        )

    # orjson is the size plan's pick (the 0.01 row); json for JSON_CLS would save 9% (worst
    # ratio 1.1 by size), but a 0.002 s class is 20% of the other class's 0.01 s decode (1.2)
    assert [s.by_class for s in plan(0.002)] == [{}]
    assert [s.by_class for s in plan(0.0005)] == [{JSON_CLS: "json"}]


@needs_orjson
def test_rows_without_features_plan_by_size_as_before(tmp_path, monkeypatch):
    """A measurements file from before classes: class "any", by size alone, no class computed."""
    old_rows = [
        {"input": "small", "size_bytes": 1000, "cost": {"json": 1.0, "orjson": 2.0}},
        {"input": "big", "size_bytes": 10**6, "cost": {"json": 9.0, "orjson": 1.0}},
    ]
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"machine": pick.machine(), "families": {"decode": old_rows}}))
    monkeypatch.setenv("HOTPATH_MEASUREMENTS", str(path))
    auto = registry.create(FAMILY, "auto")
    assert auto.steps == [(1000, "json"), (10**6, "orjson")]
    assert [(s.name, s.by_class) for s in auto.segments] == [("json", {}), ("orjson", {})]
    monkeypatch.setattr("impl.decode.auto.classify", lambda body: pytest.fail("class computed"))
    assert auto.choose(b" " * 10) == "json" and auto.choose(b" " * 10**6) == "orjson"
    mixed = [*old_rows, row(10**6, ORJSON_CLS, json=1.0, orjson=3.0)]
    assert {row.get("features", ANY) for row in mixed} == {ANY, ORJSON_CLS}


@pytest.mark.parametrize("case", text_params(3000))
def test_auto_with_a_decoder_per_class_equals_the_reference(case):
    """Every class sent to a different decoder: each real-text body still decodes bit for bit."""
    body = text_body(case)
    fast = [name for name in AVAILABLE if name != "json"] or ["json"]
    rows = [
        row(1000 + i, cls, json=2.0, **{fast[i % len(fast)]: 1.0}) for i, cls in enumerate(CLASSES)
    ]
    auto = AutoDecoder(rows)
    assert auto.choose(body) == fast[CLASSES.index(classify(body)) % len(fast)]
    assert_same(auto.decode(body), REFERENCE.decode(body))


@pytest.mark.heavy
def test_bench_records_the_class_and_shows_autos_pick_per_row(monkeypatch):
    """`hotpath bench`'s decode section: each row's class and its cost, auto's pick per row."""
    decode_bench = pytest.importorskip("impl.bench.decode")
    inputs = ((128, "minimal", "json"), (128, "vllm", "json"))
    monkeypatch.setattr(decode_bench, "QUICK_INPUTS", inputs)
    section = decode_bench.run(quick=True)
    assert [m["features"] for m in section.measurements] == ["ascii/plain/json"] * 2
    assert all(m["features_seconds"] > 0 for m in section.measurements)
    auto_rows = [r for r in section.rows if r["implementation"] == "auto"]
    assert [r["input"] for r in auto_rows] == ["minimal-128", "vllm-128"]
    auto = AutoDecoder(section.measurements)
    for r in auto_rows:
        assert r["parity"] and r["features"] == "ascii/plain/json"
        body = synthetic.body_for(128, kind=r["body"])
        assert r["auto_pick"] == auto.choose(body)
        shown = [line.split() for line in section.table.splitlines()]
        assert [r["input"], "ascii/plain/json"] in [words[:2] for words in shown]
        assert r["auto_pick"] in next(w for w in shown if w[:2] == [r["input"], "ascii/plain/json"])
