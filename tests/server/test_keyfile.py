"""The `--api-keys` file's format (impl/server/keyfile.py) and the per-request check
(impl/server/callers.py): what parses, what is refused with which line, and who a key is."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

from impl.server import keyfile
from impl.server.callers import Callers
from impl.server.keyfile import KeyFileError

ALICE = "tml-alice-0123456789abcdef"
BOB = "tml-bob-0123456789abcdefgh"


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_names_keys_hashes_and_comments_parse():
    text = f"""
    # who may sample
    alice   {ALICE}
    bob\t{sha(BOB)}   # stored hashed
    alice {sha("tml-alice-rotated-key-0000")}
    """
    names = keyfile.parse(text)
    assert sorted(names.values()) == ["alice", "alice", "bob"]
    assert names[hashlib.sha256(BOB.encode()).digest()] == "bob"
    assert ALICE not in repr(names)  # only digests are kept


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("alice", "expected 'NAME KEY'"),
        (f"alice {ALICE} extra", "got 3 fields"),
        (f"al*ce {ALICE}", "is not 1-64 letters"),
        ("alice tml-short", "at least 16 characters"),
        ("alice sk-0123456789abcdef0123", "must start with 'tml-'"),
        ("alice sha256:abcd", "64 hex digits"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(line, why):
    with pytest.raises(KeyFileError, match=why) as caught:
        keyfile.parse(f"# ok\n{line}\n", "keys.txt")
    assert "keys.txt line 2" in str(caught.value)
    assert "0123456789abcdef0123" not in str(caught.value)  # a key is never echoed


def test_one_key_cannot_belong_to_two_names():
    with pytest.raises(KeyFileError, match="also 'alice'"):
        keyfile.parse(f"alice {ALICE}\nbob {sha(ALICE)}\n")


def test_a_missing_unreadable_or_empty_file_is_a_clear_error(tmp_path):
    with pytest.raises(KeyFileError, match=r"cannot read the key file .*nope"):
        keyfile.load(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(KeyFileError, match="names no caller"):
        keyfile.load(str(empty))
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked"
        locked.write_text(f"alice {ALICE}\n")
        locked.chmod(0)
        with pytest.raises(KeyFileError, match="Permission denied"):
            keyfile.load(str(locked))


def test_a_key_is_its_callers_name_and_nothing_else_is(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"alice {ALICE}\nbob {sha(BOB)}\n")
    callers = Callers(str(path), max_outstanding=10)
    assert callers.identify(ALICE.encode()).name == "alice"
    assert callers.identify(BOB.encode()).name == "bob"
    for other in (b"tml-", b"tml-x", ALICE[:-1].encode(), b"", sha(BOB).encode()):
        assert callers.identify(other) is None
    assert callers.share == 5  # two callers: half the room each
    assert callers.tallies() == {"alice": (1, 0), "bob": (1, 0)}


def test_open_mode_takes_any_tml_key_but_the_bare_prefix():
    callers = Callers(None, max_outstanding=10)
    a, b = callers.identify(b"tml-a"), callers.identify(b"tml-b")
    assert a is not None and b is not None and a.name != b.name
    assert a.name.startswith("anon-") and "tml" not in a.name
    assert callers.identify(b"tml-a") is a
    assert callers.identify(b"tml-") is None and callers.identify(b"sk-1") is None
    assert callers.share is None  # anyone can mint keys: no share unless asked for


def test_a_reload_that_does_not_parse_keeps_the_callers_before(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text(f"alice {ALICE}\nbob {BOB}\n")
    callers = Callers(str(path), max_outstanding=10)
    path.write_text(f"alice {ALICE}\n")
    callers.check()  # the file changed
    assert callers.identify(BOB.encode()) is None and callers.share == 10  # one caller: all
    path.write_text(f"alice {ALICE}\nbroken line here\n")
    with caplog.at_level(logging.ERROR, logger="hotpath.server"):
        callers.check()
    assert "line 2" in caplog.text and "keeping the 1 callers" in caplog.text
    assert callers.identify(ALICE.encode()).name == "alice"
    assert callers.describe()["reload_error"].endswith("got 3 fields")
