"""Seeded vLLM `/v1/completions` bodies: what the fake router serves and decoders are fed.

`generate()` draws the sampled tokens and their logprobs (deterministic for the prompt, seed,
n and max_tokens); `completion_body()` renders them as one compact JSON line in the shape of
docs/vllm-body.md: `minimal` (text, token_ids, logprobs.token_logprobs) or `vllm` (logprobs=1 with
text_offset, token_logprobs, tokens, top_logprobs; prompt_logprobs when asked). Rendering is
vectorised over precomputed per-token pieces (a 262144-token vllm body renders in well under
a second). Floats are Python's repr of float32-derived doubles; -inf is written `-9999.0`, as
vLLM does, and the returned logprobs already hold -9999.0 so that decode(body) == choice.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal

import numpy as np

try:  # optional: much faster float rendering; bodies are identical without it
    import orjson as _orjson
except ImportError:
    _orjson = None

VOCAB_SIZE = 128256
EOS_TOKEN = 128009
_CREATED = 1772367069
_SPECIAL = {
    EOS_TOKEN: "<|eot_id|>",
    128000: "<|begin_of_text|>",
    30: '"',
    31: "\\",
    32: "\n",
    33: "\t",
    34: "é",
    35: " 日本",
    36: " 🙂",
    37: '":',
    38: "{",
    39: "]",
}


@dataclass(frozen=True, eq=False)
class GeneratedChoice:
    """One sampled sequence: int32 tokens, float32 logprobs (as the body writes them)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str


@cache
def _vocab() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fake decoded token strings, their JSON encodings and lengths (deterministic)."""
    rng = np.random.default_rng(20261129)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    lengths = rng.integers(1, 8, VOCAB_SIZE)
    space = rng.random(VOCAB_SIZE) < 0.7
    draws = letters[rng.integers(0, len(letters), int(lengths.sum()))].tobytes().decode()
    words, pos = [], 0
    for length, sp in zip(lengths.tolist(), space.tolist(), strict=True):
        words.append((" " if sp else "") + draws[pos : pos + length])
        pos += length
    for token, text in _SPECIAL.items():
        words[token] = text
    strings = np.array(words, dtype=object)
    encoded = np.array([json.dumps(w, ensure_ascii=False).encode() for w in words], dtype=object)
    return strings, encoded, np.array([len(w) for w in words], dtype=np.int64)


def _rng(seed: int | None, *parts: bytes | int) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    keys = [zlib.crc32(p) if isinstance(p, bytes) else int(p) & 0xFFFFFFFF for p in parts]
    return np.random.default_rng([seed & 0xFFFFFFFF, *keys])


def _logprobs(rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 logprobs <= 0: mostly small (exponent forms), some exactly 0.0, rare -9999.0."""
    values = -np.power(10.0, rng.uniform(-6.0, 1.0, size))
    values[rng.random(size) < 0.05] = 0.0
    values[rng.random(size) < 1 / 4096] = -9999.0
    return values.astype(np.float32)


