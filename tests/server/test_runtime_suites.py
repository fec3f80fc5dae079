"""The hostile-input and store-faults suites on every other HTTP runtime of the family.

Those suites start their servers without `--runtime`, so they run on the reference
(uvicorn_httptools). Here each runs again, whole, in a child pytest with `HOTPATH_RUNTIME=NAME`
in the environment (every server the suites start reads it, as `hotpath serve` reads every
`HOTPATH_*` variable), once per available runtime besides the reference: the same 4xx in the
one error shape, the keep-alive connection still usable, the store's 503 contract and no
traceback in any server's log. A runtime that is not installed is skipped with its reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from impl import registry
from tests.support.server import start_server, start_upstream

pytestmark = [pytest.mark.heavy, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("tests/server/test_hostile.py", "tests/server/store/test_faults.py")
OTHERS = [n for n in registry.names("runtime") if n != registry.reference("runtime")]


def _available(name: str) -> None:
    reason = registry.unavailable_reason("runtime", name)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("name", OTHERS)
def test_the_variable_reaches_the_suites_servers(name, monkeypatch):
    """What the suites' `start_server` starts with HOTPATH_RUNTIME set runs that runtime."""
    _available(name)
    monkeypatch.setenv("HOTPATH_RUNTIME", name)
    with start_upstream() as upstream, start_server(upstream.url) as server:
        assert server.get("/healthz")["picks"]["runtime"]["name"] == name


@pytest.mark.parametrize("name", OTHERS)
def test_hostile_and_faults_suites_pass(name):
    _available(name)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    command += ["-m", "heavy or not heavy", *SUITES]  # every test of both, the slow ones too
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "HOTPATH_RUNTIME": name},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]
