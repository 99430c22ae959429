from nameserver.pb import state_pb2 as _state_pb2
from nameserver.pb import shards_pb2 as _shards_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicListKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPIC_LIST_ALL: _ClassVar[TopicListKind]
    TOPIC_LIST_BY_CLUSTER: _ClassVar[TopicListKind]
    TOPIC_LIST_SYSTEM: _ClassVar[TopicListKind]
    TOPIC_LIST_UNIT: _ClassVar[TopicListKind]
    TOPIC_LIST_HAS_UNIT_SUB: _ClassVar[TopicListKind]
    TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT: _ClassVar[TopicListKind]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNKNOWN: _ClassVar[Role]
    ROLE_FOLLOWER: _ClassVar[Role]
    ROLE_CANDIDATE: _ClassVar[Role]
    ROLE_LEADER: _ClassVar[Role]
    ROLE_REPLICA: _ClassVar[Role]

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINEARIZABLE: _ClassVar[Consistency]
    SERIALIZABLE: _ClassVar[Consistency]
TOPIC_LIST_ALL: TopicListKind
TOPIC_LIST_BY_CLUSTER: TopicListKind
TOPIC_LIST_SYSTEM: TopicListKind
TOPIC_LIST_UNIT: TopicListKind
TOPIC_LIST_HAS_UNIT_SUB: TopicListKind
TOPIC_LIST_HAS_UNIT_SUB_NOT_UNIT: TopicListKind
ROLE_UNKNOWN: Role
ROLE_FOLLOWER: Role
ROLE_CANDIDATE: Role
ROLE_LEADER: Role
ROLE_REPLICA: Role
LINEARIZABLE: Consistency
SERIALIZABLE: Consistency

class AssignSetRequest(_message.Message):
    __slots__ = ("broker_name", "cluster_name", "pin", "group")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    cluster_name: str
    pin: bool
    group: int
    def __init__(self, broker_name: _Optional[str] = ..., cluster_name: _Optional[str] = ..., pin: _Optional[bool] = ..., group: _Optional[int] = ...) -> None: ...

class ProposeStepRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: bytes
    def __init__(self, batch: _Optional[bytes] = ...) -> None: ...

class WriteReply(_message.Message):
    __slots__ = ("offset", "records", "offsets")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    records: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offset: _Optional[int] = ..., records: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("topic_name", "read_queue_nums", "write_queue_nums", "perm", "topic_sys_flag", "mapping")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    TOPIC_SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int
    mapping: _state_pb2.QueueMapping
    def __init__(self, topic_name: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., topic_sys_flag: _Optional[int] = ..., mapping: _Optional[_Union[_state_pb2.QueueMapping, _Mapping]] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_addr", "broker_id", "ha_server_addr", "heartbeat_timeout_ms", "enable_acting_master", "zone_name", "data_version", "topics", "filter_servers")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HA_SERVER_ADDR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_ACTING_MASTER_FIELD_NUMBER: _ClassVar[int]
    ZONE_NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    FILTER_SERVERS_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    ha_server_addr: str
    heartbeat_timeout_ms: int
    enable_acting_master: bool
    zone_name: str
    data_version: _state_pb2.DataVersion
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    filter_servers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_id: _Optional[int] = ..., ha_server_addr: _Optional[str] = ..., heartbeat_timeout_ms: _Optional[int] = ..., enable_acting_master: _Optional[bool] = ..., zone_name: _Optional[str] = ..., data_version: _Optional[_Union[_state_pb2.DataVersion, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ..., filter_servers: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicConfigs(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicConfig]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicConfig, _Mapping]]] = ...) -> None: ...

