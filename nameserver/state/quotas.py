"""What the whole state may hold ([limits] quotas): a write that would cross one is refused at translation.

The leader checks each translated batch against the applied state's totals before proposing it, so a
refused write never enters the log (TooLargeError naming the quota: RESOURCE_EXHAUSTED over gRPC, a
SYSTEM_ERROR with that remark over remoting). Only growth is refused: deleting, and rewriting within
the same size, always pass. Two writes translated at the same time are each checked alone, so the
totals may end a few records over a limit; never by more than what is in flight at once.

    limits.max_queue_datas       topic/ records: one per topic per broker name
    limits.max_brokers           live/ records: registered broker addresses, and shard/ records (a sharded
                                 cluster's directory, in group 0; a moving set's fence, then its tombstone,
                                 in the group it left): a flood of new broker names is refused by group 0
                                 before its directory grows past it
    limits.max_kv_keys           kv/ and kvns/ records: KV config keys and namespaces
    limits.max_kv_bytes          their keys' and values' bytes
    limits.max_controller_sets   ctrl/ records: controller-mode broker sets

Sessions have their own quota (nameserver/state/sessions.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nameserver.errors import TooLargeError
from nameserver.state import keys
from raftlog.kvstate import KVState
from raftlog.pb import entry_pb2

QUEUE_DATAS, BROKERS, KV_KEYS, KV_BYTES, CONTROLLER_SETS = (
    "max_queue_datas", "max_brokers", "max_kv_keys", "max_kv_bytes", "max_controller_sets")
QUOTAS = (QUEUE_DATAS, BROKERS, KV_KEYS, KV_BYTES, CONTROLLER_SETS)
# The counted quota of each key prefix (KV bytes go with KV keys).
_COUNTED = ((keys.TOPIC_PREFIX, QUEUE_DATAS), (keys.LIVE_PREFIX, BROKERS), (keys.KV_PREFIX, KV_KEYS),
            (keys.KV_NAMESPACE_PREFIX, KV_KEYS), (keys.CONTROLLER_PREFIX, CONTROLLER_SETS),
            (keys.SHARD_PREFIX, BROKERS))
_PREFIXES = tuple(prefix for prefix, _ in _COUNTED)
_SIZED = (keys.KV_PREFIX, keys.KV_NAMESPACE_PREFIX)  # counted by bytes too (KV_BYTES)


def _quota_of(key: str) -> str | None:
    if not key.startswith(_PREFIXES):
        return None
    return next(name for prefix, name in _COUNTED if key.startswith(prefix))


def _delta(totals: dict[str, int], name: str, key: str, old: bytes | None, new: bytes | None) -> None:
    totals[name] = totals.get(name, 0) + (new is not None) - (old is not None)
    if name == KV_KEYS:
        size = (len(key) + len(new) if new is not None else 0) - (len(key) + len(old) if old is not None else 0)
        totals[KV_BYTES] = totals.get(KV_BYTES, 0) + size


class Usage:
    """The state's totals per quota, kept by a KVState listener (rebuilt on a restore)."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(QUOTAS, 0)

    def on_change(self, rtype: int, key: str, old: bytes | None, new: bytes | None) -> None:
        del rtype
        if old is not None and new is not None and not key.startswith(_SIZED):
            return  # a rewrite: counts do not move (most changes: every changed registration's records)
        name = _quota_of(key)
        if name is not None:
            _delta(self.totals, name, key, old, new)

    def rebuild(self, topic_keys: int, others: Iterable[tuple[str, bytes]]) -> None:
        """The totals of a restored state (every key at once): `topic_keys`, its topic/ keys' number (the
        restore's own loop counts them: nearly all of a big state, where calling on_change for each of a
        million keys was 1.3 s of a restart's 5, and a pass of its own 0.1 s); `others`, every other
        (key, value). The same counts as on_change gives key by key."""
        totals = dict.fromkeys(QUOTAS, 0)
        for key, value in others:
            name = _quota_of(key)
            if name is not None:
                _delta(totals, name, key, None, value)
        totals[QUEUE_DATAS] += topic_keys
        self.totals = totals


def check(usage: Usage, kv: KVState, batch: entry_pb2.Batch, limits: Mapping[str, int]) -> None:
    """Refuse (TooLargeError naming the quota) a batch that would take a total past its limit."""
    growth: dict[str, int] = {}
    for rec in batch.records[:]:  # sliced: raftlog/kvstate.py KVState.apply_entry says why
        key = rec.key
        if not key.startswith(_PREFIXES):
            continue
        deleted = rec.op == entry_pb2.OP_DELETE
        if not deleted and key in kv and not key.startswith(_SIZED):
            continue  # a rewrite: counts do not move (every record of a changed registration; Usage.on_change)
        name = _quota_of(key)
        if name is not None:
            _delta(growth, name, key, kv.get(key), None if deleted else rec.value)
    for name, grows in growth.items():
        held = usage.totals[name]
        if grows > 0 and held + grows > limits[name]:
            raise TooLargeError(f"limits.{name}", f"the write adds {grows} to {held} held (limit {limits[name]}); "
                                "nothing was written")
