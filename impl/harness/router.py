"""`hotpath router`: a fake vLLM router, a real aiohttp server in its own process on loopback.

`POST /v1/completions` reads the whole request body and answers, depending on `--mode`:

- `instant`: at once;
- `delay`: after `--delay` seconds;
- `barrier`: every response is held until `--barrier N` requests have arrived, then those N are
  released together, then the next N, and so on (so exactly N requests are in flight at once).

The answer is `--body-bytes N` bytes of filler JSON (`application/json`; 0 = an empty body).
`GET /stats` gives JSON `{served, in_flight, peak_in_flight, connections, peak_connections,
faults}` (`?reset=1` zeroes the peaks and counters after reading them); `GET /healthz` gives
`{"ok": true}`. `connections`/`peak_connections` count open connections that have carried a
`/v1/completions` request (from its first request until the socket closes; /stats and /healthz
polls are left out), so a client's connection cap is seen from the upstream's side.

Faults, for deterministic tests per request (header) or at random rates (`--fail`):

    X-Hotpath-Fault: 500        a 500 with a JSON error body
    X-Hotpath-Fault: html       a 502 with an HTML page, like a reverse proxy's error page
    X-Hotpath-Fault: truncate   headers promise the full body, half is sent, then the socket closes
    X-Hotpath-Fault: reset      the request is read, then the connection is reset (TCP RST)
    --fail 500:0.01,html:0.01,truncate:0.01,reset:0.01   the same at random (seeded by --seed)

Other per-request headers: `X-Hotpath-Body-Bytes: N` (this answer's size), `X-Hotpath-Delay: S`
(extra seconds before answering, any mode), `X-Hotpath-Echo: 1` (answer with the request body).

Readiness (stable, machine-readable): once listening, the process prints exactly one line on
stdout and flushes it:

    hotpath-router listening on http://127.0.0.1:PORT

`--port 0` picks a free port (the line says which). SIGTERM/SIGINT stop it. The listen backlog
is `--backlog` (default 16384; the kernel caps it at net.core.somaxconn) so a burst of connects
is not dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import socket
import struct
from dataclasses import asdict, dataclass
from functools import cache

from aiohttp import web

FAULTS = ("500", "html", "truncate", "reset")
_HTML = b"<html><head><title>502 Bad Gateway</title></head><body>bad gateway</body></html>"
_JSON = "application/json"


@cache
def filler_body(size: int) -> bytes:
    """Exactly `size` bytes of valid JSON (an object with one padded string; empty for 0)."""
    if size <= 0:
        return b""
    if size < 12:
        return b"0" + b" " * (size - 1)
    head = b'{"filler":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def parse_faults(spec: str | None) -> dict[str, float]:
    """`500:0.01,html:0.02` -> {"500": 0.01, "html": 0.02}; unknown kinds are an error."""
    rates: dict[str, float] = {}
    for part in filter(None, (spec or "").split(",")):
        kind, _, rate = part.partition(":")
        if kind not in FAULTS:
            raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        rates[kind] = float(rate or 1.0)
    return rates


@dataclass
class Stats:
    served: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    connections: int = 0
    peak_connections: int = 0
    faults: int = 0

    def reset(self) -> None:
        self.served = self.faults = 0
        self.peak_in_flight = self.in_flight
        self.peak_connections = self.connections


class _CountingServer(web.Server):
    """aiohttp's low-level server, counting open connections that carried a completion request."""

    def __init__(self, handler, stats: Stats, **kwargs) -> None:
        super().__init__(handler, **kwargs)
        self._stats = stats
        self._upstream: set[object] = set()

    def count(self, protocol: object) -> None:
        """Called on each completion request: counts its connection once."""
        if protocol not in self._upstream:
            self._upstream.add(protocol)
            stats = self._stats
            stats.connections += 1
            stats.peak_connections = max(stats.peak_connections, stats.connections)

    def connection_lost(self, handler, exc=None) -> None:
        super().connection_lost(handler, exc)
        if handler in self._upstream:
            self._upstream.discard(handler)
            self._stats.connections -= 1


class Router:
    """The request handler: modes, bodies, faults and counters. Extend here (bodies, latency)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stats = Stats()
        self.server: _CountingServer | None = None
        self.fault_rates = parse_faults(args.fail)
        self.rng = random.Random(args.seed)
        self._waiting: list[asyncio.Future[None]] = []

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/v1/completions" and request.method == "POST":
            return await self.completions(request)
        if request.path == "/stats":
            data = asdict(self.stats)
            if request.query.get("reset"):
                self.stats.reset()
            return web.json_response(data)
        if request.path in ("/healthz", "/health"):
            return web.json_response({"ok": True})
        return web.json_response({"error": "not found"}, status=404)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        stats = self.stats
        if self.server is not None:
            self.server.count(request.protocol)
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            payload = await request.content.read()
            await self.wait_turn(request)
            fault = request.headers.get("X-Hotpath-Fault") or self.random_fault()
            if fault:
                stats.faults += 1
                return await self.fault(request, fault)
            if request.headers.get("X-Hotpath-Echo"):
                body = payload
            else:
                size = int(request.headers.get("X-Hotpath-Body-Bytes", self.args.body_bytes))
                body = filler_body(size)
            stats.served += 1
            return web.Response(body=body, content_type=_JSON)
        finally:
            stats.in_flight -= 1

    async def wait_turn(self, request: web.BaseRequest) -> None:
        """Hold the request as the mode says (plus any per-request delay)."""
        extra = float(request.headers.get("X-Hotpath-Delay", 0))
        if extra > 0:
            await asyncio.sleep(extra)
        mode = self.args.mode
        if mode == "delay":
            await asyncio.sleep(self.args.delay)
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

    async def fault(self, request: web.BaseRequest, kind: str) -> web.StreamResponse:
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


async def serve(args: argparse.Namespace) -> None:
    router = Router(args)
    server = _CountingServer(
        router.handle,
        stats=router.stats,
        handler_cancellation=True,  # a client that gives up leaves no waiter in the barrier
        access_log=None,
        keepalive_timeout=75.0,
    )
    router.server = server
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    sock = listen_socket(args.host, args.port)
    site = web.SockSite(runner, sock, backlog=args.backlog)
    await site.start()
    host, port = sock.getsockname()[:2]
    print(f"hotpath-router listening on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=8100, help="0 picks a free port")
    parser.add_argument("--mode", choices=("instant", "delay", "barrier"), default="instant")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds, for --mode delay")
    parser.add_argument("--barrier", type=int, default=1, help="N, for --mode barrier")
    parser.add_argument("--body-bytes", type=int, default=256, help="filler JSON answer size")
    parser.add_argument("--fail", default=None, help="random faults, e.g. 500:0.01,reset:0.01")
    parser.add_argument("--seed", type=int, default=0, help="seed for --fail")
    parser.add_argument("--backlog", type=int, default=16384, help="listen backlog")


def run(args: argparse.Namespace) -> int:
    parse_faults(args.fail)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
    else:
        uvloop.run(serve(args))
    return 0