class RegisterBrokerChunk(_message.Message):
    __slots__ = ("header", "topics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    header: RegisterBrokerRequest
    topics: TopicConfigs
    def __init__(self, header: _Optional[_Union[RegisterBrokerRequest, _Mapping]] = ..., topics: _Optional[_Union[TopicConfigs, _Mapping]] = ...) -> None: ...

class RegisterBrokerReply(_message.Message):
    __slots__ = ("offset", "records", "master_addr", "ha_server_addr", "order_topic_config", "order_topic_config_exists", "offsets")
    class OrderTopicConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    HA_SERVER_ADDR_FIELD_NUMBER: _ClassVar[int]
    ORDER_TOPIC_CONFIG_FIELD_NUMBER: _ClassVar[int]
    ORDER_TOPIC_CONFIG_EXISTS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    records: int
    master_addr: str
    ha_server_addr: str
    order_topic_config: _containers.ScalarMap[str, str]
    order_topic_config_exists: bool
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offset: _Optional[int] = ..., records: _Optional[int] = ..., master_addr: _Optional[str] = ..., ha_server_addr: _Optional[str] = ..., order_topic_config: _Optional[_Mapping[str, str]] = ..., order_topic_config_exists: _Optional[bool] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_addr", "broker_id")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_id: _Optional[int] = ...) -> None: ...

class BrokerHeartbeat(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_addr", "channel_node", "channel_closed")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NODE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_CLOSED_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_addr: str
    channel_node: str
    channel_closed: bool
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_addr: _Optional[str] = ..., channel_node: _Optional[str] = ..., channel_closed: _Optional[bool] = ...) -> None: ...

class BrokerSilences(_message.Message):
    __slots__ = ("broker_addrs", "silent_ms")
    BROKER_ADDRS_FIELD_NUMBER: _ClassVar[int]
    SILENT_MS_FIELD_NUMBER: _ClassVar[int]
    broker_addrs: _containers.RepeatedScalarFieldContainer[str]
    silent_ms: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_addrs: _Optional[_Iterable[str]] = ..., silent_ms: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("heartbeats", "want_silences", "handover")
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    WANT_SILENCES_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_FIELD_NUMBER: _ClassVar[int]
    heartbeats: _containers.RepeatedCompositeFieldContainer[BrokerHeartbeat]
    want_silences: bool
    handover: BrokerSilences
    def __init__(self, heartbeats: _Optional[_Iterable[_Union[BrokerHeartbeat, _Mapping]]] = ..., want_silences: _Optional[bool] = ..., handover: _Optional[_Union[BrokerSilences, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("unknown_addrs", "data_versions", "silences", "silences_from_leader")
    class DataVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _state_pb2.DataVersion
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_state_pb2.DataVersion, _Mapping]] = ...) -> None: ...
    UNKNOWN_ADDRS_FIELD_NUMBER: _ClassVar[int]
    DATA_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SILENCES_FIELD_NUMBER: _ClassVar[int]
    SILENCES_FROM_LEADER_FIELD_NUMBER: _ClassVar[int]
    unknown_addrs: _containers.RepeatedScalarFieldContainer[str]
    data_versions: _containers.MessageMap[str, _state_pb2.DataVersion]
    silences: BrokerSilences
    silences_from_leader: bool
    def __init__(self, unknown_addrs: _Optional[_Iterable[str]] = ..., data_versions: _Optional[_Mapping[str, _state_pb2.DataVersion]] = ..., silences: _Optional[_Union[BrokerSilences, _Mapping]] = ..., silences_from_leader: _Optional[bool] = ...) -> None: ...

class GetRouteRequest(_message.Message):
    __slots__ = ("topic", "min_offset", "zone_name", "min_offsets")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ZONE_NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    min_offset: int
    zone_name: str
    min_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., min_offset: _Optional[int] = ..., zone_name: _Optional[str] = ..., min_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("broker_datas", "queue_datas", "filter_server_table", "order_topic_conf")
    class FilterServerTableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _state_pb2.FilterServers
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_state_pb2.FilterServers, _Mapping]] = ...) -> None: ...
    BROKER_DATAS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DATAS_FIELD_NUMBER: _ClassVar[int]
    FILTER_SERVER_TABLE_FIELD_NUMBER: _ClassVar[int]
    ORDER_TOPIC_CONF_FIELD_NUMBER: _ClassVar[int]
    broker_datas: _containers.RepeatedCompositeFieldContainer[_state_pb2.BrokerData]
    queue_datas: _containers.RepeatedCompositeFieldContainer[_state_pb2.QueueData]
    filter_server_table: _containers.MessageMap[str, _state_pb2.FilterServers]
    order_topic_conf: str
    def __init__(self, broker_datas: _Optional[_Iterable[_Union[_state_pb2.BrokerData, _Mapping]]] = ..., queue_datas: _Optional[_Iterable[_Union[_state_pb2.QueueData, _Mapping]]] = ..., filter_server_table: _Optional[_Mapping[str, _state_pb2.FilterServers]] = ..., order_topic_conf: _Optional[str] = ...) -> None: ...

