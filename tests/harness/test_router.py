"""The fake vLLM router's load-harness features: bodies, latency mode, workers, seeded faults.

Each test starts `hotpath router` in its own process on port 0 and checks it over real HTTP;
every assertion is a count or a byte comparison (never a wall-clock threshold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import aiohttp
import numpy as np
import psutil
import pytest

from impl import registry
from impl.harness import procs, watch
from impl.harness.router import server as router_module
from impl.workloads import realtext
from impl.workloads.synthetic import completion_body, generate

pytestmark = pytest.mark.heavy


@pytest.fixture
def router():
    started: list[procs.Proc] = []

    def start(*args: str) -> procs.Proc:
        started.append(procs.start_router(list(args)))
        return started[-1]

    yield start
    for proc in started:
        proc.stop()


def _post_many(
    url: str, bodies: list[bytes], *, fresh: bool = False
) -> list[tuple[int, bytes, dict]]:
    """POST every body at once; `fresh`: one connection per request."""

    async def main():
        connector = aiohttp.TCPConnector(limit=0, force_close=fresh)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(body: bytes):
                async with session.post(url + "/v1/completions", data=body) as response:
                    return response.status, await response.read(), dict(response.headers)

            return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(main())


def _request(
    prompt: list[int], n: int = 1, max_tokens: int = 8, seed: int | None = 5, **extra
) -> bytes:
    return json.dumps(
        {"prompt": prompt, "n": n, "max_tokens": max_tokens, "seed": seed, "logprobs": 1, **extra}
    ).encode()


@pytest.mark.parametrize("body", ["minimal", "vllm"])
def test_bodies_are_the_generated_tokens_deterministically(router, body):
    """--body: max_tokens tokens per choice, exactly `generate(prompt, seed)`, same bytes twice."""
    r = router("--body", body)
    prompt = [128000, 5, 6, 7]
    requests = [_request(prompt, n=3, max_tokens=40, seed=9)] * 2 + [_request(prompt, seed=10)]
    (s1, b1, _), (s2, b2, _), (s3, b3, _) = _post_many(r.url, requests)
    assert s1 == s2 == s3 == 200
    assert b1 == b2 and b1 != b3
    expected = generate(prompt, n=3, max_tokens=40, seed=9)
    assert b1 == completion_body(expected, kind=body, prompt_tokens=prompt)
    decoder = registry.create("decode", registry.reference("decode"))
    completion = decoder.decode(b1)
    assert len(completion.sequences[0].tokens) == 40
    for seq, choice in zip(completion.sequences, expected, strict=True):
        np.testing.assert_array_equal(seq.tokens, choice.tokens)
    assert r and watch.fetch_json(r.url + "/stats")["rendered"] == 2  # cached: 2 distinct keys


@pytest.mark.parametrize(
    "flags",
    [(), ("--body", "code", "--render", "orjson"), ("--body", "synthetic", "--render", "orjson")],
    ids=["default", "code-orjson", "synthetic-orjson"],
)
def test_real_text_bodies_and_renderings(router, flags):
    """No flags: real mixed text, rendered as vLLM renders (json); --body/--render pick the
    kind and the rendering. The bytes are `realtext.answer`'s for the request."""
    kind = flags[1] if flags else "mixed"
    how = flags[3] if flags else "json"
    if realtext.unavailable_reason(kind, how):
        pytest.skip(realtext.unavailable_reason(kind, how))
    r = router(*flags)
    prompt = [1, 5, 6, 7]
    [(status, body, headers)] = _post_many(r.url, [_request(prompt, n=2, max_tokens=300)])
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert body == realtext.answer(kind, how, prompt, n=2, max_tokens=300, seed=5)
    completion = registry.create("decode", registry.reference("decode")).decode(body)
    assert len(completion.sequences[0].tokens) == 300


