from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_STOP: _ClassVar[StopReason]
    STOP_REASON_LENGTH: _ClassVar[StopReason]
STOP_REASON_STOP: StopReason
STOP_REASON_LENGTH: StopReason

class SampledSequence(_message.Message):
    __slots__ = ("stop_reason", "tokens", "logprobs")
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    stop_reason: StopReason
    tokens: bytes
    logprobs: bytes
    def __init__(self, stop_reason: _Optional[_Union[StopReason, str]] = ..., tokens: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ...) -> None: ...

class TopkLogprobs(_message.Message):
    __slots__ = ("token_ids", "logprobs", "k", "length")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    logprobs: bytes
    k: int
    length: int
    def __init__(self, token_ids: _Optional[bytes] = ..., logprobs: _Optional[bytes] = ..., k: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("sequences", "prompt_logprobs", "topk_prompt_logprobs")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOPK_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[SampledSequence]
    prompt_logprobs: bytes
    topk_prompt_logprobs: TopkLogprobs
    def __init__(self, sequences: _Optional[_Iterable[_Union[SampledSequence, _Mapping]]] = ..., prompt_logprobs: _Optional[bytes] = ..., topk_prompt_logprobs: _Optional[_Union[TopkLogprobs, _Mapping]] = ...) -> None: ...
