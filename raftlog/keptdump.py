"""A follower that keeps its log over a leader's snapshot keeps the snapshot file that log goes with
(raftlog/replysafety.py, rule 2; docs/faults.md, finding 15).

pysyncobj renames a received snapshot over its dump file (`raft.dump`) before it loads it, and the binding
decides only then to keep the log. But a log goes with its node's own dump: its first two entries are that
snapshot's last two, its journal's older segments are deleted, and a restart pairs the journal with
whatever `raft.dump` holds (pysyncobj clears a journal that does not begin with the dump's last two
entries). A follower left with the leader's older dump restarted from it and lost, from its disk, every
entry after it: entries it had acknowledged.

So before the last piece of a snapshot is renamed into place, the dump in place gets a second name,
`raft.dump.kept` (`set_aside`); a kept log (or a failed load, which changes nothing) puts it back
(`put_back`), an installed snapshot drops it (`drop`). A start that finds one (a crash in between) keeps
the newer of the two (`settle`): the journal goes with either, since a follower keeps its log only when it
holds the received snapshot's last entry, and installs one only when it is newer than everything it had.
The node's own snapshot writer, on a thread of its own, links its file as `raft.dump` only over an older
one (an install may have come while it wrote), under the binding's `dump_lock` as these swaps are.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from raftlog.journal import fsync_dir

KEPT_SUFFIX = ".kept"

log = logging.getLogger("raftlog.keptdump")


def set_aside(dump_path: str, fsync: bool) -> None:
    """Give the dump in place a second name, durably, before a received snapshot is renamed over it."""
    if not os.path.exists(dump_path):
        return
    kept = dump_path + KEPT_SUFFIX
    with contextlib.suppress(FileNotFoundError):
        os.unlink(kept)
    os.link(dump_path, kept)
    if fsync:
        fsync_dir(dump_path)


def received(dump_path: str, fsync: bool) -> None:
    """The last piece of a leader's snapshot was renamed over the dump (pysyncobj writes it without an
    fsync): its bytes and its name made durable before the node answers the install and acknowledges
    entries after it. A crash before this leaves the dump set aside (durable) for `settle`."""
    if not fsync:
        return
    fd = os.open(dump_path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(dump_path)


def put_back(dump_path: str, fsync: bool) -> None:
    """The dump set aside is the dump again; the received one goes."""
    kept = dump_path + KEPT_SUFFIX
    if os.path.exists(kept):
        os.replace(kept, dump_path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dump_path)  # the node had no dump: it has none again
    if fsync:
        fsync_dir(dump_path)


def drop(dump_path: str) -> None:
    """The received snapshot is installed: the dump set aside is not needed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dump_path + KEPT_SUFFIX)


def settle(dump_path: str, last_index: Callable[[str], int], fsync: bool) -> None:
    """At start, before the journal opens: of `raft.dump` and a dump set aside by an install that a crash cut
    short, the newer (by `last_index`, its last entry's index; -1 for one missing or unreadable) stays
    `raft.dump`."""
    kept = dump_path + KEPT_SUFFIX
    if not os.path.exists(kept):
        return
    if last_index(kept) > last_index(dump_path):
        log.warning("%s: the snapshot set aside before an install a crash cut short is newer than the received "
                    "one; it stays the node's snapshot", dump_path)
        os.replace(kept, dump_path)
    else:
        os.unlink(kept)
    if fsync:
        fsync_dir(dump_path)


__all__ = ["KEPT_SUFFIX", "drop", "put_back", "set_aside", "settle"]
