"""RocketMQ remoting constants: request codes the nameserver serves, response codes, flag bits."""

from __future__ import annotations

# ---- request codes (RocketMQ RequestCode) ----------------------------------------------------------
PUT_KV_CONFIG = 100
GET_KV_CONFIG = 101
DELETE_KV_CONFIG = 102
REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
WIPE_WRITE_PERM_OF_BROKER = 205
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
DELETE_TOPIC_IN_NAMESRV = 216
REGISTER_TOPIC_IN_NAMESRV = 217
GET_KVLIST_BY_NAMESPACE = 219
GET_TOPICS_BY_CLUSTER = 224
GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
GET_UNIT_TOPIC_LIST = 311
GET_HAS_UNIT_SUB_TOPIC_LIST = 312
GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
UPDATE_NAMESRV_CONFIG = 318
GET_NAMESRV_CONFIG = 319
QUERY_DATA_VERSION = 322
ADD_WRITE_PERM_OF_BROKER = 327
GET_BROKER_MEMBER_GROUP = 901
BROKER_HEARTBEAT = 904

# ---- response codes (RocketMQ ResponseCode) --------------------------------------------------------
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
QUERY_NOT_FOUND = 22

# ---- header flag bits ------------------------------------------------------------------------------
FLAG_RESPONSE = 1 << 0
FLAG_ONEWAY = 1 << 1

# ---- header serialization types (top byte of the header-length word) -------------------------------
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

# RocketMQ LanguageCode: the binary header carries the ordinal, the JSON header the name.
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP",
             "OMS", "RUST", "NODE_JS")

# MQVersion.Version.V4_9_4.ordinal(): clients at or above it get standard JSON route bodies.
STANDARD_JSON_MIN_VERSION = 401
V5_0_0 = 413  # MQVersion.Version.V5_0_0.ordinal(): clients and brokers of the 5.x line send this or more
# The version we stamp on responses (RocketMQ 5.3.x; clients do not interpret it).
SERVER_VERSION = 479
