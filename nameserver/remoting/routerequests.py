"""Route reads' service requests, made once per (topic, zone name) and reused.

A client asks for the same topics' routes every 30 s each: checking the topic name and building its
GetRouteRequest again for every read was a few percent of a route read's CPU. A request is kept only for
a name that passed the check (a name we refuse is checked every time and kept nowhere, so refused names
cannot fill the table), nor for a zone name longer than MAX_ZONE (the client's own text: kept, 4096 of them
could hold hundreds of MiB), at most `max_entries` of them, the oldest dropped first. The requests handed out
are shared: the service only reads them. Safe across threads (one dict operation each, the GIL's atomicity).
"""

from __future__ import annotations

import contextlib

from nameserver import validation
from nameserver.pb import api_pb2

DEFAULT_ENTRIES = 4096
MAX_ZONE = 256  # characters of a kept request's zone name (zones are short names; a longer one is built each time)


class RouteRequests:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], api_pb2.GetRouteRequest] = {}

    def get(self, topic: str, zone: str) -> api_pb2.GetRouteRequest | None:
        """The request for this topic and zone name; None for a topic name we refuse to store."""
        key = (topic, zone)
        found = self._entries.get(key)
        if found is not None:
            return found
        try:
            validation.check_topic("topic", topic)
        except validation.ValidationError:
            return None
        request = api_pb2.GetRouteRequest(topic=topic, zone_name=zone)
        if len(zone) > MAX_ZONE:
            return request
        if len(self._entries) >= self.max_entries:
            # emptied or changed meanwhile by another thread: nothing to evict
            with contextlib.suppress(StopIteration, KeyError, RuntimeError):
                del self._entries[next(iter(self._entries))]
        self._entries[key] = request
        return request

    def __len__(self) -> int:
        return len(self._entries)
