from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_PUT: _ClassVar[Op]
    OP_DELETE: _ClassVar[Op]
OP_PUT: Op
OP_DELETE: Op

class Record(_message.Message):
    __slots__ = ("type", "op", "key", "value")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    type: int
    op: Op
    key: str
    value: bytes
    def __init__(self, type: _Optional[int] = ..., op: _Optional[_Union[Op, str]] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Precondition(_message.Message):
    __slots__ = ("key", "version")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("request_id", "preconditions", "records")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRECONDITIONS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    preconditions: _containers.RepeatedCompositeFieldContainer[Precondition]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, request_id: _Optional[str] = ..., preconditions: _Optional[_Iterable[_Union[Precondition, _Mapping]]] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("format", "term", "leader_time_ms", "batches")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    format: int
    term: int
    leader_time_ms: int
    batches: _containers.RepeatedCompositeFieldContainer[Batch]
    def __init__(self, format: _Optional[int] = ..., term: _Optional[int] = ..., leader_time_ms: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[Batch, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("applied", "failed_key", "failed_key_version")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    FAILED_KEY_FIELD_NUMBER: _ClassVar[int]
    FAILED_KEY_VERSION_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    failed_key: str
    failed_key_version: int
    def __init__(self, applied: _Optional[bool] = ..., failed_key: _Optional[str] = ..., failed_key_version: _Optional[int] = ...) -> None: ...
