"""Watch a server while the load runs: HTTP probes on fresh connections and the `ServerWatch`.

`ServerWatch` is a thread that samples the server's RSS (its embedded store's apart), open fds and
CPU time through psutil and the latency of `GET /healthz` on a fresh connection each time (as a
load balancer's health check would see it), and scrapes `GET /metrics` every few seconds (the
per-step split of each result's time over the measured window, `impl.harness.steps`). `probe`,
`get_json` and `fetch_json` are the one-shot GETs the harness uses for /healthz and the router's
/stats.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

import psutil

#: process names of an embedded store: its RSS is reported apart from the server's
STORE_PROCESSES = ("redis-server", "valkey-server")


def get_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET `url` on a fresh connection: (status, parsed JSON or None)."""
    status, body, _ = probe(url, timeout)
    return status, body


def probe(url: str, timeout: float = 10.0) -> tuple[int, Any, float]:
    """GET `url` on a fresh connection: (status, parsed JSON or None, seconds to connect).

    A failure after the connection was made carries the connect time as `.connected` on the
    exception (a probe that connects at once and then waits for its answer is a server that
    took the connection but did not serve it, not a full listen queue)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    started = time.perf_counter()
    connected = None
    try:
        conn.connect()
        connected = time.perf_counter() - started
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        exc.connected = connected
        raise
    finally:
        conn.close()
    try:
        return response.status, json.loads(body), connected
    except ValueError:
        return response.status, None, connected


#: The warm-up's results a server still stores when the warm-up ends are waited out (`settle`)
#: from this many bytes on: a server keeps a fetched result for its retrieved TTL (60 s by
#: default), and 256 warm-up results of 212k tokens (435 MB) held through a 192-sample run were
#: counted in that run's peak RSS. Small results (a few MB all told) are not worth the wait.
SETTLE_BYTES = 16 << 20


def settle(url: str, limit: float, *, interval: float = 0.5) -> dict[str, Any]:
    """Wait (at most `limit` seconds) until the server at `url` stores less than SETTLE_BYTES
    of results (/healthz `store.stored_bytes`, which both stores report), so the measured window
    starts without the warm-up's retained results. Returns what it saw: stored bytes before
    and after, and the seconds it waited (0 when below the bound at once)."""

    def stored() -> int | None:
        body = fetch_json(url + "/healthz")
        value = (body.get("store") or {}).get("stored_bytes") if isinstance(body, dict) else None
        return value if isinstance(value, int) else None

    started = time.monotonic()
    before = now = stored()
    if before is not None and before >= SETTLE_BYTES and limit > 0:
        print(
            f"waiting up to {limit:.0f} s for the server to release the warm-up's "
            f"{before / 1e6:,.0f} MB of results (kept for its retrieved TTL), so the run's "
            "peak RSS is its own (--settle-seconds 0: do not wait)",
            file=sys.stderr,
            flush=True,
        )
        while now is not None and now >= SETTLE_BYTES and time.monotonic() - started < limit:
            time.sleep(interval)
            now = stored()
    return {
        "stored_bytes_before": before,
        "stored_bytes_after": now,
        "seconds": round(time.monotonic() - started, 2),
    }


def scrape_steps(url: str, timeout: float = 10.0) -> Any:
    """The per-step totals of a server's GET /metrics, or None (metrics off, or no answer)."""
    from impl.harness import steps

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as response:
            return steps.parse(response.read().decode())
    except (OSError, ValueError, ImportError):
        return None


