"""`hotpath router`: a fake vLLM router, a real aiohttp server in its own process on loopback.

`POST /v1/completions` reads the whole request body and answers, depending on `--mode`:

- `instant`: at once;
- `delay`: after `--delay` seconds;
- `barrier`: every response is held until `--barrier N` requests have arrived, then those N are
  released together, then the next N, and so on (so exactly N requests are in flight at once);
- `latency`: an engine of `--max-num-seqs` slots: each request generates for `--gen-seconds`
  in a free slot; the others wait in FIFO order (with `--workers N`, each worker process runs
  `max-num-seqs / N` slots).

The answer: a vLLM completion body for the request (see docs/vllm-body.md) with `max_tokens`
tokens per choice, deterministic for (prompt, n, max_tokens, seed, prompt_logprobs) (a missing
seed counts as 0), rendered once and cached (`--cache-mb` per worker). `--body` picks the text:
`mixed` (the default: real prose, code and multilingual text through a real tokenizer, see
`impl.workloads.realtext`), `prose`, `code`, `multilingual`, `synthetic` (= `vllm`: the fake
ASCII vocabulary of `impl.workloads.synthetic`) or `minimal` (text, token_ids and token_logprobs
only); every kind but `minimal` is the logprobs=1 body (tokens, top_logprobs, text_offset,
prompt_logprobs when asked). `--render json` writes it as vLLM does (Starlette's JSONResponse),
`--render orjson` as an ORJSONResponse server does (other number layout), `--render packed` as
a vLLM with packed logprobs does (`impl.workloads.packed`): a request that sets
`packed_top_logprobs: true` gets the packed body, or, when it does not qualify (`logprobs` > 0
and `return_tokens_as_token_ids: true`, no echo, beam search or `logprob_token_ids`), vLLM's
400 (`{"error": {"message", "type": "Bad Request", "param": null, "code": 400}}`); any other
request gets the `json` body. The other renderings ignore the field, as a vLLM without it
does; `--refuse-packed` answers that 400 to every request that sets it. Without the
real-text extra the default falls back to `synthetic` and says so on stderr. A malformed
request is refused as the router does: 400 for malformed JSON, 422 for a bad field (`logprobs`
given as a boolean, no prompt). `--body filler` (the default when only `--body-bytes N` is
given) answers `--body-bytes` bytes of filler JSON (`application/json`; 0 = an empty body).

`GET /stats` gives JSON `{served, in_flight, peak_in_flight, connections, peak_connections,
faults, generating, peak_generating, rendered, refused, packed, injected: {kind: count},
workers}` (`refused`: requests answered 400/422, `packed`: packed bodies served) (`?reset=1`
zeroes the peaks and counters after reading them); `GET /healthz` gives `{"ok": true}`.
Connections are counted at the socket (those that carried a completion request, so `/stats`
polls do not count), so a client's connection cap is seen from the upstream's side. With
`--workers N` the figures are the sum over all worker processes (they share one counter array
under one lock), and `peak_in_flight` is the true peak of the sum.
Each answer carries `X-Hotpath-Worker: i`.

Faults, for deterministic tests per request (header) or at random rates (`--fail`):

    X-Hotpath-Fault: 500        a 500 with a JSON error body
    X-Hotpath-Fault: html       a 502 with an HTML page, like a reverse proxy's error page
    X-Hotpath-Fault: truncate   headers promise the full body, half is sent, then the socket closes
    X-Hotpath-Fault: reset      the request is read, then the connection is reset (TCP RST)
    --fail 500:0.01,html:0.01,truncate:0.01,reset:0.01   the same at random (seeded by --seed)

Random faults are drawn per request in arrival order from `random.Random(seed)` (worker i of
`--workers` uses seed + i); `/stats` reports how many of each kind were injected.

Other per-request headers: `X-Hotpath-Body-Bytes: N` (this answer's size), `X-Hotpath-Delay: S`
(extra seconds before answering, any mode), `X-Hotpath-Echo: 1` (answer with the request body).

Readiness (stable, machine-readable): once listening (every worker), the process prints exactly
one line on stdout and flushes it:

    hotpath-router listening on http://127.0.0.1:PORT

`--port 0` picks a free port (the line says which). SIGTERM/SIGINT stop it (and its workers).
The listen backlog is `--backlog` (default 16384; the kernel caps it at net.core.somaxconn) so a
burst of connects is not dropped. `--workers N` runs N processes sharing the port
(SO_REUSEPORT): one process cannot serve many 20 MB bodies per second.

The counters behind `/stats` are `impl.harness.router.stats`; request checks and the rendered
and filler bodies are `impl.harness.router.bodies`.

The server's tests use a smaller stand-in (`tests/support/fake_vllm.py`) whose faults are chosen
by a request's seed and which records every request it answered; its docstring says why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import signal
import socket
import struct
import sys
from typing import Any

from aiohttp import web

from impl._process import die_with_parent
from impl.harness.router.bodies import BadRequest, Bodies, filler_body
from impl.harness.router.stats import FAULTS, CountingServer, Stats
from impl.workloads import realtext

_HTML = b"<html><head><title>502 Bad Gateway</title></head><body>bad gateway</body></html>"
_JSON = "application/json"
#: answers from this size on are sent by `Router.send_whole` (no copy per answer)
_STREAM_BYTES = 1 << 20
#: SO_SNDBUF of a connection carrying such an answer (the kernel doubles it)
_SEND_BUFFER = 256 << 10


def parse_faults(spec: str | None) -> dict[str, float]:
    """`500:0.01,html:0.02` -> {"500": 0.01, "html": 0.02}; unknown kinds are an error."""
    rates: dict[str, float] = {}
    for part in filter(None, (spec or "").split(",")):
        kind, _, rate = part.partition(":")
        if kind not in FAULTS:
            raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        rates[kind] = float(rate or 1.0)
    return rates


class Router:
    """The request handler: modes, bodies, faults and counters."""

    def __init__(self, args: argparse.Namespace, stats: Stats, worker: int = 0) -> None:
        self.args = args
        self.stats = stats
        self.fault_rates = parse_faults(args.fail)
        self.rng = random.Random(args.seed + worker)
        self._waiting: list[asyncio.Future[None]] = []
        slots = max(1, args.max_num_seqs // max(1, args.workers))
        self._engine = asyncio.Semaphore(slots)
        budget = args.cache_mb << 20
        self.bodies = None
        if args.body != "filler":
            self.bodies = Bodies(
                args.body, budget, stats, render=args.render, refuse_packed=args.refuse_packed
            )
        self._headers = {"X-Hotpath-Worker": str(worker)}
        self.server: CountingServer | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/v1/completions" and request.method == "POST":
            return await self.completions(request)
        if request.path == "/stats":
            return web.json_response(self.stats.snapshot(reset=bool(request.query.get("reset"))))
        if request.path in ("/healthz", "/health"):
            return web.json_response({"ok": True})
        return web.json_response({"error": "not found"}, status=404)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        stats = self.stats
        if self.server is not None:
            self.server.count_connection(request.protocol)
        stats.add("in_flight")
        try:
            payload = await request.content.read()
            key = None
            if self.bodies is not None and not request.headers.get("X-Hotpath-Echo"):
                try:
                    key = self.bodies.key(payload)
                except BadRequest as bad:
                    stats.add("refused")
                    return web.Response(
                        status=bad.status, text=bad.text, content_type=bad.content_type
                    )
            await self.wait_turn(request)
            fault = request.headers.get("X-Hotpath-Fault") or self.random_fault()
            if request.headers.get("X-Hotpath-Echo"):
                body = payload
            elif key is not None:
                body = await self.bodies.get(key)
            else:
                size = int(request.headers.get("X-Hotpath-Body-Bytes", self.args.body_bytes))
                body = filler_body(size)
            if fault:
                stats.add("faults")
                if fault in FAULTS:
                    stats.add(f"injected_{fault}")
                return await self.fault(request, fault, body)
            stats.add("served")
            if key is not None and self.bodies.packs(key):
                stats.add("packed")
            if len(body) < _STREAM_BYTES:
                return web.Response(body=body, content_type=_JSON, headers=self._headers)
            return await self.send_whole(request, body)
        finally:
            stats.add("in_flight", -1)

    async def send_whole(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        """A big body sent from the cached bytes object itself: `web.Response` joins headers
        and body into one new bytes object before writing on Python < 3.12.9 (aiohttp's
        SKIP_WRITELINES), a copy of each long body per answer held until the client read it
        (gigabytes per router process with dozens of answers waiting on their sockets); a
        StreamResponse sends the headers first and uvloop writes the body without copying it. The
        answer counts as in flight until its last byte is in the socket.

        The socket's send buffer is fixed at `_SEND_BUFFER`: an answer the server does not read
        yet (its body budget is full) waits in the kernel, and autotuned, a few hundred
        waiting answers take a large part of the machine's TCP memory (`net.ipv4.tcp_mem`; past it
        every socket's reads crawl). A real engine's host keeps its own send buffers."""
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        response = web.StreamResponse(headers=self._headers)
        response.content_type = _JSON
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
        return response

    async def wait_turn(self, request: web.BaseRequest) -> None:
        """Hold the request as the mode says (plus any per-request delay)."""
        extra = float(request.headers.get("X-Hotpath-Delay", 0))
        if extra > 0:
            await asyncio.sleep(extra)
        mode = self.args.mode
        if mode == "delay":
            await asyncio.sleep(self.args.delay)
        elif mode == "latency":
            async with self._engine:  # FIFO: asyncio wakes waiters in arrival order
                self.stats.add("generating")
                try:
                    await asyncio.sleep(self.args.gen_seconds)
                finally:
                    self.stats.add("generating", -1)
        elif mode == "barrier":
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            if len(self._waiting) >= self.args.barrier:
                released, self._waiting = self._waiting, []
                for waiter in released:
                    if not waiter.done():
                        waiter.set_result(None)
            try:
                await future
            except asyncio.CancelledError:
                if future in self._waiting:
                    self._waiting.remove(future)
                raise

    def random_fault(self) -> str | None:
        for kind, rate in self.fault_rates.items():
            if self.rng.random() < rate:
                return kind
        return None

    async def fault(self, request: web.BaseRequest, kind: str, body: bytes) -> web.StreamResponse:
        if kind == "500":
            return web.json_response({"error": "injected fault"}, status=500)
        if kind == "html":
            return web.Response(body=_HTML, status=502, content_type="text/html")
        transport = request.transport
        if kind == "reset":
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        elif kind == "truncate":
            if len(body) < 2048:
                body = filler_body(max(int(self.args.body_bytes), 2048))
            transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
            transport.close()
        else:
            return web.json_response({"error": f"unknown fault {kind!r}"}, status=400)
        raise asyncio.CancelledError  # the connection is gone; nothing more to send


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket (listen() happens in the server with the large backlog)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


async def serve(
    args: argparse.Namespace,
    sock: socket.socket | None = None,
    stats: Stats | None = None,
    worker: int = 0,
    on_ready: Any = None,
) -> None:
    stats = stats or Stats()
    router = Router(args, stats, worker)
    server = CountingServer(
        router.handle,
        stats=stats,
        handler_cancellation=True,  # a client that gives up leaves no waiter in the barrier
        access_log=None,
        keepalive_timeout=75.0,
    )
    router.server = server
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    sock = sock or listen_socket(args.host, args.port)
    site = web.SockSite(runner, sock, backlog=args.backlog)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_ready is not None:
        on_ready(sock.getsockname()[:2])
    else:
        host, port = sock.getsockname()[:2]
        print(f"hotpath-router listening on http://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _run_loop(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def _worker(args: argparse.Namespace, port: int, stats: Stats, worker: int, ready: Any) -> None:
    """A forked worker process: its own SO_REUSEPORT socket on the shared port."""
    die_with_parent()
    sock = listen_socket(args.host, port, reuse_port=True)
    _run_loop(serve(args, sock, stats, worker, on_ready=lambda _: ready.set()))


def serve_workers(args: argparse.Namespace) -> None:
    """`--workers N`: fork N-1 workers on the same port, serve as worker 0, stop them by PID."""
    sock = listen_socket(args.host, args.port, reuse_port=True)
    port = sock.getsockname()[1]
    stats = Stats(args.workers)
    ctx = multiprocessing.get_context("fork")
    children = []
    for worker in range(1, args.workers):
        ready = ctx.Event()
        child = ctx.Process(target=_worker, args=(args, port, stats, worker, ready), daemon=True)
        child.start()
        children.append((child, ready))
    try:
        for child, ready in children:
            if not ready.wait(60):
                raise RuntimeError(f"router worker {child.pid} did not start")
        _run_loop(serve(args, sock, stats))
    finally:
        for child, _ in children:
            if child.is_alive():
                os.kill(child.pid, signal.SIGTERM)
        for child, _ in children:
            child.join(10)
            if child.is_alive():
                os.kill(child.pid, signal.SIGKILL)
                child.join(5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=8100, help="0 picks a free port")
    parser.add_argument(
        "--mode", choices=("instant", "delay", "barrier", "latency"), default="instant"
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds, for --mode delay")
    parser.add_argument("--barrier", type=int, default=1, help="N, for --mode barrier")
    parser.add_argument(
        "--gen-seconds", type=float, default=5.0, help="seconds per generation, --mode latency"
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="generations at once, --mode latency"
    )
    parser.add_argument(
        "--body", choices=(*realtext.ROUTER_BODIES, "filler"), default=None,
        help="the answer's text: mixed (default), prose, code, multilingual (real text, real "
        "tokenizer), synthetic = vllm (fake vocabulary), minimal (no logprobs=1 fields), or "
        "filler (--body-bytes of JSON; the default when only --body-bytes is given)",
    )  # fmt: skip
    parser.add_argument(
        "--render", choices=realtext.RENDERS, default="json",
        help="json: as vLLM answers (json.dumps); orjson: as an ORJSONResponse server answers; "
        "packed: as a vLLM with packed_top_logprobs answers (packed to a request that asks "
        "and qualifies, 400 to one that asks and does not, json otherwise)",
    )  # fmt: skip
    parser.add_argument(
        "--refuse-packed", action="store_true",
        help="answer 400 (vLLM's error shape) to any request that sets packed_top_logprobs",
    )  # fmt: skip
    parser.add_argument(
        "--body-bytes", type=int, default=None, help="filler JSON answer size (default 256)"
    )
    parser.add_argument("--cache-mb", type=int, default=1024, help="rendered-body cache per worker")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    parser.add_argument("--fail", default=None, help="random faults, e.g. 500:0.01,reset:0.01")
    parser.add_argument("--seed", type=int, default=0, help="seed for --fail")
    parser.add_argument("--backlog", type=int, default=16384, help="listen backlog")


DEFAULT_BODY = "mixed"


def resolve_body(args: argparse.Namespace) -> str | None:
    """Fill in `args.body` and `args.body_bytes`; a note for stderr when the default fell back.

    No `--body`: filler when `--body-bytes` was given, else DEFAULT_BODY (or `synthetic` where
    the real-text extra is missing). An explicit kind that cannot be made here is an error."""
    note = None
    if args.body is None:
        args.body = "filler" if args.body_bytes is not None else DEFAULT_BODY
        reason = None if args.body == "filler" else realtext.unavailable_reason(args.body)
        if reason is not None:
            args.body, note = (
                "synthetic",
                f"--body {DEFAULT_BODY} unavailable ({reason}): synthetic",
            )
    if args.body != "filler":
        reason = realtext.unavailable_reason(args.body, args.render)
        if reason is not None:
            raise SystemExit(f"hotpath router: --body {args.body} --render {args.render}: {reason}")
    if args.body_bytes is None:
        args.body_bytes = 256
    return note


def run(args: argparse.Namespace) -> int:
    parse_faults(args.fail)
    note = resolve_body(args)
    if note:
        print(f"hotpath router: {note}", file=sys.stderr, flush=True)
    if args.workers > 1:
        serve_workers(args)
    else:
        _run_loop(serve(args))
    return 0
