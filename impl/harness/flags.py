"""`hotpath loadtest`'s flags, and the scenario they make from a preset.

`add_arguments(parser)` declares them (the scenario's own fields as overrides of `--preset`,
then what is not part of a scenario: the target, the comparisons, the check, the report);
`scenario_from_args(args)` applies them to the preset.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from impl.harness import presets

_SCENARIO_FLAGS = {
    # flag: (Scenario field, type, help)
    "--num-requests": ("num_requests", int, "samples to submit"),
    "--prompt-tokens": ("prompt_tokens", int, "prompt length in tokens"),
    "--max-tokens": ("max_tokens", int, "tokens generated per sequence"),
    "--num-samples": ("num_samples", int, "sequences per sample (n)"),
    "--concurrency": ("concurrency", int, "concurrent asample dispatches (the SDK's 400)"),
    "--max-outstanding": ("max_outstanding", int, "samples in flight (submitted, not retrieved)"),
    "--client-processes": (
        "client_processes",
        int,
        "client processes, one 127.0.0.x source address each (--workers: its earlier name)",
    ),
    "--distinct-prompts": ("distinct_prompts", int, "distinct (prompt, seed) pairs cycled"),
    "--timeout": ("timeout", float, "stop the run after this many seconds"),
    "--poll-timeout": ("poll_timeout", float, "client timeout of one retrieve_future poll"),
    "--router-mode": ("router_mode", str, "fake router mode: instant, barrier, latency"),
    "--body": (
        "router_body",
        str,
        "fake router body: minimal, synthetic (= vllm), prose, code, multilingual or mixed",
    ),
    "--render": (
        "router_render",
        str,
        "fake router rendering: json (as vLLM), orjson, or packed (vLLM's packed logprobs, to "
        "a server that asks: --server-arg=--upstream-logprobs=auto)",
    ),
    "--router-workers": ("router_workers", int, "fake router processes sharing the port"),
    "--gen-seconds": ("gen_seconds", float, "latency mode: seconds per generation"),
    "--max-num-seqs": ("max_num_seqs", int, "latency mode: generations at once"),
    "--fail": ("router_fail", str, "router fault rates, e.g. 500:0.01,html:0.01,reset:0.01"),
    "--poll": (
        "poll",
        str,
        "how samples wait: session (one retrieve_futures poller per client process, then one "
        "fetch per result), request (one held retrieve_future poll per sample), auto (what the "
        "server's client/config says, as the SDK does); with --client sdk it sets the server's "
        "--session-poll/--no-session-poll",
    ),
    "--delay": ("delay", float, "delay mode: seconds before the router answers"),
    "--load-nice": (
        "load_nice",
        int,
        "niceness of the client processes (0..19): on one machine they would take the "
        "CPU the measured server needs; the server, the fake router (the engine the server "
        "waits on) and the /healthz prober keep their priority",
    ),
    "--healthz-interval": (
        "healthz_interval",
        float,
        "seconds between /healthz probes (fresh connection each) and server RSS samples",
    ),
}


#: flag -> its earlier spellings, still accepted
_OLD_FLAGS = {"--client-processes": ("--workers",)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(f"{name} ({desc})" for name, (_, desc) in presets.PRESETS.items())
    parser.add_argument(
        "--preset",
        default="small-2048",
        choices=list(presets.PRESETS),
        metavar="NAME",
        help=f"scenario to start from: {names}",
    )
    for flag, (_, kind, help_text) in _SCENARIO_FLAGS.items():
        parser.add_argument(
            flag,
            *_OLD_FLAGS.get(flag, ()),
            dest=flag[2:].replace("-", "_"),
            type=kind,
            default=None,
            choices=("auto", "session", "request") if flag == "--poll" else None,
            help=f"{help_text} (overrides the preset)",
        )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `hotpath serve` argument (repeatable; use --server-arg=--flag)",
    )
    parser.add_argument("--url", help="target this running server instead of starting one")
    parser.add_argument("--router-url", help="with --url: the router whose /stats to report")
    parser.add_argument("--server-pid", type=int, help="with --url: sample this PID's RSS/fds/CPU")
    parser.add_argument(
        "--client",
        choices=("http", "sdk"),
        default="http",
        help="http: the SDK-shaped aiohttp client; sdk: the real Tinker SDK",
    )
    parser.add_argument(
        "--baseline", action="store_true", help="run against `hotpath serve --baseline` only"
    )
    parser.add_argument(
        "--compare",
        choices=(
            "baseline",
            "poll",
            "client",
            "inline",
            "processes",
            "fetch",
            "memory",
            "runtime",
        ),
        help="two runs side by side with ratios: baseline (`hotpath serve --baseline`, then the "
        "picked configuration), poll (--poll request, then --poll session), client (the "
        "SDK-shaped http client, then the real SDK), inline (the picked configuration, then the "
        "same implementations decoding on the server's event loop, `--offloop inline`), processes "
        "(the same with decode processes, `--offloop processes`), fetch (the same with "
        "fetch processes, `--offloop fetch`), memory "
        "(one process on the memory store, then --server-workers/--store); runtime: one run per "
        "available HTTP runtime (`serve --runtime NAME`, the reference first, the other "
        "families pinned to its picks), side by side",
    )
    parser.add_argument(
        "--server-workers",
        type=int,
        help="server processes on one port (`serve --workers N`)",
    )
    parser.add_argument(
        "--store", help="the server's future store (`serve --store`: memory, embedded, redis://…)"
    )
    parser.add_argument(
        "--kill-one-at",
        type=float,
        metavar="SECONDS",
        help="SIGKILL one server process (with forwards in flight) SECONDS into the run; "
        "needs --server-workers >= 2",
    )
    parser.add_argument(
        "--verify",
        choices=("count", "exact"),
        default="count",
        help="check token counts, or the exact tokens the router generated",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="prompts, router faults, backoff jitter"
    )
    parser.add_argument(
        "--tries", type=int, default=16, help="tries per request on retryable errors"
    )
    parser.add_argument(
        "--backoff-base",
        type=float,
        default=0.25,
        help="first retry delay in seconds (doubles per try, capped at 30 s)",
    )
    parser.add_argument(
        "--warmup", type=int, default=1,
        help="unmeasured samples per distinct prompt (and router process) before the run",
    )  # fmt: skip
    parser.add_argument(
        "--settle-seconds", type=float, default=120.0,
        help="after the warm-up, wait up to this long for the server to release the warm-up's "
        "results (when they are 16 MiB or more: a server keeps fetched results for its "
        "retrieved TTL), so the measured peak RSS is the run's own; 0: do not wait",
    )  # fmt: skip
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PREFIX",
        help="py-spy the server: PREFIX.speedscope.json and PREFIX.svg",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--background-load",
        type=float,
        metavar="FRACTION",
        help="run a CPU burner beside the load: one process per core, each busy FRACTION "
        "(0 < F <= 1) of every 10 ms at the server's priority, like a neighbour on the same "
        "host; for the whole load test (both runs of --compare), stopped with it",
    )


def scenario_from_args(args: argparse.Namespace, shared: bool = True) -> presets.Scenario:
    """The preset with the flags' overrides (`shared=False`: without --server-workers/--store)."""
    scenario = presets.get(args.preset)
    changes = {
        field: getattr(args, flag[2:].replace("-", "_"))
        for flag, (field, _, _) in _SCENARIO_FLAGS.items()
    }
    extra = list(args.server_arg)
    if shared and args.server_workers:
        extra += ["--workers", str(args.server_workers)]
    if shared and args.store:
        extra += ["--store", args.store]
    if extra:
        changes["server_args"] = (*scenario.server_args, *extra)
    return scenario.with_overrides(**changes)
