"""Named load scenarios: the production runs of docs/scenarios.md scaled to 2 cores, 20,000 fds.

A `Scenario` says what the client sends (requests, prompt and output lengths, concurrency, the
cap on outstanding samples) and how the fake router behaves (mode, body, workers). `hotpath
loadtest --preset NAME` starts from one and every flag overrides a field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One load run: the client's side and the fake router's side."""

    num_requests: int = 2048
    prompt_tokens: int = 16
    max_tokens: int = 16
    num_samples: int = 1
    #: concurrent asample dispatches (the SDK's 400)
    concurrency: int = 400
    #: samples submitted and not yet retrieved (the SDK's sample_max_concurrent_requests)
    max_outstanding: int = 2048
    #: client processes, each bound to its own 127.0.0.x source address
    client_processes: int = 2
    #: distinct (prompt, seed) pairs cycled over the requests (the router caches each body)
    distinct_prompts: int = 64
    #: the whole run stops after this many seconds; unfinished samples are reported
    timeout: float = 600.0
    #: client timeout of one retrieve_future poll (the SDK's 45 s)
    poll_timeout: float = 45.0
    #: seconds between /healthz probes (each on a fresh connection) and RSS samples
    healthz_interval: float = 0.5
    router_mode: str = "instant"
    #: the router's --body: minimal, or a logprobs=1 kind (docs/vllm-body.md)
    router_body: str = "minimal"
    #: the router's --render: json (as vLLM answers), orjson, or packed (vLLM's packed
    #: logprobs, to a server run with --upstream-logprobs packed or auto)
    router_render: str = "json"
    router_workers: int = 1
    gen_seconds: float = 0.0
    max_num_seqs: int = 0
    #: delay mode: seconds before the router answers
    delay: float = 0.0
    #: router fault injection, e.g. "500:0.01,reset:0.01" (empty: none)
    router_fail: str = ""
    #: how samples wait: "auto" (client/config decides, as the SDK), "session" (one
    #: retrieve_futures poller per client process) or "request" (one held poll per sample)
    poll: str = "auto"
    #: niceness of the client processes (0: the server's priority). On one 2-core
    #: machine they compete with the server they measure (in production they run elsewhere):
    #: under queue-131072-all the server's event loop waits for a CPU most of the time and
    #: /healthz takes seconds (docs/measurements.md). The fake router keeps its priority: it stands
    #: in for the engine, and niced it fell behind accepting the server's 8192 upstream connections
    #: (resets)
    load_nice: int = 0
    #: extra `hotpath serve` flags
    server_args: tuple[str, ...] = field(default_factory=tuple)

    def with_overrides(self, **changes: Any) -> Scenario:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["server_args"] = list(self.server_args)
        return data

    def router_args(self) -> list[str]:
        """`hotpath router` flags for this scenario (host and port are the caller's)."""
        args = ["--mode", self.router_mode, "--body", self.router_body]
        if self.router_render != "json":
            args += ["--render", self.router_render]
        if self.router_workers > 1:
            args += ["--workers", str(self.router_workers)]
        if self.router_mode == "delay":
            args += ["--delay", str(self.delay)]
        if self.router_mode == "latency":
            args += ["--gen-seconds", str(self.gen_seconds)]
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.router_fail:
            args += ["--fail", self.router_fail]
        return args


#: the queue-* runs: a latency engine of 2048 slots generating 5 s each, far more samples
#: submitted than it generates at once, 8192 upstream connections
_QUEUE = Scenario(
    num_requests=32768,
    max_outstanding=8192,
    router_mode="latency",
    gen_seconds=5.0,
    max_num_seqs=2048,
    timeout=900.0,
    load_nice=10,
    server_args=("--upstream-connections", "8192"),
)
_QUEUE_131072 = replace(_QUEUE, num_requests=131072, client_processes=4, timeout=3600.0)

#: name -> (scenario, one line saying what it reproduces)
PRESETS: dict[str, tuple[Scenario, str]] = {
    "small-2048": (
        Scenario(num_requests=2048, max_tokens=16, timeout=300.0),
        "2048 small results, instant router (the production burst of docs/scenarios.md)",
    ),
    "long-512x32k": (
        Scenario(
            num_requests=512,
            max_tokens=32768,
            max_outstanding=512,
            distinct_prompts=8,
            timeout=900.0,
        ),
        "512 results of 32k tokens, minimal bodies",
    ),
    "long-512x262k": (
        Scenario(
            num_requests=512,
            max_tokens=262144,
            max_outstanding=128,
            distinct_prompts=4,
            router_body="mixed",
            router_workers=2,
            concurrency=128,
            timeout=1800.0,
        ),
        "512 results of 262k tokens, logprobs=1 vLLM bodies of real mixed text",
    ),
    "probe-128x262k": (
        Scenario(
            num_requests=128,
            max_tokens=262144,
            max_outstanding=64,
            concurrency=64,
            client_processes=1,
            distinct_prompts=4,
            router_mode="delay",
            delay=0.2,
            router_body="mixed",
            router_workers=2,
            healthz_interval=0.05,
            timeout=900.0,
        ),
        "128 x 262k-token vLLM bodies of real mixed text answered after 0.2 s, 64 at a "
        "time, /healthz on a fresh connection every 50 ms (a load balancer's probe)",
    ),
    "long-queue-8192x212k": (
        Scenario(
            num_requests=8192,
            max_tokens=212000,
            max_outstanding=2048,
            distinct_prompts=4,
            router_mode="latency",
            gen_seconds=5.0,
            max_num_seqs=256,
            router_body="mixed",
            router_workers=2,
            timeout=3600.0,
            load_nice=10,
            # scaled like the slots: each connection holds one answer waiting to be read, and
            # on loopback its socket buffers (both ends) are the kernel's TCP memory: 1024 of
            # them exceed net.ipv4.tcp_mem here and the reads crawl (docs/offloop.md)
            server_args=("--upstream-connections", "256"),
        ),
        "the headline run: 8192 results of 212k tokens of real mixed text from an "
        "engine of 256 slots generating 5 s each and 256 upstream connections (production's 2048 "
        "on 16 vCPU, scaled to 2 cores), SDK-like re-polls, retrieved TTL 60 s, 2048 outstanding",
    ),
    "queue-32768": (
        _QUEUE,
        "32768 small results, 5 s generation, 2048 generating at once, the rest queued",
    ),
    "queue-131072": (
        _QUEUE_131072,
        "131072 small results, 5 s generation, 45 s re-polls; outstanding capped for 20k fds",
    ),
    "queue-131072-all": (
        replace(_QUEUE_131072, max_outstanding=131072, poll="session"),
        "queue-131072 with every sample outstanding at once: session polling, the server "
        "queues forwards behind its 8192 upstream connections",
    ),
}


def get(name: str) -> Scenario:
    """The scenario of preset `name`; LookupError naming the known ones otherwise."""
    try:
        return PRESETS[name][0]
    except KeyError:
        raise LookupError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
