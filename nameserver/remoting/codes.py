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
NOTIFY_MIN_BROKER_ID_CHANGE = 905  # sent to brokers (nameserver/remoting/minbroker.py), never served here

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
SERIALIZE_TYPES = (SERIALIZE_JSON, SERIALIZE_ROCKETMQ)

# RocketMQ LanguageCode: the binary header carries the ordinal, the JSON header the name.
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP",
             "OMS", "RUST", "NODE_JS")

# MQVersion.Version.V4_9_4.ordinal(): clients at or above it get standard JSON route bodies.
STANDARD_JSON_MIN_VERSION = 401
V5_0_0 = 413  # MQVersion.Version.V5_0_0.ordinal(): clients and brokers of the 5.x line send this or more
# The version we stamp on responses (RocketMQ 5.3.x; clients do not interpret it).
SERVER_VERSION = 479

# ---- controller mode (RIP-44): requests to the controller's port, and the push to brokers ----------
CONTROLLER_ALTER_SYNC_STATE_SET = 1001
CONTROLLER_ELECT_MASTER = 1002
CONTROLLER_REGISTER_BROKER = 1003
CONTROLLER_GET_REPLICA_INFO = 1004
CONTROLLER_GET_METADATA_INFO = 1005
CONTROLLER_GET_SYNC_STATE_DATA = 1006
GET_BROKER_EPOCH_CACHE = 1007
NOTIFY_BROKER_ROLE_CHANGED = 1008
UPDATE_CONTROLLER_CONFIG = 1009
GET_CONTROLLER_CONFIG = 1010
CLEAN_BROKER_DATA = 1011
CONTROLLER_GET_NEXT_BROKER_ID = 1012
CONTROLLER_APPLY_BROKER_ID = 1013
CONTROLLER_INVALID_REQUEST = 2005  # the controller's own codes 2000-2016 come from nameserver/state/controller.py
