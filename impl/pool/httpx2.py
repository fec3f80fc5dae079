"""httpx2 (the maintained httpx fork, over httpcore2): same API and pool design as httpx.

Technique: identical to the reference (`impl.pool.httpx`), only the package differs, so the table
shows whether the fork changed the pool's per-request cost as requests in flight grow.

Caveats: same as httpx (no Happy Eyeballs to turn off); errors are httpx2's own classes, mapped
the same way (ConnectError/ConnectTimeout/PoolTimeout -> ConnectError, other transport errors
after sending -> ReadError).
"""

from __future__ import annotations

from typing import Any

import httpx2

from impl.pool._common import HttpxForwarder, Options, httpx_client


def create(**options: Any) -> HttpxForwarder:
    """httpx2's AsyncClient with the contract's limits and timeouts."""
    return HttpxForwarder(httpx2, httpx_client(httpx2, Options(**options)))
