"""What a load-client process is given and what it reads: the contract between the harness parts.

`ClientConfig` is one client process's share of a run (picklable: it crosses into a spawned
process; `impl.harness.drive` makes them); `prompt_for` is the prompt and seed of each request
index, the same for the HTTP client process (`impl.harness.client.sdk_shaped`) and the SDK one
(`impl.harness.client.real_sdk`) so `verify="exact"` can regenerate the router's tokens;
`parse_sample_response` reads the SampleResponse wire bytes; `Failure` is a sample that did not
complete, with its class in the report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from impl.encode._common import read_fields


@dataclass(frozen=True)
class ClientConfig:
    """What one client process does (picklable: it crosses into a spawned process)."""

    url: str
    indices: tuple[int, int, int]  # range(start, stop, step) of request indices
    prompt_tokens: int = 16
    max_tokens: int = 16
    num_samples: int = 1
    concurrency: int = 400
    max_outstanding: int = 2048
    distinct_prompts: int = 64
    seed: int = 0
    poll_timeout: float = 45.0
    tries: int = 16
    backoff_base: float = 0.25
    backoff_cap: float = 30.0
    timeout: float = 600.0  # seconds after the start signal when the client process stops
    source_address: str | None = None
    verify: str = "count"  # "count" | "exact"
    #: the router's --body, so that "exact" regenerates the tokens it served
    router_body: str = "minimal"
    #: unmeasured samples per distinct prompt before the run (0: no warm-up)
    warmup: int = 1
    #: "auto" (what client/config says, as the SDK), "session" or "request"
    poll: str = "auto"
    api_key: str = "tml-hotpath-loadtest"
    base_model: str = "hotpath-fake"
    #: niceness the client process gives itself (the harness's load yields to the server)
    nice: int = 0


#: The class of a sample that met the server's 503 "shared store unavailable" until its tries
#: ran out; the retries that met it are counted under the same name (not as a status code).
STORE_UNAVAILABLE = "store_unavailable"


def store_unavailable(status: int | None, body: bytes | str) -> bool:
    """True for the server's 503 while its shared store is away (`{"detail": "the shared store
    at ... is unavailable ...; retry later"}`), which the client retries like the SDK."""
    if status != 503:
        return False
    text = body[:400] if isinstance(body, str) else body[:400].decode(errors="replace")
    return "shared store" in text


class Failure(Exception):
    """A sample that did not complete; `kind` is its class in the report."""

    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def prompt_for(index: int, config: ClientConfig) -> tuple[list[int], int]:
    """The prompt tokens and sampling seed of request `index` (cycling distinct prompts)."""
    p = index % max(config.distinct_prompts, 1)
    base = config.seed * 1_000_003 + p * 7919
    tokens = [128000] + [(base + j * 104729) % 127000 + 1 for j in range(config.prompt_tokens - 1)]
    return tokens[: config.prompt_tokens], config.seed + p


def parse_sample_response(data: bytes) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
    """SampleResponse wire bytes -> [(stop_reason, int32 tokens, float32 logprobs | None)]."""
    sequences = []
    for message in read_fields(memoryview(data)).get(1, []):
        if isinstance(message, int):
            raise ValueError("field 1 (a sequence) is a varint, not a message")
        fields = read_fields(message)
        stop = fields.get(1, [0])[-1]
        tokens = fields.get(2, [b""])[-1]
        logprobs = fields.get(3, [None])[-1]
        if isinstance(tokens, int) or isinstance(logprobs, int):
            raise ValueError("a tokens or logprobs field is a varint, not bytes")
        if len(tokens) % 4 or (logprobs is not None and len(logprobs) % 4):
            raise ValueError("a tokens or logprobs field is not a whole number of 4-byte items")
        lp = None if logprobs is None else np.frombuffer(logprobs, dtype="<f4")
        sequences.append((stop, np.frombuffer(tokens, dtype="<i4"), lp))
    return sequences
