"""`hotpath bench` section for the access-log family: what each handler costs the event loop.

Two measurements per handler:
1. per record, on the calling thread (the thread CPU time of `handler.handle(record)` and of
   uvicorn's whole `access_logger.info(...)` call, writing to os.devnull); for `queue` that is
   the enqueue only, and the listener thread's CPU per record is reported beside it;
2. a real uvicorn (uvloop, httptools) serving a trivial route in a subprocess, driven with
   sequential keep-alive requests from this process: the server's CPU per request, its main
   (event-loop) thread's CPU per request, and whether the log file got every line. One server
   per handler, all started side by side and kept up for the run; each repeat drives every
   server in turn (round robin) and reads only that server's CPU across its own batch.

Lengths (`LENGTHS`): records per caller round, requests per server batch, batches; quick runs
one batch, default three of 5000 requests, full three of 10000.

    python -m impl.bench.accesslog serve NAME LOGFILE [OPTION=NUMBER ...]  # prints its port
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from impl import registry
from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE, access_record, parse_line
from impl.bench._common import Section
from impl.measure import render_table

REQUEST = b"GET /v1/ping?x=1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
RESPONSE_END = b"\r\n\r\nok"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The trivial route: 200 "ok" for any path."""
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(name: str, log_path: str, **options: Any) -> None:
    """Run uvicorn on a loopback port 0 with `name` as access handler; print the port first."""
    import uvicorn

    from impl.accesslog import uvicorn_log_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    stream = open(log_path, "a")  # noqa: SIM115 - lives as long as the process
    config = uvicorn.Config(
        _app,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_config=uvicorn_log_config(name, stream=stream, **options),
    )
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def start_server(
    name: str, log_path: str | os.PathLike[str], **options: float
) -> tuple[subprocess.Popen, int]:
    """The server subprocess and its port (the caller stops it with `stop_server`)."""
    return _ready(_spawn(name, log_path, **options))


def _spawn(name: str, log_path: str | os.PathLike[str], **options: float) -> subprocess.Popen:
    extra = [f"{key}={value}" for key, value in options.items()]
    return subprocess.Popen(
        [sys.executable, "-m", "impl.bench.accesslog", "serve", name, os.fspath(log_path), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )


def _ready(proc: subprocess.Popen) -> tuple[subprocess.Popen, int]:
    """Wait for a spawned server's port line, then until it accepts."""
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line.strip():
        proc.kill()
        raise RuntimeError(f"server did not start: {proc.communicate()[1].decode()[-2000:]}")
    port = int(line)
    for _ in range(500):  # wait until it accepts
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.01)
    stop_server(proc)
    raise RuntimeError("server never accepted a connection")


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> tuple[int, str]:
    """SIGTERM (uvicorn's graceful shutdown), wait; kill if stuck. Returns (returncode, stderr)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err.decode(errors="replace")


def drive(port: int, n: int, request: bytes = REQUEST, depth: int = 1) -> int:
    """`n` requests on one keep-alive connection, `depth` in flight; returns the local port."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sent = done = 0
        buffer = b""
        while done < n:
            batch = min(depth, n - sent)
            sock.sendall(request * batch)
            sent += batch
            while done < sent:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError(f"server closed after {done} responses")
                buffer += chunk
                complete = buffer.count(RESPONSE_END)
                if complete:
                    done += complete
                    buffer = buffer[buffer.rindex(RESPONSE_END) + len(RESPONSE_END) :]
        return sock.getsockname()[1]


def cpu_ns(pid: int) -> tuple[int, int]:
    """(main thread, whole process) CPU time in ns, from /proc/PID/task/*/schedstat."""
    main = total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:  # a thread that just ended
            continue
        total += ns
        if int(task) == pid:
            main = ns
    return main, total


