"""A worker's replica begins from its core's newest snapshot file (ReadReplica.seed), read-only.

At a restart the core loads that file; its workers used to wait for the core to be ready and then each take
the whole state over Log.Follow, one after the other (the core encoding it per worker): at a million records
the node served seconds after its core was ready. Each worker now loads the same file while the core does,
then follows from its offset. The file's bytes are checked before it is read (a damaged file is skipped,
as the core skips it); the core's digest at its offset is compared before the stream starts.
"""

from __future__ import annotations

import logging
import os

from nameserver.replica.follower import ReadReplica
from snapshot.format import SnapshotCorrupt, SnapshotFile
from snapshot.store import snapshot_paths

log = logging.getLogger("nameserver.replica")


def seed_from_snapshots(replica: ReadReplica, data_dir: str) -> int:
    """Seed `replica` from the newest readable snapshot under the node's `data_dir`; the offset it starts
    from, 0 when there is none (it then takes the state over the stream)."""
    directory = os.path.join(data_dir, "snapshots")
    try:
        paths = snapshot_paths(directory)
    except OSError:
        return 0  # no snapshot directory yet: a new node
    for path in paths:
        try:
            # Checked as the core checks the file it loads (raftlog/log.py, snapshot/store.py load's
            # bytes_verified): every byte against the trailer here, the entries unchecked; the pairs are
            # then hashed against the stamped digest by the core's own digest check, which stops the node
            # on a mismatch.
            with SnapshotFile(path, full_check=True) as f:
                info = f.info()
                replica.seed(info.offset, f.items(), info.digest)
                return info.offset
        except FileNotFoundError:
            continue  # pruned by the core meanwhile
        except (SnapshotCorrupt, OSError) as exc:
            log.warning("replica: snapshot file %s not used (%s); trying an older one", path.name, exc)
    return 0
