"""Exactly-once client sessions: who owns them, the per-owner quota, and eviction tombstones.

A session belongs to its owner (the caller's identity, nameserver/api/auth.py session_owner; "" without
auth). The rule, decided by the leader at translation and carried by the log's records, so every
replica holds the same sessions:

- An owner holds at most `per_owner` live sessions (without [auth], the one owner "" holds up to
  `max_sessions`). A write that opens one more evicts one of the owner's
  OWN least recently written sessions (among its 16 oldest), in the same batch. Another owner's
  sessions are never touched.
- Past the node-wide `max_sessions` live sessions, a new session of an owner below its quota is
  refused (RESOURCE_EXHAUSTED naming sessions.max_sessions); nothing is evicted.
- Eviction (and idle expiry) leaves a tombstone: the record stays with `evicted` set, its last
  sequence kept and its reply dropped. A retry of a sequence <= that last sequence is refused as
  evicted (its reply is gone, and whether it applied cannot be told from a first attempt); a higher
  sequence is a new write, which opens the session again.
- Tombstones are bounded too: at most `per_owner` per owner (the owner's oldest goes first), and each
  is deleted once idle for the session TTL. A retry that arrives after its tombstone is gone cannot be
  told from a new session's first write: that horizon is the TTL, or `per_owner` later evictions of
  the same owner's own sessions.
"""

from __future__ import annotations

import itertools
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from nameserver.errors import TooLargeError
from nameserver.pb import state_pb2
from nameserver.state import keys
from raftlog.pb import entry_pb2

SPREAD = 16  # an eviction picks among this many of the owner's oldest sessions


@dataclass(frozen=True)
class SessionQuota:
    per_owner: int     # [sessions] max_sessions_per_owner: live sessions of one owner
    max_sessions: int  # [sessions] max_sessions: live sessions of all owners

    def of(self, owner: str) -> int:
        """Live sessions `owner` may hold. Without [auth] every caller is the one owner "", so it gets
        the node-wide limit (per-owner quotas need identities to tell tenants apart)."""
        return self.max_sessions if owner == "" else self.per_owner


class SessionBook:
    """The applied sessions, and per owner its live and its evicted ones, least recently written first.

    Derived from the state (fed with every session record's change), so the leader finds an owner's
    oldest session in O(1). The order is the records' write order (their versions)."""

    def __init__(self) -> None:
        self._all: dict[str, state_pb2.ClientSession] = {}
        self._live: dict[str, OrderedDict[str, None]] = {}
        self._evicted: dict[str, OrderedDict[str, None]] = {}
        self.live_total = 0

    def set(self, session_id: str, session: state_pb2.ClientSession | None) -> None:
        """The record of `session_id` was written (None: deleted); it is now the most recent."""
        old = self._all.pop(session_id, None)
        if old is not None:
            self._drop(old, session_id)
        if session is not None:
            self._all[session_id] = session
            table = self._evicted if session.evicted else self._live
            table.setdefault(session.owner, OrderedDict())[session_id] = None
            self.live_total += not session.evicted

    def _drop(self, session: state_pb2.ClientSession, session_id: str) -> None:
        table = self._evicted if session.evicted else self._live
        ids = table.get(session.owner)
        if ids is not None:
            ids.pop(session_id, None)
            if not ids:
                del table[session.owner]
        self.live_total -= not session.evicted

    def reorder(self, version: Callable[[str], int]) -> None:
        """After a restore (records arrive in no order): order each owner's sessions by version."""
        for table in (self._live, self._evicted):
            for owner, ids in table.items():
                table[owner] = OrderedDict((sid, None) for sid in sorted(ids, key=lambda s: (version(s), s)))

    def get(self, session_id: str) -> state_pb2.ClientSession | None:
        return self._all.get(session_id)

    def ids(self) -> list[str]:
        return list(self._all)

    def live(self, owner: str) -> int:
        return len(self._live.get(owner, ()))

    def evicted(self, owner: str) -> int:
        return len(self._evicted.get(owner, ()))

    def oldest(self, owner: str, evicted: bool, other_than: str, count: int = 1) -> list[str]:
        """`count` of the owner's SPREAD least recently written (live or evicted) sessions, picked from a
        hash of `other_than` (the session making room) on: concurrent new sessions of one owner then
        seldom pick the same victim, whose version each batch's precondition holds (one would fail)."""
        table = self._evicted if evicted else self._live
        few = list(itertools.islice((sid for sid in table.get(owner, ()) if sid != other_than),
                                    max(SPREAD, count)))
        if not few:
            return []
        start = zlib.crc32(other_than.encode()) % len(few)
        return [few[(start + i) % len(few)] for i in range(min(count, len(few)))]


def tombstone(session: state_pb2.ClientSession) -> state_pb2.ClientSession:
    """What an evicted or expired session leaves: its last sequence, without the reply."""
    return state_pb2.ClientSession(last_seq=session.last_seq, last_write_ms=session.last_write_ms,
                                   owner=session.owner, evicted=True)


def _guarded(batch: entry_pb2.Batch, session_id: str, version: int) -> str:
    key = keys.session_key(session_id)
    batch.preconditions.add(key=key, version=version)
    return key


def open_session(batch: entry_pb2.Batch, book: SessionBook, version: Callable[[str], int], session_id: str,
                 owner: str, quota: SessionQuota) -> None:
    """Make room for `session_id` (not live now) among its owner's sessions, adding the records to `batch`:
    evict the owner's own oldest live session at its quota, drop its oldest tombstone past the same bound;
    or refuse (TooLargeError) when the node holds max_sessions live sessions and the owner is below quota."""
    reviving = book.get(session_id) is not None  # a tombstone of this very session becomes live again
    tombstones = book.evicted(owner) - reviving
    # Back to the quota: concurrent translations each check the applied state, so an owner can end a
    # few over it (the writes in flight); its next new session brings it back.
    per_owner = quota.of(owner)
    over = book.live(owner) - per_owner + 1
    if over > 0:
        for victim in book.oldest(owner, evicted=False, other_than=session_id, count=over):
            session = book.get(victim)
            if session is not None:
                key = _guarded(batch, victim, version(keys.session_key(victim)))
                batch.records.add(type=keys.SESSION_TYPE, op=entry_pb2.OP_PUT, key=key,
                                  value=tombstone(session).SerializeToString(deterministic=True))
                tombstones += 1
    elif book.live_total >= quota.max_sessions:
        raise TooLargeError("sessions.max_sessions", f"the node holds {book.live_total} exactly-once sessions "
                            f"(limit {quota.max_sessions}); retry without x-client-id or later")
    for dropped in book.oldest(owner, evicted=True, other_than=session_id, count=tombstones - per_owner):
        key = _guarded(batch, dropped, version(keys.session_key(dropped)))
        batch.records.add(type=keys.SESSION_TYPE, op=entry_pb2.OP_DELETE, key=key)


def expiry(book: SessionBook, idle_ms: Callable[[str], float], ttl_ms: int, limit: int
           ) -> list[tuple[str, state_pb2.ClientSession | None]]:
    """Sessions idle past the TTL: (id, its tombstone) for a live one, (id, None: delete) for a tombstone.
    At most `limit`, most idle first."""
    idle = {sid: idle_ms(sid) for sid in book.ids()}
    due = sorted((sid for sid, ms in idle.items() if ms > ttl_ms), key=lambda sid: (-idle[sid], sid))[:limit]
    out: list[tuple[str, state_pb2.ClientSession | None]] = []
    for sid in due:
        session = book.get(sid)
        if session is not None:
            out.append((sid, None if session.evicted else tombstone(session)))
    return out