class ServerWatch(threading.Thread):
    """Samples a server's RSS, fds, CPU time and /healthz latency every `interval` seconds, and
    its /metrics every `metrics_every` samples."""

    def __init__(
        self,
        pid: int | None,
        url: str | None,
        interval: float = 0.5,
        router_pid: int | None = None,
        metrics_every: int = 4,
    ) -> None:
        super().__init__(daemon=True, name="hotpath-watch")
        self.pid, self.url, self.interval = pid, url, interval
        self.metrics_every = metrics_every
        self._router = None
        if router_pid:
            with contextlib.suppress(psutil.Error):
                self._router = psutil.Process(router_pid)
        self.cpu_end = None
        self.healthz: Any = None
        self._halt = threading.Event()
        self._proc = None
        if pid:
            with contextlib.suppress(psutil.Error):
                self._proc = psutil.Process(pid)
        self.restart()

    def _cpu(self, root: psutil.Process | None = ...) -> float | None:
        root = self._proc if root is ... else root
        if root is None:
            return None
        total = 0.0
        with contextlib.suppress(psutil.Error):
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    total += times.user + times.system
        return total

    def restart(self) -> None:
        """Start the measured window now (after warm-up): CPU from here, peaks from here."""
        self.cpu_start = self._cpu()
        self.router_cpu_start = self._cpu(self._router)
        self.peak_rss = self.peak_fds = self.peak_store_rss = 0
        self.healthz_latencies: list[float] = []
        #: per probe: seconds into the window, /healthz latency, of which TCP connect (None:
        #: the connection was never made; set on a failed probe that did connect), then
        #: from the server's answer its worst recent event-loop lag and its worst
        #: recent GC pause (ms)
        self.healthz_timeline: list[tuple[float, float, float | None, Any, Any]] = []
        self.healthz_failures = 0
        self._window_start = time.monotonic()
        #: per-step totals from /metrics at the window's start, and per scrape since:
        #: (seconds into the window, {step: [count, seconds]} since the start)
        self.steps_start = scrape_steps(self.url) if self.url else None
        self.steps_last = self.steps_start
        self.steps_timeline: list[tuple[float, dict[str, list[float]]]] = []

    def _sample_process(self) -> None:
        if self._proc is None:
            return
        rss = fds = store = 0
        with contextlib.suppress(psutil.Error):
            for proc in [self._proc, *self._proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    if proc.name() in STORE_PROCESSES:  # the embedded store, counted apart
                        store += proc.memory_info().rss
                        continue
                    rss += proc.memory_info().rss
                    fds += proc.num_fds()
        self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
        self.peak_store_rss = max(self.peak_store_rss, store)

    def _sample_healthz(self) -> None:
        if not self.url:
            return
        started = time.perf_counter()
        connected = None
        try:
            status, body, connected = probe(self.url + "/healthz", timeout=10.0)
        except (OSError, http.client.HTTPException) as exc:
            status, body, connected = 0, None, getattr(exc, "connected", None)
        latency = time.perf_counter() - started
        self.healthz_latencies.append(latency)
        lag = pause = None
        if status == 200 and isinstance(body, dict):
            lag = (body.get("event_loop_lag_ms") or {}).get("max_recent")
            pause = (body.get("gc") or {}).get("max_recent_ms")
        offset = round(time.monotonic() - self._window_start, 3)
        connected = None if connected is None else round(connected, 4)
        self.healthz_timeline.append((offset, round(latency, 4), connected, lag, pause))
        if status == 200:
            self.healthz = body
        else:
            self.healthz_failures += 1

    def _sample_metrics(self) -> None:
        from impl.harness import steps

        if not self.url or self.steps_start is None:
            return  # the server exports no metrics (--no-metrics): nothing to follow
        totals = scrape_steps(self.url)
        if totals is None:
            return
        self.steps_last = totals
        by_step: dict[str, list[float]] = {}
        for row in steps.split(self.steps_start, totals):
            entry = by_step.setdefault(row["step"], [0, 0.0])
            entry[0] += row["count"]
            entry[1] = round(entry[1] + row["seconds"], 6)
        offset = round(time.monotonic() - self._window_start, 3)
        self.steps_timeline.append((offset, by_step))

    def run(self) -> None:
        beat = 0
        while not self._halt.is_set():
            began = time.monotonic()
            self._sample_process()
            self._sample_healthz()
            beat += 1
            if beat % self.metrics_every == 0:
                self._sample_metrics()
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def finish(self) -> dict[str, Any]:
        """Stop sampling; the figures for the report."""
        self._halt.set()
        if self.is_alive():
            self.join(15)
        self._sample_process()
        self._sample_healthz()  # every window has at least one, however short the run
        self._sample_metrics()
        self.cpu_end = self._cpu()
        cpu = router_cpu = None
        if self.cpu_start is not None and self.cpu_end is not None:
            cpu = round(self.cpu_end - self.cpu_start, 2)
        router_end = self._cpu(self._router)
        if self.router_cpu_start is not None and router_end is not None:
            router_cpu = round(router_end - self.router_cpu_start, 2)
        cores = None
        with contextlib.suppress(psutil.Error, AttributeError, TypeError):
            cores = len(self._proc.cpu_affinity())
        return {
            "peak_rss_bytes": self.peak_rss or None,
            "store_peak_rss_bytes": self.peak_store_rss or None,
            "cores": cores,
            "peak_fds": self.peak_fds or None,
            "cpu_seconds": cpu,
            "router_cpu_seconds": router_cpu,
            "healthz_failures": self.healthz_failures,
        }

    def step_split(self) -> list[dict[str, Any]]:
        """Per step and implementation over the window (empty without metrics)."""
        from impl.harness import steps

        return steps.split(self.steps_start, self.steps_last)


def fetch_json(url: str, timeout: float = 10.0) -> Any:
    """GET a JSON document or None (the router's /stats, the server's /healthz)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None
