"""`hotpath serve`: the Tinker-SDK-compatible sampling server (FastAPI on a picked HTTP runtime).

Every option is also an environment variable (`--poll-hold` = `HOTPATH_POLL_HOLD`); a flag wins.
Each family's implementation is picked at start-up (explicit flag or variable, else measurements
recorded by `hotpath bench` here, else a short calibration, else a fixed preference order) and
logged with the reason; `GET /healthz` shows the picks, the store, the answering process,
event-loop lag and GC pauses. Who may sample is `--api-keys FILE` (`impl.server.callers`;
without it any `tml-` key, on loopback only unless `--allow-any-key`). `--workers N` runs N
processes on one port and one shared store (Redis/Valkey; with no `--store`, a redis-server it
starts, keeps running and stops itself).

It listens before it picks and starts the app: meanwhile `impl.server.starting` answers
`/livez` 200 and everything else 503 on that socket, then the picked runtime (`impl.runtime`:
uvicorn with httptools and the HTTP limits of `impl.server.protocol`, unless `--runtime` or
measurements say otherwise) takes the same socket over. On SIGTERM `/readyz` answers 503 and
the server keeps serving `--drain-delay` seconds before it closes the socket and drains.
Once the runtime listens it prints one line on stdout:

    hotpath-server listening on http://HOST:PORT
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import sys

from impl.server import settings as settings_module

log = logging.getLogger("hotpath.server")
STORE_HINT = "the shared store needs redis-py: pip install 'hotpath[store]'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings_module.add_arguments(parser)


def somaxconn() -> int | None:
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def announce_callers(settings: settings_module.Settings) -> bool:
    """Log who may sample (the start-up line of the key check); False, the reason printed, when
    the --api-keys file cannot be read or does not parse."""
    from impl.server import keyfile

    if settings.api_keys is None:
        where = "--allow-any-key" if settings.allow_any_key else f"loopback only ({settings.host})"
        log.warning(
            "no --api-keys: any X-API-Key starting with 'tml-' may sample, each key a caller of "
            "its own (%s)",
            where,
        )
        return True
    try:
        names = keyfile.load(settings.api_keys)
    except keyfile.KeyFileError as exc:
        print(f"hotpath serve: --api-keys: {exc}", file=sys.stderr)
        return False
    log.info(
        "--api-keys %s: %d callers may sample (SIGHUP or a change of the file reloads it)",
        settings.api_keys,
        len(set(names.values())),
    )
    return True


def tune_runtime(settings: settings_module.Settings, accesslog: str) -> None:
    """Process-wide settings for a long-lived server (the baseline keeps CPython's defaults).

    Garbage collector: with thousands of open connections, tasks and stored records, CPython's
    defaults run long generation-2 collections every few seconds under queue-32768 (most of
    the server's CPU time goes to the collector, and /healthz waits behind it; the figures:
    docs/measurements.md).
    Objects alive once the server listens (modules, the app, the routes) are frozen: no
    collection scans them again. Logging: `logging._srcfile = None` (the logging HOWTO's
    "Optimization" advice) skips the stack walk that finds each record's caller, which no
    access-log format here prints (rich does, so not with `--accesslog rich`).
    """
    if settings.baseline:
        return
    if accesslog != "rich":
        logging._srcfile = None
    gc.collect()
    gc.freeze()
    gc.set_threshold(*settings.gc_thresholds())


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_module.from_args(args)
    except ValueError as exc:
        print(f"hotpath serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s"
    )
    from impl.server.callers import install_sighup

    install_sighup()  # before anything slow: a SIGHUP reloads the key file, never ends us
    if settings.worker_index == 0 and not settings.reuse_port and not announce_callers(settings):
        return 2
    limit = somaxconn()
    if limit is not None and settings.backlog > limit:
        log.warning(
            "backlog %d is capped at net.core.somaxconn = %d by the kernel", settings.backlog, limit
        )
    if settings.store_kind() != "memory":
        try:
            import redis  # noqa: F401
        except ModuleNotFoundError:
            print(f"hotpath serve: --store {settings.store}: {STORE_HINT}", file=sys.stderr)
            return 2
    if settings.workers > 1:
        from impl.server.workers import supervise

        return supervise(settings)
    from impl.server.starting import Starting, listening_socket

    # A worker of --workers binds with SO_REUSEPORT and listens only once it can serve (the
    # kernel would send a starting worker its share of the connections); one process listens
    # at once and answers the probes while it picks and starts.
    if settings.reuse_port:
        from impl.server.workers import reuse_port_socket

        sock, starting = reuse_port_socket(settings.host, settings.port), None
    else:
        try:
            sock = listening_socket(settings.host, settings.port, settings.backlog)
        except OSError as exc:
            print(f"hotpath serve: cannot listen on {settings.host}:{settings.port}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 2
        starting = Starting(sock, "picking the implementations").start()
    embedded = None
    try:
        from impl.server.picks import choose_or_explain

        picks = choose_or_explain(settings)
        if picks is None:
            return 2
        if starting is not None:
            starting.why = "starting the app (store, decode processes)"
        if settings.store_kind() == "embedded":
            from impl.server.workers import start_embedded_store

            embedded = start_embedded_store(settings.max_result_bytes)
            if embedded is None:
                return 2
            settings = dataclasses.replace(settings, store=embedded.url)
        from impl import registry

        if picks.accesslog.name != "null":  # each line names its caller (never the key)
            from impl.server.callers import NameInAccessLog

            logging.getLogger("uvicorn.access").addFilter(NameInAccessLog())
        runtime = registry.create("runtime", picks.runtime.name)
        started = runtime.serve(settings, picks, sock, starting)
    finally:
        if starting is not None:
            starting.stop()
        sock.close()
        if embedded is not None:
            embedded.stop()
    return 0 if started else 3
