"""The idle no-op (KRaft's): an idle leader appends an empty entry every 500 ms, so that followers' apply
lag (nameserver_apply_lag_seconds, from each entry's leader clock) stays meaningful when nothing changes,
and a follower cut off from the leader sees it grow. The server makes it one of the node's leader duties
(nameserver/core/leaderduties.py) whenever [raft] idle_noop_ms is set (deploy/ sets it with the metrics endpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from raftlog.log import ReplicatedLog
from raftlog.proposer import ProposalError

log = logging.getLogger("nameserver.core.idlenoop")

IDLE_NOOP_S = 0.5  # KRaft's metadata.max.idle.interval.ms default


class IdleNoop:
    """Leader only: append an empty entry when nothing has been applied for `interval_s` (KRaft)."""

    def __init__(self, rlog: ReplicatedLog, interval_s: float = IDLE_NOOP_S,
                 on_noop: Callable[[], None] | None = None) -> None:
        self.log = rlog
        self.interval_s = interval_s
        self.on_noop = on_noop  # told of each committed no-op (the metrics count them)

    @property
    def check_every_s(self) -> float:
        """How often to call tick(): often enough that the gap between entries stays near interval_s."""
        return min(0.1, self.interval_s)

    def tick(self) -> bool:
        """One check; True when a no-op was committed."""
        rlog = self.log
        if not (rlog.is_leader() and rlog.ready and rlog.has_quorum):
            return False  # a leader without a majority would only pile up uncommitted entries
        if rlog.stats().seconds_since_apply < self.interval_s:
            return False
        try:
            rlog.barrier(max(1.0, 4 * self.interval_s))
        except ProposalError as exc:
            log.debug("idle no-op not committed: %s", exc)
            return False
        if self.on_noop is not None:
            self.on_noop()
        return True
