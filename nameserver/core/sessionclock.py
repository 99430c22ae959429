"""How long each exactly-once client session has been idle, by this node's monotonic clock.

Session expiry must not trust the wall clock. A leader whose clock steps forward past the TTL (NTP, a VM
resumed, an operator's `date -s`) would expire every session at once, and a client retrying its last
write would then have it applied twice (tests/faults/test_clock.py showed exactly that). So, as etcd
renews its leases on a leader change, a node counts a session idle from the later of: when it last
became leader, and when it last applied a write of that session. Both are monotonic readings of this
node, so no clock step moves them. The records' `last_write_ms` (the leader's wall clock) stays for
people reading the state; it never decides an expiry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from nameserver.state import keys
from raftlog.history import AppliedEntry

# A session key's prefix as an encoded entry holds it (a protobuf string: its UTF-8 bytes, verbatim): an entry whose
# bytes lack it changed no session (a search of its bytes, where a look at each change's key was ~0.1 us a change).
_SESSION_BYTES = keys.SESSION_PREFIX.encode()


class SessionClock:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since = clock()
        self._seen: dict[str, float] = {}  # session id -> when this node applied its last write

    def restart(self) -> None:
        """This node became leader: every session gets a full TTL from now."""
        with self._lock:
            self._since = self._clock()

    def on_entry(self, entry: AppliedEntry) -> None:
        """Apply-thread listener: note the sessions this entry wrote or deleted."""
        if _SESSION_BYTES not in entry.data:
            return  # no key of the entry is a session's (its bytes hold every key as written: most entries)
        now = None
        for _offset, _type, key, _old, new in entry.changes:  # by position: raftlog/kvstate.py Change
            sid = keys.parse_session_key(key) if key.startswith(keys.SESSION_PREFIX) else None
            if sid is not None:
                now = now if now is not None else self._clock()
                with self._lock:
                    if new is None:
                        self._seen.pop(sid, None)
                    else:
                        self._seen[sid] = now

    def idle_ms(self, session_id: str) -> float:
        with self._lock:
            last = max(self._since, self._seen.get(session_id, self._since))
        return (self._clock() - last) * 1000
