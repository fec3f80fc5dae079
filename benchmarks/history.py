"""The history subset: each family's headline figure, short enough to run on every landing.

`make asv-history` runs only this module (`--bench '^history\\.'`) over the first-parent
commits of main, with asv.history.json (results committed under benchmarks/results/,
benchmarks/README.md). Each commit installs its own package while these benchmarks come from
the current checkout, so nothing of `impl` is imported at the top beyond `impl.registry` (in
every commit that has a family): each setup imports what it needs through `history_compat`,
and what a commit lacks is n/a (NotImplementedError), as asv shows it.

- `Decode`: every decoder of the registry on one real-text body (prose, 262,144 tokens, as
  json.dumps renders it), frozen on disk so every commit decodes the same bytes; CPU time.
- `Encode`, `Pool`, `AccessLog`: the implementation the server picks here, on the inputs of
  the full suite (262,144 tokens; 1,024 requests in flight; one access record).
- `EndToEnd`: one round of the small-2048 loadtest (2,048 small results), results/s.
- `Instructions`: the gate's instruction counts (`impl.ci.icount`'s method, via
  `history_icount.py`) of the CPU-bound steps; a count is the same in every process, so these
  graphs compare across days where the timings above carry the day's load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from impl import registry

from .history_compat import frozen_body, guarded

DECODE_KIND, DECODE_TOKENS = "prose", 262144
#: the decoders, by name (append only): a fixed list, not the installed commit's registry,
#: since asv keeps results by parameter index and older commits registered fewer, in another
#: order; a name a commit lacks is n/a (tests/ci/test_history.py: every registered one is here)
DECODERS = (
    "json",
    "orjson",
    "ujson",
    "msgspec",
    "fromstring",
    "simdjson",
    "simdjson_nogil",
    "onepass_nogil",
    "onepass_nogil_avx2",
    "auto",
)
ENCODE_TOKENS = 262144
POOL_IN_FLIGHT = 1024
E2E_REQUESTS = 2048
FACTS = ("127.0.0.1:50123", "POST", "/api/v1/retrieve_future", "1.1", 200)
#: the gate's steps counted here: the CPU-bound ones (the server routes need today's app)
ICOUNT_STEPS = ["decode-262k", "decode-128", "encode-262k", "accesslog-record"]
#: `impl.ci.icount.FIXED_ENV` (tests/ci/test_history.py checks they agree)
FIXED_ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
#: every class's asv version: results stay comparable across edits of this file that keep what
#: is measured; raise it when a change alters a figure (asv then starts that graph afresh)
VERSION = "1"
#: seconds one counted process may take (a 262k decode under Valgrind is the longest)
ICOUNT_TIMEOUT = 900


def picked(family: str) -> str:
    """The implementation the installed commit's server picks here."""
    from impl import pick

    return pick.pick(family).name


def _available(family: str, name: str) -> None:
    if name not in registry.names(family):
        raise NotImplementedError(f"{family}: no {name} in this commit")
    reason = registry.unavailable_reason(family, name)
    if reason:
        raise NotImplementedError(reason)


class Decode:
    """One real-text body decoded by each decoder (CPU time of a warm decoder's call)."""

    version = VERSION

    params = (list(DECODERS),)
    param_names = ("implementation",)
    timer = time.process_time
    number, repeat, rounds, warmup_time = 1, 3, 1, 0.0
    timeout = 300

    def setup(self, implementation):
        _available("decode", implementation)
        self.body = frozen_body(DECODE_KIND, DECODE_TOKENS)
        self.decoder = registry.create("decode", implementation)
        self.decoder.decode(self.body)  # warm, as the server keeps its decoder

    def time_decode(self, implementation):
        self.decoder.decode(self.body)


class Encode:
    """The picked encoder on a 262,144-token completion (CPU time)."""

    version = VERSION

    timer = time.process_time
    number, repeat, rounds, warmup_time = 1, 5, 1, 0.0
    timeout = 120

    def setup(self):
        samples = guarded(lambda: __import__("impl.encode.samples", fromlist=["sized"]))
        self.encoder = registry.create("encode", picked("encode"))
        self.completion = samples.sized(ENCODE_TOKENS)
        self.encoder.encode(self.completion)

    def time_encode(self):
        self.encoder.encode(self.completion)


class Pool:
    """One burst of 1,024 requests through the picked forwarder, connections already open."""

    version = VERSION

    number, repeat, rounds, warmup_time = 1, 3, 1, 0.0
    timeout = 300

    def setup(self):
        self.bench = guarded(lambda: __import__("impl.bench.pool", fromlist=["REQUEST"]))
        self.router = self.bench.start_barrier_router(POOL_IN_FLIGHT)
        self.url = self.router.url + "/v1/completions"
        self.loop = asyncio.new_event_loop()
        name = picked("pool")
        self.forwarder = registry.create("pool", name, max_connections=POOL_IN_FLIGHT)
        try:
            self.time_forward()  # opens the connections
        except BaseException:
            self.teardown()
            raise

    def teardown(self):
        router = self.__dict__.pop("router", None)
        if router is None:
            return
        try:
            self.loop.run_until_complete(self.forwarder.aclose())
            self.loop.close()
        finally:
            router.stop()

    async def _burst(self):
        post, bench = self.forwarder.post, self.bench
        return await asyncio.gather(
            *(post(self.url, bench.REQUEST, bench.HEADERS) for _ in range(POOL_IN_FLIGHT))
        )

    def time_forward(self):
        if any(reply.status != 200 for reply in self.loop.run_until_complete(self._burst())):
            raise RuntimeError("a forward failed")


