"""`hotpath serve --upstream-logprobs`: packed candidates asked of a real `hotpath router`.

A real server on a real socket samples against `hotpath router --render packed` (vLLM with
packed logprobs) and against a router that refuses the field (`--refuse-packed`); the router's
`/stats` counts the packed bodies it served and the requests it refused. Every result is
compared with the json server's, exactly.
"""

from __future__ import annotations

import pytest

from impl.harness import procs, watch
from tests.support.server import Api, start_server

PROMPT = [128000, 5, 6, 7]


@pytest.fixture
def started():
    with procs.stopped_at_exit() as handles:
        yield handles


def _router(started, *flags: str) -> procs.Proc:
    router = procs.start_router(["--body", "vllm", *flags])
    started.append(router)
    return router


def _samples(router_url: str, mode: str, count: int, *args: str) -> list[dict]:
    """`count` asamples (seeds 0..count-1) through a server with `--upstream-logprobs mode`:
    each result's JSON (its sequences)."""
    with start_server(router_url, "--upstream-logprobs", mode, *args) as server:
        api = Api(server.url)
        try:
            ssid = api.sampling_session()
            results = []
            for seed in range(count):
                asked = api.asample(ssid, seed, seed=seed, prompt=PROMPT, n=2, max_tokens=300)
                asked.raise_for_status()
                response = api.result(asked.json()["request_id"], proto=False)
                results.append(response.json())
            return results
        finally:
            api.close()


def _stats(router: procs.Proc) -> dict:
    return watch.fetch_json(router.url + "/stats?reset=1")


@pytest.mark.heavy
@pytest.mark.parametrize("offloop", ["inline", "fetch"])
def test_packed_and_auto_ask_packed_and_get_the_json_results(started, offloop):
    """Against a packed router, packed and auto get packed bodies for every sample; the results
    equal the json server's, which gets json bodies (inline, and from fetch processes)."""
    router = _router(started, "--render", "packed")
    args = ("--offloop", offloop)
    want = _samples(router.url, "json", 3, *args)
    assert all(r.get("type") != "error" and r["sequences"] for r in want), want
    assert _stats(router)["packed"] == 0
    for mode in ("packed", "auto"):
        assert _samples(router.url, mode, 3, *args) == want
        stats = _stats(router)
        assert (stats["served"], stats["packed"], stats["refused"]) == (3, 3, 0)


@pytest.mark.heavy
def test_auto_falls_back_to_json_once_per_router_and_packed_fails(started):
    """A router that refuses packed: auto is refused once, then asks in JSON (remembered), with
    the json server's results; packed fails each sample saying what the router answered."""
    router = _router(started, "--refuse-packed")
    want = _samples(router.url, "json", 3, "--offloop", "inline")
    _stats(router)
    assert _samples(router.url, "auto", 3, "--offloop", "inline") == want
    stats = _stats(router)
    assert (stats["served"], stats["packed"], stats["refused"]) == (3, 0, 1)
    failed = _samples(router.url, "packed", 1, "--offloop", "inline")
    assert "400" in str(failed) and "packed_top_logprobs" in str(failed), failed
    assert _stats(router)["refused"] == 1


@pytest.mark.heavy
def test_a_router_without_the_field_answers_json_to_packed(started):
    """A router that ignores the field (as a vLLM without it does) answers JSON bodies to packed
    requests: the results are the same."""
    router = _router(started)
    want = _samples(router.url, "json", 2, "--offloop", "inline")
    assert _samples(router.url, "packed", 2, "--offloop", "inline") == want
    assert _stats(router)["refused"] == 0


@pytest.mark.parametrize("mode", ["JSON", "base64", ""])
def test_an_unknown_mode_is_refused_at_start(mode):
    from impl.server.settings import Settings

    with pytest.raises(ValueError, match="upstream_logprobs must be one of json, packed, auto"):
        Settings(upstream_logprobs=mode)


def test_the_packed_request_is_the_json_one_with_the_two_fields():
    import orjson

    from impl.server import upstream

    body = orjson.dumps({"model": "m", "prompt": [1, 2], "logprobs": 1})
    asked = orjson.loads(upstream.packed_request(body))
    assert asked == {**orjson.loads(body), "packed_top_logprobs": True,
                     "return_tokens_as_token_ids": True}  # fmt: skip
