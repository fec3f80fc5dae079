"""Fixtures shared by the server test modules."""

from __future__ import annotations

import pytest

from tests.support.server import Api, start_upstream


@pytest.fixture
def api(server):
    """An `Api` client of the module's `server` fixture (each server test module has one)."""
    client = Api(server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def upstream():
    """The stand-in upstream router, one per test module that asks for it."""
    with start_upstream() as process:
        yield process
