"""uvicorn_httptools: the reference. uvicorn with httptools' C parser, under the server's limits.

Technique: uvicorn's `HttpToolsProtocol`, subclassed by `impl.server.protocol` for what
httptools bounds nothing of (head bytes, header count, head and body read times: 431 and 408
in the one error shape) and for `GET /livez` answered on the event loop without an ASGI task.
Why fast: httptools parses in C, one callback per part of a request.
Caveats: every guarantee of the family is given here (the capability table's row is empty).
"""

from __future__ import annotations

from typing import Any

from impl.runtime._uvicorn import UvicornRuntime


class HttpToolsRuntime(UvicornRuntime):
    name = "uvicorn_httptools"

    def http(self, settings: Any) -> Any:
        from impl.server.protocol import protocol_class

        return protocol_class(settings)  # httptools, with head/header/timeout limits


def create() -> HttpToolsRuntime:
    return HttpToolsRuntime()
