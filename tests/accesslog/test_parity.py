"""Access-log parity: every handler but `null` writes one line per uvicorn access record with the
same facts as the reference; no line lost on shutdown; a broken stream never raises."""

from __future__ import annotations

import contextlib
import io
import logging
import logging.config
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from impl import registry
from impl.accesslog import uvicorn_log_config
from impl.accesslog._common import (
    ACCESS_LOGGER,
    ACCESS_MESSAGE,
    Facts,
    access_record,
    facts_of,
    parse_lines,
)

FAMILY = "accesslog"
NAMES = registry.names(FAMILY)
WRITERS = [name for name in NAMES if name != "null"]
REPO = Path(__file__).resolve().parents[2]

# (client, method, path, HTTP version, status) as uvicorn passes them: client "%s:%d" (IPv6
# without brackets, "" when the scope has no client), the path percent-quoted plus the query.
CASES = [
    ("127.0.0.1:50000", "GET", "/", "1.1", 200),
    ("127.0.0.2:1", "POST", "/api/v1/asample", "1.1", 201),
    ("::1:8080", "GET", "/api/v1/retrieve_future?request_id=abc&x=%20y", "1.1", 200),
    ("", "DELETE", "/a%20b/%E2%9C%93", "1.0", 404),
    ("10.0.0.1:65535", "PUT", "/" + "x" * 300, "2", 422),
    ("127.0.0.1:3", "GET", "/healthz", "1.1", 500),
    ("127.0.0.1:4", "OPTIONS", "*", "1.1", 204),
    ("127.0.0.1:5", "GET", "/old", "1.1", 304),
    ("127.0.0.1:6", "GET", "/ws", "1.1", 101),
    ("127.0.0.1:7", "PATCH", "/odd-status?q=1", "1.1", 599),
    ("127.0.0.1:8", "HEAD", "/api/v1/asample", "1.1", 503),
]


def _require(name: str) -> None:
    reason = registry.unavailable_reason(FAMILY, name)
    if reason:
        pytest.skip(reason)


@pytest.fixture
def make_handler():
    """registry.create for the test, closed afterwards even on failure."""
    made: list[logging.Handler] = []

    def make(name: str, **options) -> logging.Handler:
        _require(name)
        handler = registry.create(FAMILY, name, **options)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler.close()


def _written(make_handler, name: str, records: list[logging.LogRecord]) -> str:
    stream = io.StringIO()
    handler = make_handler(name, stream=stream)
    for record in records:
        handler.handle(record)
    handler.flush()
    handler.close()
    return stream.getvalue()


def _records() -> list[logging.LogRecord]:
    return [access_record(*case) for case in CASES]


def test_reference_writes_the_record_facts(make_handler):
    """The reference's lines carry exactly the facts of the records, one line each, in order."""
    records = _records()
    text = _written(make_handler, registry.reference(FAMILY), records)
    assert len(text.splitlines()) == len(records)
    assert parse_lines(text) == [facts_of(r) for r in records]


@pytest.mark.parametrize("name", WRITERS)
def test_same_facts_as_reference(make_handler, name):
    """Every handler but null writes one line per record with the reference's facts."""
    records = _records()
    reference = parse_lines(_written(make_handler, registry.reference(FAMILY), records))
    text = _written(make_handler, name, _records())
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == len(records), text
    assert parse_lines(text) == reference


def test_null_writes_nothing(make_handler):
    """null is the access log turned off: nothing reaches the stream."""
    assert _written(make_handler, "null", _records()) == ""


def test_queue_formats_on_the_listener_thread(make_handler):
    """The caller only enqueues: formatting (and writing) happen on another thread."""
    stream = io.StringIO()
    handler = make_handler("queue", stream=stream)
    formatted_on: set[int] = set()
    original = handler.formatter.format

    def spy(record):
        formatted_on.add(threading.get_ident())
        return original(record)

    handler.formatter.format = spy
    for record in _records():
        handler.handle(record)
    handler.flush()
    assert len(stream.getvalue().splitlines()) == len(CASES)
    assert formatted_on and threading.get_ident() not in formatted_on


def test_queue_flush_wakes_the_listener(make_handler):
    """flush() does not wait for the listener's next tick: it wakes it and waits for the write."""
    stream = io.StringIO()
    handler = make_handler("queue", stream=stream, interval=3600, close_timeout=5)
    for record in _records():
        handler.handle(record)
    assert stream.getvalue() == ""  # nothing written on the caller
    handler.flush()
    assert handler.written == len(CASES)
    assert parse_lines(stream.getvalue()) == [Facts(*case) for case in CASES]


