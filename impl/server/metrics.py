"""Prometheus metrics of the server (`GET /metrics`), and the few hooks that feed them.

What is exported (prefix `hotpath_`; `prometheus-client`'s text format):

- `http_request_duration_seconds{route,method,status}`: one histogram per route template and
  status; its `_count` is the request count. A held poll's time includes the hold.
- `step_duration_seconds{step,implementation}`: where a result's time went, per sample:
  `upstream_wait` (the picked pool's POST, router queueing and generation included), `decode`,
  `encode`, `store` (completing the record), `serve` (a poll's answer from the finished record
  to the last byte handed to the client; `implementation` is the format: protobuf or json).
- store gauges (`store_records{state}`, `store_stored_bytes`, `store_outstanding`,
  `forwards_in_flight`) and counters (`store_*_total`: submitted, dedup hits, late duplicates,
  completed, failed, delivered, evictions; `backpressure_rejections_total{limit}`: the 429s,
  `limit` outstanding, bytes or share: a caller's share, `impl.server.callers`).
- per caller, labelled by the NAME the `--api-keys` file gives (`*`: every open-mode key, so
  the label set is the file's): `caller_requests_total{caller}` (requests with a valid key,
  each process its own), `caller_rejections_total{caller}` (its asamples answered 429, for
  any limit) and `caller_outstanding{caller}` (its samples pending).
- `store_unavailable_total{op}`: calls of this process that failed, or were refused at once,
  while the shared store was away (`impl.server.store.redis.health`), by store operation;
  `store_available` (1, or 0 while away or silent); `http_refused_total{reason}`: connections
  refused by the HTTP limits before the application (`impl.server.protocol`: header_bytes,
  header_count, header_timeout, body_timeout).
- `held_polls_total{kind,reason}`: why held polls answered (`impl.server.store.held`: kind future or
  session; reason at_once, woken, batch_deadline, hold_expired, released), counted by each
  process for its own polls (also on a shared store), the same counts as /healthz `held_polls`.
- `intake_admitted_total`, `intake_deferred_total` (asamples admitted, of which waited for a
  later loop turn: `impl.server.intake`) and `intake_waiting` (waiting now), each process its
  own, the same counts as /healthz `intake`.
- `upstream_failures_total{class}` (connect, read, http_5xx, http_status, decode, choices,
  decode_worker (a decode process died holding the sample),
  internal, shutdown) and `upstream_retries_total`.
- `event_loop_lag_seconds` (histogram of the lag monitor's samples), `gc_pause_seconds
  {generation}` (every collection), `build_info` (picks, versions), and prometheus-client's own
  process and Python collectors (CPU, RSS, fds, gc counts).

Why it is cheap. A prometheus-client `Histogram.observe` takes a lock twice and scans the
buckets, a noticeable share of a small request's CPU. The hot path instead calls a `Tally`
(tallies.py): a bisect into the bucket bounds and two additions on plain Python numbers (~0.3
µs, event-loop thread only); `sync()` (every second, and before each scrape) adds the tallies
into the real histograms. Per request that leaves two `perf_counter` calls, a wrapped `send`
that notes the status, a dict lookup and one tally; per sample, four more tallies. Store figures
cost nothing on the hot path: the store already counts them, and `sync()` copies them into
gauges and adds the counters' increments since the last sync.

Several processes. Every figure lives in a prometheus-client metric object (nothing is computed
only at scrape time in one process), so prometheus-client's multiprocess mode works unchanged:
with `PROMETHEUS_MULTIPROC_DIR` set before the server starts, each process writes its values to
files there and `/metrics`, answered by whichever process, aggregates every process's files
(counters and histograms summed; gauges summed over live processes). Per-process labels were
not chosen because behind one shared port a scrape reaches one process at random.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
from bisect import bisect_left
from collections.abc import Callable
from time import perf_counter
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from impl.server.callers import OPEN_LABEL
from impl.server.protocol import REASONS as HTTP_REFUSALS
from impl.server.store.held import KINDS, REASONS
from impl.server.tallies import Mirror, Tally

#: Seconds; from a try_again answered at once to a poll held 30 s and a 20 MB result.
REQUEST_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
#: Seconds; a step runs from microseconds (encode) to minutes (a queued generation).
STEP_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
PAUSE_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STEPS = ("upstream_wait", "decode", "encode", "store", "serve")
FAILURE_CLASSES = (
    "connect",
    "read",
    "http_5xx",
    "http_status",
    "decode",
    "choices",
    "decode_worker",
    "internal",
    "shutdown",
)
#: store.stats() counter -> exported counter name (without the `hotpath_` prefix)
STORE_COUNTERS = {
    "submitted": "store_submitted_total",
    "deduplicated": "store_dedup_hits_total",
    "late_duplicates": "store_late_duplicates_total",
    "completed": "store_completed_total",
    "failed": "store_failed_total",
    "delivered": "store_delivered_total",
    "evicted": "store_evictions_total",
}
#: Versions shown in build_info (the libraries behind the picks, and the server's stack).
VERSIONED = (
    "hotpath",
    "fastapi",
    "uvicorn",
    "prometheus-client",
    "orjson",
    "msgspec",
    "pysimdjson",
    "protobuf",
    "pyreqwest",
    "pyqwest",
    "aiohttp",
    "httpx",
)


def multiprocess_dir() -> str | None:
    """The multiprocess-mode directory prometheus-client uses, when one is set."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist.replace("-", "_")] = importlib.metadata.version(dist)
    return out


