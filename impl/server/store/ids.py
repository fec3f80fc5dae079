"""Ids nobody can count: every request, session and sampling-session id the server hands out.

An id is 128 random bits (16 bytes from `os.urandom`, URL-safe base64 without padding: 22
characters of `A-Z a-z 0-9 - _`), so one caller's id says nothing about any other id, and a
caller cannot reach another caller's futures by guessing (each is also owned by its caller's
NAME: `impl.server.callers`). They contain no space, `:` or NUL, the separators the stores'
keys and log entries use. `random_bytes` is looked up at each call, so a measurement can make
the ids repeatable (`impl.ci.icount_steps`).
"""

from __future__ import annotations

import base64
import os

#: random bytes per id (128 bits; fewer than 96 would make guessing thinkable)
BYTES = 16


#: where the bytes come from
random_bytes = os.urandom


def new_id() -> str:
    """A fresh id of BYTES random bytes (what `secrets.token_urlsafe(BYTES)` returns)."""
    return base64.urlsafe_b64encode(random_bytes(BYTES)).rstrip(b"=").decode("ascii")
