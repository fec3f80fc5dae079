"""`hotpath profile`: py-spy flame graphs of one implementation in a tight loop, or of the server.

    hotpath profile decode simdjson --native     # a tight loop on the largest benchmark input
    hotpath profile encode picked                # `picked`: what the server would pick here
    hotpath profile pool aiohttp --in-flight 2048
    hotpath profile accesslog rich
    hotpath profile server --preset small-2048 [--baseline] [--num-requests N]
    hotpath profile summarize profiles/*.speedscope.json

A family profile starts the loop in a child process (`python -m impl.profile loop FAMILY IMPL`),
waits until its input is built (setup stays out of the profile), attaches `py-spy record` for
`--seconds`, once per format: OUT/FAMILY-IMPL.speedscope.json and OUT/FAMILY-IMPL.svg. A server
profile starts the fake router and `hotpath serve`, attaches two non-blocking recorders to the
server for the whole harness run (`impl.harness.load.run_scenario`) and writes
OUT/server-PRESET-{baseline,picked}.*. Every speedscope file carries a `hotpath` key with the
command, the input and the environment (speedscope ignores it). `summarize` prints the top
frames by self and total share, aggregated by function over all threads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from impl import registry
from impl.measure import LARGEST_TOKENS

_ROOT = Path(__file__).resolve().parents[1]
#: the largest in-flight count of the pool comparisons (docs/scenarios.md: 512, 2048, 4096)
POOL_IN_FLIGHT = 2048
DECODE_TOKENS = ENCODE_TOKENS = LARGEST_TOKENS


def _pyspy() -> str:
    """py-spy's path; `procs.PySpyMissing` with the install hint when it is not installed."""
    from impl.harness.procs import pyspy_executable

    return pyspy_executable()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    for family in registry.families():
        p = sub.add_parser(family, help=f"a tight loop of one {family} implementation")
        p.add_argument("impl", metavar="IMPL", help="registry name, or `picked`")
        p.add_argument("--seconds", type=float, default=10.0, help="recording time per format")
        p.add_argument("--native", action="store_true", help="include C/Rust frames")
        if family == "pool":
            p.add_argument("--in-flight", type=int, default=POOL_IN_FLIGHT)
        _common_options(p)
    p = sub.add_parser("server", help="the server during a `hotpath loadtest` run")
    p.add_argument("--preset", required=True, help="a `hotpath loadtest` preset")
    p.add_argument("--baseline", action="store_true", help="the configuration before the fixes")
    p.add_argument("--num-requests", type=int, help="override the preset's request count")
    _common_options(p, rate=50)
    p = sub.add_parser("summarize", help="top frames of speedscope files")
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=10)


def _common_options(parser: argparse.ArgumentParser, rate: int = 100) -> None:
    parser.add_argument("--rate", type=int, default=rate, help="samples per second")
    parser.add_argument("--out", type=Path, default=Path("profiles"), help="output directory")
    parser.add_argument("--name", help="file name prefix (default: derived from the target)")


