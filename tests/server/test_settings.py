"""Settings from flags and HOTPATH_* variables, the picks, and the uvicorn configuration."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from impl import pick, registry
from impl.server import calibration, picks
from impl.server.settings import Settings, add_arguments, env_name, from_args
from tests.support.server import ROOT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_field_is_a_flag_with_help_and_env():
    parser = _parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    for field in dataclasses.fields(Settings):
        action = actions[field.name]
        assert action.option_strings[0] == "--" + field.name.replace("_", "-")
        assert action.help and env_name(field.name) in action.help


def test_flag_beats_env_beats_default():
    env = {"HOTPATH_POLL_HOLD": "12.5", "HOTPATH_PORT": "9001", "HOTPATH_BASELINE": "true"}
    settings = from_args(_parser().parse_args(["--port", "9002"]), env)
    assert settings.port == 9002  # flag
    assert settings.poll_hold == 12.5  # env
    assert settings.baseline is True  # env bool
    assert settings.retrieved_ttl == Settings().retrieved_ttl  # default
    assert from_args(_parser().parse_args(["--no-baseline"]), env).baseline is False


@pytest.mark.parametrize(
    ("new", "old", "value"),
    [("offloop_count", "decode_workers", 3), ("offloop_nice", "decode_worker_nice", 5)],
)
def test_renamed_options_keep_their_old_spelling(new, old, value):
    """--decode-workers and --decode-worker-nice (and their HOTPATH_* variables), the spellings
    before issue 26, still set --offloop-count and --offloop-nice; the new spelling wins."""
    old_flag, new_env, old_env = "--" + old.replace("_", "-"), env_name(new), env_name(old)
    assert getattr(from_args(_parser().parse_args([old_flag, str(value)]), {}), new) == value
    assert getattr(from_args(_parser().parse_args([]), {old_env: str(value)}), new) == value
    both = {old_env: "1", new_env: str(value)}
    assert getattr(from_args(_parser().parse_args([]), both), new) == value
    flag_wins = from_args(_parser().parse_args([old_flag, str(value)]), {new_env: "1"})
    assert getattr(flag_wins, new) == value
    with pytest.raises(ValueError, match=f"{old_env}='x' is not a valid int"):
        from_args(_parser().parse_args([]), {old_env: "x"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOTPATH_PORT": "http"}, "HOTPATH_PORT='http' is not a valid int"),
        ({"HOTPATH_BASELINE": "maybe"}, "not a boolean"),
        ({"HOTPATH_RETRIEVED_TTL": "0"}, "retrieved_ttl must be > 0"),
        ({"HOTPATH_ROUTER_URL": "127.0.0.1:8001"}, "router_url must be an http(s) URL"),
        ({"HOTPATH_GC_THRESHOLD": "700,10"}, "gc_threshold must be three positive ints"),
        ({"HOTPATH_GC_THRESHOLD": "a,b,c"}, "gc_threshold must be three positive ints"),
        ({"HOTPATH_STORE": "postgres://db"}, "store must be memory, embedded, auto or a URL"),
        ({"HOTPATH_WORKERS": "2", "HOTPATH_STORE": "memory"}, "--workers > 1 needs a shared"),
        ({"HOTPATH_WORKERS": "0"}, "workers must be > 0"),
        ({"HOTPATH_STORE_LEASE": "0"}, "store_lease must be > 0"),
        (
            {"HOTPATH_BASELINE": "1", "HOTPATH_STORE": "redis://127.0.0.1:6379/0"},
            "--baseline runs on the memory store only",
        ),
    ],
)
def test_bad_values_say_what_is_wrong(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_args(_parser().parse_args([]), env)


def test_store_kind_resolves_auto():
    assert Settings().store_kind() == "memory"
    assert Settings(workers=2).store_kind() == "embedded"
    assert Settings(store="unix:///tmp/r.sock").store_kind() == "url"
    assert Settings(store="embedded").store_kind() == "embedded"


def test_serve_help_explains_every_option():
    out = subprocess.run(
        [sys.executable, "-m", "impl.cli", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for field in dataclasses.fields(Settings):
        assert "--" + field.name.replace("_", "-") in out
        assert env_name(field.name) in out


@pytest.mark.heavy
def test_bad_implementation_name_fails_at_startup():
    done = subprocess.run(
        [sys.executable, "-m", "impl.cli", "serve", "--port", "0", "--decode", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no decode implementation 'nope'" in done.stderr and "json" in done.stderr


@pytest.fixture
def no_measurements(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTPATH_MEASUREMENTS", str(tmp_path / "measurements.json"))
    for family in registry.families():
        monkeypatch.delenv(f"HOTPATH_{family.upper()}", raising=False)
    return tmp_path


def test_picks_follow_preference_and_never_choose_null_access_log(no_measurements):
    chosen = picks.choose(Settings(calibrate=False))
    for family in registry.families():
        p = getattr(chosen, family)
        assert p.name in registry.available(family)
        assert p.reason
    # Even when measurements say "no access log" is cheapest, it is not picked automatically.
    pick.record(
        "accesslog",
        [{"input": "x", "size_bytes": None, "cost": {"null": 0.1, "plain": 1.0, "rich": 9.0}}],
    )
    chosen = picks.choose(Settings(calibrate=False))
    assert chosen.accesslog.name != "null"
    assert "measurements" in chosen.accesslog.reason
    assert picks.choose(Settings(calibrate=False, accesslog="null")).accesslog.name == "null"


def test_picks_has_one_field_per_family():
    assert tuple(f.name for f in dataclasses.fields(picks.Picks)) == registry.all_families()


@pytest.mark.heavy
def test_start_up_calibration_measures_and_leaves_out_a_wrong_result(no_measurements, monkeypatch):
    """With nothing recorded, decode, encode and the access log are picked by a calibration."""
    chosen = picks.choose(Settings())
    for family in ("decode", "encode", "accesslog"):
        assert getattr(chosen, family).reason.startswith("fastest in a start-up calibration")
    assert "preference order" in chosen.pool.reason  # no start-up calibration for the pool
    assert calibration.calibrator("pool") is None

    real_create = registry.create

    class Wrong:
        def encode(self, completion):
            return real_create("encode", "protobuf").encode(completion) + b"\x00"

    def create(family, name, **options):
        return Wrong() if (family, name) == ("encode", "wire") else real_create(family, name)

    monkeypatch.setattr(registry, "create", create)
    rows = calibration.encode(["protobuf", "wire"])
    assert [sorted(row["cost"]) for row in rows] == [["protobuf"]] * len(rows)


def test_baseline_picks(no_measurements):
    chosen = picks.choose(Settings(baseline=True, calibrate=False))
    assert {f: getattr(chosen, f).name for f in registry.families()} == {
        "decode": "json",
        "encode": "validated",
        "pool": "httpx",
        "accesslog": "rich",
    }
    # An explicit flag still wins over --baseline.
    assert (
        picks.choose(Settings(baseline=True, calibrate=False, pool="aiohttp")).pool.name
        == "aiohttp"
    )


def test_uvicorn_configuration(no_measurements):
    settings = Settings(calibrate=False)
    config = registry.create("runtime", "uvicorn_httptools").config(
        settings, picks.choose(settings)
    )
    assert config.factory is True
    # httptools, with the HTTP limits (impl/server/protocol.py) bound to the settings
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert config.loop == "uvloop" and issubclass(config.http, HttpToolsProtocol)
    assert (config.http.max_head, config.http.max_headers) == (32768, 100)
    assert (config.http.header_timeout, config.http.body_timeout) == (10.0, 60.0)
    assert config.backlog == 4096  # the connection limit, not uvicorn's 2048
    assert config.timeout_keep_alive == 75
    handlers = config.log_config["loggers"]["uvicorn.access"]["handlers"]
    assert handlers == ["access"]


def test_runtime_pick_never_chooses_a_runtime_that_lacks_a_guarantee(no_measurements, monkeypatch):
    """auto: the reference unless a runtime that gives every guarantee measured cheaper; an
    explicit runtime runs with what it lacks listed on /healthz, unless it lacks a required one."""
    import impl.runtime

    chosen = picks.choose(Settings(calibrate=False))
    assert chosen.runtime.name == "uvicorn_httptools"
    lacking = [n for n in registry.available("runtime") if impl.runtime.LACKS[n]]
    rows = [{"input": "x", "size_bytes": None, "cost": {n: 0.1 for n in lacking}}]
    rows[0]["cost"]["uvicorn_httptools"] = 1.0
    pick.record("runtime", rows)
    assert picks.choose(Settings(calibrate=False)).runtime.name == "uvicorn_httptools"
    assert picks.choose(Settings(calibrate=False, runtime="auto")).runtime.name == (
        "uvicorn_httptools"
    )
    explicit = picks.choose(Settings(calibrate=False, runtime="uvicorn_h11"))
    assert explicit.runtime.name == "uvicorn_h11"
    shown = explicit.as_json()["runtime"]
    assert shown["lacks"] == sorted(impl.runtime.LACKS["uvicorn_h11"]) and shown["lacks"]
    monkeypatch.setitem(impl.runtime.LACKS, "uvicorn_h11", {"workers": "cannot"})
    assert "workers" not in impl.runtime.lacking("uvicorn_h11", Settings(workers=1))
    picks.choose(Settings(calibrate=False, runtime="uvicorn_h11"))  # one process: runs
    with pytest.raises(registry.UnavailableError, match="cannot give workers: cannot"):
        picks.choose(Settings(calibrate=False, runtime="uvicorn_h11", workers=2))
    with pytest.raises(LookupError, match="known: uvicorn_httptools"):
        picks.choose(Settings(calibrate=False, runtime="nope"))
    assert picks.choose(Settings(calibrate=False, baseline=True)).runtime.name == (
        "uvicorn_httptools"
    )
