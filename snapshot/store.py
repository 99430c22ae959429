"""A directory of snapshot files: one LMDB file per snapshot, named snap-<offset:020d>-<term>.mdb.

The store owns names and directory operations (atomic rename into place, fsyncs, pruning, moving corrupt
files aside, importing and hard-linking files for the Raft library); format.py owns the file contents.

Crash safety: a snapshot is written under a `.tmp-` name, fsynced, renamed to its canonical name, and the
directory is fsynced. Only canonical names count as snapshots, so a crash leaves at most a temp file,
which the next store opened on the directory removes. Temp files are flock()ed while in use so that a
second store on the same directory (an admin tool, say) never removes a temp that is being written.
Importing a file is the same protocol with a hard link (or a copy) as the temp. A file that already is
one of the store's snapshots (another link to it: a restarting node's Raft dump) is verified in place
and nothing is created or renamed; every temp name is removed before an import returns, so a temp file
found at open always means a crash.

Threads: the long parts (writing, verifying, loading) run without the store lock; only the short
directory mutations (rename into place, prune, move aside) take it. link_to takes no lock at all, so it
is safe to call from the Raft tick thread.
"""

from __future__ import annotations

import builtins  # SnapshotStore.list shadows the builtin inside the class
import errno
import fcntl
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from snapshot.format import Entries, SnapshotCorrupt, SnapshotFile, SnapshotInfo
from snapshot.writer import Item, SnapshotWriter, check_position

log = logging.getLogger("snapshot")

TEMP_PREFIX = ".tmp-"
CORRUPT_SUFFIX = ".corrupt"
_NAME_RE = re.compile(r"^snap-(\d{20})-(\d+)\.mdb$")
_LINK_FALLBACK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


def snapshot_name(offset: int, term: int) -> str:
    """The canonical file name of the snapshot at `offset` (zero-padded so names sort like offsets)."""
    return f"snap-{offset:020d}-{term}.mdb"


def parse_snapshot_name(name: str) -> tuple[int, int] | None:
    """(offset, term) for a canonical snapshot file name, else None."""
    m = _NAME_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def snapshot_paths(directory: str | os.PathLike[str]) -> list[Path]:
    """Canonical snapshot paths in `directory`, newest first (by offset, then term). Reads only: another
    process than the store's owner may list them (a node's worker, nameserver/replica/seed.py)."""
    found: list[tuple[int, int, Path]] = []
    for entry in os.scandir(directory):
        parsed = parse_snapshot_name(entry.name)
        if parsed is not None and entry.is_file():
            found.append((*parsed, Path(entry.path)))
    found.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [p for _, _, p in found]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Temp:
    """A private, flock()ed temp path in the store directory; removed on discard unless kept."""

    def __init__(self, directory: Path, tag: str, link_from: Path | None = None) -> None:
        self.path = directory / f"{TEMP_PREFIX}{tag}-{uuid.uuid4().hex}"
        if link_from is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        else:
            os.link(link_from, self.path)  # creates the name atomically; it must not exist yet
            self.fd = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.kept = False

    def __enter__(self) -> _Temp:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.discard()

    def fsync(self) -> None:
        os.fsync(self.fd)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def keep(self) -> None:
        """The path was renamed into place: discard must not remove it."""
        self.kept = True

    def discard(self) -> None:
        if not self.kept:
            self.path.unlink(missing_ok=True)
            Path(f"{self.path}-lock").unlink(missing_ok=True)
        os.close(self.fd)


