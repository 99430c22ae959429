"""Computed topic routes, reused while nothing that feeds a route has changed.

Clients ask for every topic's route every 30 s each, and routes change rarely. Building one (decoding
queue datas, copying broker datas, the zone and acting-master views) was the largest part of a route
read's own time. A route is kept per (topic, zone name) with the state's `route_generation` it was
computed at (nameserver/state/metadata.py); any applied record that
feeds some route moves the generation, so a kept route is used only while it is still exactly what the
state would compute. The routes handed out are shared: callers copy them (GetRouteReply(route=...)) and
never change them.

Why a read may skip the state lock on a hit: the apply thread moves the generation before it moves the
apply offset, and the reader reads the offset first, then the generation. A hit therefore holds every
route change up to the offset it is stamped with (perhaps later ones too, which a lower stamp allows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any

MISS = object()
DEFAULT_ENTRIES = 8192

# topic, zone name. The replicated switches a route also depends on (orderMessageEnable,
# supportActingMaster) are setting/ records: changing one moves the generation.
RouteKey = tuple[str, str]


class RouteCache:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[RouteKey, tuple[Hashable, Any]] = {}  # generation: a state's, or a vector of them
        self.hits = 0
        self.misses = 0

    def get(self, key: RouteKey, generation: Hashable) -> Any:
        """The route (or None: no such topic) kept for `key` at `generation`, else MISS."""
        found = self._entries.get(key)
        if found is not None and found[0] == generation:
            self.hits += 1
            return found[1]
        self.misses += 1
        return MISS

    def put(self, key: RouteKey, generation: Hashable, route: Any) -> None:
        """Keep `route` as computed at `generation` (call with the state lock held)."""
        if len(self._entries) >= self.max_entries and key not in self._entries:
            # one dict operation at a time (the GIL's atomicity); an entry that vanished meanwhile is fine
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del self._entries[next(iter(self._entries))]
        self._entries[key] = (generation, route)

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["MISS", "RouteCache", "RouteKey"]