class Metrics:
    """The server's metric objects in one private registry (one per app, so tests can run
    several apps in one process), pre-bound to the picked implementations."""

    def __init__(
        self,
        picks: dict[str, str],
        *,
        baseline: bool = False,
        hot_paths: frozenset[str] = (),
        store: str = "memory",
    ) -> None:
        #: paths served before FastAPI's router (no scope["route"]), kept as route labels
        self.hot_paths = frozenset(hot_paths)
        disable_created_metrics()  # no `_created` series: half the scrape, never charted
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Histogram(
            "hotpath_http_request_duration_seconds",
            "Time from request start to the last response byte, per route template and status "
            "(_count: requests)",
            ("route", "method", "status"),
            buckets=REQUEST_BUCKETS,
            registry=reg,
        )
        self._request_tallies: dict[tuple[str, str, int], Tally] = {}
        self._tallies: list[Tally] = []
        steps = Histogram(
            "hotpath_step_duration_seconds",
            "Where each result's time went: upstream_wait, decode, encode, store, serve; "
            "labelled with the implementation that ran the step",
            ("step", "implementation"),
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        store_kind = "baseline" if baseline else store
        self.upstream_wait = self._tally(steps.labels("upstream_wait", picks["pool"]))
        self.decode = self._tally(steps.labels("decode", picks["decode"]))
        self.encode = self._tally(steps.labels("encode", picks["encode"]))
        self.store = self._tally(steps.labels("store", store_kind))
        self.serve = {fmt: self._tally(steps.labels("serve", fmt)) for fmt in ("protobuf", "json")}
        failures = Counter(
            "hotpath_upstream_failures",
            "Samples failed by the router side, by class (final failures only)",
            ("class",),
            registry=reg,
        )
        self._failures = {kind: failures.labels(kind) for kind in FAILURE_CLASSES}
        self.retries = Counter(
            "hotpath_upstream_retries",
            "Router requests retried once (connect-phase error or 5xx)",
            registry=reg,
        )
        rejections = Counter(
            "hotpath_backpressure_rejections",
            "asample answered 429 + Retry-After, by the limit that was reached",
            ("limit",),
            registry=reg,
        )
        self._rejections = {k: rejections.labels(k) for k in ("outstanding", "bytes", "share")}
        self._callers = {
            kind: Mirror(Counter(f"hotpath_caller_{kind}", text, ("caller",), registry=reg))
            for kind, text in (
                ("requests", "Requests with a valid API key, by caller NAME (* : open-mode keys)"),
                ("rejections", "asample answered 429 (any limit), by caller NAME"),
            )
        }
        self._caller_outstanding = Gauge(
            "hotpath_caller_outstanding",
            "Samples pending, by caller NAME (* : open-mode keys)",
            ("caller",),
            registry=reg,
            multiprocess_mode="livesum",
        )
        held = Counter(
            "hotpath_held_polls",
            "Held polls answered, by kind (future, session) and why (impl.server.store.held)",
            ("kind", "reason"),
            registry=reg,
        )
        self._held = Mirror(held, [(k, r) for k in KINDS for r in REASONS])
        self._unavailable = Mirror(
            Counter(
                "hotpath_store_unavailable",
                "Store calls that failed, or were refused at once, while the shared store was "
                "away, by operation",
                ("op",),
                registry=reg,
            )
        )
        self._refused = Mirror(
            Counter(
                "hotpath_http_refused",
                "Connections refused by the HTTP limits before the application, by reason",
                ("reason",),
                registry=reg,
            ),
            [(reason,) for reason in HTTP_REFUSALS],
        )
        self._available = Gauge(
            "hotpath_store_available",
            "1 while the store answers, 0 while a shared store is away or silent",
            registry=reg,
            multiprocess_mode="livemin",
        )
        self._intake = {
            key: Counter(f"hotpath_intake_{key}", text, registry=reg)
            for key, text in (
                ("admitted", "asample requests admitted by the intake (impl.server.intake)"),
                ("deferred", "asample requests that waited for a later event-loop turn"),
            )
        }
        self._intake_synced = dict.fromkeys(self._intake, 0)
        self._intake_waiting = Gauge(
            "hotpath_intake_waiting",
            "asample requests waiting for their event-loop turn now",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self._store_counters = {
            key: Counter("hotpath_" + name.removesuffix("_total"), f"store: {key}", registry=reg)
            for key, name in STORE_COUNTERS.items()
        }
        self._synced: dict[str, int] = dict.fromkeys(STORE_COUNTERS, 0)
        records = Gauge(
            "hotpath_store_records",
            "Records held by the store, by state (done/failed: finished, still retrievable)",
            ("state",),
            registry=reg,
            multiprocess_mode="livesum",
        )
        self._records = {s: records.labels(s) for s in ("pending", "done", "failed")}
        self._gauges = {
            name: Gauge("hotpath_" + name, text, registry=reg, multiprocess_mode="livesum")
            for name, text in (
                ("store_stored_bytes", "Result bytes the store holds (protobuf and cached JSON)"),
                ("store_outstanding", "Samples submitted and not finished (the 429 limit)"),
                ("forwards_in_flight", "Forwards to the router running now"),
                ("sessions", "Sampling sessions known"),
            )
        }
        self.loop_lag = self._tally(
            Histogram(
                "hotpath_event_loop_lag_seconds",
                "How late the lag monitor's timer fired (sampled every 0.25 s)",
                buckets=PAUSE_BUCKETS,
                registry=reg,
            )
        )
        pauses = Histogram(
            "hotpath_gc_pause_seconds",
            "Garbage-collector pauses, by generation",
            ("generation",),
            buckets=PAUSE_BUCKETS,
            registry=reg,
        )
        # observed directly: a collection can run in any thread (a Tally is loop-thread only)
        self._pauses = [pauses.labels(str(g)).observe for g in range(3)]
        info = {**{f"pick_{k}": v for k, v in picks.items()}, **_versions()}
        info["baseline"] = str(baseline).lower()
        Gauge(  # a gauge, not an Info: Info does not exist in multiprocess mode
            "hotpath_build_info",
            "Always 1; the labels are the picked implementations and library versions",
            tuple(info),
            registry=reg,
            multiprocess_mode="max",
        ).labels(**info).set(1)
        if multiprocess_dir() is None:
            from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

            for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
                with contextlib.suppress(ValueError):  # already registered in this registry
                    reg.register(collector)

    def _tally(self, child: Any) -> Callable[[float], None]:
        tally = Tally(child)
        self._tallies.append(tally)
        return tally.observe

    # -- hooks -----------------------------------------------------------------------------
    def upstream_failure(self, kind: str) -> None:
        self._failures.get(kind, self._failures["internal"]).inc()

    def rejected(self, reason: str) -> None:
        kind = "share" if "share" in reason else "bytes" if "bytes" in reason else "outstanding"
        self._rejections[kind].inc()

    def gc_pause(self, generation: int, seconds: float) -> None:
        self._pauses[generation](seconds)

    async def http(self, scope: Any, receive: Any, send: Any, app: Any) -> None:
        """Pure ASGI middleware: time `app` on this request and count it by route and status."""
        status = 500  # an exception before the response started is a 500 to the client
        started = perf_counter()

        async def noting_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, noting_send)
        finally:
            elapsed = perf_counter() - started
            route = scope.get("route")  # set by FastAPI's router; hot routes skip it
            path = scope["path"] if route is None else route.path
            key = (path, scope["method"], status)
            tally = self._request_tallies.get(key)
            if tally is None:
                tally = self._request_tally(scope, key)
            tally.counts[bisect_left(tally.bounds, elapsed)] += 1  # Tally.observe, inlined
            tally.total += elapsed

    def _request_tally(self, scope: Any, key: tuple[str, str, int]) -> Tally:
        """The tally of a (path, method, status) seen for the first time. Paths that are neither
        a route template nor a hot path share the label `unmatched` (and are not remembered,
        so a scan of random paths cannot grow the table)."""
        route, method, status = key
        if scope.get("route") is None and route not in self.hot_paths:
            route = "unmatched"
            key = (route, method, status)
            tally = self._request_tallies.get(key)
            if tally is not None:
                return tally
        tally = Tally(self.requests.labels(route, method, status))
        self._tallies.append(tally)
        self._request_tallies[key] = tally
        return tally

    # -- scrape ----------------------------------------------------------------------------
    def sync(self, state: Any) -> None:
        """Flush the tallies; copy the store's counts into gauges, add counter increments."""
        for tally in self._tallies:
            tally.flush()
        self._gauges["forwards_in_flight"].set(len(state.forwards.tasks))
        held = state.store.held_polls.counts  # this process's polls, on every store
        self._held.sync({(k, r): n for k, reasons in held.items() for r, n in reasons.items()})
        self._refused.sync({(reason,): n for reason, n in state.http_refused.items()})
        health = getattr(state.store, "health", None)  # this process's calls (a shared store)
        if health is not None:
            self._unavailable.sync({(op,): n for op, n in health.failed.items()})
        self._available.set(0 if state.store.unavailable() else 1)
        intake = state.intake.stats()  # this process's asamples
        for key, counter in self._intake.items():
            if intake[key] > self._intake_synced[key]:
                counter.inc(intake[key] - self._intake_synced[key])
            self._intake_synced[key] = intake[key]
        self._intake_waiting.set(intake["waiting"])
        callers = state.callers.tallies()  # this process's requests
        self._callers["requests"].sync({(k,): n for k, (n, _) in callers.items()})
        self._callers["rejections"].sync({(k,): n for k, (_, n) in callers.items()})
        if state.store.describe()["kind"] != "memory" and state.settings.worker_index != 0:
            return  # a shared store's figures count every process: worker 0 alone exports them
        stats = state.store.stats()
        for key, counter in self._store_counters.items():
            value = stats.get(key, 0)
            delta = value - self._synced[key]
            if delta > 0:
                counter.inc(delta)
            self._synced[key] = value
        failed = stats.get("failed_held", 0)
        pending = stats.get("pending", 0)
        self._records["pending"].set(pending)
        self._records["failed"].set(failed)
        if "records" in stats:  # the shared store does not count its records
            self._records["done"].set(stats["records"] - pending - failed)
        self._gauges["store_stored_bytes"].set(stats.get("stored_bytes", 0))
        self._gauges["store_outstanding"].set(pending)
        self._gauges["sessions"].set(state.sessions.stats().get("sampling_sessions", 0))
        self._sync_outstanding(state)

    def _sync_outstanding(self, state: Any) -> None:
        """Each caller's pending samples; the NAMEs removed from the file are set to 0."""
        owners = state.store.outstanding_by_owner()
        named = state.callers.named
        for name in state.callers.known:
            self._caller_outstanding.labels(name).set(owners.get(name, 0) if name in named else 0)
        if state.callers.open:
            anonymous = sum(n for owner, n in owners.items() if owner not in named)
            self._caller_outstanding.labels(OPEN_LABEL).set(anonymous)

    def close(self) -> None:
        """In multiprocess mode, drop this process's live gauges (it no longer serves)."""
        directory = multiprocess_dir()
        if directory is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), directory)

    def exposition(self, state: Any) -> tuple[bytes, str]:
        """The /metrics body and content type (every process's figures in multiprocess mode)."""
        self.sync(state)
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry), CONTENT_TYPE_LATEST