def _remove_if_unused(path: Path) -> bool:
    """Remove a temp file unless its writer is alive (holds its flock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


class SnapshotStore:
    """Offset-stamped snapshots of a key -> (value, version, type) map, one LMDB file each."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, *, map_size: int = 1 << 40,
                 commit_every: int = 50_000) -> None:
        self.keep = _check_keep(keep)
        if map_size < 1 << 20:
            raise ValueError(f"map_size must be at least 1 MiB, got {map_size}")
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._map_size = map_size
        self._commit_every = commit_every
        self._lock = threading.RLock()
        self._clean_leftovers()

    def path_for(self, offset: int, term: int) -> Path:
        return self.directory / snapshot_name(offset, term)

    # ---- writing ---------------------------------------------------------------------------------

    def write(self, offset: int, term: int, digest: str, items: Iterable[Item],
              meta: bytes = b"") -> SnapshotInfo:
        """Persist the whole map at `offset`; returns once the file is durable under its final name.

        `items` is consumed once, `commit_every` items at a time (memory holds one chunk). Sorted input
        (by utf-8 key) is written in one pass; other input goes through sorted runs in a scratch file.
        A duplicate key or a malformed item raises ValueError/TypeError naming it; nothing is installed.
        """
        check_position(offset, term, digest, meta)
        with _Temp(self.directory, "snap") as out, _Temp(self.directory, "runs") as scratch:
            writer = SnapshotWriter(out.path, scratch.path, map_size=self._map_size,
                                    chunk_items=self._commit_every)
            header = writer.write(offset, term, digest, items, bytes(meta))
            out.fsync()
            final = self.path_for(offset, term)
            info = header.info(final, out.size())
            self._install(out, final)
        log.info("snapshot written: %s (%d items, %d bytes)", final.name, info.count, info.size_bytes)
        return info

    def _install(self, temp: _Temp, final: Path) -> None:
        with self._lock:
            if final.exists():
                if os.path.samefile(temp.path, final):  # rename() would do nothing, and keep the temp name
                    return  # not kept: the caller's discard removes the temp name
                log.warning("replacing existing snapshot %s", final.name)
            os.replace(temp.path, final)
            temp.keep()
            _fsync_dir(self.directory)

    # ---- reading ---------------------------------------------------------------------------------

    def list(self) -> list[SnapshotInfo]:
        """Every readable snapshot, newest (highest offset) first; reads meta only."""
        infos = []
        for path in self._snapshot_paths():
            try:
                infos.append(self.read_info(path))
            except FileNotFoundError:
                continue  # pruned or moved aside meanwhile
            except SnapshotCorrupt as exc:
                log.warning("skipping unreadable snapshot %s: %s", path.name, exc.reason)
        return infos

    def read_info(self, path: str | os.PathLike[str]) -> SnapshotInfo:
        """The snapshot's meta (no data read). Raises SnapshotCorrupt if even that is damaged."""
        with SnapshotFile(path) as f:
            return _check_name(f.info())

    def verify(self, path: str | os.PathLike[str]) -> SnapshotInfo:
        """Recompute the data checksum and count; raise SnapshotCorrupt(path, reason) on a mismatch."""
        with SnapshotFile(path, full_check=True) as f:
            return _check_name(f.verify())

    def load(self, path: str | os.PathLike[str], verify: bool = True, *, bytes_verified: bool = False
             ) -> tuple[SnapshotInfo, Entries]:
        """The snapshot's info and its entries: an iterator of (key, value, version, type) in key order, or
        read into a map at once (Entries.into_map).

        With verify, every byte of the file is hashed against its trailer before LMDB opens it, and the
        entries' checksum is computed in the same pass that yields them: the iterator raises
        SnapshotCorrupt after the last item if it does not match (a writer's bug behind an intact file;
        whatever was built from the stream must be dropped).
        `bytes_verified`: import_file just hashed every byte, and the caller checks what it loaded against
        the stamped digest afterwards (raftlog's digest-check); the entries are then read unchecked, which
        halves the pass (a writer's bug that the entries' checksum would catch changes the pairs, so the
        digest check catches it too, and more: a writer that checksummed the wrong pairs).
        The iterator holds the file open until it is exhausted or closed.
        """
        check = verify and not bytes_verified
        f = SnapshotFile(path, full_check=check)
        try:
            info = _check_name(f.info())
        except BaseException:
            f.close()
            raise
        return info, f.items(check=check)

    def verify_bytes(self, path: str | os.PathLike[str]) -> SnapshotInfo:
        """Hash every byte against the trailer and check the structure and meta, without reading the
        entries (see load's bytes_verified)."""
        with SnapshotFile(path, full_check=True) as f:
            return _check_name(f.info())

    def newest_good(self) -> SnapshotInfo | None:
        """The newest snapshot that verifies; corrupt ones are logged and moved aside to *.corrupt."""
        for path in self._snapshot_paths():
            try:
                inode = os.stat(path).st_ino
                return self.verify(path)
            except FileNotFoundError:
                continue
            except SnapshotCorrupt as exc:
                log.error("snapshot %s is corrupt (%s); moving it aside", path.name, exc.reason)
                self._move_aside(path, inode)
        return None

    def _move_aside(self, path: Path, inode: int) -> None:
        with self._lock:
            try:
                if os.stat(path).st_ino != inode:
                    return  # replaced by a new write since we verified it: not ours to judge
            except FileNotFoundError:
                return
            target = _unused_name(path.with_name(path.name + CORRUPT_SUFFIX))
            os.replace(path, target)
            _fsync_dir(self.directory)
            log.error("moved corrupt snapshot to %s", target.name)

    # ---- housekeeping ----------------------------------------------------------------------------

    def prune(self, keep: int | None = None) -> builtins.list[Path]:
        """Delete all but the newest `keep` snapshots (default: the store's keep); return what went."""
        keep = self.keep if keep is None else _check_keep(keep)
        removed: builtins.list[Path] = []
        with self._lock:
            for path in self._snapshot_paths()[keep:]:
                path.unlink(missing_ok=True)
                removed.append(path)
                log.info("pruned snapshot %s", path.name)
            if removed:
                _fsync_dir(self.directory)
        return removed

    def import_file(self, src_path: str | os.PathLike[str], *, move: bool = False,
                    check_entries: bool = True) -> SnapshotInfo:
        """Verify a snapshot file made elsewhere and install it under its canonical name (atomically).

        The file is hard-linked (copied across file systems) into a temp name first and that exact
        inode is verified, so `src_path` is left untouched unless move=True. Without `check_entries`
        only its bytes, structure and meta are (the caller loads it with bytes_verified=True next and
        checks the loaded pairs against the stamped digest).
        """
        src = Path(src_path)
        if not src.is_file():
            raise FileNotFoundError(f"import_file: no such snapshot file: {src}")
        held = self._holding(src)
        if held is not None:
            return self._verify_held(src, held, move=move, check_entries=check_entries)
        with self._stage(src) as temp:
            info = self.verify(temp.path) if check_entries else self.verify_bytes(temp.path)
            final = self.path_for(info.offset, info.term)
            self._install(temp, final)
        if move and src.resolve() != final.resolve():
            src.unlink(missing_ok=True)
        log.info("imported snapshot %s from %s", final.name, src)
        return replace(info, path=final)

    def _holding(self, src: Path) -> Path | None:
        """The canonical snapshot that `src` is another name of (a hard link, as a restarting node's
        Raft dump is of its newest snapshot), if the store has one."""
        try:
            inode = src.stat()
        except FileNotFoundError:
            return None
        for path in self._snapshot_paths():
            try:
                held = path.stat()
            except FileNotFoundError:
                continue
            if (held.st_ino, held.st_dev) == (inode.st_ino, inode.st_dev):
                return path
        return None

    def _verify_held(self, src: Path, held: Path, *, move: bool, check_entries: bool) -> SnapshotInfo:
        """import_file of a snapshot the store already holds: verify it in place, install nothing (renaming
        a link onto another name of the same file is a no-op that would leave the temp name behind)."""
        info = self.verify(held) if check_entries else self.verify_bytes(held)
        if move and src != held:
            src.unlink(missing_ok=True)
        log.info("snapshot %s is already held here; verified it in place", held.name)
        return info

    def _stage(self, src: Path) -> _Temp:
        try:
            return _Temp(self.directory, "import", link_from=src)
        except OSError as exc:
            if exc.errno not in _LINK_FALLBACK_ERRNOS:
                raise
        temp = _Temp(self.directory, "import")
        try:
            with open(src, "rb") as fin, open(temp.path, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            temp.fsync()
        except BaseException:
            temp.discard()
            raise
        return temp

    def link_to(self, info: SnapshotInfo, dest_path: str | os.PathLike[str]) -> Path:
        """Make `dest_path` a hard link to the snapshot file (a copy if linking fails), atomically.

        O(1) and lock-free in the usual case, for the Raft tick thread. The directory is not fsynced:
        the data already is, and the caller decides how durable the new name must be.
        """
        if not isinstance(info, SnapshotInfo):
            raise TypeError(f"link_to: info must be a SnapshotInfo, got {type(info).__name__}")
        dest = Path(dest_path)
        tmp = dest.with_name(f"{dest.name}{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            _link_or_copy(info.path, tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return dest

    # ---- internals -------------------------------------------------------------------------------

    def _snapshot_paths(self) -> builtins.list[Path]:
        return snapshot_paths(self.directory)

    def _clean_leftovers(self) -> None:
        """Remove temp files of crashed writers and stray LMDB lock files (never snapshots)."""
        for entry in os.scandir(self.directory):
            name, path = entry.name, Path(entry.path)
            if name.startswith(TEMP_PREFIX) and not name.endswith("-lock"):
                if _remove_if_unused(path):
                    log.warning("removed leftover temp file %s", name)
            elif name.endswith("-lock") and (name.startswith(TEMP_PREFIX) or parse_snapshot_name(name[:-5])):
                path.unlink(missing_ok=True)
                log.warning("removed stray LMDB lock file %s", name)


def _check_keep(keep: object) -> int:
    if not isinstance(keep, int) or isinstance(keep, bool):
        raise TypeError(f"keep must be an int, got {type(keep).__name__}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (a node needs a snapshot to restart from), got {keep}")
    return keep


def _check_name(info: SnapshotInfo) -> SnapshotInfo:
    """A canonically named file must hold the snapshot its name promises."""
    parsed = parse_snapshot_name(info.path.name)
    if parsed is not None and parsed != (info.offset, info.term):
        raise SnapshotCorrupt(info.path, f"name says offset {parsed[0]} term {parsed[1]}, "
                                         f"meta says offset {info.offset} term {info.term}")
    return info


def _unused_name(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
        return
    except OSError as exc:
        if exc.errno not in _LINK_FALLBACK_ERRNOS:
            raise
    with open(src, "rb") as fin, open(dest, "xb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
