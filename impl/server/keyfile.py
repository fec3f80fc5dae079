"""The `--api-keys` file: who may sample, one caller per line, read into digests.

Each line is `NAME KEY` or `NAME sha256:HEX` (whitespace between them); blank lines and lines
starting with `#` are ignored, and so is a third field starting with `#` (a trailing comment).
A KEY is what the client sends as `X-API-Key` (the Tinker SDK refuses a key that does not
start with `tml-`, so a literal key must, with at least `MIN_SECRET` characters after it);
`sha256:HEX` is the hex SHA-256 of such a key, so a deployment need not keep the key itself
(`printf %s tml-... | sha256sum` prints the HEX).

Only digests are kept in memory: a request's key is hashed once and looked up among them
(`impl.server.callers`). One NAME may have several keys (a rotation: the old and the new key
both work until the old line goes); one key may not belong to two NAMEs. NAMEs are what the
access log, `/metrics` and the records' owners show; a key is never shown.
"""

from __future__ import annotations

import hashlib
import re

#: A caller's NAME: letters, digits and `_ . @ -`, at most 64 characters.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
KEY_PREFIX = "tml-"
#: Fewest characters a literal key carries after its `tml-` prefix.
MIN_SECRET = 16
_HEX = re.compile(r"[0-9a-fA-F]{64}")


class KeyFileError(ValueError):
    """The file cannot be read or a line does not parse; the message says where and why."""


def digest(key: bytes) -> bytes:
    """The SHA-256 of a key as sent (what the file's `sha256:` lines hold, as bytes)."""
    return hashlib.sha256(key).digest()


def parse(text: str, where: str = "the key file") -> dict[bytes, str]:
    """digest -> NAME of every caller `text` names; KeyFileError for the first bad line."""
    callers: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2 and fields[2].startswith("#"):
            fields = fields[:2]
        at = f"{where} line {number}"
        if len(fields) != 2:
            raise KeyFileError(
                f"{at}: expected 'NAME KEY' or 'NAME sha256:HEX', got {len(fields)} fields"
            )
        name, secret = fields
        if NAME.fullmatch(name) is None:
            raise KeyFileError(
                f"{at}: the name {name[:70]!r} is not 1-64 letters, digits or _ . @ - "
                "(starting with a letter or digit)"
            )
        if secret.startswith("sha256:"):
            hexdigest = secret[len("sha256:") :]
            if _HEX.fullmatch(hexdigest) is None:
                raise KeyFileError(f"{at}: sha256: must be followed by 64 hex digits")
            key_digest = bytes.fromhex(hexdigest)
        elif secret.startswith(KEY_PREFIX) and len(secret) >= len(KEY_PREFIX) + MIN_SECRET:
            key_digest = digest(secret.encode())
        else:
            raise KeyFileError(
                f"{at}: the key of {name!r} must start with {KEY_PREFIX!r} followed by at least "
                f"{MIN_SECRET} characters (or be sha256:HEX of such a key)"
            )
        other = callers.get(key_digest)
        if other is not None and other != name:
            raise KeyFileError(f"{at}: the key of {name!r} is also {other!r}'s")
        callers[key_digest] = name
    return callers


def load(path: str) -> dict[bytes, str]:
    """The callers of the file at `path`; KeyFileError when it is missing, unreadable, not
    UTF-8, has a bad line, or names nobody."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KeyFileError(f"cannot read the key file {path}: {reason}") from None
    callers = parse(text, path)
    if not callers:
        raise KeyFileError(f"the key file {path} names no caller ('NAME KEY' per line)")
    return callers