class AccessLog:
    """One uvicorn access record through `logger.info` and the picked handler (thread CPU)."""

    version = VERSION

    timer = time.thread_time
    rounds, warmup_time = 1, 0.0
    timeout = 120

    def setup(self):
        common = guarded(lambda: __import__("impl.accesslog._common", fromlist=["ACCESS_LOGGER"]))
        self.devnull = open(os.devnull, "w")  # noqa: SIM115 - closed in teardown
        handler = registry.create("accesslog", picked("accesslog"), stream=self.devnull)
        self.handler = handler
        self.logger = logging.Logger(common.ACCESS_LOGGER)
        self.logger.addHandler(handler)
        self.message = common.ACCESS_MESSAGE
        for _ in range(2):
            self.logger.info(self.message, *FACTS)

    def teardown(self):
        handler = self.__dict__.pop("handler", None)
        if handler is not None:
            handler.close()
            self.devnull.close()

    def time_logger_info(self):
        self.logger.info(self.message, *FACTS)


class EndToEnd:
    """One round of the small-2048 loadtest through the picked server (results/s)."""

    version = VERSION

    timeout = 300

    def setup_cache(self):
        def run():
            from impl.harness import load, presets, report

            scenario = presets.get("small-2048").with_overrides(
                num_requests=E2E_REQUESTS, timeout=120.0
            )
            result = load.run_scenario(scenario, label="history", progress_bar=False)
            if hasattr(report, "checked_summary"):
                return report.checked_summary(result, "history round")
            summary = report.summarize(result)  # older commits: the same check, unwrapped
            problems = report.verdict(summary)
            if problems:
                raise RuntimeError("history round: " + "; ".join(problems))
            return summary

        summary = guarded(run)
        return {
            "results_per_second": summary["results_per_second"],
            "server_cpu_ms_per_sample": 1e3 * summary["server_cpu_seconds"] / summary["completed"],
        }

    def track_results_per_second(self, data):
        return data["results_per_second"]

    track_results_per_second.unit = "results/s"

    def track_server_cpu_ms_per_sample(self, data):
        return data["server_cpu_ms_per_sample"]

    track_server_cpu_ms_per_sample.unit = "ms"


def _summary(path: Path) -> int:
    match = re.search(r"^summary:\s+(\d+)", path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no summary line")
    return int(match.group(1))


def count(step: str) -> int:
    """The gate's count of `step` for the installed commit: `impl.ci.icount.count` itself where
    the commit has it and knows the step, else today's steps file run by `history_icount.py`
    in the same fresh-process, fixed-environment way."""
    try:
        from impl.ci import icount
    except ImportError:
        icount = None
    if icount is not None and step in icount.STEPS:
        return icount.count(step)
    script = Path(__file__).resolve().parent / "history_icount.py"
    with tempfile.TemporaryDirectory(prefix="hotpath-history-icount-") as out:
        command = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}/cachegrind.%p",
            f"--log-file={out}/valgrind.%p.log",
            sys.executable,
            "-P",
            str(script),
            step,
        ]
        env = {**os.environ, **FIXED_ENV}
        done = subprocess.run(
            command, env=env, cwd=out, capture_output=True, text=True, timeout=ICOUNT_TIMEOUT
        )
        if done.returncode != 0:
            tail = done.stderr[-2000:]
            if "ModuleNotFoundError" in tail or "ImportError" in tail or "AttributeError" in tail:
                raise NotImplementedError(f"{step}: not in this commit\n{tail}")
            raise RuntimeError(f"{step}: exit {done.returncode}\n{tail}")
        pids = json.loads(done.stdout.strip().splitlines()[-1])
        repeats = pids.pop("repeats")
        totals = {key: _summary(Path(out, f"cachegrind.{pid}")) for key, pid in pids.items()}
    return round((totals["call"] - (totals["before"] + totals["after"]) / 2) / repeats)


class Instructions:
    """Instructions of one warm call of each CPU-bound step, as the gate counts them."""

    version = VERSION

    params = (ICOUNT_STEPS,)
    param_names = ("step",)
    number, repeat, rounds = 1, 1, 1
    timeout = 1200

    def setup(self, step):
        if shutil.which("valgrind") is None:
            raise NotImplementedError("valgrind is not installed (apt-get install -y valgrind)")

    def track_instructions(self, step):
        return count(step)

    track_instructions.unit = "instructions"
