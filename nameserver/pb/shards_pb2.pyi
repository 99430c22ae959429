from nameserver.pb import state_pb2 as _state_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardEntry(_message.Message):
    __slots__ = ("broker_name", "set")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    set: _state_pb2.ShardSet
    def __init__(self, broker_name: _Optional[str] = ..., set: _Optional[_Union[_state_pb2.ShardSet, _Mapping]] = ...) -> None: ...

class ListShardsRequest(_message.Message):
    __slots__ = ("broker_name",)
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    def __init__(self, broker_name: _Optional[str] = ...) -> None: ...

class ListShardsReply(_message.Message):
    __slots__ = ("groups", "sets", "apply_offsets")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SETS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    groups: int
    sets: _containers.RepeatedCompositeFieldContainer[ShardEntry]
    apply_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, groups: _Optional[int] = ..., sets: _Optional[_Iterable[_Union[ShardEntry, _Mapping]]] = ..., apply_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class ShardPlacement(_message.Message):
    __slots__ = ("broker_name", "group")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    group: int
    def __init__(self, broker_name: _Optional[str] = ..., group: _Optional[int] = ...) -> None: ...

class AssignShardReply(_message.Message):
    __slots__ = ("offset", "records")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    records: int
    def __init__(self, offset: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class MoveShardReply(_message.Message):
    __slots__ = ("source", "set", "steps")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    source: int
    set: _state_pb2.ShardSet
    steps: int
    def __init__(self, source: _Optional[int] = ..., set: _Optional[_Union[_state_pb2.ShardSet, _Mapping]] = ..., steps: _Optional[int] = ...) -> None: ...