def test_queue_pause_stops_the_listener_and_resume_restarts_it(make_handler):
    """pause() writes what is queued and stops the listener; records handled while paused wait
    (nothing written) until resume(); flush() while paused writes them on the caller; close()
    while paused writes them too. pause/resume are idempotent."""
    stream = io.StringIO()
    handler = make_handler("queue", stream=stream, interval=0.001, close_timeout=5)
    handler.handle(access_record("127.0.0.1:9", "GET", "/before", "1.1", 200))
    handler.pause()
    handler.pause()
    assert handler.written == 1 and not handler._thread.is_alive()
    handler.handle(access_record("127.0.0.1:9", "GET", "/paused", "1.1", 200))
    time.sleep(0.05)  # many listener intervals: no listener, nothing written
    assert handler.written == 1 and len(handler.queue) == 1
    handler.resume()
    handler.resume()
    handler.flush()
    assert [f.path for f in parse_lines(stream.getvalue())] == ["/before", "/paused"]
    handler.pause()
    handler.handle(access_record("127.0.0.1:9", "GET", "/flushed", "1.1", 200))
    handler.flush()
    assert handler.written == 3 and not handler._thread.is_alive()
    handler.handle(access_record("127.0.0.1:9", "GET", "/closed", "1.1", 200))
    handler.close()
    assert [f.path for f in parse_lines(stream.getvalue())][-2:] == ["/flushed", "/closed"]
    handler.resume()  # closed: stays closed, no listener
    assert not handler._thread.is_alive()


@pytest.mark.heavy
def test_queue_keeps_a_burst_closed_right_after(make_handler):
    """10,000 records handled, then close() at once: all 10,000 lines, in order."""
    stream = io.StringIO()
    handler = make_handler("queue", stream=stream)
    for i in range(10_000):
        handler.handle(access_record("127.0.0.1:9", "GET", f"/r?i={i}", "1.1", 200))
    handler.close()
    facts = parse_lines(stream.getvalue())
    assert [f.path for f in facts] == [f"/r?i={i}" for i in range(10_000)]
    assert handler.written == 10_000 and handler.errors == 0


@pytest.mark.heavy
def test_queue_flushes_at_interpreter_exit(tmp_path):
    """Configured by dictConfig and never closed explicitly: atexit still writes every line."""
    log = tmp_path / "access.log"
    script = textwrap.dedent(
        f"""
        import logging, logging.config
        from impl.accesslog import uvicorn_log_config
        logging.config.dictConfig(uvicorn_log_config("queue", stream=open({str(log)!r}, "w")))
        access = logging.getLogger("uvicorn.access")
        for i in range(10_000):
            access.info({ACCESS_MESSAGE!r}, "127.0.0.1:9", "GET", f"/r?i={{i}}", "1.1", 200)
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=120)
    assert [f.path for f in parse_lines(log.read_text())] == [f"/r?i={i}" for i in range(10_000)]


def test_queue_flushes_before_sigterm_kills(tmp_path):
    """SIGTERM with the default action (how uvicorn ends after re-raising it) skips atexit:
    the queue handler still writes every queued line, and the process still dies of SIGTERM."""
    log = tmp_path / "access.log"
    script = textwrap.dedent(
        f"""
        import os, signal
        from impl import registry
        from impl.accesslog._common import access_record
        handler = registry.create("accesslog", "queue", stream=open({str(log)!r}, "w"),
                                  interval=3600)  # the listener would not wake before the end
        for i in range(10_000):
            handler.handle(access_record("127.0.0.1:9", "GET", f"/r?i={{i}}", "1.1", 200))
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=120)
    assert proc.returncode == -signal.SIGTERM
    assert [f.path for f in parse_lines(log.read_text())] == [f"/r?i={i}" for i in range(10_000)]


class _BrokenPipe(io.TextIOBase):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def _closed_file(tmp_path: Path):
    stream = open(tmp_path / "closed.log", "w")  # noqa: SIM115
    stream.close()
    return stream


def _full_pipe():
    """A non-blocking pipe nobody reads, filled until a write would block (BlockingIOError)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    with pytest.raises(BlockingIOError):
        while True:
            os.write(write_fd, b"x" * 65536)
    return read_fd, open(write_fd, "w", buffering=1)


@pytest.mark.parametrize("kind", ["broken-pipe", "closed-file", "full-pipe"])
@pytest.mark.parametrize("name", NAMES)
def test_failed_writes_never_raise(make_handler, capsys, tmp_path, name, kind):
    """Broken, closed or full stream: nothing raised to the caller, one notice, lines counted."""
    read_fd = None
    if kind == "broken-pipe":
        stream = _BrokenPipe()
    elif kind == "closed-file":
        stream = _closed_file(tmp_path)
    else:
        read_fd, stream = _full_pipe()
    try:
        handler = make_handler(name, stream=stream)
        logger = logging.Logger(ACCESS_LOGGER)
        logger.addHandler(handler)
        for case in CASES * 10:
            logger.info(ACCESS_MESSAGE, *case)  # must not raise
        handler.flush()
        handler.close()
        err = capsys.readouterr().err
        assert "Traceback" not in err and "Logging error" not in err
        if name == "null":
            return
        # The full pipe accepts a partial buffer first; every other line must be counted lost.
        assert handler.errors >= (1 if kind == "full-pipe" else len(CASES) * 10)
        assert err.count("could not write a line") == 1, err
    finally:
        if read_fd is not None:
            os.close(read_fd)
            with contextlib.suppress(OSError):  # bytes still buffered fail to flush
                stream.close()


@pytest.fixture
def restore_logging():
    """dictConfig changes global logging state: put uvicorn's loggers back afterwards."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {
        n: (lg.handlers[:], lg.level, lg.propagate)
        for n, lg in ((n, logging.getLogger(n)) for n in names)
    }
    yield
    for n, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(n)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.mark.parametrize("name", NAMES)
