"""Encode family: a decoded `Completion` into Tinker `SampleResponse` protobuf wire bytes, once.

Contract: `registry.create("encode", name).encode(completion) -> bytes`. Every implementation
produces the reference's (`protobuf`) bytes exactly. The server stores those bytes and serves
them as they are; legacy JSON is derived lazily from them (`proto_to_json`).

Legacy JSON: `proto_to_json(data) -> bytes` uses the first available derivation of
`JSON_PREFERENCE`; `json_implementation(name)` gives a named one. Every derivation matches the
reference (`JSON_REFERENCE`) by parsed value; the JSON's shape is documented in
`impl.encode.tojson_json`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from typing import Protocol

from impl._table import Entry, lookup
from impl.decode import Completion


class Encoder(Protocol):
    def encode(self, completion: Completion) -> bytes: ...


REFERENCE = "protobuf"

IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry(
        "protobuf",
        "impl.encode.protobuf",
        "protobuf messages built from the numpy buffers; the reference",
        ("google.protobuf",),
        "encode",
    ),
    Entry(
        "validated",
        "impl.encode.validated",
        "the old path: pydantic model from Python lists, validated, then protobuf",
        ("google.protobuf", "pydantic"),
        "encode",
    ),
    Entry("wire", "impl.encode.wire", "wire bytes written directly from the raw buffers"),
)

PREFERENCE = ("wire", "protobuf", "validated")

#: Legacy JSON derivations from stored SampleResponse bytes: each module exposes
#: `proto_to_json(data: bytes) -> bytes`. Same row type as IMPLEMENTATIONS, read by the same
#: `impl._table` functions the registry uses (not a pickable family: the server always uses
#: the first available of `JSON_PREFERENCE`).
JSON_REFERENCE = "json"

JSON_IMPLEMENTATIONS: tuple[Entry, ...] = (
    Entry(
        "json",
        "impl.encode.tojson_json",
        "protobuf parse + stdlib json; the reference",
        ("google.protobuf",),
        "encode",
    ),
    Entry(
        "orjson",
        "impl.encode.tojson_orjson",
        "zero-copy wire reader + orjson numpy serialization",
        ("orjson",),
        "fast",
    ),
)

JSON_PREFERENCE = ("orjson", "json")


def _json_entry(name: str) -> Entry:
    return lookup(JSON_IMPLEMENTATIONS, name, "proto->JSON implementation")


def json_unavailable_reason(name: str) -> str | None:
    """Why the proto->JSON derivation `name` cannot run here, or None."""
    return _json_entry(name).unavailable_reason("encode JSON")


@cache
def json_implementation(name: str) -> Callable[[bytes], bytes]:
    """The `proto_to_json` function of derivation `name`; ImportError with the hint if missing."""
    reason = json_unavailable_reason(name)
    if reason is not None:
        raise ImportError(reason)
    return importlib.import_module(_json_entry(name).module).proto_to_json


@cache
def _preferred_json() -> Callable[[bytes], bytes]:
    for name in JSON_PREFERENCE:
        if json_unavailable_reason(name) is None:
            return json_implementation(name)
    raise ImportError(json_unavailable_reason(JSON_REFERENCE))


def proto_to_json(data: bytes) -> bytes:
    """Legacy JSON of stored SampleResponse bytes, by the first available preferred derivation."""
    return _preferred_json()(data)
