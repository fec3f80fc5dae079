"""Encode family: a decoded `Completion` into Tinker `SampleResponse` protobuf wire bytes, once.

Contract: `registry.create("encode", name).encode(completion) -> bytes`. Every implementation
produces the reference's (`protobuf`) bytes exactly. The server stores those bytes and serves
them as they are; legacy JSON is derived lazily from them (`proto_to_json`).
"""

from __future__ import annotations

from typing import Protocol

from impl._table import Entry
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
