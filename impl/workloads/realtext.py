"""Seeded vLLM bodies from real text through a real tokenizer, rendered as real servers render.

Body kinds (docs/vllm-body.md): `synthetic` (`impl.workloads.synthetic`' `vllm` body: a fake ASCII
vocabulary, byte for byte as before), `prose`, `code`, `multilingual` and `mixed`; renderings:
`json` (vLLM's `/v1/completions` answers through Starlette's `JSONResponse`: `json.dumps(...,
ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))`), `orjson`
(FastAPI's `ORJSONResponse`: `orjson.dumps(..., option=OPT_NON_STR_KEYS | OPT_SERIALIZE_NUMPY)`)
and `packed` (vLLM's answer to a `packed_top_logprobs` request, `impl.workloads.packed`: the
same generation, its top-1 candidates as base64 arrays).
Every body has the logprobs=1 shape of `synthetic`' `vllm` kind, so the kinds differ only in text.

How a real-text choice is made (`generate`):

1. tokens: passages of the kind's text (`impl.workloads.textsources`; `mixed` draws each passage
   from prose, code in a ```python fence, or multilingual text with weights 0.45/0.35/0.20),
   in seeded random order, tokenized by Mistral's Tekken (`impl.workloads.vocab`), separated by
   "\\n\\n", cut at `max_tokens`. Choices after the first may stop early on `</s>`.
2. sampled logprobs, float32, from a stated mixture: with probability 0.52 -10**U(-7, -1.3)
   (a confident model), 0.455 -Gamma(0.9, 1.6), 0.025 -U(10, 30) (the tail below -10); then
   with probability 0.04 exactly 0.0 and 1 in 8192 -9999.0 (what vLLM writes for -inf).
3. the top-1 entry logprobs=1 adds: when the sampled token has p < 0.5, another token is the
   most likely one with probability 1 - 2p, its id drawn from the same text, its p uniform in
   [p, 1 - p]; otherwise the top-1 is the sampled token itself (one key).
4. token strings as vLLM writes them (`tokens` and the `top_logprobs` keys): each id decoded
   alone (`convert_ids_list_to_tokens`), and a string ending in U+FFFD (an incomplete UTF-8
   sequence, common with byte-level BPE on CJK and emoji) replaced as the V1 engine's
   `LogprobsProcessor._verify_tokens` does: decoded with the id before it in that position's
   list [sampled, top-1], else also with the previous position's sampled id, else "".
   `text_offset` adds up the strings' lengths; `text` is the whole output decoded.

Deterministic for (kind, prompt, n, max_tokens, seed) and the Python version (the code and
prose passages are the interpreter's own); docs/measurements.md has how long a 262144-token
body takes to render.
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from impl.workloads import packed, synthetic, textsources, vocab
from impl.workloads.synthetic import _rng

KINDS = ("synthetic", "prose", "code", "multilingual", "mixed")
RENDERS = ("json", "orjson", "packed")
#: `hotpath router --body` names: the two original shapes and the kinds above
ROUTER_BODIES = ("minimal", "vllm", *KINDS)
MIXED = {"prose": 0.45, "code": 0.35, "multilingual": 0.20}
SEPARATOR, FENCE_OPEN, FENCE_CLOSE = "\n\n", "```python\n", "\n```"
ORJSON_HINT = "pip install 'hotpath[fast]' (orjson)"


@dataclass(frozen=True, eq=False)
class TextChoice:
    """One sampled sequence and its top-1 entries (`top_ids` -1 where the sampled one is top)."""

    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    top_ids: np.ndarray  # int32
    top_logprobs: np.ndarray  # float32, NaN where top_ids is -1
    finish_reason: str


def unavailable_reason(kind: str, render: str = "json") -> str | None:
    """Why (kind, render) cannot be made here, with the install hint; None when it can."""
    if kind not in ROUTER_BODIES:
        raise LookupError(f"unknown body kind {kind!r}; known: {', '.join(ROUTER_BODIES)}")
    if render not in RENDERS:
        raise LookupError(f"unknown rendering {render!r}; known: {', '.join(RENDERS)}")
    if render == "orjson" and importlib.util.find_spec("orjson") is None:
        return f"orjson is not installed: {ORJSON_HINT}"
    if kind in ("minimal", "vllm", "synthetic"):
        return None
    return vocab.unavailable_reason()


@cache
def _ids(text: str) -> np.ndarray:
    return vocab.load().encode(text)


@cache
def _passage(source: str, index: int) -> np.ndarray:
    return _ids(textsources.passage(source, index))


def _draw(rng: np.random.Generator, kind: str, count: int) -> np.ndarray:
    """`count` token ids of seeded passages of `kind`."""
    sources, weights = list(MIXED), np.array(list(MIXED.values()))
    parts: list[np.ndarray] = []
    total = 0
    while total < count:
        source = sources[rng.choice(len(sources), p=weights)] if kind == "mixed" else kind
        ids = _passage(source, int(rng.integers(textsources.count(source))))
        if kind == "mixed" and source == "code":
            ids = np.concatenate((_ids(FENCE_OPEN), ids, _ids(FENCE_CLOSE)))
        parts += [ids, _ids(SEPARATOR)]
        total += len(ids) + len(parts[-1])
    return np.concatenate(parts)[:count].astype(np.int32) if parts else np.zeros(0, np.int32)


def _logprobs(rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 sampled logprobs from the mixture of the module docstring."""
    u = rng.random(size)
    confident = -np.power(10.0, rng.uniform(-7.0, -1.3, size))
    uncertain = -rng.gamma(0.9, 1.6, size)
    tail = -rng.uniform(10.0, 30.0, size)
    values = np.where(u < 0.52, confident, np.where(u < 0.975, uncertain, tail))
    values[rng.random(size) < 0.04] = 0.0
    values[rng.random(size) < 1 / 8192] = -9999.0
    return values.astype(np.float32)


