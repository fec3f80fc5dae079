"""The unmodified Tinker SDK (0.38) samples through `hotpath serve` and gets exactly what the
upstream sent: tokens, float32 logprobs, prompt logprobs and top-k prompt logprobs — with the
session protocol (the default: one retrieve_futures poller per sampling session), with
per-request polling (`--no-session-poll`), on `--baseline`, and with the session protocol
through two server processes on the shared store (`--workers 2`: an embedded redis-server; the
SDK's polls and fetches land on either process), and on every other HTTP runtime of the family
(`--runtime NAME`).

Real processes: the stand-in vLLM upstream (tests/support/fake_vllm.py) and the server, each on a
loopback port; the SDK talks HTTP to the server in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle

import numpy as np
import pytest

from impl import registry
from impl.workloads import synthetic
from tests.support.server import API_KEY, Api, start_server, start_upstream

tinker = pytest.importorskip(
    "tinker", reason="the real-SDK tests need `pip install 'hotpath[sdk]'`"
)
from tinker import types  # noqa: E402

pytestmark = pytest.mark.heavy

os.environ.setdefault("TINKER_TELEMETRY", "0")

CASES = [  # (n, prompt_logprobs, topk_prompt_logprobs)
    pytest.param(1, False, 0, id="n1"),
    pytest.param(3, False, 0, id="n3"),
    pytest.param(1, True, 0, id="n1-prompt_logprobs"),
    pytest.param(3, True, 3, id="n3-prompt_logprobs-topk3"),
    pytest.param(2, False, 2, id="n2-topk2-only"),
]


STACK_ARGS = {
    "session": (),
    "request": ("--no-session-poll",),
    "baseline": ("--baseline",),
    "session-workers2": ("--workers", "2"),
    # every other HTTP runtime of the family (impl/runtime), with session polling
    **{
        f"runtime-{name}": ("--runtime", name)
        for name in registry.names("runtime")
        if name != registry.reference("runtime")
    },
}


def _shared_store_missing() -> str | None:
    """Why the --workers 2 stack cannot run here, or None."""
    from impl.server.store.redis import embedded

    try:
        import redis  # noqa: F401
    except ImportError:
        return "the shared store needs redis-py: pip install 'hotpath[store]'"
    return embedded.INSTALL_HINT if embedded.binary() is None else None


@pytest.fixture(scope="module", params=list(STACK_ARGS))
def stack(request):
    """(upstream, server) processes; the server in its picked configuration with session
    polling (the default) or per-request polling, in its --baseline configuration, or as two
    processes on the shared store with session polling."""
    args = STACK_ARGS[request.param]
    if "--workers" in args and (missing := _shared_store_missing()):
        pytest.skip(missing)
    if "--runtime" in args and (missing := registry.unavailable_reason("runtime", args[1])):
        pytest.skip(missing)
    with start_upstream() as upstream, start_server(upstream.url, *args) as server:
        yield upstream, server


@pytest.fixture(scope="module")
def sampler(stack):
    _, server = stack
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    client = service.create_sampling_client(base_model="fake/model").result()
    yield client
    service.close("success").result(timeout=30)  # POST /api/v1/sessions/{id}/finish


def _sent(upstream, seed: int) -> dict:
    """The one request with `seed` the upstream answered with a body, and that body."""
    matches = [e for e in upstream.get("/sent") if e["request"].get("seed") == seed and e["body"]]
    assert len(matches) == 1, f"expected one forward for seed {seed}, got {len(matches)}"
    return {"request": matches[0]["request"], "body": json.loads(matches[0]["body"])}


def _check(
    response,
    upstream,
    *,
    seed: int,
    prompt: list[int],
    n: int,
    max_tokens: int,
    prompt_logprobs: bool,
    topk: int,
) -> None:
    sent = _sent(upstream, seed)
    assert sent["request"]["n"] == n and sent["request"]["prompt"] == prompt
    assert sent["request"]["logprobs"] == 1 and sent["request"]["return_token_ids"] is True
    expected = synthetic.generate(prompt, n=n, max_tokens=max_tokens, seed=seed)
    assert len(response.sequences) == n
    for seq, want, choice in zip(
        response.sequences, expected, sent["body"]["choices"], strict=True
    ):
        assert np.array_equal(seq.tokens_np, want.tokens)
        assert seq.tokens == choice["token_ids"]
        assert seq.logprobs_np.dtype == np.float32
        assert np.array_equal(seq.logprobs_np, want.logprobs)
        assert seq.stop_reason == ("stop" if choice["finish_reason"] == "stop" else "length")
        assert seq.sequence_id
    positions = sent["body"]["choices"][0]["prompt_logprobs"]
    if prompt_logprobs:
        want = [None] + [
            float(np.float32(positions[i][str(t)]["logprob"]))
            for i, t in enumerate(prompt)
            if i > 0
        ]
        assert response.prompt_logprobs == want
    else:
        assert response.prompt_logprobs is None
    if topk:
        rows = [None]
        for entry in positions[1:]:
            ranked = sorted(
                (v["rank"], int(tok), v["logprob"])
                for tok, v in entry.items()
                if 1 <= v["rank"] <= topk
            )
            rows.append([(tok, float(np.float32(lp))) for _, tok, lp in ranked])
        assert response.topk_prompt_logprobs == rows
    else:
        assert response.topk_prompt_logprobs is None


@pytest.mark.parametrize(("n", "prompt_logprobs", "topk"), CASES)
@pytest.mark.slow
def test_sdk_sample_sync(stack, sampler, n, prompt_logprobs, topk):
    """`SamplingClient.sample(...).result()` gets exactly the upstream's tokens and logprobs."""
    upstream, _ = stack
    seed = 1000 + n * 10 + prompt_logprobs * 5 + topk
    prompt = [128000, 11, 22, 33, 44, 55]
    future = sampler.sample(
        prompt=types.ModelInput.from_ints(prompt),
        sampling_params=types.SamplingParams(max_tokens=12, seed=seed, temperature=0.7),
        num_samples=n,
        include_prompt_logprobs=prompt_logprobs,
        topk_prompt_logprobs=topk,
    )
    response = future.result(timeout=60)
    case = {"n": n, "prompt_logprobs": prompt_logprobs, "topk": topk}
    _check(response, upstream, seed=seed, prompt=prompt, max_tokens=12, **case)


