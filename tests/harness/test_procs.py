"""The harness's processes (impl.harness.procs, load): the /healthz prober says whether a failed
probe connected; the client processes run at their own niceness."""

from __future__ import annotations

import socket

import pytest

from impl.harness import procs, watch


@pytest.mark.heavy
def test_a_probe_that_connected_but_got_no_answer_carries_its_connect_time():
    """A listener that never accepts: the kernel completes the handshake, nothing answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(OSError) as raised:
            watch.probe(f"http://127.0.0.1:{port}/healthz", timeout=0.3)
    assert raised.value.connected is not None and raised.value.connected >= 0


def test_a_probe_that_could_not_connect_has_no_connect_time():
    """Nothing listens on the port: the failure is in connect, `.connected` is None."""
    port = procs.free_port()
    with pytest.raises(OSError) as raised:
        watch.probe(f"http://127.0.0.1:{port}/healthz", timeout=0.3)
    assert raised.value.connected is None


def test_client_processes_and_queue_presets_carry_the_load_niceness():
    """The queue presets lower the load's priority; every client process's config carries it, and a
    flag overrides it (0: the server's priority)."""
    import argparse

    from impl.harness import load, presets

    for name in ("queue-32768", "queue-131072", "queue-131072-all"):
        assert presets.get(name).load_nice == 10
    assert presets.get("small-2048").load_nice == 0
    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    args = parser.parse_args(["--preset", "queue-131072-all", "--load-nice", "3"])
    scenario = load.scenario_from_args(args)
    configs = load.client_configs("http://127.0.0.1:1", scenario)
    assert {config.nice for config in configs} == {3}


@pytest.mark.parametrize("flag", ["--client-processes", "--workers"])
def test_client_processes_keep_their_old_flag(flag):
    """`--workers` (the spelling before issue 26) still sets the client processes."""
    import argparse

    from impl.harness import load

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    scenario = load.scenario_from_args(parser.parse_args([flag, "3", "--num-requests", "9"]))
    assert scenario.client_processes == 3
    assert len(load.client_configs("http://127.0.0.1:1", scenario)) == 3


def test_a_client_process_lowers_its_own_priority(monkeypatch):
    """`_client_main` applies the config's niceness before the client runs."""
    import queue

    from impl.harness import drive
    from impl.harness.client import config as client_config
    from impl.harness.client import sdk_shaped

    niced: list[int] = []
    monkeypatch.setattr(drive.os, "nice", niced.append)
    monkeypatch.setattr(
        sdk_shaped, "run_client_process", lambda config, progress, go: {"niced": list(niced)}
    )
    results: queue.Queue = queue.Queue()
    config = client_config.ClientConfig(url="http://127.0.0.1:1", indices=(0, 0, 1), nice=4)
    drive._client_main(config, "http", None, None, results)
    assert results.get_nowait() == {"niced": [4]}