def generate(
    prompt_tokens: Sequence[int], *, n: int, max_tokens: int, seed: int | None
) -> list[GeneratedChoice]:
    """`n` sampled sequences; choice 0 always runs to `max_tokens`, others may stop early."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64).tobytes()
    rng = _rng(seed, prompt, n, max_tokens)
    choices = []
    for index in range(n):
        length, finish = max_tokens, "length"
        if index > 0 and max_tokens > 0 and rng.random() < 0.5:
            length, finish = int(rng.integers(max(1, max_tokens // 2), max_tokens + 1)), "stop"
        tokens = rng.integers(0, 128000, length, dtype=np.int32)
        if finish == "stop":
            tokens[-1] = EOS_TOKEN
        choices.append(GeneratedChoice(tokens, _logprobs(rng, length), finish))
    return choices


def _floats(values: np.ndarray) -> list[bytes]:
    """Python's repr of each value as a double; orjson's shortest digits where they agree."""
    doubles = values.astype(np.float64)
    if _orjson is None:
        return [repr(x).encode() for x in doubles.tolist()]
    out = _orjson.dumps(doubles.tolist())[1:-1].split(b",") if len(doubles) else []
    # orjson and repr pick the same shortest digits; they differ in layout below 1e-4.
    for i in np.flatnonzero((np.abs(doubles) < 1e-4) | (np.abs(doubles) >= 1e16)).tolist():
        out[i] = repr(doubles[i].item()).encode()
    return out


def _ints(values: np.ndarray) -> bytes:
    return ",".join(map(str, values.tolist())).encode()


def top1(
    choice: GeneratedChoice, strings: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-1 entries of logprobs=1: (a drawn id per token, where it is the top-1 rather
    than the sampled token, the float32 logprobs of those top-1 entries)."""
    if strings is None:
        strings = _vocab()[0]
    rng = _rng(0, choice.tokens.tobytes(), choice.logprobs.tobytes())
    size = len(choice.tokens)
    # When the sampled token was not the most likely one, vLLM adds the top-1 as a 2nd key
    # (unless both decode to the same string: the dict then has one key).
    alt_ids = rng.integers(0, 128000, size)
    other = rng.random(size) > np.exp(np.maximum(choice.logprobs, -50.0))
    other &= strings[alt_ids] != strings[choice.tokens]
    alt_values = np.log(rng.uniform(0.5, 1.0, int(other.sum()))).astype(np.float32)
    return alt_ids, other, alt_values


def _vllm_logprobs(choice: GeneratedChoice, strings: np.ndarray, encoded: np.ndarray) -> bytes:
    """The `logprobs` object of logprobs=1: text_offset, token_logprobs, tokens, top_logprobs."""
    _, _, lengths = _vocab()
    size = len(choice.tokens)
    offsets = np.concatenate(([0], np.cumsum(lengths[choice.tokens])[:-1])) if size else []
    lp = _floats(choice.logprobs)
    keys = encoded[choice.tokens]
    alt_ids, other, alt_values = top1(choice, strings)
    values = np.array(lp, dtype=object)
    alt_lp = _floats(alt_values)
    rows = np.flatnonzero(other)
    values[rows] = [
        v + b"," + k + b":" + a
        for v, k, a in zip(values[rows], encoded[alt_ids[rows]], alt_lp, strict=True)
    ]
    return _logprobs_json(np.asarray(offsets, dtype=np.int64), lp, keys, values)


def _logprobs_json(
    offsets: np.ndarray, logprobs: list[bytes], keys: np.ndarray, tops: np.ndarray
) -> bytes:
    """The logprobs=1 object from its rendered parts, per token: its text offset, its logprob,
    its key (a JSON string) and the rest of its top_logprobs entry after `key:` (the value,
    then `,"other":value` when the top-1 token was another one)."""
    pieces = np.empty((len(keys), 5), dtype=object)
    pieces[:, 0], pieces[:, 1], pieces[:, 2], pieces[:, 3], pieces[:, 4] = (
        b",{",
        keys,
        b":",
        tops,
        b"}",
    )
    return (
        b'{"text_offset":['
        + _ints(offsets)
        + b'],"token_logprobs":['
        + b",".join(logprobs)
        + b'],"tokens":['
        + b",".join(keys.tolist())
        + b'],"top_logprobs":['
        + b"".join(pieces.ravel().tolist())[1:]
        + b"]}"
    )


def _prompt_logprobs(prompt_tokens: Sequence[int], k: int, encoded: np.ndarray) -> bytes:
    """vLLM's prompt_logprobs list: null first, then {token id: {logprob, rank, decoded_token}}."""
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    rng = _rng(0, prompt.tobytes(), k)
    entries = [b"null"]
    for token in prompt[1:].tolist():
        top = np.sort(np.log(rng.uniform(0.001, 1.0, max(k, 1))).astype(np.float32))[::-1]
        rank = 1 if rng.random() < 0.3 else int(rng.integers(1, 2000))
        own = top[rank - 1] if rank <= k else np.float32(top[-1] - rng.uniform(0.1, 5.0))
        items = {token: (float(own), rank)}  # the real prompt token first, then ranks 1..k
        others = rng.choice(VOCAB_SIZE - 256, k, replace=False).tolist() if k else []
        for r, other in enumerate(others, start=1):
            if r != rank and other not in items:
                items[other] = (float(top[r - 1]), r)
        fields = [
            b'"%d":{"logprob":%s,"rank":%d,"decoded_token":%s}'
            % (tid, repr(lp).encode(), r, encoded[tid % VOCAB_SIZE])
            for tid, (lp, r) in items.items()
        ]
        entries.append(b"{" + b",".join(fields) + b"}")
    return b"[" + b",".join(entries) + b"]"


