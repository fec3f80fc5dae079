"""The end-to-end stage's runs: each commit's server under this tree's load client, in rounds.

`Servers` starts each side's server from its commit's tree (`impl.ci.trees`) once, or afresh
for every run; `together` drives both at once, their client processes released together, so
both meet the machine in the same seconds; `interleaved` runs rounds of that (or one side after
the other, alternating which goes first). A `Run` is one side's figures of one round;
`impl.ci.gate_e2e` compares them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impl.harness import load, procs, report


class NotStarted(RuntimeError):
    """A commit's server did not start (the message has its output)."""

    def __init__(self, side: str, message: str) -> None:
        super().__init__(message)
        self.side = side


@dataclass
class Run:
    """One run of the scenario against one commit's server."""

    side: str
    round: int
    results_per_second: float
    p50: float
    load: float
    summary: dict[str, Any] = field(default_factory=dict, repr=False)


def start_server(side: str, tree: Path, router_url: str, flags: list[str]) -> procs.Proc:
    """`tree`'s server with `flags` (NotStarted if it does not come up)."""
    try:
        return procs.start_server(
            router_url, extra=flags, cwd=tree, env={"HOTPATH_MEASUREMENTS": os.devnull}
        )
    except RuntimeError as exc:
        raise NotStarted(side, str(exc)) from None


def run_once(
    side: str,
    server: procs.Proc,
    router_url: str,
    round_: int,
    scenario: Any,
    before_go: Any = None,
) -> Run:
    """The scenario against `server` (a RuntimeError when a sample was lost or failed)."""
    before = os.getloadavg()[0]
    run = load.run_scenario(
        scenario,
        label=side,
        url=server.url,
        router_url=router_url,
        server_pid=server.pid,
        progress_bar=False,
        before_go=before_go,
    )
    summary = report.checked_summary(run, f"{side} round {round_ + 1}")
    return Run(side, round_, summary["results_per_second"], summary["latency_p50"], before, summary)


class Servers:
    """Each side's server: one kept for every round (the gate: the rounds are then seconds
    apart, which is what keeps their ratios fair on a machine whose load moves), or a fresh one
    per run (`fresh`, for presets whose figures depend on a server's first run)."""

    def __init__(self, trees: dict[str, Path], flags: list[str], router_url: str, fresh: bool):
        self.trees, self.flags, self.router_url, self.fresh = trees, flags, router_url, fresh
        self.running: dict[str, procs.Proc] = {}

    def get(self, side: str) -> procs.Proc:
        if side not in self.running:
            self.running[side] = start_server(side, self.trees[side], self.router_url, self.flags)
        return self.running[side]

    def done(self, side: str) -> None:
        if self.fresh:
            self.running.pop(side).stop()

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()
        self.running = {}


def together(servers: Servers, round_: int, scenario: Any) -> list[Run]:
    """One round with both servers driven at once, their client processes released together,
    so both sides meet the same machine in the same seconds (the base first)."""
    for side in ("base", "HEAD"):
        servers.get(side)
    release = threading.Barrier(2, timeout=600)
    done: dict[str, Run] = {}
    failed: list[BaseException] = []

    def one(side: str) -> None:
        try:
            done[side] = run_once(
                side, servers.get(side), servers.router_url, round_, scenario, release.wait
            )
        except BaseException as exc:  # reported by the caller; the other side is let go
            release.abort()
            failed.append(exc)

    threads = [threading.Thread(target=one, args=(side,)) for side in ("base", "HEAD")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for side in ("base", "HEAD"):
        servers.done(side)
    real = [exc for exc in failed if not isinstance(exc, threading.BrokenBarrierError)]
    if real or failed:
        raise (real or failed)[0]
    return [done["base"], done["HEAD"]]


def interleaved(
    servers: Servers, rounds: int, first: int, scenario: Any, *, at_once: bool = True
) -> list[Run]:
    """`rounds` rounds from round number `first`: both sides at once (`at_once`), else one
    after the other, base first in even rounds and HEAD first in odd ones."""
    runs = []
    for r in range(first, first + rounds):
        order = ("base", "HEAD") if r % 2 == 0 else ("HEAD", "base")
        if at_once:
            pair = together(servers, r, scenario)
        else:
            pair = []
            for side in order:
                try:
                    pair.append(run_once(side, servers.get(side), servers.router_url, r, scenario))
                finally:
                    servers.done(side)
        for run in pair:
            runs.append(run)
            print(
                f"gate e2e: round {r + 1} {run.side:4s} {run.results_per_second:8.1f} results/s, "
                f"p50 {run.p50 * 1e3:7.2f} ms (load average {run.load:.1f})",
                flush=True,
            )
    return runs