def run(args: argparse.Namespace) -> int:
    if args.target == "summarize":
        for path in args.paths:
            print(f"## {path}\n\n{render_summary(summarize(path), args.top)}\n")
        return 0
    from impl.harness.procs import PySpyMissing

    try:
        _pyspy()  # before anything starts: a missing py-spy is a set-up problem, not a crash
    except PySpyMissing as exc:
        print(f"hotpath profile: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    if args.target == "server":
        prefix, problems = profile_server(args)
    else:
        prefix = profile_family(args)
    print(f"\n{render_summary(summarize(_json_path(prefix)), 10)}")
    for path in (_json_path(prefix), prefix.with_name(prefix.name + ".svg")):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    for problem in problems:  # a profile of a failing run shows the failure, not the hot path
        print(f"PROBLEM {problem}", file=sys.stderr)
    return 1 if problems else 0


def _json_path(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + ".speedscope.json")


def resolve(family: str, name: str) -> tuple[str, str]:
    """(implementation name, why): `picked` asks `impl.pick` as the server would."""
    if name != "picked":
        reason = registry.unavailable_reason(family, name)
        if reason:
            raise registry.UnavailableError(reason)
        return name, "named on the command line"
    from impl import pick
    from impl.server.calibration import calibrator

    exclude = ("null",) if family == "accesslog" else ()
    chosen = pick.pick(family, calibrator=calibrator(family), exclude=exclude)
    return chosen.name, f"picked: {chosen.reason}"


# -- family loops ------------------------------------------------------------------------------


def _decode(name: str, **_: Any) -> tuple[Callable[[], object], str]:
    from impl.workloads.synthetic import body_for

    body = body_for(DECODE_TOKENS)
    decoder = registry.create("decode", name)
    return lambda: decoder.decode(body), f"body_for({DECODE_TOKENS}): {len(body):,} bytes"


def _encode(name: str, **_: Any) -> tuple[Callable[[], object], str]:
    from impl.encode import samples

    completion = samples.sized(ENCODE_TOKENS)
    encoder = registry.create("encode", name)
    return lambda: encoder.encode(completion), f"samples.sized({ENCODE_TOKENS})"


def _accesslog(name: str, **_: Any) -> tuple[Callable[[], object], str]:
    import logging
    import logging.config

    from impl.accesslog import uvicorn_log_config
    from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE

    stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the loop process
    logging.config.dictConfig(uvicorn_log_config(name, stream=stream))
    logger = logging.getLogger(ACCESS_LOGGER)
    args = ("127.0.0.1:50000", "POST", "/api/v1/asample", "1.1", 200)

    def call() -> None:
        for _ in range(100):
            logger.info(ACCESS_MESSAGE, *args)

    return call, "100 uvicorn access records per call, written to os.devnull"


def _pool_loop(name: str, url: str, in_flight: int) -> None:
    """Rounds of `in_flight` concurrent posts to a barrier router at `url`, forever."""
    import asyncio

    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 16}).encode()
    headers = {"content-type": "application/json"}

    async def main() -> None:
        pool = registry.create("pool", name, max_connections=in_flight)
        await asyncio.gather(*(pool.post(url, body, headers) for _ in range(in_flight)))
        print(f"ready barrier router, {in_flight} in flight", flush=True)
        while True:
            await asyncio.gather(*(pool.post(url, body, headers) for _ in range(in_flight)))

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


_LOOPS: dict[str, Callable[..., tuple[Callable[[], object], str]]] = {
    "decode": _decode,
    "encode": _encode,
    "accesslog": _accesslog,
}


def loop_main(argv: list[str]) -> None:
    """The child: build the input, say `ready INPUT` on stdout, then call in a loop until killed."""
    family, name = argv[0], argv[1]
    # SIGTERM ends the loop at once: nothing to flush, and the parent owns any router.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if family == "pool":
        _pool_loop(name, url=argv[2], in_flight=int(argv[3]))
        return
    call, described = _LOOPS[family](name)
    call()  # warm up (first-call imports, caches) before the profile starts
    print(f"ready {described}", flush=True)
    while True:
        call()


def _record(pid: int, out: Path, fmt: str, *, seconds: float, rate: int, native: bool) -> None:
    command = [_pyspy(), "record", "--pid", str(pid), "--rate", str(rate), "--function"]
    command += ["--duration", str(max(1, round(seconds))), "--format", fmt, "-o", str(out)]
    if native:
        command.append("--native")
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:  # e.g. no ptrace permission (containers need CAP_SYS_PTRACE)
        raise RuntimeError(f"py-spy failed ({shlex.join(command)}):\n{done.stderr[-2000:]}")


def profile_family(args: argparse.Namespace) -> Path:
    """Record the loop child in both formats; returns the output prefix."""
    name, why = resolve(args.target, args.impl)
    prefix = args.out / (args.name or f"{args.target}-{name}")
    argv = [sys.executable, "-m", "impl.profile", "loop", args.target, name]
    router = child = None
    try:
        if args.target == "pool":
            from impl.harness import procs

            router = procs.start_router(
                ["--mode", "barrier", "--barrier", str(args.in_flight), "--body", "filler"]
            )
            argv += [router.url + "/v1/completions", str(args.in_flight)]
        child = subprocess.Popen(argv, cwd=_ROOT, stdout=subprocess.PIPE, text=True)
        ready = child.stdout.readline()  # type: ignore[union-attr]
        if not ready.startswith("ready"):
            raise RuntimeError(f"{args.target}/{name} loop did not start (exit {child.wait()})")
        described = ready.removeprefix("ready").strip()
        print(f"recording {args.target}/{name} ({why}) on {described}", file=sys.stderr)
        options = dict(seconds=args.seconds, rate=args.rate, native=args.native)
        _record(child.pid, _json_path(prefix), "speedscope", **options)
        _record(child.pid, prefix.with_name(prefix.name + ".svg"), "flamegraph", **options)
    finally:
        if child is not None:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if router is not None:
            router.stop()
    _annotate(prefix, args, implementation=name, why=why, input=described)
    return prefix


