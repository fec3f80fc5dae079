"""A stand-in vLLM upstream for the server tests: a real aiohttp server in its own process.

`POST /v1/completions` answers with a realistic vLLM body from `impl.workloads.synthetic` (the
sampled tokens and logprobs are `synthetic.generate(prompt, n=, max_tokens=, seed=)`), and records
every request and the body it sent (`GET /sent`, `GET /stats`: requests, in flight and the peak
of requests in flight). Special seeds select a bad
upstream behaviour, so one server run can mix good and bad samples:

    SEED_HTML          200 with an HTML page
    SEED_TRUNCATED     200 with the first half of the JSON body (Content-Length matches)
    SEED_500_ONCE      500 on the first request for a prompt, a good body on the retry
    SEED_500_ALWAYS    500 every time
    SEED_CLOSE         headers promise the full body, half is sent, the socket closes
    SEED_MISMATCH      a body whose token_ids and token_logprobs differ in length
    SEED_422           422 plain text (what the router says about a bad field)
    DELAY_BASE + ms    a good body (generated with that seed) after `ms` milliseconds

Run: `python tests/support/fake_vllm.py` prints `fake-vllm listening on http://127.0.0.1:PORT`.

Why this is not `hotpath router` (`impl.harness.router`): the server under test decides what
it sends upstream, so a test cannot put the router's `X-Hotpath-Fault` header on one sample; here
the request's seed selects the fault, and the faults are the ones a test of the server needs
(a 200 with HTML, a 200 truncated to a matching Content-Length, a 500 only the first time for a
prompt, arrays of different lengths), not the ones a load run injects at random rates. It also
keeps every request and the body it sent (`GET /sent`), which a load router must not (memory).
The bodies are the same: both render `impl.workloads.synthetic`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from aiohttp import web

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from impl.workloads import synthetic

SEED_HTML = 900_000_001
SEED_TRUNCATED = 900_000_002
SEED_500_ONCE = 900_000_003
SEED_500_ALWAYS = 900_000_004
SEED_CLOSE = 900_000_005
SEED_MISMATCH = 900_000_006
SEED_422 = 900_000_007
DELAY_BASE = 800_000_000
_HTML = b"<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>"


def body_for(request: dict) -> bytes:
    """The good body for a router request (the same function the tests use to predict it)."""
    prompt = request["prompt"]
    seed = request.get("seed")
    choices = synthetic.generate(
        prompt, n=request.get("n", 1), max_tokens=request.get("max_tokens", 16), seed=seed
    )
    return synthetic.completion_body(
        choices, kind="vllm", prompt_tokens=prompt, prompt_logprobs=request.get("prompt_logprobs")
    )


class Upstream:
    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.failed_once: set[tuple] = set()
        self.requests = 0
        self.in_flight = self.peak_in_flight = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests += 1
        data = json.loads(raw)
        seed = data.get("seed")
        entry = {"request": data, "status": 200, "body": None}
        self.sent.append(entry)
        if seed == SEED_HTML:
            entry["body"] = _HTML.decode()
            return web.Response(body=_HTML, content_type="text/html")
        if seed == SEED_422:
            return web.Response(status=422, text="max_tokens: Input should be a valid integer")
        if seed == SEED_500_ALWAYS or (
            seed == SEED_500_ONCE and tuple(data["prompt"]) not in self.failed_once
        ):
            self.failed_once.add(tuple(data["prompt"]))
            entry["status"] = 500
            return web.Response(status=500, text="Internal Server Error")
        if seed is not None and DELAY_BASE <= seed < DELAY_BASE + 100_000:
            await asyncio.sleep((seed - DELAY_BASE) / 1000)
        body = body_for(data)
        if seed == SEED_TRUNCATED:
            body = body[: len(body) // 2]
        elif seed == SEED_MISMATCH:
            body = body.replace(b'"token_logprobs":[', b'"token_logprobs":[-0.5,', 1)
        elif seed == SEED_CLOSE:
            request.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
            request.transport.close()
            raise asyncio.CancelledError
        entry["body"] = body.decode()
        return web.Response(body=body, content_type="application/json")

    async def sent_log(self, request: web.Request) -> web.Response:
        return web.json_response(self.sent)

    async def stats(self, request: web.Request) -> web.Response:
        counts = {"requests": self.requests, "in_flight": self.in_flight}
        return web.json_response({**counts, "peak_in_flight": self.peak_in_flight})


async def main(port: int) -> None:
    upstream = Upstream()
    app = web.Application(client_max_size=1 << 26)
    app.router.add_post("/v1/completions", upstream.completions)
    app.router.add_get("/sent", upstream.sent_log)
    app.router.add_get("/stats", upstream.stats)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound = site._server.sockets[0].getsockname()[:2]
    print(f"fake-vllm listening on http://{host}:{bound}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args().port))
