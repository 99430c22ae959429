"""Encoded route bodies, kept per (topic, JSON dialect) and reused while the route is the same.

Encoding a route as RocketMQ's JSON costs several times what reading the route does (the sorted writer
of jsonfmt.py), and a route changes rarely while clients ask for it every 30 s each. The cache is keyed
by the route's own protobuf bytes, so it needs no invalidation: a changed route has other bytes and is
encoded afresh; an entry can only ever return the body of exactly the route it was made from. Bounded
(oldest entries go first); safe across threads (one dict operation each, the GIL's atomicity).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

DEFAULT_ENTRIES = 4096


class BodyCache:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[str, bool], tuple[bytes, bytes]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, topic: str, fastjson: bool, route_bytes: bytes, encode: Callable[[], bytes]) -> bytes:
        """The body for this route: cached when `route_bytes` are the ones it was encoded from."""
        key = (topic, fastjson)
        found = self._entries.get(key)
        if found is not None and found[0] == route_bytes:
            self.hits += 1
            return found[1]
        self.misses += 1
        body = encode()
        if len(self._entries) >= self.max_entries and key not in self._entries:
            # emptied or changed meanwhile by another thread: nothing to evict
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del self._entries[next(iter(self._entries))]
        self._entries[key] = (route_bytes, body)
        return body

    def __len__(self) -> int:
        return len(self._entries)
