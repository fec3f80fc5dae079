"""The /healthz prober (impl.harness.procs.probe): a failed probe says whether it connected."""

from __future__ import annotations

import socket

import pytest

from impl.harness import procs


def test_a_probe_that_connected_but_got_no_answer_carries_its_connect_time():
    """A listener that never accepts: the kernel completes the handshake, nothing answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(OSError) as raised:
            procs.probe(f"http://127.0.0.1:{port}/healthz", timeout=0.3)
    assert raised.value.connected is not None and raised.value.connected >= 0


def test_a_probe_that_could_not_connect_has_no_connect_time():
    """Nothing listens on the port: the failure is in connect, `.connected` is None."""
    port = procs.free_port()
    with pytest.raises(OSError) as raised:
        procs.probe(f"http://127.0.0.1:{port}/healthz", timeout=0.3)
    assert raised.value.connected is None
