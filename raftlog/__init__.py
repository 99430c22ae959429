"""The replicated log: record/entry format, pysyncobj binding, group commit, offsets, barrier."""

from raftlog.digest import digest_hex, digest_of, pair_hash
from raftlog.fdreserve import RESERVE as FD_RESERVE
from raftlog.history import AppliedEntry
from raftlog.journal import DurableJournal, JournalCorrupt
from raftlog.kvstate import Change, KVState, KVStateMachine
from raftlog.log import LeaderView, LogConfig, LogStats, ReplicatedLog, Subscription
from raftlog.proposer import NotLeader, ProposalError
from raftlog.roles import Role
from raftlog.seed import seed_from_snapshot

__all__ = [
    "FD_RESERVE", "AppliedEntry", "Change", "DurableJournal", "JournalCorrupt", "KVState", "KVStateMachine",
    "LeaderView", "LogConfig", "LogStats", "NotLeader", "ProposalError", "ReplicatedLog", "Role", "Subscription",
    "digest_hex", "digest_of", "pair_hash", "seed_from_snapshot",
]