def completion_body(
    choices: list[GeneratedChoice],
    *,
    kind: Literal["minimal", "vllm"],
    prompt_tokens: Sequence[int],
    prompt_logprobs: int | None = None,
    model: str = "hotpath-fake",
) -> bytes:
    """One compact JSON line in vLLM's shape (docs/vllm-body.md) for these choices."""
    if kind not in ("minimal", "vllm"):
        raise ValueError(f"kind must be 'minimal' or 'vllm', not {kind!r}")
    strings, encoded, _ = _vocab()
    prompt_ids = b"[" + _ints(np.asarray(prompt_tokens, dtype=np.int64)) + b"]"
    plp = b"null"
    if prompt_logprobs is not None:
        plp = _prompt_logprobs(prompt_tokens, prompt_logprobs, encoded)
    digest = zlib.crc32(b"".join(c.tokens.tobytes() for c in choices) + prompt_ids)
    parts = []
    for index, choice in enumerate(choices):
        text = json.dumps("".join(strings[choice.tokens].tolist()), ensure_ascii=False).encode()
        head = b'{"index":%d,"text":%s,"logprobs":' % (index, text)
        ids = b'"token_ids":[' + _ints(choice.tokens) + b"]"
        finish = b'"finish_reason":"%s"' % choice.finish_reason.encode()
        if kind == "minimal":
            lp = b'{"token_logprobs":[' + b",".join(_floats(choice.logprobs)) + b"]}"
            tail = b""
            if prompt_logprobs is not None:
                tail = b',"prompt_logprobs":' + plp + b',"prompt_token_ids":' + prompt_ids
            parts.append(head + lp + b"," + finish + b"," + ids + tail + b"}")
        else:
            parts.append(
                head
                + _vllm_logprobs(choice, strings, encoded)
                + b","
                + finish
                + b',"stop_reason":null,'
                + ids
                + b',"prompt_logprobs":'
                + plp
                + b',"prompt_token_ids":'
                + prompt_ids
                + b',"routed_experts":null,"weight_versions":null}'
            )
    completion = sum(len(c.tokens) for c in choices)
    prompt_len = len(prompt_tokens)
    usage = b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d' % (
        prompt_len,
        prompt_len + completion,
        completion,
    )
    top = (
        b'{"id":"cmpl-%08x%08x","object":"text_completion","created":%d,"model":%s,"choices":['
        % (digest, len(choices), _CREATED, json.dumps(model).encode())
    )
    if kind == "minimal":
        return top + b",".join(parts) + b"]," + usage + b"}}"
    return (
        top
        + b",".join(parts)
        + b'],"service_tier":null,"system_fingerprint":"vllm-0.33.0-hotpath",'
        + usage
        + b',"prompt_tokens_details":null,"completion_tokens_details":null},'
        + b'"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
    )


@lru_cache(maxsize=32)
def body_for(
    tokens: int,
    *,
    kind: Literal["minimal", "vllm"] = "vllm",
    n: int = 1,
    prompt_len: int = 16,
    prompt_logprobs: int | None = None,
    seed: int = 0,
) -> bytes:
    """A cached body with `tokens` generated tokens per choice (choice 0 exactly `tokens`)."""
    prompt = [
        128000,
        *np.random.default_rng(seed).integers(0, 128000, max(prompt_len - 1, 0)).tolist(),
    ]
    choices = generate(prompt, n=n, max_tokens=tokens, seed=seed)
    return completion_body(
        choices, kind=kind, prompt_tokens=prompt, prompt_logprobs=prompt_logprobs
    )
