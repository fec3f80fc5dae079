"""A Tinker-shaped stand-in server that misbehaves on purpose, to test the load client.

Run as its own process: `python tests/support/standin.py --port 0 [faults]`; prints
`standin listening on http://127.0.0.1:PORT`. It answers the SDK's sampling flow with the tokens
`impl.workloads.synthetic.generate` makes for the (prompt, seed) and SampleResponse wire bytes, and
injects faults by request number, so a test can count exactly what the client should see:

    --drop K          every K-th sample: retrieve_future answers 404 (a lost result)
    --wrong K         every K-th sample: one token short
    --error K         every K-th sample: 200 {"error", "category": "server"}
    --asample-fail S  e.g. 429:5,503:7,reset:11: the FIRST try of every K-th asample fails so
    --poll-fail S     e.g. 503:5,reset:7,408:3: the FIRST poll of every K-th sample fails so
    --pending N       the first N polls of each sample answer {"type": "try_again"}

GET /stats: {"forwards", "asample_calls", "duplicates", "injected": {kind: count}}.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import sys
from collections import Counter

import orjson
from aiohttp import web

from impl.workloads.synthetic import generate


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sample_response(choices, short: bool = False) -> bytes:
    out = b""
    for choice in choices:
        tokens = choice.tokens[:-1] if short else choice.tokens
        logprobs = choice.logprobs[: len(tokens)]
        stop = 0 if choice.finish_reason == "stop" else 1
        seq = (_varint(1 << 3) + _varint(stop) if stop else b"") + _field(
            2, tokens.astype("<i4").tobytes()
        )
        seq += _field(3, logprobs.astype("<f4").tobytes())
        out += _field(1, seq)
    return out


def _rates(spec: str | None) -> dict[str, int]:
    out = {}
    for part in filter(None, (spec or "").split(",")):
        kind, _, every = part.partition(":")
        out[kind] = int(every)
    return out


class Standin:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.asample_fail = _rates(args.asample_fail)
        self.poll_fail = _rates(args.poll_fail)
        self.futures: dict[str, dict] = {}
        self.by_seq: dict[tuple[str, int], str] = {}
        self.numbers: dict[tuple[str, int], int] = {}
        self.injected: Counter[str] = Counter()
        self.forwards = self.asample_calls = self.duplicates = 0
        self.sessions = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/stats":
            return web.json_response(
                {
                    "forwards": self.forwards,
                    "asample_calls": self.asample_calls,
                    "duplicates": self.duplicates,
                    "injected": dict(self.injected),
                }
            )
        if path == "/healthz":
            return web.json_response({"ok": True, "picks": {"decode": "standin"}})
        if not request.headers.get("X-API-Key", "").startswith("tml-"):
            return web.json_response({"detail": "bad key"}, status=401)
        body = orjson.loads(await request.read() or b"{}")
        if path == "/api/v1/client/config":
            return web.json_response({"sample_max_concurrent_requests": 2000})
        if path == "/api/v1/create_session":
            self.sessions += 1
            return web.json_response({"session_id": f"s{self.sessions}"})
        if path == "/api/v1/create_sampling_session":
            return web.json_response({"sampling_session_id": f"{body['session_id']}-ss"})
        if path == "/api/v1/session_heartbeat":
            return web.json_response({})
        if path == "/api/v1/asample":
            return await self.asample(request, body)
        if path == "/api/v1/retrieve_future":
            return await self.retrieve(request, body)
        return web.json_response({"detail": "not found"}, status=404)

    def _fault(self, request: web.Request, kind: str, name: str) -> web.StreamResponse:
        self.injected[name] += 1
        if kind == "reset":
            sock = request.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            request.transport.abort()
            raise asyncio.CancelledError
        return web.json_response({"detail": f"injected {kind}"}, status=int(kind))

    async def asample(self, request: web.Request, body: dict) -> web.StreamResponse:
        self.asample_calls += 1
        key = (body["sampling_session_id"], body["seq_id"])
        if key in self.by_seq:
            self.duplicates += 1
            rid = self.by_seq[key]
            return web.json_response(
                {"request_id": rid, "sample_sequence_ids": self.futures[rid]["ids"]}
            )
        first_try = key not in self.numbers
        number = self.numbers.setdefault(key, len(self.numbers) + 1)
        if first_try:
            for kind, every in self.asample_fail.items():
                if number % every == 0:
                    return self._fault(request, kind, f"asample_{kind}")
        self.forwards += 1
        params = body["sampling_params"]
        choices = generate(
            body["prompt"]["chunks"][0]["tokens"],
            n=body["num_samples"],
            max_tokens=params["max_tokens"],
            seed=params.get("seed"),
        )
        rid = f"r{number}"
        a = self.args
        future = {
            "n": number,
            "polls": 0,
            "answered": 0,
            "ids": [f"{rid}-{i}" for i in range(body["num_samples"])],
            "drop": bool(a.drop and number % a.drop == 0),
            "error": bool(a.error and number % a.error == 0),
            "wrong": bool(a.wrong and number % a.wrong == 0),
        }
        future["data"] = sample_response(choices, short=future["wrong"])
        for kind in ("drop", "error", "wrong"):
            self.injected[kind] += future[kind]
        self.futures[rid] = future
        self.by_seq[key] = rid
        return web.json_response({"request_id": rid, "sample_sequence_ids": future["ids"]})

    async def retrieve(self, request: web.Request, body: dict) -> web.StreamResponse:
        future = self.futures.get(body["request_id"])
        if future is None or future["drop"]:
            return web.json_response({"detail": "unknown request_id"}, status=404)
        future["polls"] += 1
        if future["polls"] == 1:
            for kind, every in self.poll_fail.items():
                if future["n"] % every == 0:
                    return self._fault(request, kind, f"poll_{kind}")
        future["answered"] += 1
        if future["answered"] <= self.args.pending:
            return web.json_response({"type": "try_again"})
        if future["error"]:
            return web.json_response({"error": "injected sample failure", "category": "server"})
        return web.Response(body=future["data"], content_type="application/x-protobuf")


async def main(args: argparse.Namespace) -> None:
    standin = Standin(args)
    app = web.Application(client_max_size=1 << 26)
    app.router.add_route("*", "/{tail:.*}", standin.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"standin listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--drop", type=int, default=0)
    parser.add_argument("--wrong", type=int, default=0)
    parser.add_argument("--error", type=int, default=0)
    parser.add_argument("--asample-fail")
    parser.add_argument("--poll-fail")
    parser.add_argument("--pending", type=int, default=0)
    try:
        asyncio.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        sys.exit(0)