def profile_server(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The server under one harness run of `--preset`, recorded for the whole run.

    Returns the output prefix and the run's problems (`impl.harness.report.verdict`).
    """
    from impl.harness import load, presets, procs

    scenario = presets.get(args.preset)
    if args.num_requests:
        scenario = scenario.with_overrides(num_requests=args.num_requests)
    label = "baseline" if args.baseline else "picked"
    prefix = args.out / (args.name or f"server-{args.preset}-{label}")
    router = server = None
    recorders: list[subprocess.Popen] = []
    try:
        router = procs.start_router(scenario.router_args())
        server = procs.start_server(router.url, baseline=args.baseline, extra=scenario.server_args)
        svg = prefix.with_name(prefix.name + ".svg")
        for fmt, out in (("speedscope", _json_path(prefix)), ("flamegraph", svg)):
            command = [_pyspy(), "record", "--pid", str(server.pid), "--rate", str(args.rate)]
            command += ["--function", "--nonblocking", "--format", fmt, "-o", str(out)]
            recorders.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches
        result = load.run_scenario(
            scenario,
            label=label,
            url=server.url,
            router_url=router.url,
            server_pid=server.pid,
            progress_bar=False,
        )
    finally:
        procs.stop_pyspy(recorders)
        for proc in (server, router):
            if proc is not None:
                proc.stop()
    from impl.harness import report

    summary = report.summarize(result)
    keep = ("completed", "failed", "wall_seconds", "results_per_second", "server_cpu_seconds")
    described = f"{scenario.num_requests} x {scenario.max_tokens} tokens ({args.preset})"
    _annotate(
        prefix,
        args,
        implementation=label,
        why=json.dumps(summary.get("picks")),
        input=described,
        run={k: summary.get(k) for k in keep},
    )
    return prefix, report.verdict(summary)


def _annotate(prefix: Path, args: argparse.Namespace, **facts: Any) -> None:
    """Add the command, input and environment to the speedscope JSON (`hotpath` key)."""
    from impl.measure import environment

    path = _json_path(prefix)
    data = json.loads(path.read_text())
    command = ["hotpath", "profile", *sys.argv[2:]] if sys.argv[1:2] == ["profile"] else None
    data["name"] = f"hotpath profile {args.target} {facts['implementation']}"
    data["hotpath"] = {
        "target": args.target,
        **facts,
        "rate": args.rate,
        "command": shlex.join(command) if command else None,
        "environment": environment(),
    }
    path.write_text(json.dumps(data, separators=(",", ":")))


# -- summaries ---------------------------------------------------------------------------------


#: leaf functions that mean "this thread is blocked", not running Python code
_WAITS = frozenset(
    {"Condition.wait", "Event.wait", "Thread.join", "Queue.get", "Semaphore.acquire"}
)
#: frames of the profiling loop itself, left out of the total-share list
_HARNESS = re.compile(r"\((impl/profile\.py|<frozen runpy>)\)$")


_LIBRARY_PREFIX = re.compile(r".*/(?:site-packages|dist-packages|lib/python3\.\d+)/")
_ADDRESS = re.compile(r"0x[0-9a-f]+")
_ABI_TAG = re.compile(r"\.(?:cpython-\d+-[\w-]+|abi3)(?=\.so$)")


def _short(file: str) -> str:
    short = _ABI_TAG.sub("", _LIBRARY_PREFIX.sub("", file))
    if short.startswith(str(_ROOT) + "/"):
        return short[len(str(_ROOT)) + 1 :]
    return os.path.basename(short) if short.startswith("/") else short


def _key(frame: dict[str, Any]) -> str:
    """`function (file)`; native frames without a symbol become `<unresolved> (library)`."""
    name = frame["name"]
    if _ADDRESS.fullmatch(name):
        name = "<unresolved>"
    return f"{name} ({_short(frame.get('file') or '?')})"


def _by_file(weights: dict[str, float]) -> dict[str, float]:
    """Self weight per file (an unresolved native leaf counts for its library)."""
    out: dict[str, float] = {}
    for key, weight in weights.items():
        if key.startswith("["):
            file = key[1:].split("]", 1)[0]
        else:
            file = key.rsplit(" (", 1)[-1].rstrip(")")
        out[file] = out.get(file, 0.0) + weight
    return out


def _leaf(keys: list[str], stack: list[int]) -> str:
    """The leaf's key; an unresolved native leaf names its first resolved caller."""
    leaf = keys[stack[-1]]
    if not leaf.startswith("<unresolved>"):
        return leaf
    library = leaf.removeprefix("<unresolved> (").removesuffix(")")
    caller = next((keys[i] for i in reversed(stack) if not keys[i].startswith("<un")), None)
    return f"[{library}] under {caller.rsplit(' (', 1)[0]}" if caller else leaf


def summarize(path: Path) -> dict[str, Any]:
    """Self and total share per function over all threads of a py-spy speedscope file."""
    data = json.loads(Path(path).read_text())
    frames = data["shared"]["frames"]
    keys = [_key(f) for f in frames]
    self_w: dict[str, float] = {}
    total_w: dict[str, float] = {}
    threads: dict[str, float] = {}
    all_w = 0.0
    for profile in data["profiles"]:
        weight_sum = 0.0
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            weight_sum += weight
            if stack:
                leaf = _leaf(keys, stack)
                self_w[leaf] = self_w.get(leaf, 0.0) + weight
            for key in {keys[i] for i in stack}:
                total_w[key] = total_w.get(key, 0.0) + weight
        threads[profile["name"]] = weight_sum
        all_w += weight_sum
    all_w = all_w or 1.0

    def shares(weights: dict[str, float]) -> list[tuple[str, float]]:
        return sorted(((k, v / all_w) for k, v in weights.items()), key=lambda kv: (-kv[1], kv[0]))

    for key in [k for k in total_w if k.startswith("<unresolved>") or _HARNESS.search(k)]:
        del total_w[key]  # the loop's own frames and thread roots sit on every stack

    return {
        "path": str(path),
        "samples": sum(len(p["samples"]) for p in data["profiles"]),
        "seconds": all_w if data["profiles"][0].get("unit") == "seconds" else None,
        "threads": shares(threads),
        "self": shares(self_w),
        "files": shares(_by_file(self_w)),
        "waiting": sum(w for k, w in self_w.items() if k.split(" (")[0] in _WAITS) / all_w,
        "total": shares(total_w),
        "hotpath": data.get("hotpath", {}),
    }


def _clip(key: str, width: int = 72) -> str:
    """Long C++ template names cut in the middle of the function name, the file kept."""
    if len(key) <= width:
        return key
    name, sep, file = key.rpartition(" (")
    if not sep:
        return key[: width - 1] + "…"
    keep = max(width - len(file) - 4, 16)
    return f"{name[:keep]}… ({file}"


def render_summary(summary: dict[str, Any], top: int = 10) -> str:
    """Markdown: the top functions by self share and by total (inclusive) share."""
    lines = [f"{summary['samples']} samples"]
    if len(summary["threads"]) > 1:
        threads = ", ".join(f"{name} {share:.0%}" for name, share in summary["threads"][:4])
        lines[0] += f"; threads: {threads}"
    files = ", ".join(f"`{name}` {share:.0%}" for name, share in summary["files"][:5])
    if summary["waiting"] >= 0.005:
        lines[0] += f"; {summary['waiting']:.0%} in thread waits (`Condition.wait` etc.)"
    lines += ["", f"self time by file: {files}"]
    lines += ["", "| self | function | | total | function |", "|---:|---|---|---:|---|"]
    selfs, totals = summary["self"][:top], summary["total"][:top]
    for i in range(max(len(selfs), len(totals))):
        left = f"{selfs[i][1]:.1%} | `{_clip(selfs[i][0])}`" if i < len(selfs) else " | "
        right = f"{totals[i][1]:.1%} | `{_clip(totals[i][0])}`" if i < len(totals) else " | "
        lines.append(f"| {left} | | {right} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["loop"]:
        loop_main(sys.argv[2:])
    else:
        sys.exit(f"usage: python -m impl.profile loop FAMILY IMPL [IN_FLIGHT]; see {__doc__}")