@pytest.mark.parametrize(("n", "prompt_logprobs", "topk"), CASES)
def test_sdk_sample_async(stack, sampler, n, prompt_logprobs, topk):
    """`await SamplingClient.sample(...)` (several at once) gets exactly the same data."""
    upstream, _ = stack
    prompts = [[128000, 7, 8, 9 + i] for i in range(3)]
    seeds = [2000 + n * 100 + prompt_logprobs * 50 + topk * 10 + i for i in range(3)]

    async def sample_all():
        return await asyncio.gather(
            *(
                sampler.sample(
                    prompt=types.ModelInput.from_ints(prompt),
                    sampling_params=types.SamplingParams(max_tokens=20, seed=seed),
                    num_samples=n,
                    include_prompt_logprobs=prompt_logprobs,
                    topk_prompt_logprobs=topk,
                )
                for prompt, seed in zip(prompts, seeds, strict=True)
            )
        )

    responses = asyncio.run(asyncio.wait_for(sample_all(), 60))
    for response, prompt, seed in zip(responses, prompts, seeds, strict=True):
        case = {"n": n, "prompt_logprobs": prompt_logprobs, "topk": topk}
        _check(response, upstream, seed=seed, prompt=prompt, max_tokens=20, **case)


def test_gc_is_tuned_in_the_picked_server_only(stack):
    """The picked server freezes its start-up objects and raises the collection thresholds
    (its GC pauses are on /healthz); the baseline keeps CPython's defaults."""
    _, server = stack
    health = server.get("/healthz")
    gc_state = health["gc"]
    if health["baseline"]:
        assert gc_state["threshold"] == [700, 10, 10] and gc_state["frozen_objects"] == 0
    else:
        assert gc_state["threshold"] == [50000, 20, 20] and gc_state["frozen_objects"] > 10000
    assert len(gc_state["collections"]) == 3 and gc_state["max_recent_ms"] >= 0


