"""Comparing two MetadataStates, and the snapshot round trips a state must survive."""

from __future__ import annotations

import functools
import tempfile
from typing import Any

import lmdb

from nameserver.pb import api_pb2
from nameserver.state import MetadataState
from raftlog.digest import digest_hex, digest_of
from snapshot import SnapshotStore


def reads(state: MetadataState, versions: bool = True) -> dict[str, Any]:
    """Every read the service offers, as comparable values (the digest covers only the raw map).

    versions=False leaves out key versions: they are offsets, so they depend on the order of writes."""
    out: dict[str, Any] = {
        "digest": state.digest_hex,
        "cluster": state.cluster_info().SerializeToString(deterministic=True),
        "kv": {ns: state.kv_list(ns) for ns in state.kv_namespaces()},
        "lives": [(a, lv.SerializeToString(deterministic=True), v if versions else 0)
                  for a, lv, v in state.live_addrs()],
    }
    for kind in api_pb2.TopicListKind.values():
        out[f"list/{kind}"] = [state.topic_list(kind, c) for c in ["", *state.cluster_names()]]
    for topic in state.topic_list(api_pb2.TOPIC_LIST_ALL):
        route = state.route(topic, order_message_enable=True)
        out[f"route/{topic}"] = route.SerializeToString(deterministic=True) if route else None
        out[f"bind/{topic}"] = [(b.owner, b.epoch, b.version if versions else 0) for b in state.bindings(topic)]
    for name in state.broker_names():
        out[f"topics/{name}"] = state.broker_topics(name)
        out[f"group/{name}"] = state.broker_member_group("", name).SerializeToString(deterministic=True)
    return out


def digest_matches_items(state: MetadataState) -> bool:
    """The incrementally kept digest equals the one computed from scratch over the live pairs."""
    return digest_hex(digest_of((k, v) for k, v, _ver, _t in state.kv.items())) == state.digest_hex


def restored_in_memory(state: MetadataState) -> MetadataState:
    out = MetadataState()
    out.restore(state.offset, list(state.kv.items()))
    return out


def restored_from_lmdb(state: MetadataState) -> MetadataState:
    """Through a real snapshot file, as a restarting node loads it."""
    with tempfile.TemporaryDirectory(prefix="fuzz-snap-") as tmp:
        store = SnapshotStore(tmp)
        frozen = state.kv.freeze()
        items = ((k, v, ver, t) for k, (v, ver, t) in sorted(frozen.items()))
        info = store.write(max(state.offset, 1), 1, state.digest_hex, items)
        _, loaded = store.load(info.path)
        out = MetadataState()
        out.restore(state.offset, list(loaded))
    return out


@functools.cache
def snapshot_max_key() -> int:
    """The longest key the snapshot store (LMDB) can hold, asked of LMDB itself."""
    with tempfile.TemporaryDirectory(prefix="fuzz-lmdb-") as tmp:
        env = lmdb.open(tmp, map_size=1 << 20)
        try:
            return env.max_key_size()
        finally:
            env.close()


def oversized_keys(state: MetadataState) -> list[str]:
    """State keys no snapshot could hold (each one makes every later snapshot fail)."""
    limit = snapshot_max_key()
    return [k for k, _v, _ver, _t in state.kv.items() if len(k.encode()) > limit]
