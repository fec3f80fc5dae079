"""`hotpath bench` section `endtoend`: the whole server, baseline vs picked, under the load harness.

Runs `hotpath loadtest --preset small-2048 --compare baseline` and a short long-output
comparison (32k-token results) in-process, each a fresh fake router and a fresh `hotpath serve`
(`--baseline`, then the configuration the server picks from the measurements the earlier
sections just recorded). A row's `parity` is False when any sample failed or went missing, so
`hotpath bench` fails on a server that loses results.

Then the off-loop comparison in its short form: `hotpath loadtest --preset probe-128x262k
--num-requests 32 --compare inline` (realistic long bodies, /healthz on a fresh connection
every 50 ms): the picked server, then the same implementations decoding on the event loop.

`--quick` scales the counts down (128 small requests, 8 long ones of 8192 tokens, one client
process instead of two) and, since starting processes is then most of the time, runs both
scenarios against one router and one server per side (baseline: router + `--baseline` server;
picked: its own router + server), in the same order on both sides.
"""

from __future__ import annotations

import sys
from typing import Any

from impl.bench._common import Section
from impl.harness import load, presets, procs, report
from impl.measure import render_table


def _scenarios(quick: bool) -> list[tuple[str, str, presets.Scenario]]:
    small = presets.get("small-2048")
    long = presets.get("long-512x32k")
    if quick:
        return [
            (
                "small-2048",
                "--num-requests 128 --distinct-prompts 16 --client-processes 1",
                small.with_overrides(
                    num_requests=128, distinct_prompts=16, timeout=60.0, client_processes=1
                ),
            ),
            (
                "long-512x32k",
                "--num-requests 8 --max-tokens 8192 --distinct-prompts 4 --client-processes 1",
                long.with_overrides(
                    num_requests=8,
                    max_tokens=8192,
                    distinct_prompts=4,
                    timeout=60.0,
                    client_processes=1,
                ),
            ),
        ]
    return [
        ("small-2048", "", small.with_overrides(timeout=240.0)),
        ("long-512x32k", "--num-requests 64", long.with_overrides(num_requests=64, timeout=240.0)),
    ]


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _shared_runs(scenarios: list[presets.Scenario]) -> list[list[dict[str, Any]]]:
    """[baseline run, picked run] per scenario, each side's scenarios on one router + server."""
    by_side = []
    for baseline in (True, False):
        label = "baseline" if baseline else "picked"
        first = scenarios[0]
        with procs.stopped_at_exit() as started:
            router = procs.start_router([*first.router_args(), "--seed", "0"])
            started.append(router)
            server = procs.start_server(router.url, baseline=baseline, extra=first.server_args)
            started.append(server)
            common = dict(url=server.url, router_url=router.url, server_pid=server.pid)
            by_side.append([load.run_scenario(s, label=label, **common) for s in scenarios])
    return [list(pair) for pair in zip(*by_side, strict=True)]


def _offloop(quick: bool) -> tuple[dict[str, Any], str, str]:
    """(row, table, detail) of the off-loop comparison: inline vs the picked decode design."""
    count = 8 if quick else 32
    command = f"hotpath loadtest --preset probe-128x262k --num-requests {count} --compare inline"
    print(f"-- {command}", file=sys.stderr, flush=True)
    scenario = presets.get("probe-128x262k").with_overrides(num_requests=count, timeout=240.0)
    picked = load.run_scenario(scenario, label="picked", verify="exact")
    inline = load.run_scenario(
        load.inline_scenario(scenario, picked), label="inline", verify="exact"
    )
    before, after = report.summarize(inline), report.summarize(picked)
    problems = report.verdict(before) + report.verdict(after)
    row = {
        "scenario": "probe-128x262k",
        "command": command,
        "samples": count,
        "max_tokens": scenario.max_tokens,
        "inline": before,
        "picked": after,
        "ratios": report.compare(before, after),
        "parity": not problems,
        "problems": problems,
    }
    cells = []
    for summary in (before, after):
        cells.append(
            (
                f"{summary['label']} ({summary.get('decode_design') or '-'})",
                _cell(summary["results_per_second"], ",.2f"),
                _cell(summary["healthz_p50"], ".3f"),
                _cell(summary["healthz_p99"], ".3f"),
                _cell(summary["healthz_max"], ".3f"),
                _cell(summary["loop_lag_max"], ".3f"),
                _cell((summary["server_peak_rss_bytes"] or 0) / 1e6, ",.0f"),
                f"{summary['completed']}/{summary['requested']}",
            )
        )
    table = render_table(
        ["decode", "res/s", "/healthz p50 s", "p99 s", "max s", "loop lag max s", "RSS MB", "done"],
        cells,
    )
    return row, table, f"{command}\n{report.render_compare(before, after)}"


def run(quick: bool) -> Section:
    rows, table_rows, detail = [], [], []
    picks: dict[str, str] = {}
    scenarios = _scenarios(quick)
    shared = quick and len({(tuple(s.router_args()), s.server_args) for _, _, s in scenarios}) == 1
    if shared:
        print("-- quick: both scenarios on one router + server per side", file=sys.stderr)
        shared_runs = _shared_runs([scenario for _, _, scenario in scenarios])
    for index, (preset, flags, scenario) in enumerate(scenarios):
        command = f"hotpath loadtest --preset {preset} {flags} --compare baseline".replace(
            "  ", " "
        )
        print(f"-- {command}", file=sys.stderr, flush=True)
        if shared:
            runs = shared_runs[index]
        else:
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
    offloop_row, offloop_table, offloop_detail = _offloop(quick)
    rows.append(offloop_row)
    detail.append(offloop_detail)
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
    table += "\n\nOff the event loop (" + offloop_row["command"] + "):\n" + offloop_table
    notes = "\n\n".join(
        [
            *detail,
            *(
                ["--quick: both scenarios ran against one router + server per side, in order."]
                if shared
                else []
            ),
            "The server picks (shown on /healthz; from the measurements recorded above): "
            + (", ".join(f"{k}={v}" for k, v in picks.items()) or "not reported"),
            "Other scenarios (`hotpath loadtest --preset NAME --compare baseline`): "
            + ", ".join(presets.PRESETS)
            + "; `--client sdk` drives the real Tinker SDK instead of the SDK-shaped client.",
        ]
    )
    return Section(
        family="endtoend",
        title="End to end: baseline vs picked server under the load harness",
        table=table,
        rows=rows,
        notes=notes,
    )
