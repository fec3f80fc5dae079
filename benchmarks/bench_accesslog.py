"""Access-log family: what each handler costs the thread that logs (uvicorn's event loop).

Input: one uvicorn access record (`impl.accesslog._common.access_record`), the same one for
every handler, written to os.devnull. Params are the registry table; a handler that cannot run
here raises NotImplementedError in setup (n/a), and so does one whose line differs from the
reference's (no speed without correctness). `UvicornServer` runs a real uvicorn (uvloop,
httptools, trivial route) in a subprocess per measurement and reads its CPU from /proc.
"""

import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from impl import registry
from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE, access_record, parse_lines
from impl.bench.accesslog import caller_cost, server_cost

NAMES = list(registry.names("accesslog"))
FACTS = ("127.0.0.1:50123", "GET", "/api/v1/retrieve_future", "1.1", 200)


def _check(implementation):
    """NotImplementedError (n/a) when unavailable or when its line differs from the reference."""
    reason = registry.unavailable_reason("accesslog", implementation)
    if reason:
        raise NotImplementedError(reason)
    if implementation == "null":
        return
    written = []
    for name in (registry.reference("accesslog"), implementation):
        stream = io.StringIO()
        handler = registry.create("accesslog", name, stream=stream)
        handler.handle(access_record(*FACTS))
        handler.close()
        written.append(parse_lines(stream.getvalue()))
    if written[0] != written[1]:
        raise NotImplementedError(f"{implementation}: line differs from the reference")


def _only_with_listener(implementation):
    """Setup of `track_listener_cpu_us` alone (asv also runs the class's): n/a without a listener.

    Raised here, not in the benchmark body, so asv records n/a rather than a failure.
    """
    if implementation != "queue":
        raise NotImplementedError(f"{implementation}: no listener thread (only queue has one)")


class AccessRecord:
    """One access record on the calling thread: the handler alone, and uvicorn's whole call.

    Timer: `time.thread_time`, the CPU time of the calling thread only. The claim is the cost
    on the thread that logs (uvicorn's event loop); `process_time` would also charge whatever
    the queue handler's listener thread formats and writes while a sample runs (it wakes every
    10 ms), by accident of scheduling, and wall time would charge time the thread waited for
    the GIL or for a core. The listener's CPU is reported by `track_listener_cpu_us`.
    Warm: asv re-runs `setup` before every sample (one call each), so `setup` ends with two
    untimed calls of each path; the first call after creating a handler costs several times the
    following ones, and that first call is not what uvicorn pays.
    """

    params = (NAMES,)
    param_names = ("implementation",)
    timeout = 300
    timer = time.thread_time
    rounds = 1  # one process per handler; the gate passes -a rounds=4 for the one it times

    def setup(self, implementation):
        _check(implementation)
        self.devnull = open(os.devnull, "w")  # noqa: SIM115 - closed in teardown
        self.handler = registry.create("accesslog", implementation, stream=self.devnull)
        self.logger = logging.Logger(ACCESS_LOGGER)
        self.logger.addHandler(self.handler)
        self.record = access_record(*FACTS)
        for _ in range(2):  # warm (see the class docstring)
            self.handler.handle(self.record)
            self.logger.info(ACCESS_MESSAGE, *FACTS)

    def teardown(self, implementation):
        self.handler.close()
        self.devnull.close()

    def time_handle(self, implementation):
        self.handler.handle(self.record)

    def time_logger_info(self, implementation):
        self.logger.info(ACCESS_MESSAGE, *FACTS)

    def track_caller_cpu_us(self, implementation):
        # Thread CPU time, so a queue's listener taking the GIL is not charged to the caller.
        return caller_cost(implementation, rounds=3)["handle_us"]

    track_caller_cpu_us.unit = "µs"

    def track_listener_cpu_us(self, implementation):
        return caller_cost(implementation, rounds=3)["listener_us"]

    track_listener_cpu_us.unit = "µs"
    track_listener_cpu_us.setup = _only_with_listener


class UvicornServer:
    """A real uvicorn serving a trivial route; server CPU per request with each handler.

    One server run per handler feeds both tracks: the first track to run keeps its result in
    `setup_cache`'s directory and the other reads it back (a run drives 5000 requests, 1000
    with rich, and asv would otherwise start a server per track and per round).
    """

    params = (NAMES,)
    param_names = ("implementation",)
    timeout = 600
    number = 1
    repeat = 1
    rounds = 1

    def setup_cache(self):
        """A directory where each handler's server run is kept for both tracks."""
        return tempfile.mkdtemp(prefix="hotpath-bench-accesslog-")

    def setup(self, cache, implementation):
        _check(implementation)
        self.requests = 1000 if implementation == "rich" else 5000

    def _measure(self, cache, implementation):
        path = Path(cache, f"{implementation}.json")
        if not path.exists():
            result = server_cost(implementation, self.requests)
            if not result["complete"]:
                raise RuntimeError(
                    f"{implementation}: {result['lines']} lines, not all were logged"
                )
            path.write_text(json.dumps(result))
        return json.loads(path.read_text())

    def track_process_cpu_us_per_request(self, cache, implementation):
        return self._measure(cache, implementation)["total_us"]

    track_process_cpu_us_per_request.unit = "µs"

    def track_loop_cpu_us_per_request(self, cache, implementation):
        return self._measure(cache, implementation)["loop_us"]

    track_loop_cpu_us_per_request.unit = "µs"
