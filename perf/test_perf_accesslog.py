"""Access log: one uvicorn access record through each handler, on the calling thread."""

import logging
import os

import pytest
from conftest import create_or_skip, label

from impl import registry
from impl.accesslog._common import ACCESS_LOGGER, ACCESS_MESSAGE

FACTS = ("127.0.0.1:50123", "GET", "/api/v1/retrieve_future", "1.1", 200)


@pytest.fixture
def devnull():
    with open(os.devnull, "w") as stream:
        yield stream


@pytest.mark.parametrize("name", registry.names("accesslog"))
def test_logger_info(benchmark, name, devnull):
    """uvicorn's whole call: `logger.info(...)` with the handler attached."""
    handler = create_or_skip("accesslog", name, stream=devnull)
    logger = logging.Logger(ACCESS_LOGGER)
    logger.addHandler(handler)
    label(benchmark, "accesslog", "one access record", name)
    try:
        benchmark(logger.info, ACCESS_MESSAGE, *FACTS)
    finally:
        handler.close()
