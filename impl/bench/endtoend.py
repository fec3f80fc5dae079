"""`hotpath bench` section `endtoend`: the whole server, baseline vs picked, under the load harness.

Runs `hotpath loadtest --preset small-2048 --compare baseline` and a short long-output
comparison (32k-token results) in-process, each a fresh fake router and a fresh `hotpath serve`
(`--baseline`, then the configuration the server picks from the measurements the earlier
sections just recorded). A row's `parity` is False when any sample failed or went missing, so
`hotpath bench` fails on a server that loses results. `--quick` scales the counts down.
"""

from __future__ import annotations

import sys

from impl.bench._common import Section, render_table
from impl.harness import load, presets, report


def _scenarios(quick: bool) -> list[tuple[str, str, presets.Scenario]]:
    small = presets.get("small-2048")
    long = presets.get("long-512x32k")
    if quick:
        return [
            (
                "small-2048",
                "--num-requests 128 --distinct-prompts 16",
                small.with_overrides(num_requests=128, distinct_prompts=16, timeout=60.0),
            ),
            (
                "long-512x32k",
                "--num-requests 8 --max-tokens 8192 --distinct-prompts 4",
                long.with_overrides(
                    num_requests=8, max_tokens=8192, distinct_prompts=4, timeout=60.0
                ),
            ),
        ]
    return [
        ("small-2048", "", small.with_overrides(timeout=240.0)),
        ("long-512x32k", "--num-requests 64", long.with_overrides(num_requests=64, timeout=240.0)),
    ]


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def run(quick: bool) -> Section:
    rows, table_rows, detail = [], [], []
    picks: dict[str, str] = {}
    for preset, flags, scenario in _scenarios(quick):
        command = f"hotpath loadtest --preset {preset} {flags} --compare baseline".replace(
            "  ", " "
        )
        print(f"-- {command}", file=sys.stderr, flush=True)
        runs = [
            load.run_scenario(scenario, label="baseline", baseline=True),
            load.run_scenario(scenario, label="picked"),
        ]
        before, after = (report.summarize(r) for r in runs)
        ratios = report.compare(before, after)
        problems = report.verdict(before) + report.verdict(after)
        picks = after["picks"] or picks
        rows.append(
            {
                "scenario": preset,
                "command": command,
                "samples": scenario.num_requests,
                "max_tokens": scenario.max_tokens,
                "baseline": before,
                "picked": after,
                "ratios": ratios,
                "parity": not problems,
                "problems": problems,
            }
        )
        table_rows.append(
            (
                f"{preset} ({scenario.num_requests} x {scenario.max_tokens} tok)",
                _cell(before["results_per_second"], ",.1f"),
                _cell(after["results_per_second"], ",.1f"),
                _cell(ratios["results_per_second"], ".1f") + "x",
                _cell(after["latency_p99"], ".2f"),
                _cell(after["healthz_p99"], ".3f"),
                f"{after['completed']}/{after['requested']}",
                "yes" if not problems else "NO",
            )
        )
        detail.append(f"{command}\n{report.render_compare(before, after)}")
    table = render_table(
        [
            "scenario",
            "baseline res/s",
            "picked res/s",
            "throughput",
            "p99 s",
            "/healthz p99 s",
            "done",
            "no failures",
        ],
        table_rows,
    )
    notes = "\n\n".join(
        [
            *detail,
            "The server picks (shown on /healthz; from the measurements recorded above): "
            + (", ".join(f"{k}={v}" for k, v in picks.items()) or "not reported"),
            "Where to look next: `hotpath loadtest --preset NAME --compare baseline "
            "--report r.json` for the full table of a scenario (presets: "
            + ", ".join(presets.PRESETS)
            + "); "
            "`--profile profiles/NAME` records the server with py-spy (speedscope + SVG); "
            "`--client sdk` drives the real Tinker SDK.",
        ]
    )
    return Section(
        family="endtoend",
        title="End to end: baseline vs picked server under the load harness",
        table=table,
        rows=rows,
        notes=notes,
    )
