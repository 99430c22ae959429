"""The replicated log: record/entry format, pysyncobj binding, group commit, offsets, barrier."""

from raftlog.digest import digest_hex, digest_of, pair_hash
from raftlog.kvstate import Change, KVState

__all__ = ["Change", "KVState", "digest_hex", "digest_of", "pair_hash"]