def _top1(
    rng: np.random.Generator, tokens: np.ndarray, logprobs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    size = len(tokens)
    p = np.exp(logprobs.astype(np.float64))
    other = (p < 0.5) & (rng.random(size) >= 2 * p)
    alt = tokens[rng.integers(0, max(size, 1), size)] if size else tokens
    other &= alt != tokens
    top = np.log(p + rng.random(size) * (1 - 2 * p)).astype(np.float32)
    top = np.where(other, np.maximum(top, logprobs), np.float32("nan")).astype(np.float32)
    return np.where(other, alt, -1).astype(np.int32), top


def generate(
    prompt_tokens: Sequence[int], *, kind: str, n: int, max_tokens: int, seed: int | None
) -> list[TextChoice]:
    """`n` sampled sequences of real text; choice 0 always runs to `max_tokens`."""
    if kind not in KINDS[1:]:
        raise ValueError(f"kind must be one of {', '.join(KINDS[1:])}, not {kind!r}")
    prompt = np.asarray(prompt_tokens, dtype=np.int64).tobytes()
    rng = _rng(seed, kind.encode(), prompt, n, max_tokens)
    choices = []
    for index in range(n):
        length, finish = max_tokens, "length"
        if index > 0 and max_tokens > 0 and rng.random() < 0.5:
            length, finish = int(rng.integers(max(1, max_tokens // 2), max_tokens + 1)), "stop"
        tokens = _draw(rng, kind, length).copy()
        if finish == "stop":
            tokens[-1] = vocab.load().eos
        logprobs = _logprobs(rng, length)
        choices.append(TextChoice(tokens, logprobs, *_top1(rng, tokens, logprobs), finish))
    return choices


def _corrected(v: vocab.Vocab, ids: list[int], prev: int | None, idx: int) -> str:
    """vLLM's `_correct_decoded_token(idx, ids)`: `prev` is the previous position's sampled id."""
    if idx > 0:
        text = v.decode(ids[idx - 1 : idx + 1])
        if not text.endswith(vocab.REPLACEMENT):
            return text
    if prev is not None:
        text = v.decode([prev, *ids[max(idx - 1, 0) : idx + 1]])
        if not text.endswith(vocab.REPLACEMENT):
            return text
    return ""


def vllm_strings(choice: TextChoice) -> tuple[list[str], list[str | None]]:
    """The `tokens` strings and the top-1 keys (None: the sampled token is the top-1)."""
    v = vocab.load()
    tokens, top = choice.tokens, choice.top_ids
    strings = v.alone[tokens]
    has_top = top >= 0
    keys = np.full(len(tokens), None, dtype=object)
    keys[has_top] = v.alone[top[has_top]]
    listed = np.where(has_top, top, tokens).tolist()  # the top-1 entry of [sampled, top-1]
    ids, tops = tokens.tolist(), has_top.tolist()
    for i in np.flatnonzero(v.ends_bad[tokens]).tolist():
        prev = ids[i - 1] if i else None
        if tops[i]:
            strings[i] = _corrected(v, [ids[i], listed[i]], prev, 0)
        else:  # one key: the top-1 entry's string, corrected as the 2nd of [t, t]
            strings[i] = _corrected(v, [ids[i], ids[i]], prev, 1)
    for i in np.flatnonzero(has_top & v.ends_bad[np.maximum(top, 0)]).tolist():
        keys[i] = _corrected(v, [ids[i], listed[i]], ids[i - 1] if i else None, 1)
    return strings.tolist(), keys.tolist()


def _offsets(strings: list[str]) -> np.ndarray:
    """`text_offset`: where each token string starts, in code points (vLLM adds up len())."""
    lengths = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
    return np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(strings) else lengths


def _logprobs_object(choice: TextChoice) -> dict[str, Any]:
    """The `logprobs` object as the server's dict (what `render` serializes)."""
    strings, keys = vllm_strings(choice)
    lps = choice.logprobs.astype(np.float64).tolist()
    tops: list[dict[str, float]] = [{s: lp} for s, lp in zip(strings, lps, strict=True)]
    top_lps = choice.top_logprobs.astype(np.float64).tolist()
    for i in np.flatnonzero(choice.top_ids >= 0).tolist():
        tops[i][keys[i]] = top_lps[i]  # a key equal to the sampled one keeps its place
    return {
        "text_offset": _offsets(strings).tolist(),
        "token_logprobs": lps,
        "tokens": strings,
        "top_logprobs": tops,
    }


_JSON_STRINGS: dict[str, bytes] = {}


def _json_string(text: str) -> bytes:
    found = _JSON_STRINGS.get(text)
    if found is None:
        found = _JSON_STRINGS[text] = json.dumps(text, ensure_ascii=False).encode()
    return found


def _json_logprobs(choice: TextChoice) -> bytes:
    """`json.dumps` of `_logprobs_object(choice)`, byte for byte, several times faster: the numbers
    as `synthetic` renders them (repr of the double), each distinct string dumped once."""
    strings, keys = vllm_strings(choice)
    size = len(strings)
    names = np.array([_json_string(t) for t in strings] or [b""], dtype=object)[:size]
    values = np.array(synthetic._floats(choice.logprobs) or [b""], dtype=object)[:size]
    entries = values.copy()
    rows = np.flatnonzero(choice.top_ids >= 0).tolist()
    for i, top in zip(rows, synthetic._floats(choice.top_logprobs[rows]), strict=True):
        if keys[i] == strings[i]:  # one key, the top-1 entry's value
            entries[i] = top
        else:
            entries[i] = entries[i] + b"," + _json_string(keys[i]) + b":" + top
    return synthetic._logprobs_json(_offsets(strings), values.tolist(), names, entries)


def _prompt_logprobs(prompt: Sequence[int], k: int) -> list[dict[int, Any] | None]:
    """vLLM's prompt_logprobs: null first, then {id: {logprob, rank, decoded_token}}."""
    v = vocab.load()
    rng = _rng(0, np.asarray(prompt, dtype=np.int64).tobytes(), k)
    entries: list[dict[int, Any] | None] = [None]
    for token in list(prompt)[1:]:
        top = np.sort(np.log(rng.uniform(0.001, 1.0, max(k, 1))).astype(np.float32))[::-1]
        rank = 1 if rng.random() < 0.3 else int(rng.integers(1, 2000))
        own = top[rank - 1] if rank <= k else np.float32(top[-1] - rng.uniform(0.1, 5.0))
        others = [t for t in rng.choice(v.size - v.num_special, k + 1, replace=False).tolist()]
        others = [t + v.num_special for t in others if t + v.num_special != token][:k]
        if rank <= k:
            others[rank - 1] = token
        ids = [token, *others]
        named = [v.alone[t] if 0 <= t < v.size else "" for t in ids]
        for idx, _t in enumerate(ids):
            if named[idx].endswith(vocab.REPLACEMENT):
                named[idx] = _corrected(v, ids, None, idx)
        ranked = [(float(own), rank), *((float(top[r]), r + 1) for r in range(k))]
        entries.append(
            {
                t: {"logprob": lp, "rank": r, "decoded_token": name}
                for t, (lp, r), name in zip(ids, ranked, named, strict=True)
            }
        )
    return entries


def render(doc: dict[str, Any], how: str) -> bytes:
    """`doc` as the server writes it: Starlette's JSONResponse or FastAPI's ORJSONResponse."""
    if how == "json":
        return json.dumps(
            doc, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
    if how == "orjson":
        import orjson

        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    raise LookupError(f"unknown rendering {how!r}; known: {', '.join(RENDERS)}")


def rerender(body: bytes, how: str) -> bytes:
    """A generated body as `how` renders it (`json` bodies are returned as they are)."""
    if how == "json":
        return body
    import orjson  # parses to the same document as json.loads, faster

    return render(orjson.loads(body), how)


def completion_body(
    choices: list[TextChoice],
    *,
    prompt_tokens: Sequence[int],
    render_as: str = "json",
    prompt_logprobs: int | None = None,
    model: str = "hotpath-fake",
) -> bytes:
    """One vLLM /v1/completions answer (logprobs=1, token ids) for these choices."""
    if render_as == "packed":
        body = completion_body(
            choices, prompt_tokens=prompt_tokens, prompt_logprobs=prompt_logprobs, model=model
        )
        return packed.packed_body(body, [packed.text_candidates(c) for c in choices])
    v = vocab.load()
    prompt = [int(t) for t in prompt_tokens]
    plp = None if prompt_logprobs is None else _prompt_logprobs(prompt, prompt_logprobs)
    digest = zlib.crc32(b"".join(c.tokens.tobytes() for c in choices) + repr(prompt).encode())
    docs, rendered = [], {}
    for index, choice in enumerate(choices):
        visible = choice.tokens[choice.tokens >= v.num_special]  # skip_special_tokens
        if render_as == "json":  # rendered apart (fast), put in place of a unique placeholder
            logprobs: Any = f"\x00hotpath-logprobs-{digest:08x}-{index}\x00"
            rendered[json.dumps(logprobs).encode()] = _json_logprobs(choice)
        else:
            logprobs = _logprobs_object(choice)
        docs.append(
            {
                "index": index,
                "text": b"".join(v.pieces[visible].tolist()).decode("utf-8", "replace"),
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
                "stop_reason": None,
                "token_ids": choice.tokens.tolist(),
                "prompt_logprobs": plp,
                "prompt_token_ids": prompt,
                "routed_experts": None,
                "weight_versions": None,
            }
        )
    completion = sum(len(c.tokens) for c in choices)
    doc = {
        "id": f"cmpl-{digest:08x}{len(choices):08x}",
        "object": "text_completion",
        "created": synthetic._CREATED,
        "model": model,
        "choices": docs,
        "service_tier": None,
        "system_fingerprint": "vllm-0.33.0-hotpath",
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    body = render(doc, render_as)
    if any(body.count(placeholder) != 1 for placeholder in rendered):  # text containing one
        for choice_doc, choice in zip(docs, choices, strict=True):
            choice_doc["logprobs"] = _logprobs_object(choice)
        return render(doc, render_as)
    for placeholder, raw in rendered.items():
        body = body.replace(placeholder, raw)
    return body


def answer(
    kind: str,
    how: str,
    prompt: Sequence[int],
    *,
    n: int,
    max_tokens: int,
    seed: int | None,
    prompt_logprobs: int | None = None,
) -> bytes:
    """The body the fake router answers for a request, for any of ROUTER_BODIES."""
    if kind in ("minimal", "vllm", "synthetic"):
        shape = "minimal" if kind == "minimal" else "vllm"
        choices = synthetic.generate(prompt, n=n, max_tokens=max_tokens, seed=seed)
        body = synthetic.completion_body(
            choices, kind=shape, prompt_tokens=prompt, prompt_logprobs=prompt_logprobs
        )
        if how == "packed":
            return packed.packed_body(body, [packed.synthetic_candidates(c) for c in choices])
        return rerender(body, how)
    text = generate(prompt, kind=kind, n=n, max_tokens=max_tokens, seed=seed)
    return completion_body(
        text, prompt_tokens=prompt, render_as=how, prompt_logprobs=prompt_logprobs
    )


def generated_tokens(
    kind: str, prompt: Sequence[int], *, n: int, max_tokens: int, seed: int | None
) -> list[np.ndarray]:
    """The token ids per choice that `answer(kind, ...)` carries (for exact verification)."""
    if kind in ("minimal", "vllm", "synthetic"):
        return [c.tokens for c in synthetic.generate(prompt, n=n, max_tokens=max_tokens, seed=seed)]
    return [c.tokens for c in generate(prompt, kind=kind, n=n, max_tokens=max_tokens, seed=seed)]


def prompt_for(kind: str, length: int, seed: int) -> list[int]:
    """A seeded prompt: BOS and the start of a passage of `kind` (the synthetic one for it)."""
    if kind in ("minimal", "vllm", "synthetic"):
        rng = np.random.default_rng(seed)
        return [128000, *rng.integers(0, 128000, max(length - 1, 0)).tolist()]
    rng = _rng(seed, b"prompt", kind.encode(), length)
    return [vocab.load().bos, *_draw(rng, kind, max(length - 1, 0)).tolist()]


@lru_cache(maxsize=32)
def body_for(
    tokens: int,
    *,
    kind: str = "mixed",
    render_as: str = "json",
    n: int = 1,
    prompt_len: int = 16,
    prompt_logprobs: int | None = None,
    seed: int = 0,
) -> bytes:
    """A cached body of `kind` and rendering with `tokens` tokens in choice 0 (any kind of
    ROUTER_BODIES; `synthetic` in `json` is `synthetic.body_for(kind="vllm")` byte for byte)."""
    reason = unavailable_reason(kind, render_as)
    if reason is not None:
        raise RuntimeError(reason)
    if kind in ("minimal", "vllm", "synthetic"):
        shape = "minimal" if kind == "minimal" else "vllm"
        base = synthetic.body_for(
            tokens, kind=shape, n=n, prompt_len=prompt_len, prompt_logprobs=prompt_logprobs,
            seed=seed,
        )  # fmt: skip
        if render_as != "packed":
            return rerender(base, render_as)
        prompt = prompt_for(kind, prompt_len, seed)
        return answer(
            kind, "packed", prompt, n=n, max_tokens=tokens, seed=seed,
            prompt_logprobs=prompt_logprobs,
        )  # fmt: skip
    prompt = prompt_for(kind, prompt_len, seed)
    return answer(
        kind, render_as, prompt, n=n, max_tokens=tokens, seed=seed, prompt_logprobs=prompt_logprobs
    )


if __name__ == "__main__":  # python -m impl.workloads.realtext [TOKENS]: size and render time
    import sys
    import time

    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 262144
    started = time.perf_counter()
    vocab.load()
    print(f"tokenizer loaded in {time.perf_counter() - started:.2f} s")
    for kind in KINDS:
        for how in RENDERS:
            if unavailable_reason(kind, how):
                print(f"{kind:>12} {how:<6} n/a: {unavailable_reason(kind, how)}")
                continue
            for attempt in ("first", "again"):
                synthetic.body_for.cache_clear()
                started = time.perf_counter()
                size = len(body_for.__wrapped__(tokens, kind=kind, render_as=how))
                took = time.perf_counter() - started
                print(f"{kind:>12} {how:<6} {size / 1e6:6.2f} MB  {attempt} {took:5.2f} s")
