"""`hotpath loadtest`: drive a sampling server like the Tinker SDK does, and report.

Starts the fake router and `hotpath serve` itself (or targets `--url`), then runs
`--client-processes` client processes, each bound to its own 127.0.0.x source address, that
submit `--num-requests` samples with at most `--concurrency` asample dispatches and
`--max-outstanding` samples in flight, poll them with 45 s timeouts, retry as the SDK retries
and check every result (see `impl.harness.client.sdk_shaped`; spawning the client processes and
merging what they report is `impl.harness.drive`). While it runs: a progress bar on stderr, and a
watcher of the server's RSS, open fds, CPU time, /healthz latency and /metrics (where each
result's time went: upstream wait, decode, encode, store, serve). At the end: a table, and with
`--report PATH` the JSON report. `--compare baseline` runs the same scenario against `hotpath
serve --baseline` and then the picked configuration, and prints them side by side with ratios;
`--compare inline` does the same with the picked configuration, then the same implementations
decoding on the server's event loop (`--offloop inline`), `--compare processes` with decode
processes (`--offloop processes`), `--compare fetch` with fetch processes (`--offloop fetch`).
`--profile PREFIX` records the server with py-spy (PREFIX.speedscope.json and PREFIX.svg).
`--background-load FRACTION` runs a fixed CPU burner beside the whole load test
(`impl.harness.burner`: a process per core busy FRACTION of every 10 ms), so "under load" is a
scenario, not whatever else the machine runs.

Every run is bounded: `--num-requests` and `--timeout` (unfinished samples are reported as
such); processes are stopped by PID; all traffic stays on 127.0.0.0/8. SIGINT or SIGTERM stops
the run and everything it started (client processes, server with its decode or fetch processes
and embedded store, router, py-spy) before it exits with 130 or 143. Exit status 0 only when
every requested sample completed and checked out.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from impl import registry
from impl.harness import burner, faults, presets, procs, report, watch
from impl.harness.drive import client_configs as client_configs
from impl.harness.drive import drive
from impl.harness.flags import add_arguments as add_arguments
from impl.harness.flags import scenario_from_args


def run_scenario(
    scenario: presets.Scenario,
    *,
    label: str,
    baseline: bool = False,
    url: str | None = None,
    router_url: str | None = None,
    server_pid: int | None = None,
    client: str = "http",
    seed: int = 0,
    verify: str = "count",
    tries: int = 16,
    backoff_base: float = 0.25,
    warmup: int = 1,
    settle_seconds: float = 120.0,
    profile: Path | None = None,
    progress_bar: bool = True,
    kill_one_at: float | None = None,
    before_go: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One run: start router and server (unless `url`), drive, sample, stop; the run dict.
    `before_go` is called once every client process is ready, just before they are released
    (`impl.ci.gate_e2e` releases two runs together with it)."""
    router = None
    recorders: list = []
    commands: dict[str, list[str]] = {}
    with procs.stopped_at_exit() as started:
        if url is None:
            router = procs.start_router([*scenario.router_args(), "--seed", str(seed)])
            started.append(router)
            router_url = router.url
            extra = scenario.server_args
            if client == "sdk" and scenario.poll == "request":  # the SDK follows client/config
                extra = (*extra, "--no-session-poll")
            server = procs.start_server(router.url, baseline=baseline, extra=extra)
            started.append(server)
            url, server_pid = server.url, server.pid
            commands = {"router": router.command, "server": server.command}
        watcher = watch.ServerWatch(
            server_pid,
            url,
            interval=scenario.healthz_interval,
            router_pid=router.pid if router else None,
        )
        if profile is not None and server_pid:
            recorders = procs.start_pyspy(server_pid, profile)
        try:
            watcher.start()
            configs = client_configs(
                url,
                scenario,
                seed=seed,
                verify=verify,
                tries=tries,
                backoff_base=backoff_base,
                warmup=warmup,
            )

            polls_at_go: dict[str, int] = {}
            settled: dict[str, Any] = {}
            killer = faults.KillOne(url, server_pid, kill_one_at) if kill_one_at else None

            def on_go() -> None:  # the measured window starts: forget the warm-up's peaks
                settled.update(watch.settle(url, settle_seconds))
                if before_go is not None:
                    before_go()
                watcher.restart()
                polls_at_go.update((watch.fetch_json(url + "/healthz") or {}).get("polls") or {})
                if router_url:
                    watch.fetch_json(router_url + "/stats?reset=1")
                if killer is not None:
                    killer.start()

            run = drive(configs, client=client, label=label, progress_bar=progress_bar, on_go=on_go)
            run["server"] = watcher.finish()
            run["settle"] = settled
            if killer is not None:
                run["fault"] = killer.finish()
            run["healthz_latencies"] = watcher.healthz_latencies
            run["healthz_timeline"] = watcher.healthz_timeline
            run["steps"] = watcher.step_split()
            run["steps_timeline"] = watcher.steps_timeline
            run["healthz"] = watch.fetch_json(url + "/healthz") or watcher.healthz
            polls_at_end = (run["healthz"] or {}).get("polls") or {}
            run["server_polls"] = {k: v - polls_at_go.get(k, 0) for k, v in polls_at_end.items()}
            run["router"] = watch.fetch_json(router_url + "/stats") if router_url else None
        finally:
            procs.stop_pyspy(recorders)  # before the server stops: py-spy writes its file
    run.update(label=label, scenario=scenario.as_json(), commands=commands)
    return run


def inline_scenario(
    scenario: presets.Scenario, picked: dict[str, Any], design: str = "inline"
) -> presets.Scenario:
    """`scenario` against a server that decodes on its event loop (`--offloop inline`, or
    `design`) with the implementations the picked run used (its /healthz picks), so only the
    design differs."""
    pinned: list[str] = []
    for family, name in report.picks(picked.get("healthz")).items():
        pinned += [f"--{family}", name]
    extra = (*scenario.server_args, *pinned, "--offloop", design)
    return scenario.with_overrides(server_args=extra)