class GetRouteReply(_message.Message):
    __slots__ = ("route", "apply_offset", "offsets")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    route: TopicRoute
    apply_offset: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, route: _Optional[_Union[TopicRoute, _Mapping]] = ..., apply_offset: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class GetClusterInfoRequest(_message.Message):
    __slots__ = ("min_offset", "min_offsets")
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    min_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, min_offset: _Optional[int] = ..., min_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class BrokerNames(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class GetClusterInfoReply(_message.Message):
    __slots__ = ("broker_addr_table", "cluster_addr_table", "apply_offset", "offsets")
    class BrokerAddrTableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _state_pb2.BrokerData
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_state_pb2.BrokerData, _Mapping]] = ...) -> None: ...
    class ClusterAddrTableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BrokerNames
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BrokerNames, _Mapping]] = ...) -> None: ...
    BROKER_ADDR_TABLE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ADDR_TABLE_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    broker_addr_table: _containers.MessageMap[str, _state_pb2.BrokerData]
    cluster_addr_table: _containers.MessageMap[str, BrokerNames]
    apply_offset: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_addr_table: _Optional[_Mapping[str, _state_pb2.BrokerData]] = ..., cluster_addr_table: _Optional[_Mapping[str, BrokerNames]] = ..., apply_offset: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class GetTopicListRequest(_message.Message):
    __slots__ = ("kind", "cluster_name", "min_offset")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    kind: TopicListKind
    cluster_name: str
    min_offset: int
    def __init__(self, kind: _Optional[_Union[TopicListKind, str]] = ..., cluster_name: _Optional[str] = ..., min_offset: _Optional[int] = ...) -> None: ...

class GetTopicListReply(_message.Message):
    __slots__ = ("topics", "apply_offset")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    apply_offset: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class GetBrokerMemberGroupRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "min_offset")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    min_offset: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., min_offset: _Optional[int] = ...) -> None: ...

class GetBrokerMemberGroupReply(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "addrs", "apply_offset")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    addrs: _containers.RepeatedCompositeFieldContainer[_state_pb2.BrokerAddr]
    apply_offset: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., addrs: _Optional[_Iterable[_Union[_state_pb2.BrokerAddr, _Mapping]]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class PutKvRequest(_message.Message):
    __slots__ = ("namespace", "key", "value")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    value: str
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class GetKvRequest(_message.Message):
    __slots__ = ("namespace", "key", "min_offset")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    min_offset: int
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., min_offset: _Optional[int] = ...) -> None: ...