def test_uvicorn_log_config_routes_access_and_keeps_errors(restore_logging, capsys, name):
    """The dict configures uvicorn.access with the named handler and uvicorn.error on stderr."""
    _require(name)
    stream = io.StringIO()
    config = uvicorn_log_config(name, stream=stream)
    config["formatters"]["access"]["use_colors"] = False  # what uvicorn does with use_colors
    config["formatters"]["default"]["use_colors"] = False
    logging.config.dictConfig(config)
    access = logging.getLogger(ACCESS_LOGGER)
    assert access.propagate is False
    assert access.hasHandlers() is (name != "null")  # uvicorn logs only if it has handlers
    for case in CASES:
        access.info(ACCESS_MESSAGE, *case)
    logging.getLogger("uvicorn.error").info("Application startup complete.")
    for handler in access.handlers:
        handler.flush()
    expected = [] if name == "null" else [Facts(*case) for case in CASES]
    assert parse_lines(stream.getvalue()) == expected
    err = capsys.readouterr().err
    assert "INFO:" in err and "Application startup complete." in err
    assert "GET" not in err  # access lines go to the access handler only


def test_reconfiguring_flushes_the_previous_queue(restore_logging):
    """dictConfig closes the previous configuration's handlers: the queue's lines get written."""
    first, second = io.StringIO(), io.StringIO()
    logging.config.dictConfig(uvicorn_log_config("queue", stream=first, interval=3600))
    access = logging.getLogger(ACCESS_LOGGER)
    old = access.handlers[0]
    for case in CASES:
        access.info(ACCESS_MESSAGE, *case)
    logging.config.dictConfig(uvicorn_log_config("plain", stream=second))
    assert parse_lines(first.getvalue()) == [Facts(*case) for case in CASES]
    old.handle(access_record(*CASES[0]))  # a straggler after close is written directly
    assert parse_lines(first.getvalue())[-1] == Facts(*CASES[0])
    access.info(ACCESS_MESSAGE, *CASES[1])
    assert parse_lines(second.getvalue()) == [Facts(*CASES[1])]


def test_unknown_name_fails_before_dictconfig():
    with pytest.raises(LookupError, match="known: plain"):
        uvicorn_log_config("no-such-handler")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_real_uvicorn_logs_every_request(tmp_path, name):
    """A real uvicorn (uvloop, httptools) stopped right after a burst: one line per request."""
    _require(name)
    from impl.bench.accesslog import drive, start_server, stop_server

    n = 10_000 if name == "queue" else 500
    # queue: a listener that never wakes by itself, so only the shutdown path can write lines.
    options = {"interval": 3600} if name == "queue" else {}
    log = tmp_path / "access.log"
    proc, port = start_server(name, log, **options)
    try:
        request = b"GET /burst?x=1 HTTP/1.1\r\nhost: t\r\n\r\n"
        local_port = drive(port, n, request, depth=50)
    finally:
        code, err = stop_server(proc)  # SIGTERM as soon as the last response arrived
    # uvicorn re-raises the SIGTERM it handled once shut down: -15 is its normal exit.
    assert code in (0, -signal.SIGTERM), err
    assert "Started server process" in err and "Finished server process" in err, err
    want = (
        []
        if name == "null"
        else [Facts(f"127.0.0.1:{local_port}", "GET", "/burst?x=1", "1.1", 200)] * n
    )
    assert parse_lines(log.read_text()) == want


def test_queue_caller_is_much_cheaper_than_rich(make_handler):
    """Same run, same records: rich costs the caller many times what queue's enqueue does."""
    _require("rich")
    record = access_record(*CASES[2])
    cost = {}
    for name in ("queue", "rich"):
        with open(os.devnull, "w") as devnull:
            handler = make_handler(name, stream=devnull)
            start = time.thread_time()
            for _ in range(200):
                handler.handle(record)
            cost[name] = time.thread_time() - start
            handler.close()
    # Measured ratio is ~1000x; 10x leaves room for any noise on a shared machine.
    assert cost["rich"] > 10 * cost["queue"], cost


@pytest.mark.heavy
def test_pick_never_takes_null(tmp_path, monkeypatch):
    """With nothing recorded, the start-up calibration picks a handler that writes lines."""
    from impl import pick
    from impl.server.calibration import calibrator

    calibrate = calibrator(FAMILY)
    monkeypatch.setenv("HOTPATH_MEASUREMENTS", str(tmp_path / "none.json"))
    monkeypatch.delenv("HOTPATH_ACCESSLOG", raising=False)
    rows = calibrate(list(registry.available(FAMILY)))
    assert rows and all("null" not in row["cost"] for row in rows)
    assert pick.fastest_in(rows, list(registry.available(FAMILY))) != "null"
    assert pick.pick(FAMILY, calibrator=calibrate).name != "null"
