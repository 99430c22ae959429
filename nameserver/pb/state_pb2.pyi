from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECORD_TYPE_UNSPECIFIED: _ClassVar[RecordType]
    BROKER: _ClassVar[RecordType]
    BROKER_LIVE: _ClassVar[RecordType]
    TOPIC_QUEUE: _ClassVar[RecordType]
    FILTER_SERVER: _ClassVar[RecordType]
    KV_CONFIG: _ClassVar[RecordType]
    QUEUE_BINDING: _ClassVar[RecordType]
    CLIENT_SESSION: _ClassVar[RecordType]
    MEMBER: _ClassVar[RecordType]
    KV_NAMESPACE: _ClassVar[RecordType]
    SETTING: _ClassVar[RecordType]
    CONTROLLER_BROKER_SET: _ClassVar[RecordType]
    SHARD_SET: _ClassVar[RecordType]
RECORD_TYPE_UNSPECIFIED: RecordType
BROKER: RecordType
BROKER_LIVE: RecordType
TOPIC_QUEUE: RecordType
FILTER_SERVER: RecordType
KV_CONFIG: RecordType
QUEUE_BINDING: RecordType
CLIENT_SESSION: RecordType
MEMBER: RecordType
KV_NAMESPACE: RecordType
SETTING: RecordType
CONTROLLER_BROKER_SET: RecordType
SHARD_SET: RecordType

class BrokerAddr(_message.Message):
    __slots__ = ("broker_id", "addr")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    addr: str
    def __init__(self, broker_id: _Optional[int] = ..., addr: _Optional[str] = ...) -> None: ...

class BrokerData(_message.Message):
    __slots__ = ("cluster", "broker_name", "addrs", "enable_acting_master", "zone")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ACTING_MASTER_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    addrs: _containers.RepeatedCompositeFieldContainer[BrokerAddr]
    enable_acting_master: bool
    zone: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., addrs: _Optional[_Iterable[_Union[BrokerAddr, _Mapping]]] = ..., enable_acting_master: _Optional[bool] = ..., zone: _Optional[str] = ...) -> None: ...

class DataVersion(_message.Message):
    __slots__ = ("counter", "timestamp", "state_version")
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    counter: int
    timestamp: int
    state_version: int
    def __init__(self, counter: _Optional[int] = ..., timestamp: _Optional[int] = ..., state_version: _Optional[int] = ...) -> None: ...

class BrokerLive(_message.Message):
    __slots__ = ("cluster", "broker_name", "broker_id", "broker_addr", "ha_server_addr", "data_version", "heartbeat_timeout_ms", "zone")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    HA_SERVER_ADDR_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    ha_server_addr: str
    data_version: DataVersion
    heartbeat_timeout_ms: int
    zone: str
    def __init__(self, cluster: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., broker_addr: _Optional[str] = ..., ha_server_addr: _Optional[str] = ..., data_version: _Optional[_Union[DataVersion, _Mapping]] = ..., heartbeat_timeout_ms: _Optional[int] = ..., zone: _Optional[str] = ...) -> None: ...

class QueueData(_message.Message):
    __slots__ = ("broker_name", "read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag", "mapping")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    TOPIC_SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    mapping: QueueMapping
    def __init__(self, broker_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., topic_sys_flag: _Optional[int] = ..., mapping: _Optional[_Union[QueueMapping, _Mapping]] = ...) -> None: ...

class QueueMapping(_message.Message):
    __slots__ = ("scope", "total_queues", "epoch", "dirty", "curr_id_map")
    class CurrIdMapEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_QUEUES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DIRTY_FIELD_NUMBER: _ClassVar[int]
    CURR_ID_MAP_FIELD_NUMBER: _ClassVar[int]
    scope: str
    total_queues: int
    epoch: int
    dirty: bool
    curr_id_map: _containers.ScalarMap[int, int]
    def __init__(self, scope: _Optional[str] = ..., total_queues: _Optional[int] = ..., epoch: _Optional[int] = ..., dirty: _Optional[bool] = ..., curr_id_map: _Optional[_Mapping[int, int]] = ...) -> None: ...

class FilterServers(_message.Message):
    __slots__ = ("addrs",)
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class KvValue(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: str
    def __init__(self, value: _Optional[str] = ...) -> None: ...

class KvNamespace(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SettingValue(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: str
    def __init__(self, value: _Optional[str] = ...) -> None: ...

class QueueBindingValue(_message.Message):
    __slots__ = ("owner", "epoch")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    owner: str
    epoch: int
    def __init__(self, owner: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ClientSession(_message.Message):
    __slots__ = ("last_seq", "reply", "last_write_ms", "owner", "evicted")
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    LAST_WRITE_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    reply: bytes
    last_write_ms: int
    owner: str
    evicted: bool
    def __init__(self, last_seq: _Optional[int] = ..., reply: _Optional[bytes] = ..., last_write_ms: _Optional[int] = ..., owner: _Optional[str] = ..., evicted: _Optional[bool] = ...) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("grpc_addr",)
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    grpc_addr: str
    def __init__(self, grpc_addr: _Optional[str] = ...) -> None: ...

class ControllerReplica(_message.Message):
    __slots__ = ("broker_id", "address", "register_check_code")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_CHECK_CODE_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    address: str
    register_check_code: str
    def __init__(self, broker_id: _Optional[int] = ..., address: _Optional[str] = ..., register_check_code: _Optional[str] = ...) -> None: ...

class ControllerBrokerSet(_message.Message):
    __slots__ = ("cluster_name", "replicas", "next_broker_id", "master_id", "master_epoch", "sync_state_set", "sync_state_set_epoch")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    replicas: _containers.RepeatedCompositeFieldContainer[ControllerReplica]
    next_broker_id: int
    master_id: int
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    def __init__(self, cluster_name: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ControllerReplica, _Mapping]]] = ..., next_broker_id: _Optional[int] = ..., master_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ...) -> None: ...

class ShardSet(_message.Message):
    __slots__ = ("group", "moving_to", "since", "pinned", "cluster")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MOVING_TO_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    group: int
    moving_to: int
    since: int
    pinned: bool
    cluster: str
    def __init__(self, group: _Optional[int] = ..., moving_to: _Optional[int] = ..., since: _Optional[int] = ..., pinned: _Optional[bool] = ..., cluster: _Optional[str] = ...) -> None: ...