def test_body_bytes_alone_means_filler_and_a_missing_kind_is_refused(router, monkeypatch):
    """--body-bytes without --body: filler JSON of that size (as before real-text bodies)."""
    r = router("--body-bytes", "300")
    [(status, body, _)] = _post_many(r.url, [b"not even json"])
    assert status == 200 and len(body) == 300 and json.loads(body)
    parser = argparse.ArgumentParser()
    router_module.add_arguments(parser)
    monkeypatch.setattr(realtext.vocab, "unavailable_reason", lambda: "no tokenizer: pip it")
    args = parser.parse_args([])
    assert (
        router_module.resolve_body(args)
        == "--body mixed unavailable (no tokenizer: pip it): synthetic"
    )
    assert args.body == "synthetic" and args.body_bytes == 256
    with pytest.raises(SystemExit, match="--body code --render json: no tokenizer: pip it"):
        router_module.resolve_body(parser.parse_args(["--body", "code"]))


def test_prompt_logprobs_when_asked(router):
    r = router("--body", "vllm")
    prompt = [128000, 11, 12]
    [(status, body, _)] = _post_many(r.url, [_request(prompt, prompt_logprobs=2)])
    assert status == 200
    choice = json.loads(body)["choices"][0]
    assert choice["prompt_logprobs"][0] is None and len(choice["prompt_logprobs"]) == 3
    [(_, plain, _)] = _post_many(r.url, [_request(prompt)])
    assert json.loads(plain)["choices"][0]["prompt_logprobs"] is None


_PACKED = {"packed_top_logprobs": True, "return_tokens_as_token_ids": True}


