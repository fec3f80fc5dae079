"""`hotpath loadtest --background-load`: the CPU burner processes start, burn in proportion to
their fraction, and stop by themselves (with the load test, when their parent dies, or at their
deadline). What they burn is compared side by side (a ratio), never against a clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from impl.harness import burner


def _gone(pid: int, within: float = 10.0) -> bool:
    """True once `pid` has exited (or is a zombie), polling up to `within` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_fraction_must_be_a_share_of_the_period():
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="background-load"):
            burner.check_fraction(bad)
    assert burner.check_fraction(1.0) == 1.0


def test_one_burner_per_core_stopped_by_pid():
    load = burner.BackgroundLoad(0.3, seconds=60)
    assert load.count == burner.cores()
    load.start()
    try:
        assert all(psutil.pid_exists(pid) for pid in load.pids)
        pids = load.pids
    finally:
        load.stop()
    assert all(_gone(pid) for pid in pids)
    stats = load.stats()
    assert stats["fraction"] == 0.3 and stats["processes"] == burner.cores()
    assert stats["cpu_seconds"] >= 0 and load.procs == []


@pytest.mark.heavy
def test_a_burner_burns_in_proportion_to_its_fraction():
    """Two burners side by side for the same time: the one busy 90% of each period uses more
    CPU than the one busy 15% (6x in principle; more than 1.5x however loaded the machine)."""
    busy = burner.BackgroundLoad(0.9, seconds=60, processes=1)
    light = burner.BackgroundLoad(0.15, seconds=60, processes=1)
    busy.start()
    light.start()
    time.sleep(1.5)
    busy.stop()
    light.stop()
    assert busy.cpu_seconds > 1.5 * light.cpu_seconds, (busy.cpu_seconds, light.cpu_seconds)


def test_a_burner_exits_when_its_parent_dies():
    """A load test killed with SIGKILL cannot stop its burners: each exits on its own once its
    parent is gone."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from impl.harness import burner\n"
            "load = burner.BackgroundLoad(0.2, seconds=120, processes=1)\n"
            "load.start()\n"
            "print(load.pids[0], flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert _gone(child), "the burner outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()


@pytest.mark.heavy
def test_a_burner_stops_at_its_deadline():
    done = subprocess.run(
        [sys.executable, "-m", "impl.harness.burner", "--fraction", "0.1", "--seconds", "0.3"],
        timeout=60,
    )
    assert done.returncode == 0