def _shared(server) -> bool:
    """True when the server runs on the shared store (there: two processes)."""
    return (server.get("/healthz").get("store_backend") or {}).get("kind") == "redis"


def _polls(server) -> dict[str, int]:
    """This process's poll counters; with several processes (one answers each /healthz),
    the requests per route of all of them from /metrics (multiprocess mode), in the same
    names: each retrieve_future is counted as a payload fetch, so a try_again or a metadata
    round would show as more fetches than samples."""
    if not _shared(server):
        return server.get("/healthz")["polls"]
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    time.sleep(1.5)  # every process flushes its tallies into the shared files each second
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    counts = {"retrieve_futures": 0, "retrieve_future_payload": 0, "join": 0}
    names = {
        "/api/v1/retrieve_futures": "retrieve_futures",
        "/api/v1/retrieve_future": "retrieve_future_payload",
        "/api/v1/join_sampling_session": "join",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hotpath_http_request_duration_seconds_count":
                name = names.get(sample.labels.get("route"))
                if name is not None and sample.labels.get("status") == "200":
                    counts[name] += int(sample.value)
    return counts


def _session_protocol(server) -> bool:
    """What client/config tells the SDK: session protocol on or off."""
    api = Api(server.url)
    try:
        return api.post("/api/v1/client/config", {"sdk_version": "0.38.0"}).json()[
            "sample_use_retrieve_futures"
        ]
    finally:
        api.close()


def test_which_polls_the_sdk_makes(stack, sampler):
    """With the session protocol the server serves retrieve_futures and each retrieve_future
    is a payload fetch (no try_again, no metadata round, one per sample); without it the SDK
    polls retrieve_future per sample and never calls retrieve_futures."""
    _, server = stack
    session = _session_protocol(server)
    before = _polls(server)

    async def sample_all():
        return await asyncio.gather(
            *(
                sampler.sample(
                    prompt=types.ModelInput.from_ints([128000, 5, i]),
                    sampling_params=types.SamplingParams(max_tokens=6, seed=3000 + i),
                    num_samples=1,
                )
                for i in range(16)
            )
        )

    responses = asyncio.run(asyncio.wait_for(sample_all(), 60))
    assert [len(r.sequences[0].tokens) for r in responses] == [6] * 16
    after = _polls(server)
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    fetches = sum(v for k, v in diff.items() if k.startswith("retrieve_future_"))
    if session:
        assert diff.get("retrieve_futures", 0) >= 1
        if not _shared(server):  # (not in /metrics)
            assert diff.get("retrieve_futures_completions", 0) == 16
        assert diff.get("retrieve_future_payload", 0) == 16 and fetches == 16
    else:
        assert diff.get("retrieve_futures", 0) == 0
        assert diff.get("retrieve_future_payload", 0) == 16 and fetches >= 16


def test_unpickled_client_joins_the_sampling_session(stack, sampler):
    """An unpickled SamplingClient asks join_sampling_session for its clone id (session
    protocol) and samples under it; its results are exact either way."""
    upstream, server = stack
    several = _shared(server)
    clones_before = (
        _polls(server)["join"] if several else server.get("/healthz")["sessions"]["clones"]
    )
    clone = pickle.loads(pickle.dumps(sampler))
    prompt = [128000, 9, 9, 9]
    response = clone.sample(
        prompt=types.ModelInput.from_ints(prompt),
        sampling_params=types.SamplingParams(max_tokens=5, seed=4242),
        num_samples=1,
    ).result(timeout=60)
    _check(
        response, upstream, seed=4242, prompt=prompt, n=1, max_tokens=5,
        prompt_logprobs=False, topk=0,
    )  # fmt: skip
    clones_after = (
        _polls(server)["join"] if several else server.get("/healthz")["sessions"]["clones"]
    )
    joined = clones_after - clones_before
    assert joined == (1 if _session_protocol(server) else 0)