class GetKvReply(_message.Message):
    __slots__ = ("value", "apply_offset")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    value: str
    apply_offset: int
    def __init__(self, value: _Optional[str] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class DeleteKvRequest(_message.Message):
    __slots__ = ("namespace", "key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class ListKvRequest(_message.Message):
    __slots__ = ("namespace", "min_offset")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    min_offset: int
    def __init__(self, namespace: _Optional[str] = ..., min_offset: _Optional[int] = ...) -> None: ...

class ListKvReply(_message.Message):
    __slots__ = ("table", "apply_offset", "namespace_exists")
    class TableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_EXISTS_FIELD_NUMBER: _ClassVar[int]
    table: _containers.ScalarMap[str, str]
    apply_offset: int
    namespace_exists: bool
    def __init__(self, table: _Optional[_Mapping[str, str]] = ..., apply_offset: _Optional[int] = ..., namespace_exists: _Optional[bool] = ...) -> None: ...

class UpdateSettingsRequest(_message.Message):
    __slots__ = ("settings",)
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.ScalarMap[str, str]
    def __init__(self, settings: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetSettingsRequest(_message.Message):
    __slots__ = ("min_offset",)
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    def __init__(self, min_offset: _Optional[int] = ...) -> None: ...

class GetSettingsReply(_message.Message):
    __slots__ = ("settings", "stored", "apply_offset")
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.ScalarMap[str, bool]
    stored: _containers.RepeatedScalarFieldContainer[str]
    apply_offset: int
    def __init__(self, settings: _Optional[_Mapping[str, bool]] = ..., stored: _Optional[_Iterable[str]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class BrokerPermRequest(_message.Message):
    __slots__ = ("broker_name",)
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    def __init__(self, broker_name: _Optional[str] = ...) -> None: ...

class BrokerPermReply(_message.Message):
    __slots__ = ("topic_count", "offset")
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic_count: int
    offset: int
    def __init__(self, topic_count: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class RegisterTopicRequest(_message.Message):
    __slots__ = ("topic", "queue_datas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DATAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_datas: _containers.RepeatedCompositeFieldContainer[_state_pb2.QueueData]
    def __init__(self, topic: _Optional[str] = ..., queue_datas: _Optional[_Iterable[_Union[_state_pb2.QueueData, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic", "cluster_name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    cluster_name: str
    def __init__(self, topic: _Optional[str] = ..., cluster_name: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "grpc_addr", "role", "leader_id", "leader_grpc_addr", "term", "end_offset", "commit_offset", "apply_offset", "digest", "ready", "snapshot_offset", "keys", "has_quorum", "apply_error", "read_replicas", "following", "lag", "not_ready_reason", "groups", "grpc_front")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    HAS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    APPLY_ERROR_FIELD_NUMBER: _ClassVar[int]
    READ_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    NOT_READY_REASON_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GRPC_FRONT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_addr: str
    role: Role
    leader_id: str
    leader_grpc_addr: str
    term: int
    end_offset: int
    commit_offset: int
    apply_offset: int
    digest: str
    ready: bool
    snapshot_offset: int
    keys: int
    has_quorum: bool
    apply_error: str
    read_replicas: _containers.RepeatedScalarFieldContainer[str]
    following: str
    lag: int
    not_ready_reason: str
    groups: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    grpc_front: GrpcFront
    def __init__(self, node_id: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., leader_id: _Optional[str] = ..., leader_grpc_addr: _Optional[str] = ..., term: _Optional[int] = ..., end_offset: _Optional[int] = ..., commit_offset: _Optional[int] = ..., apply_offset: _Optional[int] = ..., digest: _Optional[str] = ..., ready: _Optional[bool] = ..., snapshot_offset: _Optional[int] = ..., keys: _Optional[int] = ..., has_quorum: _Optional[bool] = ..., apply_error: _Optional[str] = ..., read_replicas: _Optional[_Iterable[str]] = ..., following: _Optional[str] = ..., lag: _Optional[int] = ..., not_ready_reason: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., grpc_front: _Optional[_Union[GrpcFront, _Mapping]] = ...) -> None: ...

class GrpcFront(_message.Message):
    __slots__ = ("pid", "up", "restarts")
    PID_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    up: bool
    restarts: int
    def __init__(self, pid: _Optional[int] = ..., up: _Optional[bool] = ..., restarts: _Optional[int] = ...) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "grpc_addr", "is_self", "is_leader", "connected", "match_offset")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    IS_SELF_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MATCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_addr: str
    is_self: bool
    is_leader: bool
    connected: bool
    match_offset: int
    def __init__(self, node_id: _Optional[str] = ..., grpc_addr: _Optional[str] = ..., is_self: _Optional[bool] = ..., is_leader: _Optional[bool] = ..., connected: _Optional[bool] = ..., match_offset: _Optional[int] = ...) -> None: ...

class MembersReply(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class TakeSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TakeSnapshotReply(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class MemberChangeRequest(_message.Message):
    __slots__ = ("node_id", "grpc_addr")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    grpc_addr: str
    def __init__(self, node_id: _Optional[str] = ..., grpc_addr: _Optional[str] = ...) -> None: ...

class MemberChangeReply(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class TransferLeadershipReply(_message.Message):
    __slots__ = ("leader_id",)
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    def __init__(self, leader_id: _Optional[str] = ...) -> None: ...

class QueueBinding(_message.Message):
    __slots__ = ("topic", "queue_id", "owner", "epoch", "version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    owner: str
    epoch: int
    version: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class BindQueueRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "owner", "expected_version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    owner: str
    expected_version: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., owner: _Optional[str] = ..., expected_version: _Optional[int] = ...) -> None: ...

class ReleaseQueueRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "expected_version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    expected_version: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., expected_version: _Optional[int] = ...) -> None: ...

class BindingReply(_message.Message):
    __slots__ = ("offset", "binding")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    offset: int
    binding: QueueBinding
    def __init__(self, offset: _Optional[int] = ..., binding: _Optional[_Union[QueueBinding, _Mapping]] = ...) -> None: ...

class GetBindingRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "consistency", "min_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    consistency: Consistency
    min_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., min_offset: _Optional[int] = ...) -> None: ...

class GetBindingReply(_message.Message):
    __slots__ = ("found", "binding", "apply_offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    binding: QueueBinding
    apply_offset: int
    def __init__(self, found: _Optional[bool] = ..., binding: _Optional[_Union[QueueBinding, _Mapping]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class ListBindingsRequest(_message.Message):
    __slots__ = ("topic", "consistency", "min_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consistency: Consistency
    min_offset: int
    def __init__(self, topic: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., min_offset: _Optional[int] = ...) -> None: ...

class ListBindingsReply(_message.Message):
    __slots__ = ("bindings", "apply_offset")
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[QueueBinding]
    apply_offset: int
    def __init__(self, bindings: _Optional[_Iterable[_Union[QueueBinding, _Mapping]]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class ReadIndexRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadIndexReply(_message.Message):
    __slots__ = ("read_index",)
    READ_INDEX_FIELD_NUMBER: _ClassVar[int]
    read_index: int
    def __init__(self, read_index: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("key_prefixes", "topics", "start_offset", "progress_interval_ms")
    KEY_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    key_prefixes: _containers.RepeatedScalarFieldContainer[str]
    topics: _containers.RepeatedScalarFieldContainer[str]
    start_offset: int
    progress_interval_ms: int
    def __init__(self, key_prefixes: _Optional[_Iterable[str]] = ..., topics: _Optional[_Iterable[str]] = ..., start_offset: _Optional[int] = ..., progress_interval_ms: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "deleted", "key", "value", "version")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    type: int
    deleted: bool
    key: str
    value: bytes
    version: int
    def __init__(self, type: _Optional[int] = ..., deleted: _Optional[bool] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("offset", "events", "initial_state", "initial_state_done")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_DONE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    initial_state: bool
    initial_state_done: bool
    def __init__(self, offset: _Optional[int] = ..., events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ..., initial_state: _Optional[bool] = ..., initial_state_done: _Optional[bool] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("from_offset", "to_offset", "max_batch")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    to_offset: int
    max_batch: int
    def __init__(self, from_offset: _Optional[int] = ..., to_offset: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("offset", "term", "entry")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    offset: int
    term: int
    entry: bytes
    def __init__(self, offset: _Optional[int] = ..., term: _Optional[int] = ..., entry: _Optional[bytes] = ...) -> None: ...

class LogBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ...) -> None: ...

class DumpStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DigestAtRequest(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class DigestAtReply(_message.Message):
    __slots__ = ("offset", "digest", "apply_offset", "first_kept")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FIRST_KEPT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    digest: str
    apply_offset: int
    first_kept: int
    def __init__(self, offset: _Optional[int] = ..., digest: _Optional[str] = ..., apply_offset: _Optional[int] = ..., first_kept: _Optional[int] = ...) -> None: ...

class StateItem(_message.Message):
    __slots__ = ("key", "value", "version", "type")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    version: int
    type: int
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ..., type: _Optional[int] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("items", "apply_offset", "digest")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StateItem]
    apply_offset: int
    digest: str
    def __init__(self, items: _Optional[_Iterable[_Union[StateItem, _Mapping]]] = ..., apply_offset: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class FollowRequest(_message.Message):
    __slots__ = ("from_offset",)
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    def __init__(self, from_offset: _Optional[int] = ...) -> None: ...

class FollowMessage(_message.Message):
    __slots__ = ("snapshot", "snapshot_done", "entries", "through_offset", "core_offset")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_DONE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    THROUGH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CORE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    snapshot: StateChunk
    snapshot_done: bool
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    through_offset: int
    core_offset: int
    def __init__(self, snapshot: _Optional[_Union[StateChunk, _Mapping]] = ..., snapshot_done: _Optional[bool] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ..., through_offset: _Optional[int] = ..., core_offset: _Optional[int] = ...) -> None: ...

class BrokerSetRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "consistency")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    consistency: Consistency
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class ApplyBrokerIdRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_id", "register_check_code")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTER_CHECK_CODE_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., register_check_code: _Optional[str] = ...) -> None: ...

class ControllerRegisterRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_id", "broker_address")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_address: str
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., broker_address: _Optional[str] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_id", "designate_elect")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGNATE_ELECT_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_id: int
    designate_elect: bool
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., designate_elect: _Optional[bool] = ...) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("broker_name", "master_id", "master_epoch", "sync_state_set", "sync_state_set_epoch")
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    master_id: int
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    def __init__(self, broker_name: _Optional[str] = ..., master_id: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ...) -> None: ...

class CleanBrokerDataRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_ids", "clean_living_broker")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    CLEAN_LIVING_BROKER_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_ids: _containers.RepeatedScalarFieldContainer[int]
    clean_living_broker: bool
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_ids: _Optional[_Iterable[int]] = ..., clean_living_broker: _Optional[bool] = ...) -> None: ...

class ControllerReplicaView(_message.Message):
    __slots__ = ("broker_id", "address", "alive", "in_sync")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    address: str
    alive: bool
    in_sync: bool
    def __init__(self, broker_id: _Optional[int] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class BrokerSetView(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "master_id", "master_address", "master_epoch", "sync_state_set", "sync_state_set_epoch", "replicas", "next_broker_id")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    master_id: int
    master_address: str
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    replicas: _containers.RepeatedCompositeFieldContainer[ControllerReplicaView]
    next_broker_id: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., master_id: _Optional[int] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ControllerReplicaView, _Mapping]]] = ..., next_broker_id: _Optional[int] = ...) -> None: ...

class ControllerReply(_message.Message):
    __slots__ = ("code", "remark", "offset", "set", "next_broker_id", "set_version")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REMARK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    NEXT_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    SET_VERSION_FIELD_NUMBER: _ClassVar[int]
    code: int
    remark: str
    offset: int
    set: BrokerSetView
    next_broker_id: int
    set_version: int
    def __init__(self, code: _Optional[int] = ..., remark: _Optional[str] = ..., offset: _Optional[int] = ..., set: _Optional[_Union[BrokerSetView, _Mapping]] = ..., next_broker_id: _Optional[int] = ..., set_version: _Optional[int] = ...) -> None: ...

class ListBrokerSetsRequest(_message.Message):
    __slots__ = ("broker_names", "consistency")
    BROKER_NAMES_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    broker_names: _containers.RepeatedScalarFieldContainer[str]
    consistency: Consistency
    def __init__(self, broker_names: _Optional[_Iterable[str]] = ..., consistency: _Optional[_Union[Consistency, str]] = ...) -> None: ...

class ListBrokerSetsReply(_message.Message):
    __slots__ = ("sets", "apply_offset")
    SETS_FIELD_NUMBER: _ClassVar[int]
    APPLY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    sets: _containers.RepeatedCompositeFieldContainer[BrokerSetView]
    apply_offset: int
    def __init__(self, sets: _Optional[_Iterable[_Union[BrokerSetView, _Mapping]]] = ..., apply_offset: _Optional[int] = ...) -> None: ...

class ControllerHeartbeatRequest(_message.Message):
    __slots__ = ("cluster_name", "broker_name", "broker_address", "broker_id", "epoch", "max_offset", "confirm_offset", "timeout_ms", "election_priority")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int
    epoch: int
    max_offset: int
    confirm_offset: int
    timeout_ms: int
    election_priority: int
    def __init__(self, cluster_name: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_address: _Optional[str] = ..., broker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirm_offset: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., election_priority: _Optional[int] = ...) -> None: ...

class ControllerHeartbeatReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControllerLeaderRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControllerLeaderReply(_message.Message):
    __slots__ = ("leader_id", "leader_address", "is_leader", "peers")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    leader_address: str
    is_leader: bool
    peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., peers: _Optional[_Iterable[str]] = ...) -> None: ...
