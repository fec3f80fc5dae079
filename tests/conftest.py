"""Fixtures shared by the server test modules."""

from __future__ import annotations

import pytest
from _server import Api


@pytest.fixture
def api(server):
    """An `Api` client of the module's `server` fixture (each server test module has one)."""
    client = Api(server.url)
    yield client
    client.close()