@pytest.mark.parametrize("kind", ["vllm", "mixed"])
def test_packed_rendering_answers_as_vllm(router, kind):
    """--render packed: a packed request that qualifies gets the packed body of the same
    generation, one without the flag the json body, one that does not qualify vLLM's 400."""
    if realtext.unavailable_reason(kind, "packed"):
        pytest.skip(realtext.unavailable_reason(kind, "packed"))
    r = router("--body", kind, "--render", "packed")
    prompt = [1, 5, 6, 7]
    asks = _request(prompt, n=2, max_tokens=200, **_PACKED)
    plain = _request(prompt, n=2, max_tokens=200)
    refused = [
        _request(prompt, **(_PACKED | {"logprobs": 0})),
        _request(prompt, **(_PACKED | {"return_tokens_as_token_ids": False})),
        _request(prompt, **(_PACKED | {"echo": True})),
    ]
    replies = _post_many(r.url, [asks, plain, *refused])
    (s1, packed_body, h1), (s2, json_body, _) = replies[:2]
    assert s1 == s2 == 200 and h1["Content-Type"].startswith("application/json")
    assert packed_body == realtext.answer(kind, "packed", prompt, n=2, max_tokens=200, seed=5)
    assert json_body == realtext.answer(kind, "json", prompt, n=2, max_tokens=200, seed=5)
    for status, body, headers in replies[2:]:
        assert status == 400 and headers["Content-Type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert error["type"] == "Bad Request" and error["code"] == 400 and error["param"] is None
        assert error["message"].startswith("packed_top_logprobs")
    stats = watch.fetch_json(r.url + "/stats")
    assert (stats["served"], stats["packed"], stats["refused"]) == (2, 1, 3)


def test_other_renderings_ignore_packed_and_refuse_packed_refuses(router):
    """A json router answers a packed request with the json body (as a vLLM without the
    field); --refuse-packed answers it 400 in vLLM's error shape and serves the rest."""
    prompt = [128000, 5, 6]
    asks, plain = _request(prompt, **_PACKED), _request(prompt)
    [(s1, b1, _), (s2, b2, _)] = _post_many(router("--body", "vllm").url, [asks, plain])
    assert s1 == s2 == 200 and b1 == b2
    refusing = router("--body", "vllm", "--render", "packed", "--refuse-packed")
    [(s3, b3, _), (s4, b4, _)] = _post_many(refusing.url, [asks, plain])
    assert s3 == 400 and json.loads(b3)["error"]["code"] == 400
    assert s4 == 200 and b4 == b2


def test_bad_requests_are_refused_like_the_router(router):
    r = router("--body", "minimal")
    replies = _post_many(r.url, [b'{"prompt": [1', _request([1], logprobs=True), b'{"n": 1}'])
    assert [status for status, _, _ in replies] == [400, 422, 422]
    assert b"boolean" in replies[1][1]


def test_latency_mode_caps_generations_and_queues_the_rest(router):
    """--mode latency: at most --max-num-seqs generate at once, the others wait (in flight)."""
    r = router(
        "--mode", "latency", "--max-num-seqs", "3", "--gen-seconds", "0.3", "--body", "minimal"
    )
    replies = _post_many(r.url, [_request([1, i]) for i in range(10)])
    assert all(status == 200 for status, _, _ in replies)
    stats = watch.fetch_json(r.url + "/stats")
    assert stats["peak_generating"] == 3
    assert stats["peak_in_flight"] == 10 and stats["served"] == 10


def test_seeded_faults_are_deterministic_and_reported(router):
    """--fail with --seed: the n-th request's fault is the n-th draw; /stats counts each kind."""
    spec = {"500": 0.2, "html": 0.2, "truncate": 0.1, "reset": 0.1}
    r = router("--body", "minimal", "--seed", "4",
               "--fail", ",".join(f"{k}:{v}" for k, v in spec.items()))  # fmt: skip
    count = 60
    _post_many_sequential(r.url, count)
    rng, expected = random.Random(4), {}
    for _ in range(count):
        for kind, rate in spec.items():
            if rng.random() < rate:
                expected[kind] = expected.get(kind, 0) + 1
                break
    stats = watch.fetch_json(r.url + "/stats")
    assert stats["injected"] == expected
    assert stats["faults"] == sum(expected.values())
    assert stats["served"] == count - stats["faults"]


def _post_many_sequential(url: str, count: int) -> None:
    async def main():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            for i in range(count):
                try:
                    async with s.post(url + "/v1/completions", data=_request([1, i])) as response:
                        await response.read()
                except aiohttp.ClientError:
                    pass  # truncate and reset faults

    asyncio.run(main())


def test_workers_share_the_port_and_the_stats(router):
    """--workers 2: both processes answer, /stats sums both, stopping the router stops both."""
    r = router("--workers", "2", "--body", "minimal")
    children = psutil.Process(r.pid).children()
    assert len(children) == 1
    replies = _post_many(r.url, [_request([1, i]) for i in range(40)], fresh=True)
    assert {headers["X-Hotpath-Worker"] for _, _, headers in replies} == {"0", "1"}
    stats = watch.fetch_json(r.url + "/stats")
    assert stats["served"] == 40 and stats["workers"] == 2
    r.stop()
    assert not any(
        child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children
    )


def test_body_cache_is_bounded(router):
    """--cache-mb 0 keeps only the newest body: A, B, A renders three times (default: twice)."""
    small, bounded = router("--body", "minimal"), router("--body", "minimal", "--cache-mb", "0")
    for r in (small, bounded):
        for prompt in ([1, 2], [3, 4], [1, 2]):
            assert _post_many(r.url, [_request(prompt)])[0][0] == 200
    assert watch.fetch_json(small.url + "/stats")["rendered"] == 2
    assert watch.fetch_json(bounded.url + "/stats")["rendered"] == 3


def test_body_cache_is_keyed_by_a_digest():
    """A huge prompt is held by no cache entry and rendered once: keys are 16-byte digests of
    (prompt, n, max_tokens, seed, prompt_logprobs); a repeat is served from the cache."""
    from impl.harness.router.bodies import Bodies
    from impl.harness.router.stats import Stats

    stats = Stats()
    cache = Bodies("minimal", 64 << 20, stats)
    huge = list(range(2_000_000))
    payload = json.dumps({"prompt": huge, "max_tokens": 2, "seed": 3}).encode()
    request = cache.key(payload)
    assert len(request[0]) == 16 and request[1] == huge
    other = cache.key(json.dumps({"prompt": huge, "max_tokens": 2, "seed": 4}).encode())
    assert other[0] != request[0]
    small = cache.key(b'{"prompt": [1, 2], "max_tokens": 2}')

    async def serve() -> list[bytes]:
        return [await cache.get(r) for r in (request, cache.key(payload), small, small)]

    first, again, tiny, tiny_again = asyncio.run(serve())
    assert first == again and tiny == tiny_again
    assert stats.snapshot()["rendered"] == 2
    assert all(type(key) is bytes and len(key) == 16 for key in cache._cache)
    choices = generate(huge, n=1, max_tokens=2, seed=3)
    want = completion_body(choices, kind="minimal", prompt_tokens=huge, prompt_logprobs=None)
    assert first == want
