"""The CPU-bound steps whose instructions `impl.ci.icount` counts, and the forked measurement.

`python -m impl.ci.icount_steps STEP` (run under Valgrind by `impl.ci.icount`, never by hand)
imports what STEP needs, builds its input, calls it twice to warm it (as the server keeps its
decoder, encoder and handler), and forks a child (which has one thread, whatever threads this
process runs) that collects garbage and forks three children in turn: the first and the third
exit at once, the second makes the measured call (REPEATS times for the small steps) and exits.
Each leaves with `os._exit` (no interpreter shutdown), so the three differ only by the call,
and by the fork and wait the later children inherit from the earlier ones: the count is the
second child's total minus the mean of the other two, divided by REPEATS, which cancels
start-up, imports, input building and that fork overhead. The children's pids are printed as
JSON.

Steps (the picked implementation of each family, as the server would pick it here):
- `decode-262k`, `decode-128`: the picked decoder on a realistic vLLM body (logprobs=1) of
  262,144 generated tokens and of 128 tokens.
- `encode-262k`: the picked encoder on a 262,144-token completion.
- `accesslog-record`: one uvicorn access record through `logger.info` and the picked handler
  (into os.devnull), with `logging`'s clock frozen (`FrozenClock` says why). A queue handler's
  listener thread is paused before the forks (it would not survive them anyway), so this is
  the cost on the logging thread only, as the time benchmark's thread CPU time is.
- `asample`, `retrieve-try-again`: the production app's hot routes, driven in-process over
  ASGI (no socket) with the forward stubbed, as `impl.bench._server_apps` runs it: a new
  sample's route, and a poll of a pending sample answered try_again (no poll hold). The app's
  periodic timers (loop lag, store sweep) are stopped first, so nothing else runs in the call.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import sys
from collections.abc import Callable
from typing import Any

Call = Callable[[], object]

DECODE_BODY = "vllm"
BIG_TOKENS, SMALL_TOKENS = 262144, 128
API_KEY = b"tml-icount"


def picked(family: str) -> str:
    """The implementation the server would pick here without calibrating."""
    from impl import pick

    return pick.pick(family).name


def decode_step(tokens: int) -> Call:
    from impl import registry
    from impl.workloads.synthetic import body_for

    decoder = registry.create("decode", picked("decode"))
    body = body_for(tokens, kind=DECODE_BODY)
    return lambda: decoder.decode(body)


def encode_step() -> Call:
    from impl import registry
    from impl.encode import samples

    encoder = registry.create("encode", picked("encode"))
    completion = samples.sized(BIG_TOKENS)
    return lambda: encoder.encode(completion)


#: the wall clock the access-log step's records read (2025-12-01 00:00:00.500 UTC), see below
FROZEN_CLOCK = 1_764_547_200.5


class FrozenClock:
    """`logging`'s view of the `time` module with `time()` fixed at FROZEN_CLOCK.

    A LogRecord stores `int(milliseconds)` of its wall-clock time, and CPython caches the ints
    below 257 instead of allocating them: with a real clock a record's cost depends on which
    millisecond it falls in, and a formatter that caches per second pays a strftime at each
    new second, so counts would wander between processes. A fixed
    time at .500 s counts the common case (allocated, most real records); `functools.partial
    (float, t)` is a C call like `time.time()`, so the count changes only by the clock read
    itself (a few dozen instructions, the same in every process).
    """

    def __init__(self) -> None:
        import functools

        self.time = functools.partial(float, FROZEN_CLOCK)

    def __getattr__(self, name: str) -> Any:
        import time

        return getattr(time, name)


def accesslog_step() -> Call:
    import logging

    from impl import registry
    from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE

    facts = ("127.0.0.1:50123", "POST", "/api/v1/retrieve_future", "1.1", 200)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as this process
    logger = logging.Logger(ACCESS_LOGGER)
    handler = registry.create("accesslog", picked("accesslog"), stream=devnull)
    logger.addHandler(handler)
    logging.time = FrozenClock()  # type: ignore[attr-defined]  # this process only

    def call() -> None:
        logger.info(ACCESS_MESSAGE, *facts)

    def settle() -> None:
        """Write what the warm calls queued and pause a listener thread (`queue`): the measured
        child has no listener either (threads do not survive a fork), and one waking every
        10 ms here would leave this process's heap depending on when the fork happened. So
        this is the cost on the logging thread only, as the time benchmark's thread CPU time
        is; records the calls queue stay queued."""
        handler.flush()
        pause = getattr(handler, "pause", None)
        if pause is not None:
            pause()

    call.settle = settle  # type: ignore[attr-defined]
    return call


class AsgiClient:
    """Requests to an ASGI app on one event loop, in this thread, without a socket."""

    def __init__(self, app: Any, state: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.state, self.loop = app, state, loop

    async def _request(self, path: str, body: bytes) -> tuple[int, bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"content-type", b"application/json"),
                (b"accept", b"application/x-protobuf"),
                (b"x-api-key", API_KEY),
                (b"content-length", b"%d" % len(body)),
            ],
            "client": ("127.0.0.1", 50123),
            "server": ("127.0.0.1", 8000),
            "state": dict(self.state),
        }
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.get_running_loop().create_future()  # the client stays connected
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        return status, b"".join(m.get("body", b"") for m in sent if "body" in m)

    def post_bytes(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body`; the status and the answer's bytes."""
        return self.loop.run_until_complete(self._request(path, body))

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST `payload` as JSON; the JSON answer (AssertionError unless status 200)."""
        status, body = self.post_bytes(path, json.dumps(payload).encode())
        if status != 200:
            raise AssertionError(f"{path}: {status} {body[:200]!r}")
        return json.loads(body)


def asample_payload(ssid: str, seq_id: int) -> dict[str, Any]:
    """An asample of 64 prompt tokens, 256 to generate, as the SDK sends it."""
    return {
        "sampling_session_id": ssid,
        "seq_id": seq_id,
        "num_samples": 1,
        "type": "sample",
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(range(1000, 1064))}]},
        "sampling_params": {"max_tokens": 256, "seed": seq_id, "temperature": 1.0},
        "prompt_logprobs": False,
        "topk_prompt_logprobs": 0,
    }


def server_step(route: str) -> Call:
    """The app's route in-process, made repeatable: three things would otherwise make its
    count depend on the process (docs/measurements.md has the spread they caused).
    - Timers (metrics sync every 1 s, loop lag, store sweep) fire inside the call at the whim
      of the wall clock: the loop's clock is frozen, so none comes due (`loop.time()` is a C
      call either way).
    - Off-loop decode workers are processes watched by threads that wake the loop: the app
      decodes inline (bodies this small are decoded inline by every design).
    - The ids the server hands out are random bytes (`impl.server.store.ids`), so they hash
      differently and dict probes differ: while the app is built and during each call they
      come from one seeded generator (each id still distinct, the same ones in every process).
    """
    import functools

    from impl.bench._server_apps import hotpath_app

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from impl.server.store import ids

    seeded, system = random.Random(0).randbytes, ids.random_bytes
    ids.random_bytes = seeded  # repeatable ids; restored after each use
    try:
        app = hotpath_app(offloop="inline")
        lifespan = app.router.lifespan_context(app)
        state = loop.run_until_complete(lifespan.__aenter__())
    finally:
        ids.random_bytes = system
    loop.time = functools.partial(float, loop.time())  # type: ignore[method-assign]
    server = state["server"]
    server.lag.stop()
    server.gc.stop()
    server.store.close()
    client = AsgiClient(app, state, loop)
    session = client.post("/api/v1/create_session", {})["session_id"]
    ssid = client.post(
        "/api/v1/create_sampling_session",
        {"session_id": session, "sampling_session_seq_id": 0, "base_model": "icount"},
    )["sampling_session_id"]
    if route == "asample":  # built outside the call: the route's cost, not the client's
        requests = iter(
            [
                json.dumps(asample_payload(ssid, i)).encode()
                for i in range(2 + max(REPEATS.values()))
            ]
        )
        path, expected = "/api/v1/asample", b'"request_id"'
    else:
        pending = client.post("/api/v1/asample", asample_payload(ssid, 10**9))["request_id"]
        poll = json.dumps({"request_id": pending}).encode()
        requests = iter([poll] * (2 + max(REPEATS.values())))
        path, expected = "/api/v1/retrieve_future", b'{"type":"try_again"}'

    def call() -> object:
        ids.random_bytes = seeded
        try:
            status, answer = client.post_bytes(path, next(requests))
        finally:
            ids.random_bytes = system
        if status != 200 or expected not in answer:
            raise AssertionError(f"{path}: {status} {answer[:200]!r}")
        return answer

    return call


#: step name -> what builds its measured call (imports and input building happen there)
STEPS: dict[str, Callable[[], Call]] = {
    "decode-262k": lambda: decode_step(BIG_TOKENS),
    "decode-128": lambda: decode_step(SMALL_TOKENS),
    "encode-262k": encode_step,
    "accesslog-record": accesslog_step,
    "asample": lambda: server_step("asample"),
    "retrieve-try-again": lambda: server_step("retrieve_future"),
}
#: calls per measured child; the count is their mean. One call of a small step is so short that
#: a single allocator event (pymalloc taking a fresh pool) would move it measurably; over many calls
#: such events are part of the mean cost, as they are in the server.
REPEATS = {
    "decode-262k": 1,
    "decode-128": 20,
    "encode-262k": 4,
    "accesslog-record": 1000,
    "asample": 20,
    "retrieve-try-again": 20,
}


def fork(call: Call | None) -> int:
    """A child that makes `call` (if any) and exits at once; its pid, after it ended."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            if call is not None:
                call()
        except BaseException:
            import traceback

            traceback.print_exc()
            status = 1
        sys.stderr.flush()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"icount: the measured call failed in child {pid}")
    return pid


def main(step: str) -> None:
    once, repeats = STEPS[step](), REPEATS[step]
    once()  # warm: first-call set-up (buffers, caches) is not the cost of a call
    once()
    settle = getattr(once, "settle", None)
    if settle is not None:  # e.g. a queue handler writes what the warm calls left queued
        settle()

    def call() -> None:
        for _ in range(repeats):
            once()

    # The three children fork from one single-threaded child: threads of this process (a
    # queue handler's listener, a Rust pool's runtime) keep running between forks and their
    # instructions would be inherited by the later children in varying amounts.
    sys.stdout.flush()
    quiet = os.fork()
    if quiet == 0:
        status = 0
        try:
            gc.collect()  # once: a collection before each fork would differ in cost
            pids = {"before": fork(None), "call": fork(call), "after": fork(None)}
            print(json.dumps({**pids, "repeats": repeats}), flush=True)
        except BaseException as error:
            print(f"icount: {error}", file=sys.stderr, flush=True)
            status = 1
        os._exit(status)
    _, status = os.waitpid(quiet, 0)
    if status != 0:
        raise SystemExit(f"icount: counting {step} failed (exit status {status})")


if __name__ == "__main__":
    main(sys.argv[1])
