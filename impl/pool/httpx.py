"""httpx.AsyncClient (over httpcore's connection pool): the reference forwarder.

Technique: one AsyncClient with `Limits(max_connections=N, max_keepalive_connections=N)` and
`Timeout(connect, read, pool=None, write=None)`; no total deadline.

Why slow under load: httpcore's pool keeps one list of connections and one of waiting requests,
and on every request assignment and every release it walks them (`_assign_requests_to_connections`
scans every connection for every queued request, under one lock). Per-request CPU therefore grows
with the number of requests in flight: fine at a few dozen, ms per request at thousands (see the
pool table of `hotpath bench`). It stays the reference because it is what most servers start with
and its semantics (status, content type, bytes, error classes) are the ones the others must match.

Caveats: httpx has no Happy Eyeballs (one connect attempt per request), so nothing to turn off.
"""

from __future__ import annotations

from typing import Any

import httpx

from impl.pool._common import HttpxForwarder, Options, httpx_client


def create(**options: Any) -> HttpxForwarder:
    """The reference forwarder (see the pool contract in `impl.pool`)."""
    return HttpxForwarder(httpx, httpx_client(httpx, Options(**options)))
