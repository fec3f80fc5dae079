"""The server's settings: one typed object built from CLI flags and `HOTPATH_*` variables.

Every field is one flag (`--completed-ttl`) and one environment variable
(`HOTPATH_COMPLETED_TTL`); a flag wins over the variable, the variable over the default. No
instance exists at import: `hotpath serve` builds one with `from_args`, tests with `Settings(...)`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def _opt(default: Any, help: str, *, flag_type: type | None = None) -> Any:
    return field(default=default, metadata={"help": help, "type": flag_type})


@dataclass(frozen=True)
class Settings:
    """Everything `hotpath serve` can be told; see each field's help."""

    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on (0: a free port, printed in the ready line)")
    router_url: str = _opt(
        "http://127.0.0.1:8100",
        "base URL of the vLLM router (`hotpath router`'s default); samples go to "
        "{URL}/v1/completions",
    )
    baseline: bool = _opt(
        False,
        "run the baseline configuration (httpx pool, rich access log, reference decode, "
        "validated encode, JSON converted to proto on every poll under one lock, retrieved-TTL "
        "clock started when the response is built, per-request polling), the other side of "
        "--compare baseline",
    )
    decode: str | None = _opt(
        None, "decode implementation (see /healthz for the pick and why)", flag_type=str
    )
    encode: str | None = _opt(None, "encode implementation", flag_type=str)
    pool: str | None = _opt(None, "forwarding pool implementation", flag_type=str)
    accesslog: str | None = _opt(
        None, "access-log handler ('null' turns the access log off)", flag_type=str
    )
    runtime: str | None = _opt(
        None,
        "HTTP runtime that runs the app (uvicorn_httptools, uvicorn_h11, granian) or auto: "
        "among those that give every HTTP guarantee the settings ask for (`hotpath list "
        "runtime`; /healthz shows the pick, why, and what it lacks)",
        flag_type=str,
    )
    # -- off-loop decoding (impl.server.offloop) --
    offloop: str = _opt(
        "auto",
        "where bodies are decoded and encoded: inline (on the event loop), threads (for a "
        "decoder that releases the GIL), processes (decode processes, any decoder), "
        "fetch (fetch processes send the router request, read the body, decode and "
        "encode it: the body never enters the server's process), or auto (fetch: measured "
        "freest loop side by side); /healthz shows the choice and why",
    )
    offloop_count: int | None = _opt(
        None,
        "how many decode threads, decode processes or fetch processes the --offloop design "
        "runs (default: one per core this process may use)",
        flag_type=int,
    )
    offloop_min_bytes: int = _opt(
        1 << 20,
        "bodies smaller than this are decoded on the loop even with threads or processes: "
        "below it a decode blocks the loop briefly and costs less CPU in total "
        "than handing the body over (with fetch: requests whose expected body, from "
        "max_tokens, is smaller go through the loop's pool and decode on the loop)",
    )
    offloop_nice: int | None = _opt(
        None,
        "niceness added to decode processes and fetch processes (default: 10 for decode "
        "processes, so the server's event loop gets a core first when both want one; 0 for "
        "fetch processes, which also receive the bodies and would otherwise wait behind every "
        "other process)",
        flag_type=int,
    )
    offloop_pool: str = _opt(
        "auto",
        "the pool implementation of the fetch processes, which receive only long bodies: a "
        "registry name, or auto (aiohttp where it imports, else --pool's pick: on long bodies "
        "aiohttp costs the least server CPU per result and its fetch processes the least "
        "memory)",
    )
    max_body_bytes_in_flight: int = _opt(
        128 << 20,
        "upstream body bytes held at once: a body takes its Content-Length (or, without one, "
        "the size expected from max_tokens) when its answer's headers arrive, its own size once "
        "read, until its SampleResponse bytes exist. Answers that do not fit wait unread "
        "in their sockets (TCP flow control holds the router); requests are never held back: "
        "the requests at the router are bounded by --upstream-connections. One body larger "
        "than this is let through alone",
    )
    calibrate: bool = _opt(
        True, "allow a start-up calibration of a few seconds when nothing was measured here"
    )
    backlog: int = _opt(
        4096,
        "listen backlog = the most connections expected at once (net.core.somaxconn caps it)",
    )
    eager_accept: bool = _opt(
        True,
        "accept every connection waiting in the listen queue each time it is readable (as "
        "asyncio does), not one per event-loop turn as uvloop's libuv does: under load a turn "
        "is long, and a health check's fresh connection would wait behind a burst of new "
        "client connections; --no-eager-accept keeps libuv's behaviour",
    )
    intake_per_turn: int = _opt(
        16,
        "asample requests that proceed per event-loop turn; the rest wait for a later turn, "
        "so polls, fetches and completions are not queued behind a burst of submissions "
        "(impl/server/intake.py; 0: no bound, as with --baseline)",
    )
    keep_alive: float = _opt(75.0, "seconds an idle client connection is kept open")
    upstream_connections: int = _opt(1024, "most connections the pool opens to the router")
    upstream_logprobs: str = _opt(
        "json",
        "how completions ask the router for their candidates: json (vLLM's usual logprobs "
        "body), packed (vLLM's packed_top_logprobs: the candidates as base64 arrays, a smaller "
        "body to read and decode; a router that refuses it fails the sample) or auto (packed, "
        "and JSON from then on for a router that refuses it: each process remembers the "
        "router URL); the samples are the same either way",
    )
    connect_timeout: float = _opt(60.0, "seconds to get a connection to the router")
    read_timeout: float = _opt(2048.0, "seconds the router may stay silent while answering")
    poll_hold: float = _opt(
        30.0, "seconds retrieve_future holds a pending poll before answering try_again (< 45)"
    )
    # -- the Tinker SDK 0.38 session protocol ------------------------------------------------
    session_poll: bool = _opt(
        True,
        "advertise the session protocol in client/config (sample_use_retrieve_futures and "
        "sample_join_sampling_session): the SDK then waits on one retrieve_futures long-poll per "
        "sampling session and fetches each result once, instead of holding one retrieve_future "
        "poll (and one connection) per sample; --no-session-poll advertises per-request polling "
        "(the endpoints still answer)",
    )
    session_batch: int = _opt(
        32,
        "the most completions a filling batch collects before its retrieve_futures poll "
        "answers: a session's poll answers at once when completions are waiting and no batch "
        "is filling, and a batch fills only while completions arrive faster than polls carry "
        "them (Nagle's algorithm with a cork; docs/server.md)",
    )
    session_batch_wait: float = _opt(
        0.25,
        "the longest a filling batch waits: seconds after its oldest completion arrived (0: "
        "answer every completion at once)",
    )
    metadata_first_bytes: int = _opt(
        1 << 20,
        "a result of at least this many bytes is first announced with "
        '{"status": "complete_metadata", "response_payload_size": N} when the poll sets '
        "allow_metadata_only (the SDK then reserves its in-flight-bytes budget and fetches it); "
        "0: announce every result",
    )
    # ----------------------------------------------------------------------------------------
    completed_ttl: float = _opt(600.0, "seconds a completed result is kept while undelivered")
    retrieved_ttl: float = _opt(
        60.0, "seconds a result is kept after its response really reached the client"
    )
    dedup_ttl: float = _opt(
        600.0,
        "seconds a delivered sample's (sampling_session_id, seq_id) still answers a repeated "
        "asample with its request_id after eviction, instead of generating it again",
    )
    max_outstanding: int = _opt(131072, "pending samples beyond which asample answers 429")
    max_result_bytes: int = _opt(4 << 30, "stored result bytes beyond which asample answers 429")
    # -- who may sample (impl/server/callers.py, impl/server/keyfile.py) --------------------
    api_keys: str | None = _opt(
        None,
        "file of the callers who may sample, one 'NAME KEY' or 'NAME sha256:HEX' per line (# "
        "comments); read again on SIGHUP and when it changes. Without it any X-API-Key "
        "starting with 'tml-' is accepted, on loopback only (see --allow-any-key)",
        flag_type=str,
    )
    allow_any_key: bool = _opt(
        False,
        "without --api-keys, accept any X-API-Key starting with 'tml-' even when --host listens "
        "beyond loopback (each key is then a caller of its own)",
    )
    max_outstanding_per_key: int | None = _opt(
        None,
        "pending samples beyond which one caller's asample answers 429 while others still get "
        "in (default: half of --max-outstanding, all of it when --api-keys names one caller; "
        "no share without --api-keys)",
        flag_type=int,
    )
    retry_after: int = _opt(1, "seconds in the Retry-After header of a 429")
    sample_max_concurrent_requests: int = _opt(
        2000, "client/config's cap on each SDK client's in-flight samples"
    )
    # -- request limits (impl/server/limits.py): bad input gets a short 4xx ------------------
    max_id_length: int = _opt(
        256,
        "longest request_id, session_id, sampling_session_id, base_model or tag accepted (422); "
        "at least 64, so that every id the server hands out passes it",
    )
    max_body_bytes: int = _opt(
        64 << 10,
        "body cap of every route but asample (telemetry: 16 times it, retrieve_futures: 256 "
        "times), checked before the body is read (413)",
    )
    max_prompt_tokens: int = _opt(
        1 << 20,
        "most prompt tokens an asample may carry (422); asample's body cap is 12 bytes per "
        "token plus --max-body-bytes (413)",
    )
    max_tags: int = _opt(64, "most tags a create_session may carry (422)")
    # -- HTTP limits (impl/server/protocol.py): before a request reaches the app -------------
    max_header_bytes: int = _opt(
        32 << 10,
        "most bytes of a request's head (request line and headers; nginx's "
        "large_client_header_buffers 4 x 8k): over it, 431 and the connection closes",
    )
    max_headers: int = _opt(
        100, "most header fields in one request (Apache's LimitRequestFields): over it, 431"
    )
    header_timeout: float = _opt(
        10.0,
        "seconds a request's head may take to arrive, from its first byte (or from the "
        "connection's opening, for its first request): then 408 and the connection closes "
        "(slowloris)",
    )
    body_timeout: float = _opt(
        60.0,
        "seconds a request's body may take to arrive after its head (not counting time the "
        "server itself paused reading): then 408 and the connection closes",
    )
    # -- end of request limits ---------------------------------------------------------------
    shutdown_timeout: float = _opt(5.0, "seconds held polls get to finish on shutdown")
    drain_delay: float = _opt(
        0.0,
        "seconds the server keeps serving after SIGTERM, with /readyz answering 503, before it "
        "closes its listening socket: time for a load balancer (a Kubernetes endpoint) to stop "
        "sending it new requests",
    )
    log_level: str = _opt("info", "uvicorn and server log level")
    gc_threshold: str = _opt(
        "50000,20,20",
        "gc.set_threshold of the server process ('700,10,10' is CPython's default; --baseline "
        "keeps it); objects alive at start-up are also frozen out of every collection",
    )
    # -- metrics (GET /metrics) --
    metrics: bool = _opt(
        True,
        "export Prometheus metrics on GET /metrics (request latencies, per-step times, store, "
        "upstream failures, loop lag, GC pauses); --no-metrics turns them off. With several "
        "processes, set PROMETHEUS_MULTIPROC_DIR to an empty directory first: any process then "
        "answers with every process's figures",
    )
    # -- the shared store and several processes (impl/server/store/redis/store.py, workers.py) ----
    store: str = _opt(
        "auto",
        "where futures live: 'memory' (this process only), 'embedded' (a redis-server started "
        "and stopped with the server, on a unix socket in a temp dir), or a Redis/Valkey URL "
        "(redis://HOST:PORT/DB, rediss://…, unix://PATH); 'auto' = memory for one worker, "
        "embedded for --workers > 1",
    )
    workers: int = _opt(
        1, "server processes answering one port (SO_REUSEPORT), all on the shared store"
    )
    store_lease: float = _opt(
        15.0,
        "seconds a process's claim on a pending sample lasts without renewal; after that "
        "another process forwards it again (a killed process's samples are not lost; a "
        "process whose event loop stalls longer than this has its samples generated twice)",
    )
    store_prefix: str = _opt(
        "hotpath:", "prefix of every key in the shared store (two deployments on one engine)"
    )
    store_ack_replicas: int = _opt(
        0,
        "on a Redis/Valkey Cluster: a create and a finish answer only once this many replicas "
        "have them (WAIT); 0 answers at once, and a failover may lose the last writes, which "
        "each process then finds and writes again (docs/shared-store.md)",
    )
    store_timeout: float = _opt(
        1.0,
        "seconds the shared store may take to answer a health ping (every 0.2 s): past it the "
        "store counts as away, /readyz answers 503 and store calls answer 503 + Retry-After "
        "at once until it answers again",
    )
    worker_index: int = _opt(
        0,
        "this process's index among the processes on one store (--workers sets it; give "
        "processes started apart distinct values: only index 0 exports the shared store's "
        "counts on /metrics, which count every process)",
    )
    reuse_port: bool = _opt(
        False, "listen with SO_REUSEPORT (set for each process started by --workers)"
    )

    def __post_init__(self) -> None:
        positive = (
            "completed_ttl",
            "retrieved_ttl",
            "dedup_ttl",
            "keep_alive",
            "connect_timeout",
            "read_timeout",
            "backlog",
            "upstream_connections",
            "max_outstanding",
            "max_result_bytes",
            "sample_max_concurrent_requests",
            "session_batch",
            "max_body_bytes",
            "max_prompt_tokens",
            "max_tags",
            "workers",
            "store_lease",
            "max_body_bytes_in_flight",
            "max_header_bytes",
            "max_headers",
            "header_timeout",
            "body_timeout",
            "store_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        from impl.server.limits import MIN_ID_LENGTH

        if self.max_id_length < MIN_ID_LENGTH:
            raise ValueError(
                f"max_id_length must be >= {MIN_ID_LENGTH} (the ids this server hands out are up "
                f"to 61 characters long), got {self.max_id_length!r}"
            )
        if self.store_ack_replicas < 0:
            raise ValueError(f"store_ack_replicas must be >= 0, got {self.store_ack_replicas!r}")
        if self.offloop_nice is not None and not 0 <= self.offloop_nice <= 19:
            raise ValueError(f"offloop_nice must be 0..19, got {self.offloop_nice!r}")
        if self.offloop_count is not None and self.offloop_count < 1:
            raise ValueError(f"offloop_count must be >= 1, got {self.offloop_count!r}")
        from impl.server.offloop import DESIGNS
        from impl.server.upstream import LOGPROBS

        if self.upstream_logprobs not in LOGPROBS:
            raise ValueError(
                f"upstream_logprobs must be one of {', '.join(LOGPROBS)}, "
                f"got {self.upstream_logprobs!r}"
            )

        if self.offloop not in DESIGNS:
            raise ValueError(f"offloop must be one of {', '.join(DESIGNS)}, got {self.offloop!r}")
        nonnegative = (
            "poll_hold",
            "retry_after",
            "shutdown_timeout",
            "port",
            "session_batch_wait",
            "intake_per_turn",
            "metadata_first_bytes",
            "worker_index",
            "offloop_min_bytes",
            "drain_delay",
        )
        for name in nonnegative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        self.gc_thresholds()  # raises ValueError on a malformed value
        if not self.router_url.startswith(("http://", "https://")):
            raise ValueError(f"router_url must be an http(s) URL, got {self.router_url!r}")
        self._check_store()
        self._check_callers()

    def _check_callers(self) -> None:
        if self.max_outstanding_per_key is not None and self.max_outstanding_per_key <= 0:
            raise ValueError(
                f"max_outstanding_per_key must be > 0, got {self.max_outstanding_per_key!r}"
            )
        if self.api_keys is not None and self.allow_any_key:
            raise ValueError(
                "--allow-any-key accepts any key only without --api-keys: give one of them"
            )
        if self.api_keys is None and not self.allow_any_key and not loopback(self.host):
            raise ValueError(
                f"--host {self.host} listens beyond loopback and no --api-keys file says who may "
                "sample: give --api-keys FILE (or HOTPATH_API_KEYS), or --allow-any-key to "
                "accept any X-API-Key starting with 'tml-'"
            )

    def _check_store(self) -> None:
        kinds = ("auto", "memory", "embedded")
        if self.store not in kinds and not self.store.startswith(STORE_SCHEMES):
            raise ValueError(
                f"store must be memory, embedded, auto or a URL starting with "
                f"{', '.join(STORE_SCHEMES)}; got {self.store!r}"
            )
        if self.workers > 1 and self.store == "memory":
            raise ValueError(
                "--workers > 1 needs a shared store: the memory store lives in one process "
                "(leave --store unset for an embedded redis-server, or give a redis:// URL)"
            )
        if self.baseline and self.store_kind() != "memory":
            raise ValueError("--baseline runs on the memory store only")

    def session_poll_off(self) -> str | None:
        """Why client/config does not advertise the session protocol, or None when it does."""
        if not self.session_poll:
            return "--no-session-poll"
        if self.baseline:
            return "--baseline polls per request"
        return None

    def store_kind(self) -> str:
        """'memory', 'embedded' or 'url' after resolving 'auto'."""
        if self.store == "auto":
            return "memory" if self.workers == 1 else "embedded"
        return self.store if self.store in ("memory", "embedded") else "url"

    def gc_thresholds(self) -> tuple[int, int, int]:
        """`gc_threshold` as the three ints gc.set_threshold takes."""
        parts = self.gc_threshold.split(",")
        try:
            values = tuple(int(part) for part in parts)
        except ValueError:
            values = ()
        if len(values) != 3 or min(values) < 1:
            raise ValueError(
                f"gc_threshold must be three positive ints like 50000,20,20, got "
                f"{self.gc_threshold!r}"
            )
        return values

    @property
    def completions_url(self) -> str:
        return self.router_url.rstrip("/") + "/v1/completions"


def loopback(host: str) -> bool:
    """True when `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: URL schemes `--store` accepts (redis-py's).
STORE_SCHEMES = ("redis://", "rediss://", "unix://")


#: field -> its earlier name, still accepted as a flag (`--decode-workers`) and as a variable
#: (`HOTPATH_DECODE_WORKERS`); the new spelling wins when both are given.
OLD_NAMES = {"offloop_count": "decode_workers", "offloop_nice": "decode_worker_nice"}


def env_name(name: str) -> str:
    return "HOTPATH_" + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _kind(f: Any) -> type:
    return f.metadata.get("type") or type(f.default)


def _parse(kind: type, raw: str, source: str) -> Any:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{source}={raw!r} is not a boolean (use 1/0, true/false)")
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{source}={raw!r} is not a valid {kind.__name__}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field, each with its help, environment variable and default."""
    for f in fields(Settings):
        flags = [_flag(f.name)]
        default = "picked" if f.default is None else f.default
        help_text = f"{f.metadata['help']} [env {env_name(f.name)}; default: {default}]"
        if f.name in OLD_NAMES:
            old = OLD_NAMES[f.name]
            flags.append(_flag(old))
            help_text += f" (its earlier name {_flag(old)} / {env_name(old)} still works)"
        help_text = help_text.replace("%", "%%")
        if _kind(f) is bool:
            parser.add_argument(
                *flags,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(*flags, dest=f.name, type=_kind(f), default=None, help=help_text)


def from_args(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from flags (when given), else `HOTPATH_*` variables, else the defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in fields(Settings):
        given = getattr(args, f.name, None) if args is not None else None
        variables = [env_name(f.name)]
        if f.name in OLD_NAMES:
            variables.append(env_name(OLD_NAMES[f.name]))
        variable = next((v for v in variables if v in environ), None)
        if given is not None:
            values[f.name] = given
        elif variable is not None:
            values[f.name] = _parse(_kind(f), environ[variable], variable)
        elif f.default is MISSING:  # pragma: no cover - every field has a default
            raise ValueError(f"{f.name} is required")
    return Settings(**values)
