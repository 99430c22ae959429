"""One topic's queue datas by broker name, as MetadataState's topic index holds them.

Most topics live on one broker: theirs is a (broker, bytes) pair, and only a topic on several brokers gets
a dict. A one-entry dict cost 217 bytes against the pair's 72: ~140 MiB of each copy of the state at a
million topics, and a node with two worker processes holds three copies (docs/benchmarks.md, "Memory of a
node with workers"). The bytes are the KVState's own (encoded QueueData, decoded on read).
"""

from __future__ import annotations

Queues = tuple[str, bytes] | dict[str, bytes]


def put(entry: Queues | None, broker: str, raw: bytes) -> Queues:
    """`entry` with `broker`'s queue data set to `raw` (the entry to keep: it may be a new object)."""
    if entry is None:
        return broker, raw
    if isinstance(entry, tuple):
        if entry[0] == broker:
            return entry[0], raw  # the held name: interned once, not one string per rewrite
        return {entry[0]: entry[1], broker: raw}
    entry[broker] = raw
    return entry


def pop(entry: Queues, broker: str) -> tuple[Queues | None, bytes | None]:
    """(`entry` without `broker`, None when nothing is left; `broker`'s bytes, None when it had none)."""
    if isinstance(entry, tuple):
        return (None, entry[1]) if entry[0] == broker else (entry, None)
    raw = entry.pop(broker, None)
    if len(entry) == 1:
        return next(iter(entry.items())), raw
    return entry or None, raw


def get(entry: Queues | None, broker: str) -> bytes | None:
    if entry is None:
        return None
    if isinstance(entry, tuple):
        return entry[1] if entry[0] == broker else None
    return entry.get(broker)


def by_broker(entry: Queues | None) -> list[tuple[str, bytes]]:
    """(broker, bytes) sorted by broker name."""
    if entry is None:
        return []
    if isinstance(entry, tuple):
        return [entry]
    return sorted(entry.items())


def brokers(entry: Queues | None) -> list[str]:
    """The broker names, sorted."""
    return [broker for broker, _ in by_broker(entry)]
