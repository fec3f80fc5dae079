"""The load client of tests/server/test_hosts.py: samples spread over several hosts, each
retried on another host when its own does not answer (as a load balancer in front of them would).

Run inside the test's network namespace: `python tests/support/hosts_client.py --hosts URL URL
--samples N --max-tokens T`. It creates a sampling session, submits every sample (seq_id i to
host i mod hosts, at most --concurrency at once) with the SDK's rule on failure: the same seq_id
again, here on the next host; prints `HALF` once half were accepted (the test then kills a
host); waits for every result on any live host and checks its token count. Last line: JSON
{completed, failed: {kind: count}, accepted_by: {url: count}, resubmitted, store: the /healthz
store counters of a live host}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from impl.harness.client.config import parse_sample_response

HEADERS = {"X-API-Key": "tml-hosts-test"}
PROTO = {**HEADERS, "Accept": "application/x-protobuf"}


def count(counter: dict[str, int], kind: str) -> None:
    counter[kind] = counter.get(kind, 0) + 1


class Hosts:
    """The hosts in turn; a host that failed a call is skipped from then on."""

    def __init__(self, client: httpx.AsyncClient, urls: list[str]) -> None:
        self.client, self.urls = client, urls
        self.dead: set[str] = set()

    async def post(self, first: int, path: str, body: dict, **kwargs: object) -> httpx.Response:
        """POST to host `first`, then each other host, until one answers below 500."""
        order = [self.urls[(first + k) % len(self.urls)] for k in range(len(self.urls))]
        for attempt in itertools.count():
            for url in order:
                if url in self.dead and attempt == 0 and len(self.dead) < len(self.urls):
                    continue
                try:
                    reply = await self.client.post(url + path, json=body, **kwargs)
                except httpx.TransportError:
                    self.dead.add(url)
                    continue
                if reply.status_code < 500:
                    return reply
            await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))
            if attempt > 100:
                raise RuntimeError(f"no host answered {path}")
        raise AssertionError("unreachable")


async def main(args: argparse.Namespace) -> dict:
    timeout = httpx.Timeout(60.0, connect=5.0)
    async with httpx.AsyncClient(headers=HEADERS, timeout=timeout) as client:
        hosts = Hosts(client, args.hosts)
        session = await hosts.post(0, "/api/v1/create_session", {"tags": [], "sdk_version": "t"})
        sampling = await hosts.post(
            0,
            "/api/v1/create_sampling_session",
            {
                "session_id": session.json()["session_id"],
                "sampling_session_seq_id": 0,
                "base_model": "hosts/model",
            },
        )
        ssid = sampling.json()["sampling_session_id"]
        accepted_by: dict[str, int] = {}
        failed: dict[str, int] = {}
        completed = resubmitted = 0
        gate = asyncio.Semaphore(args.concurrency)
        half = asyncio.Event()

        async def one(i: int) -> None:
            nonlocal completed, resubmitted
            body = {
                "sampling_session_id": ssid,
                "seq_id": i,
                "num_samples": 1,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, i % 97]}]},
                "sampling_params": {"max_tokens": args.max_tokens, "seed": i, "temperature": 1.0},
            }
            async with gate:
                reply = await hosts.post(i, "/api/v1/asample", body)
            if reply.status_code != 200:
                count(failed, f"asample_{reply.status_code}")
                return
            count(accepted_by, str(reply.url).rsplit("/api", 1)[0])
            if sum(accepted_by.values()) >= args.samples // 2:
                half.set()
            request_id = reply.json()["request_id"]
            while True:
                poll = {"request_id": request_id}
                got = await hosts.post(i, "/api/v1/retrieve_future", poll, headers=PROTO)
                if got.headers.get("content-type") == "application/x-protobuf":
                    sequences = parse_sample_response(got.content)
                    if len(sequences[0][1]) != args.max_tokens:
                        count(failed, "bad_result")
                    else:
                        completed += 1
                    return
                answer = got.json() if got.status_code == 200 else {}
                if got.status_code == 410:  # the SDK re-submits a sample the server forgot
                    resubmitted += 1
                    return await one(i)
                if got.status_code != 200 or answer.get("error"):
                    count(failed, f"retrieve_{got.status_code}_{answer.get('category', '')}")
                    return

        async def announce() -> None:
            await half.wait()
            print("HALF", flush=True)
            await asyncio.sleep(args.pause)

        announcer = asyncio.ensure_future(announce())
        await asyncio.gather(*(one(i) for i in range(args.samples)))
        announcer.cancel()
        live = [url for url in args.hosts if url not in hosts.dead] or args.hosts
        health = (await client.get(live[0] + "/healthz")).json()
        return {
            "completed": completed,
            "failed": failed,
            "accepted_by": accepted_by,
            "resubmitted": resubmitted,
            "dead": sorted(hosts.dead),
            "store": health.get("store"),
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", nargs="+", required=True)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pause", type=float, default=0.0)
    print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
