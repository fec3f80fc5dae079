"""The packed rendering: vLLM's packed logprobs of the same generation as the json rendering.

Kinds that cannot be made here (no mistral-common) skip with the install hint.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from impl.workloads import packed, realtext, synthetic
from tests.support.params import skipped_unless_available

KINDS = skipped_unless_available(realtext.ROUTER_BODIES, realtext.unavailable_reason)


def _arrays(block: dict) -> tuple[np.ndarray, np.ndarray]:
    shape = block["shape"]
    ids = np.frombuffer(base64.b64decode(block["token_ids_b64"], validate=True), "<i4")
    values = np.frombuffer(base64.b64decode(block["logprobs_b64"], validate=True), "<f4")
    return ids.reshape(shape), values.reshape(shape)


@pytest.mark.parametrize("kind", KINDS)
def test_packed_is_the_json_generation_in_vllms_packed_form(kind):
    """Same text, ids, sampled logprobs, prompt logprobs and usage; `tokens` are `token_id:N`,
    `text_offset` adds up their lengths, `top_logprobs` is empty and the [tokens, 1] candidates
    are the json body's top-1 entries; written as Starlette's JSONResponse writes it."""
    args = dict(kind=kind, n=3, prompt_logprobs=2, seed=5)
    plain = json.loads(realtext.body_for(900, **args))
    body = realtext.body_for(900, render_as="packed", **args)
    doc = json.loads(body)
    assert json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() == body
    assert list(doc) == list(plain) and doc["usage"] == plain["usage"]
    for choice, like in zip(doc["choices"], plain["choices"], strict=True):
        lp, like_lp = choice.pop("logprobs"), like.pop("logprobs")
        assert choice == like  # text, token ids, finish, prompt logprobs: untouched
        tokens = like["token_ids"]
        assert lp["token_logprobs"] == like_lp["token_logprobs"]
        assert lp["tokens"] == [f"token_id:{t}" for t in tokens]
        lengths = [len(f"token_id:{t}") for t in tokens]
        assert lp["text_offset"] == [sum(lengths[:i]) for i in range(len(tokens))]
        assert lp["top_logprobs"] == []
        block = lp["packed_top_logprobs"]
        assert list(block) == [
            "shape", "token_ids_dtype", "logprobs_dtype", "token_ids_b64", "logprobs_b64",
        ]  # fmt: skip
        assert block["shape"] == [len(tokens), 1]
        assert (block["token_ids_dtype"], block["logprobs_dtype"]) == ("<i4", "<f4")
        ids, values = _arrays(block)
        if kind == "minimal":
            continue  # no top_logprobs in the json body to compare with
        strings = synthetic._vocab()[0]
        for i, entry in enumerate(like_lp["top_logprobs"]):
            listed = list(entry.values())[-1]  # the top-1's entry: the 2nd key, if any
            assert values[i, 0] == np.float32(listed)
            if kind in ("vllm", "synthetic"):  # keys are the fake vocabulary's strings
                assert np.float32(entry[strings[ids[i, 0]]]) == values[i, 0]


def test_candidates_differ_from_the_sampled_token_where_json_lists_another():
    """The top-1 is another token exactly where the json body's dict has a second key."""
    plain = json.loads(realtext.body_for(3000, kind="synthetic", seed=2))["choices"][0]
    doc = json.loads(realtext.body_for(3000, kind="synthetic", render_as="packed", seed=2))
    ids, _ = _arrays(doc["choices"][0]["logprobs"]["packed_top_logprobs"])
    other = ids[:, 0] != np.asarray(plain["token_ids"])
    two = np.array([len(e) == 2 for e in plain["logprobs"]["top_logprobs"]])
    assert other.any() and (other == two).all()


QUALIFYING = {"prompt": [1], "logprobs": 2, "packed_top_logprobs": True,
              "return_tokens_as_token_ids": True}  # fmt: skip


@pytest.mark.parametrize(
    "override",
    [
        {"echo": True},
        {"use_beam_search": True},
        {"logprobs": 0},
        {"logprobs": -1},
        {"logprobs": None},
        {"logprob_token_ids": [1]},
        {"return_tokens_as_token_ids": False},
    ],
)
def test_requests_vllm_refuses(override):
    """vLLM's CompletionRequest refuses these packed requests; the error is its 400 shape."""
    reason = packed.request_error(QUALIFYING | override)
    assert reason is not None and reason.startswith("packed_top_logprobs")
    error = json.loads(packed.error_body(reason))["error"]
    assert error == {"message": reason, "type": "Bad Request", "param": None, "code": 400}


def test_requests_that_qualify_or_do_not_ask():
    assert packed.request_error(QUALIFYING) is None
    assert packed.request_error(QUALIFYING | {"packed_top_logprobs": False, "logprobs": 0}) is None
    assert not packed.wants_packed({"prompt": [1]})


def test_an_empty_choice_packs_to_an_empty_block():
    block = packed.logprobs_object(np.zeros(0, np.int32), [], np.zeros((0, 1)), np.zeros((0, 1)))
    assert block["packed_top_logprobs"]["shape"] == [0, 1]
    assert block["packed_top_logprobs"]["token_ids_b64"] == "" and block["text_offset"] == []