def caller_cost(
    name: str, *, rounds: int = 5, number: int | None = None, info: bool = True
) -> dict[str, float]:
    """Thread CPU µs per record on the caller (`handle`, and uvicorn's `info` call)."""
    import logging

    number = number or (300 if name == "rich" else 20_000)
    record = access_record("127.0.0.1:50123", "GET", "/api/v1/retrieve_future", "1.1", 200)
    args = record.args
    with open(os.devnull, "w") as devnull:
        handler = registry.create("accesslog", name, stream=devnull)
        logger = logging.Logger(ACCESS_LOGGER)
        logger.addHandler(handler)
        handle_us, info_us = [], []
        try:
            listener = getattr(handler, "_thread", None)
            clock = time.pthread_getcpuclockid(listener.ident) if listener else None
            listener_before = time.clock_gettime(clock) if clock is not None else 0.0
            for _ in range(rounds):
                start = time.thread_time()
                for _ in range(number):
                    handler.handle(record)
                middle = time.thread_time()
                for _ in range(number if info else 0):
                    logger.info(ACCESS_MESSAGE, *args)  # type: ignore[misc]
                end = time.thread_time()
                handle_us.append((middle - start) / number * 1e6)
                info_us.append((end - middle) / number * 1e6)
            handler.flush()
            listener_us = 0.0
            if clock is not None:
                records = (2 if info else 1) * rounds * number
                listener_us = (time.clock_gettime(clock) - listener_before) / records
                listener_us *= 1e6
        finally:
            handler.close()
    return {
        "handle_us": statistics.median(handle_us),
        "info_us": statistics.median(info_us),
        "listener_us": listener_us,
    }


def server_cost(name: str, n: int, warmup: int = 300) -> dict[str, Any]:
    """Server CPU µs per request (process, main thread) and whether every line was logged."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "access.log"
        proc, port = start_server(name, log_path)
        try:
            drive(port, warmup)
            main0, total0 = cpu_ns(proc.pid)
            local_port = drive(port, n)
            main1, total1 = cpu_ns(proc.pid)
        finally:
            stop_server(proc)
        lines = [parse_line(line) for line in log_path.read_text().splitlines() if line.strip()]
    expected = 0 if name == "null" else warmup + n
    ours = [f for f in lines if f and f.client == f"127.0.0.1:{local_port}"]
    complete = len(lines) == expected and (name == "null" or len(ours) == n)
    return {
        "total_us": (total1 - total0) / n / 1e3,
        "loop_us": (main1 - main0) / n / 1e3,
        "lines": len(lines),
        "expected_lines": expected,
        "complete": complete,
    }


def server_costs(
    names: list[str], counts: dict[str, int], repeats: int, warmup: int = 300
) -> dict[str, list[dict[str, Any]]]:
    """`server_cost` for every handler with one server each, started once, driven round-robin.

    The servers start together and stay up; each repeat drives every one in turn (so load drift
    hits every handler) and reads only that server's CPU across its own batch.
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        servers: dict[str, tuple[subprocess.Popen, int]] = {}
        try:
            spawned = {name: _spawn(name, Path(tmp) / f"{name}.log") for name in names}
            for name, proc in spawned.items():  # they start side by side
                try:
                    servers[name] = _ready(proc)
                except BaseException:
                    for other in spawned.values():
                        if all(other is not p for p, _port in servers.values()):
                            with contextlib.suppress(Exception):  # may be stopped already
                                stop_server(other)
                    raise
            ports: dict[str, set[int]] = {name: set() for name in names}
            for _proc, port in servers.values():
                drive(port, warmup)
            for repeat in range(repeats):
                for name, (proc, port) in servers.items():
                    n = counts[name]
                    print(f"  uvicorn with {name}: {n} requests ({repeat + 1})", file=sys.stderr)
                    main0, total0 = cpu_ns(proc.pid)
                    ports[name].add(drive(port, n))
                    main1, total1 = cpu_ns(proc.pid)
                    main_us, total_us = (main1 - main0) / n / 1e3, (total1 - total0) / n / 1e3
                    runs[name].append({"total_us": total_us, "loop_us": main_us})
        finally:
            for proc, _port in servers.values():
                stop_server(proc)
        for name in names:  # every line written once the server stopped (queue flushes on exit)
            text = (Path(tmp) / f"{name}.log").read_text()
            lines = [parse_line(line) for line in text.splitlines() if line.strip()]
            expected = 0 if name == "null" else warmup + repeats * counts[name]
            mine = {f"127.0.0.1:{port}" for port in ports[name]}
            ours = [f for f in lines if f and f.client in mine]
            sent = repeats * counts[name]
            complete = len(lines) == expected and (name == "null" or len(ours) == sent)
            for run in runs[name]:
                run.update(lines=len(lines), expected_lines=expected, complete=complete)
    return runs