def runtime_runs(scenario: presets.Scenario, common: dict[str, Any]) -> list[dict[str, Any]]:
    """One run per available HTTP runtime: the reference first, then each other one with
    the implementations the reference's server picked (its /healthz), so only the runtime
    differs."""
    reference, *others = registry.available("runtime")
    first = scenario.with_overrides(server_args=(*scenario.server_args, "--runtime", reference))
    runs = [run_scenario(first, label=reference, **common)]
    pinned: list[str] = []
    for family, name in report.picks(runs[0].get("healthz")).items():
        if family != "runtime":
            pinned += [f"--{family}", name]
    for name in others:
        args = (*scenario.server_args, *pinned, "--runtime", name)
        runs.append(run_scenario(scenario.with_overrides(server_args=args), label=name, **common))
    return runs


class Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run unwinds and stops what it started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def run(args: argparse.Namespace) -> int:
    """`hotpath loadtest`; SIGINT/SIGTERM stop every process it started (130/143)."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args)
    except Interrupted as stop:
        print(f"hotpath loadtest: {stop}: stopped every process it started", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    from impl.measure import environment

    scenario = scenario_from_args(args)
    # the flags run_scenario takes as they are, by their own names
    passed = ("url", "router_url", "server_pid", "client", "seed", "verify", "tries")
    passed += ("backoff_base", "warmup", "settle_seconds")
    common = {name: getattr(args, name) for name in passed}
    common["progress_bar"] = not args.no_progress
    if (args.compare or args.kill_one_at) and args.url:
        print(
            "--compare and --kill-one-at start their own servers; not with --url", file=sys.stderr
        )
        return 2
    if not 0 <= scenario.load_nice <= 19:
        print(f"--load-nice must be 0..19, got {scenario.load_nice}", file=sys.stderr)
        return 2
    if args.profile:
        try:
            procs.pyspy_executable()
        except procs.PySpyMissing as exc:
            print(f"hotpath loadtest --profile: {exc}", file=sys.stderr)
            return 2
    try:  # one burner for the whole load test, so both sides of --compare run beside it
        count = len(registry.available("runtime")) if args.compare == "runtime" else 2
        runs_budget = (scenario.timeout + 300) * (count if args.compare else 1)
        background = burner.start(args.background_load, seconds=runs_budget)
    except ValueError as exc:
        print(f"hotpath loadtest: {exc}", file=sys.stderr)
        return 2
    runs = []
    label = "baseline" if args.baseline else ("picked" if not args.url else "server")
    if args.compare == "baseline":
        runs.append(run_scenario(scenario, label="baseline", baseline=True, **common))
    elif args.compare == "poll":
        request = scenario.with_overrides(poll="request")
        runs.append(run_scenario(request, label="request-poll", baseline=args.baseline, **common))
        scenario, label = scenario.with_overrides(poll="session"), "session-poll"
    elif args.compare == "client":
        http = {**common, "client": "http"}
        runs.append(run_scenario(scenario, label="http-client", baseline=args.baseline, **http))
        common["client"], label = "sdk", "sdk-client"
    elif args.compare == "memory":  # the same scenario on one process and the memory store
        alone = scenario_from_args(args, shared=False)
        runs.append(run_scenario(alone, label="memory", **common))
    if args.server_workers or args.store:
        label = f"{args.server_workers or 1}x {args.store or 'auto'}"
    if args.compare == "runtime":
        runs = runtime_runs(scenario, common)
    else:
        runs.append(
            run_scenario(
                scenario,
                label=label,
                baseline=args.baseline,
                profile=args.profile,
                kill_one_at=args.kill_one_at,
                **common,
            )
        )
    if args.compare in (
        "inline",
        "processes",
        "fetch",
    ):  # same implementations, another decode design
        other = inline_scenario(scenario, runs[0], args.compare)
        runs.insert(0, run_scenario(other, label=args.compare, **common))
    if background is not None:
        background.stop()
    summaries = [report.summarize(r) for r in runs]
    print(
        f"\nhotpath loadtest --preset {args.preset}: {scenario.num_requests} samples x "
        f"{scenario.num_samples} of {scenario.max_tokens} tokens, {args.client} client, "
        f"poll {scenario.poll}, load nice {scenario.load_nice}"
    )
    if background is not None:
        used = background.stats()
        print(
            f"background load: {used['processes']} burner processes busy {used['fraction']:g} "
            f"of every {used['period_ms']:g} ms (used {used['cpu_seconds']} CPU s in "
            f"{used['wall_seconds']} s)"
        )
    if len(summaries) > 2:
        print(report.render_many(summaries))
    elif len(summaries) == 2:
        print(report.render_compare(*summaries))
    else:
        print(report.render_run(summaries[0]))
    problems = [f"[{s['label']}] {p}" for s in summaries for p in report.verdict(s)]
    for run_ in runs:
        if "fault" in run_:
            print(f"  [{run_['label']}] kill-one-at: {json.dumps(run_['fault'])}")
        for kind, message in run_.get("examples", {}).items():
            print(f"  [{run_['label']}] {kind}: {message}", file=sys.stderr)
    if args.report:
        data = report.report_json(runs, environment=environment())
        data["argv"] = sys.argv
        data["background_load"] = background.stats() if background is not None else None
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(data, indent=1))
        print(f"report: {args.report}")
    if args.profile:
        print(f"profile: {args.profile}.speedscope.json, {args.profile}.svg")
    for problem in problems:
        print(f"PROBLEM {problem}", file=sys.stderr)
    return 1 if problems else 0
