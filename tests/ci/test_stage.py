"""The shape the gate's stages share (impl.ci.stage): verdicts, the table, accepting a change."""

from __future__ import annotations

import pytest

from impl.ci import gate_e2e, gate_icount, gate_timers
from impl.ci.stage import Row, Stage, Verdict, accepted_names, judge, print_table


@pytest.mark.parametrize(
    ("base", "head", "ratio", "inclusive", "accepted", "expected"),
    [
        (10.0, 20.0, 2.0, False, False, Verdict.WORSE),
        (10.0, 15.0, 1.5, False, False, Verdict.PASS),  # at the factor: not beyond it
        (10.0, 15.0, 1.5, True, False, Verdict.WORSE),  # counts: at the factor fails
        (10.0, 20.0, 2.0, False, True, Verdict.ACCEPTED),
        (10.0, None, None, False, False, Verdict.BROKE),
        (None, 10.0, None, False, False, Verdict.NOT_COMPARED),
        (None, None, None, False, False, Verdict.NOT_COMPARED),
    ],
)
def test_judge(base, head, ratio, inclusive, accepted, expected):
    assert judge(base, head, ratio, 1.5, inclusive=inclusive, accepted=accepted) is expected


def test_only_worse_and_broke_fail():
    assert {verdict for verdict in Verdict if verdict.fails} == {Verdict.WORSE, Verdict.BROKE}


def test_table_has_one_line_per_row_in_columns(capsys):
    rows = [
        Row("decode-262k", 1_000_000, 1_100_000, 1.1, Verdict.WORSE),
        Row("asample", None, 12.5, None, Verdict.NOT_COMPARED),
        Row("p50", 2.0, 2.1, 1.05, Verdict.PASS, cells=("2.00 ms", "2.10 ms")),
    ]
    print_table("a stage", rows, what="step", digits=4)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "gate: a stage"
    assert [cell.strip() for cell in lines[1].strip("|").split("|")] == [
        "step", "base", "HEAD", "ratio", "verdict",
    ]  # fmt: skip
    assert len({len(line) for line in lines[1:]}) == 1  # aligned
    assert "| 1,000,000 | 1,100,000 | 1.1000 | FAIL" in lines[3]
    assert "failed" in lines[4] and "n/a" in lines[4]
    assert "2.00 ms" in lines[5] and "pass" in lines[5]


def test_accept_lines():
    assert accepted_names("fix\n\nGate-accept: decode-262k, e2e\ngate-accept: all\n") == [
        "decode-262k", "e2e", "all",
    ]  # fmt: skip


def test_the_three_stages_are_stages():
    """Each stage has the protocol's title, measure and compare."""
    for stage in (gate_timers.Timers, gate_icount.Counts, gate_e2e.EndToEnd):
        assert all(callable(getattr(stage, name)) for name in ("measure", "compare"))
    counts: Stage = gate_icount.Counts("b", "h", 1.05, [], None, lambda c, b: iter(()))
    assert counts.title.startswith("instruction counts")


def test_end_to_end_rows_take_the_median_ratios():
    """The median of the per-round ratios, judged with the signed-rank test over the rounds: a
    consistent rise beyond the line fails; a median beyond it that rounds the other way make
    inconsistent is noise (passes)."""
    latencies = [1.5, 1.4, 1.3, 1.45, 1.35]
    runs = [
        gate_e2e.Run(side, r, 10.0, p50, 0.0)
        for r, h in enumerate(latencies)
        for side, p50 in (("base", 1.0), ("HEAD", h))
    ]
    latency, rate = gate_e2e.rows(runs, 1.15)
    assert latency.ratio == pytest.approx(1.4) and latency.verdict is Verdict.WORSE
    assert rate.ratio == pytest.approx(1.0) and rate.verdict is Verdict.PASS
    assert (latency.base, latency.head) == (pytest.approx(1000.0), pytest.approx(1400.0))
    for run in runs:
        if run.side == "HEAD" and run.round in (1, 3):
            run.p50 = 0.5
    assert gate_e2e.rows(runs, 1.15)[0].verdict is Verdict.NOISE