#: (records per round on the caller, requests per server batch, batches): quick, default, full;
#: rich is far slower per record, so it gets a tenth (caller) and a third (server) of them.
LENGTHS = {"quick": (5000, 2000, 1), "default": (10_000, 5000, 3), "full": (20_000, 10_000, 3)}


def run(quick: bool, full: bool = False) -> Section:
    length = "quick" if quick else "full" if full else "default"
    records, requests, repeats = LENGTHS[length]
    names = registry.available("accesslog")
    per_record = {
        name: caller_cost(
            name,
            rounds=3 if quick else 5,
            number=records // 60 if name == "rich" else records,
        )
        for name in names
    }
    counts = {name: requests // 3 if name == "rich" else requests for name in names}
    runs = server_costs(list(names), counts, repeats)
    servers = {
        name: {
            "loop_us": statistics.median(r["loop_us"] for r in results),
            "total_us": statistics.median(r["total_us"] for r in results),
            "lines": results[0]["lines"],
            "expected_lines": results[0]["expected_lines"],
            "complete": all(r["complete"] for r in results),
        }
        for name, results in runs.items()
    }
    rich_loop = servers.get("rich", {}).get("loop_us")
    rows, table1, table2 = [], [], []
    for name in names:
        pr, sv = per_record[name], servers[name]
        listener = f"{pr['listener_us']:.2f}" if name == "queue" else "-"
        table1.append([name, f"{pr['handle_us']:.2f}", f"{pr['info_us']:.2f}", listener])
        vs_rich = f"{rich_loop / sv['loop_us']:.1f}x" if rich_loop else "-"
        lines = f"{sv['lines']}/{sv['expected_lines']}"
        table2.append(
            [name, f"{sv['loop_us']:.1f}", f"{sv['total_us']:.1f}", vs_rich, lines, sv["complete"]]
        )
        rows.append({"implementation": name, **pr, **{f"server_{k}": v for k, v in sv.items()}})
    table = "\n\n".join(
        [
            render_table(
                ["handler", "handle µs", "logger.info µs", "listener µs"],
                table1,
            ),
            render_table(
                [
                    "handler",
                    "loop CPU µs/req",
                    "process CPU µs/req",
                    "loop vs rich",
                    "lines",
                    "all lines",
                ],
                table2,
            ),
        ]
    )
    # Picks: null is left out of every row (it loses lines), so pick.fastest_in never takes it.
    keep = [n for n in names if n != "null" and servers[n]["complete"]]
    measurements = [
        {
            "input": "per-record handle (devnull)",
            "size_bytes": None,
            "cost": {n: per_record[n]["handle_us"] for n in keep},
        },
        {
            "input": "uvicorn loop CPU per request",
            "size_bytes": None,
            "cost": {n: servers[n]["loop_us"] for n in keep},
        },
    ]
    notes = (
        "Per record: thread CPU on the calling thread, stream os.devnull; 'handle' is the handler "
        "alone, 'logger.info' is uvicorn's whole call (record creation + handler); for queue the "
        "listener column is its thread's CPU per record (formatting + batched write), paid in "
        "the same process but off the event loop.\n"
        "uvicorn (uvloop, httptools, trivial ASGI route) in a subprocess, sequential keep-alive "
        "requests from this process, access log to a file; CPU from /proc/PID/task/*/schedstat; "
        "'loop' = the main (event-loop) thread. 'lines' = lines in the file / requests sent "
        "(null: access log off, no line by design; left out of picks).\n"
        f"This run: {records} records x {3 if quick else 5} rounds per handler on the caller "
        f"(rich: {records // 60}); one server per handler, {counts.get('plain', requests)} "
        f"requests per batch (rich: {requests // 3}), median of {repeats} round-robin "
        f"batch(es) after {300} warm-up requests."
    )
    return Section(
        "accesslog", "accesslog: handler cost on the event loop", table, rows, measurements, notes
    )


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "serve":
        options = dict(arg.split("=", 1) for arg in sys.argv[4:])
        serve(sys.argv[2], sys.argv[3], **{k: float(v) for k, v in options.items()})
    else:
        sys.exit("usage: python -m impl.bench.accesslog serve NAME LOGFILE [OPTION=NUMBER ...]")
