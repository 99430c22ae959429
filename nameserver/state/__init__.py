"""The nameserver's replicated state (MetadataState) and the leader's request translation."""

from nameserver.state import keys
from nameserver.state.metadata import (
    MASTER_ID,
    ORDER_TOPIC_CONFIG,
    PERM_READ,
    PERM_WRITE,
    SYS_FLAG_UNIT,
    SYS_FLAG_UNIT_SUB,
    MetadataState,
)
from nameserver.state.translate import (
    Translation,
    add_write_perm,
    canonical,
    delete_kv,
    delete_topic,
    expire_broker,
    put_kv,
    register_broker,
    register_topic,
    unregister_broker,
    wipe_write_perm,
)

__all__ = [
    "MASTER_ID",
    "ORDER_TOPIC_CONFIG",
    "PERM_READ",
    "PERM_WRITE",
    "SYS_FLAG_UNIT",
    "SYS_FLAG_UNIT_SUB",
    "MetadataState",
    "Translation",
    "add_write_perm",
    "canonical",
    "delete_kv",
    "delete_topic",
    "expire_broker",
    "keys",
    "put_kv",
    "register_broker",
    "register_topic",
    "unregister_broker",
    "wipe_write_perm",
]
