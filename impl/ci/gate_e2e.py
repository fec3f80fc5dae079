"""The gate's end-to-end stage: a sample's whole path, the base commit's server against HEAD's.

The timers and instruction counts of `impl.ci.gate` gate the CPU-bound steps; a change that
makes each sample wait longer (a delay in the poll path, answers held for a batch, requests
queued behind others) costs no CPU and passes them. This stage runs the server of each commit
under the same load client, router and scenario, and compares what a user of the server sees:
results per second and the median latency of a sample.

- **Each commit's server, one harness.** Each commit is exported into `.asv/e2e/<commit>` and
  its server runs from there with this interpreter (`impl.ci.trees`: the compiled decoders
  copied or built, one implementation per family that both trees have, so neither
  calibrates). The fake router and the load client are this tree's, for both commits.
- **The scenario** (`SCENARIO`): a closed loop of 4 samples in flight (2 client processes of
  2) over 1000 small samples against an instant router. With so few in flight nothing queues
  behind other samples: a sample's latency is what the server does for it (asample, forward,
  decode, encode, store, the poll that reports it, its fetch) plus the loopback hops, and a
  delay anywhere on that path shows. (16 in flight saturated a loaded machine, which then hid
  a sleep on the path; small-2048 submits everything at once, so its latency is mostly the
  order in which queued samples are served.)
- **Rounds side by side** (`ROUNDS`, 5): one server per commit, started once; each round
  drives both at once, their client processes released together, so both meet the machine in
  the same seconds (runs one after the other, seconds apart, differ by more than the factor
  between two servers of the same commit on a loaded machine: docs/measurements.md). Per round,
  HEAD/base of the p50 latency and base/HEAD of results/s (>1: HEAD is worse); the verdict is on the
  median of the per-round ratios, so one round disturbed by another job does not decide. Beyond the
  factor (1.3), or borderline (beyond its square root), as many rounds again, and the verdict on all
  of them.

`python -m impl.ci.gate_e2e --base REV --head REV` runs the stage alone (`make gate` runs it
after the instruction counts; `--only e2e` runs only it); with `--preset NAME`, `--poll` and
`--background-load F` it compares two commits' servers on any loadtest preset, one run after
the other with a fresh server each (how the small-result latency bisection is re-measured).
Exit 0: pass (or not compared: the base's server could not start); 1: slower end to end, or a
sample lost or failed; 2: the stage could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from impl.ci import trees as commit_trees
from impl.harness import load, presets, procs, report

ROOT = Path(__file__).resolve().parents[2]
FACTOR = 1.3
ROUNDS = 5
#: 1000 small samples, 4 in flight (2 per client process), instant router, minimal bodies
SCENARIO = presets.get("small-2048").with_overrides(
    num_requests=1000, max_outstanding=4, concurrency=4, timeout=240.0, healthz_interval=1.0
)


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


def ratios(runs: list[Run]) -> list[tuple[float, float]]:
    """Per round with both sides: (HEAD/base p50 latency, base/HEAD results/s); >1 is worse."""
    out = []
    for r in sorted({run.round for run in runs}):
        base = [x for x in runs if x.round == r and x.side == "base"]
        head = [x for x in runs if x.round == r and x.side == "HEAD"]
        if base and head:
            b, h = base[0], head[0]
            out.append((h.p50 / b.p50, b.results_per_second / h.results_per_second))
    return out


def verdict(pairs: list[tuple[float, float]], factor: float) -> tuple[float, float, bool]:
    """(median latency ratio, median throughput ratio, HEAD worse than the factor)."""
    latency = statistics.median(p for p, _ in pairs)
    throughput = statistics.median(q for _, q in pairs)
    return latency, throughput, latency > factor or throughput > factor


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
    servers: Servers, rounds: int, first: int, scenario: Any = SCENARIO, *, at_once: bool = True
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


def stage(
    base: str,
    head: str,
    *,
    rounds: int = ROUNDS,
    factor: float = FACTOR,
    workdir: Path | None = None,
    json_path: Path | None = None,
    scenario: Any = SCENARIO,
    fresh: bool = False,
) -> int:
    """The stage (see the module docstring): 0 pass or not compared, 1 slower, 2 could not run.
    `scenario`: another load than the gate's (`--preset`, for comparisons by hand); `fresh`: a
    new server for every run."""
    started = time.monotonic()
    workdir = workdir or ROOT / ".asv" / "e2e"
    trees = {
        "base": commit_trees.tree_of(base, workdir),
        "HEAD": commit_trees.tree_of(head, workdir),
    }
    flags = commit_trees.pins(list(trees.values()))
    print(
        f"gate e2e: {base[:8]} (base) vs {head[:8]} (HEAD), {rounds} interleaved rounds, "
        f"{scenario.num_requests} samples, {scenario.max_outstanding} in flight, factor "
        f"{factor}; servers with {' '.join(flags)}",
        flush=True,
    )
    router = procs.start_router([*scenario.router_args(), "--seed", "0"])
    servers = Servers(trees, flags, router.url, fresh)
    first: list[Run] = []
    try:
        try:
            runs = interleaved(servers, rounds, 0, scenario, at_once=not fresh)
        except NotStarted as exc:
            if exc.side == "base":
                print(f"gate e2e: not compared, the base's server did not start: {exc}")
                return 0
            print(f"gate e2e: FAIL - HEAD's server did not start: {exc}")
            return 1
        except RuntimeError as exc:  # a run lost or failed samples
            print(f"gate e2e: FAIL - {exc}")
            return 1
        first = list(runs)
        latency, throughput, worse = verdict(ratios(runs), factor)
        if worse or max(latency, throughput) > factor**0.5:
            why = "slower than the factor" if worse else "borderline"
            print(f"gate e2e: {why} ({latency:.2f}x latency, {throughput:.2f}x throughput), "
                  f"confirming with {rounds} more rounds", flush=True)  # fmt: skip
            runs += interleaved(servers, rounds, rounds, scenario, at_once=not fresh)
            latency, throughput, worse = verdict(ratios(runs), factor)
    finally:
        servers.stop()
        router.stop()
    pairs = ratios(runs)
    shown = ", ".join(f"{p:.2f}/{q:.2f}" for p, q in pairs)
    print(
        f"gate e2e: per round HEAD/base p50 latency / base/HEAD results/s: {shown}; medians "
        f"{latency:.2f}x latency, {throughput:.2f}x throughput ({time.monotonic() - started:.0f} s)"
    )
    if json_path is not None:
        json_path.write_text(
            json.dumps(
                {
                    "base": base,
                    "head": head,
                    "factor": factor,
                    "latency_ratio": latency,
                    "throughput_ratio": throughput,
                    "failed": worse,
                    "pairs": pairs,
                    "first_run_pairs": ratios(first),
                    "runs": [
                        {k: v for k, v in vars(run).items() if k != "summary"} for run in runs
                    ],
                },
                indent=1,
            )
            + "\n"
        )
    if worse:
        print(
            f"gate e2e: FAIL - HEAD's server is slower end to end by more than {factor}x "
            f"(p50 latency {latency:.2f}x, results/s {throughput:.2f}x)"
        )
        return 1
    print(f"gate e2e: PASS - p50 latency {latency:.2f}x, results/s {throughput:.2f}x the base's")
    return 0


def in_gate(base: str, head: str, args: Any, accepted: list[str]) -> tuple[int, dict[str, Any]]:
    """The stage as `impl.ci.gate` runs it: (exit status, the summary its --json keeps). A
    `Gate-accept: e2e` line between base and HEAD accepts an intended slowdown."""
    from impl.ci import gate_icount

    if args.compare_only:
        print("gate: the end-to-end stage is measured afresh, not with --compare-only")
        return 0, {}
    print(flush=True)
    path = ROOT / ".asv" / "gate-e2e.json"
    path.unlink(missing_ok=True)
    status = stage(base, head, rounds=args.e2e_rounds, factor=args.e2e_factor, json_path=path)
    summary = json.loads(path.read_text()) if path.exists() else {}
    path.unlink(missing_ok=True)
    if status == 1 and gate_icount.is_accepted("e2e", None, accepted):
        print("gate: slower end to end but accepted by commit message (Gate-accept: e2e)")
        status = 0
    elif status == 1:
        print(gate_icount.HOW_TO_ACCEPT.format(example="e2e"))
    summary["status"] = status
    return status, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.ci.gate_e2e",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", help="the base commit (default: HEAD's first parent)")
    parser.add_argument("--head", default="HEAD", help="the commit under test (default: HEAD)")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"rounds per side (>= 3, default {ROUNDS})"
    )
    parser.add_argument("--factor", type=float, default=FACTOR, help="slowdown that fails")
    parser.add_argument("--json", type=Path, help="write the runs and the verdict here")
    parser.add_argument(
        "--preset",
        choices=list(presets.PRESETS),
        help="compare the two servers on this loadtest preset instead of the gate's scenario "
        "(e.g. small-2048: the burst whose latency is the order samples are served in)",
    )
    parser.add_argument(
        "--poll", choices=("auto", "session", "request"), help="the load client's --poll"
    )
    parser.add_argument(
        "--background-load",
        type=float,
        metavar="FRACTION",
        help="run `hotpath loadtest --background-load`'s CPU burner for the whole comparison",
    )
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    head = commit_trees.git("rev-parse", "--verify", args.head)
    base = commit_trees.git("rev-parse", "--verify", args.base or f"{head}^")
    scenario = presets.get(args.preset) if args.preset else SCENARIO
    scenario = scenario.with_overrides(poll=args.poll)
    from impl.harness import burner

    with burner.running(args.background_load, seconds=3 * 3600):
        return stage(
            base,
            head,
            rounds=args.rounds,
            factor=args.factor,
            json_path=args.json,
            scenario=scenario,
            fresh=args.preset is not None,
        )


if __name__ == "__main__":
    sys.exit(main())
