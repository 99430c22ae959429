"""`python -m nameserver.ops.restore --config node.toml SNAPSHOT`: seed a stopped node from a snapshot backup.

Restoring is more than copying the snapshot into place. A node started with only a snapshot (no
Raft journal) would start at Raft term 0 while its log ends with entries of the snapshot's term T.
The next leader would then append entries of term 1, 2... after entries of term T, and Raft's
election rule (the candidate with the higher last log term wins) would let a node holding only the
snapshot win against nodes holding newer entries, and overwrite committed writes. So this tool
also writes the Raft journal's metadata: current term = T, commit index = the snapshot's offset.

What it does, on a stopped node, with the node's own config:
  1. refuses a non-empty data directory (or moves it aside with --force; nothing is deleted);
  2. verifies the snapshot file (checksums, stamped digest) and imports it under snapshots/;
  3. seeds raft/ from it (raftlog.seed_from_snapshot): the snapshot linked where the log loads it, the
     journal's term and commit index set to the snapshot's.
Restore every member from the same file, then start them all (docs/operations.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from nameserver import config
from raftlog.seed import seed_from_snapshot
from snapshot import SnapshotStore
from snapshot.format import SnapshotCorrupt


class RestoreError(Exception):
    pass


@dataclass(frozen=True)
class Restored:
    data_dir: str
    snapshot_path: str
    offset: int
    term: int
    digest: str
    moved_aside: str | None


def restore(cfg: config.NodeConfig, snapshot_file: str, force: bool = False) -> Restored:
    data_dir = cfg.data_dir
    if not os.path.isfile(snapshot_file):
        raise RestoreError(f"no such snapshot file: {snapshot_file}")
    moved = None
    if os.path.isdir(data_dir) and os.listdir(data_dir):
        if not force:
            raise RestoreError(f"{data_dir} is not empty: stop the node and pass --force to move it aside")
        moved = f"{data_dir}.before-restore-{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(data_dir, moved)
    # Same layout as NameServerNode / ReplicatedLog: data_dir/snapshots, data_dir/raft/raft.{dump,journal}.
    store = SnapshotStore(os.path.join(data_dir, "snapshots"), keep=cfg.snapshots_kept)
    try:
        info = store.import_file(snapshot_file)  # verifies the whole file first
    except SnapshotCorrupt as exc:
        raise RestoreError(f"{snapshot_file} is not a valid snapshot: {exc.reason}") from exc
    seed_from_snapshot(os.path.join(data_dir, "raft"), store, info)
    return Restored(data_dir, str(info.path), info.offset, info.term, info.digest, moved)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nameserver.ops.restore",
                                description="Seed a stopped node's data directory from a snapshot file.")
    p.add_argument("--config", required=True, help="the node's TOML file (its data_dir is restored)")
    p.add_argument("--data-dir", help="override the config's data_dir")
    p.add_argument("--force", action="store_true", help="move a non-empty data_dir aside first")
    p.add_argument("snapshot", help="a snap-<offset>-<term>.mdb file (from `nsctl snapshot` on any node)")
    args = p.parse_args(argv)
    try:
        cfg = config.load(args.config, {"data_dir": args.data_dir})
        done = restore(cfg, args.snapshot, force=args.force)
    except (config.ConfigError, RestoreError, OSError) as exc:
        print(f"restore: {exc}", file=sys.stderr)
        return 1
    if done.moved_aside:
        print(f"moved the old data directory to {done.moved_aside}")
    print(f"restored {done.data_dir} to offset {done.offset} (term {done.term}, digest {done.digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
