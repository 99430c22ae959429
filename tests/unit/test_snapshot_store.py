"""SnapshotStore: real LMDB files in tmp_path, damaged on purpose."""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshot import SnapshotCorrupt, SnapshotInfo, SnapshotStore, parse_snapshot_name, snapshot_name
from snapshot.format import append_trailer

Item = tuple[str, bytes, int, int]
TRAILER_BYTES = 56
DIGEST = "00ff" * 8


def make_items(n: int, seed: int = 1, shuffle: bool = True) -> list[Item]:
    rng = random.Random(seed)
    items = [(f"topic/{i:07d}/broker-{i % 13}", rng.randbytes(rng.randint(0, 120)), i + 1, i % 9)
             for i in range(n)]
    if shuffle:
        rng.shuffle(items)
    return items


def by_key(items: list[Item]) -> list[Item]:
    return sorted(items, key=lambda it: it[0].encode())


def loaded(store: SnapshotStore, info: SnapshotInfo, verify: bool = True) -> list[Item]:
    _, it = store.load(info.path, verify=verify)
    return list(it)


def files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def flip_byte(path: Path, needle: bytes) -> None:
    """Flip one bit inside the (unique) byte string `needle` in the file."""
    raw = bytearray(path.read_bytes())
    at = raw.find(needle)
    assert at >= 0 and raw.find(needle, at + 1) < 0, "needle must occur exactly once"
    raw[at + len(needle) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def reseal(path: Path) -> None:
    """Recompute the whole-file trailer, as if the damage had happened before sealing."""
    raw = path.read_bytes()[:-TRAILER_BYTES]
    path.write_bytes(raw)
    append_trailer(path)


@pytest.fixture()
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snaps")


# ---- round trip ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False], ids=["unordered", "sorted"])
def test_round_trip_preserves_items_meta_and_digest(store: SnapshotStore, shuffle: bool) -> None:
    items = make_items(500, shuffle=shuffle) + [
        ("unicode/ключ/键", b"", 2**64 - 1, 2**32 - 1),
        ("z" * 511, b"\x00" * 5000, 0, 0),  # longest key LMDB allows; value spills to overflow pages
    ]
    info = store.write(42, 7, DIGEST, iter(items), meta=b"raft\x00bookkeeping")

    assert info.path == store.directory / "snap-00000000000000000042-7.mdb"
    assert (info.offset, info.term, info.digest, info.count) == (42, 7, DIGEST, len(items))
    assert info.meta == b"raft\x00bookkeeping"
    assert info.size_bytes == info.path.stat().st_size
    assert store.read_info(info.path) == info
    assert store.verify(info.path) == info
    assert loaded(store, info) == by_key(items)


@pytest.mark.parametrize("order", ["sorted", "unordered", "sorted_then_unordered"])
def test_many_chunks_in_every_write_path(tmp_path: Path, order: str) -> None:
    small = SnapshotStore(tmp_path, commit_every=7)
    items = make_items(100, shuffle=order == "unordered")
    if order == "sorted_then_unordered":  # 3 sorted chunks go straight in, then the writer must spill
        tail = items[21:]
        random.Random(5).shuffle(tail)
        items = items[:21] + tail
    info = small.write(1, 1, DIGEST, (it for it in items))
    assert info.count == 100
    assert loaded(small, info) == by_key(items)
    assert files(tmp_path) == [info.path.name]


@pytest.mark.parametrize("order", ["sorted", "unordered"])
def test_duplicate_key_in_another_chunk_is_rejected(tmp_path: Path, order: str) -> None:
    small = SnapshotStore(tmp_path, commit_every=7)
    items = make_items(30, shuffle=order == "unordered")
    items.append((items[3][0], b"again", 1, 1))
    with pytest.raises(ValueError, match=f"duplicate key {items[3][0]!r}"):
        small.write(1, 1, DIGEST, items)
    assert files(tmp_path) == []


def test_empty_snapshot(store: SnapshotStore) -> None:
    info = store.write(0, 0, "", [])
    assert info.count == 0
    assert loaded(store, info) == []


def test_load_streams_and_closes(store: SnapshotStore) -> None:
    info = store.write(5, 1, DIGEST, make_items(50))
    got_info, it = store.load(info.path)
    assert got_info == info
    first = next(it)
    assert isinstance(first[0], str) and isinstance(first[1], bytes)
    assert len(list(it)) == 49
    assert not any(name.endswith("-lock") for name in files(store.directory))


def test_same_offset_rewrite_replaces(store: SnapshotStore) -> None:
    store.write(9, 1, DIGEST, [("a", b"1", 1, 1)])
    info = store.write(9, 1, DIGEST, [("b", b"2", 2, 2)])
    assert [i.path for i in store.list()] == [info.path]
    assert loaded(store, info) == [("b", b"2", 2, 2)]


# ---- listing and pruning -----------------------------------------------------------------------------


def test_names_sort_like_offsets() -> None:
    assert snapshot_name(10, 3) == "snap-00000000000000000010-3.mdb"
    assert parse_snapshot_name(snapshot_name(2**64 - 1, 12)) == (2**64 - 1, 12)
    assert parse_snapshot_name("snap-10-3.mdb") is None
    assert parse_snapshot_name("snap-00000000000000000010-3.mdb.corrupt") is None


def test_list_newest_first_and_ignores_other_files(store: SnapshotStore) -> None:
    for offset in (9, 100, 10, 2):
        store.write(offset, 1, DIGEST, [("k", str(offset).encode(), offset, 1)])
    (store.directory / "notes.txt").write_text("not a snapshot")
    (store.directory / (snapshot_name(1000, 1) + ".corrupt")).write_bytes(b"junk")
    assert [i.offset for i in store.list()] == [100, 10, 9, 2]


def test_prune_keeps_newest(store: SnapshotStore) -> None:
    for offset in range(1, 7):
        store.write(offset, 1, DIGEST, [("k", b"v", offset, 1)])
    removed = store.prune(2)
    assert sorted(parse_snapshot_name(p.name)[0] for p in removed) == [1, 2, 3, 4]  # type: ignore[index]
    assert [i.offset for i in store.list()] == [6, 5]
    assert store.prune() == []  # default keep=3 keeps both


def test_prune_default_keep(tmp_path: Path) -> None:
    s = SnapshotStore(tmp_path)
    for offset in range(1, 6):
        s.write(offset, 1, DIGEST, [])
    s.prune()
    assert [i.offset for i in s.list()] == [5, 4, 3]


@pytest.mark.parametrize("keep", [0, -1])
def test_prune_rejects_bad_keep(store: SnapshotStore, keep: int) -> None:
    with pytest.raises(ValueError, match="keep"):
        store.prune(keep)


# ---- corruption ------------------------------------------------------------------------------------


def test_verify_detects_flipped_byte_in_data(store: SnapshotStore) -> None:
    marker = b"MARKER-VALUE-0123456789-abcdef"
    info = store.write(3, 1, DIGEST, make_items(300) + [("marked", marker, 1, 1)])
    flip_byte(info.path, marker)
    with pytest.raises(SnapshotCorrupt, match="file checksum mismatch") as exc:
        store.verify(info.path)
    assert exc.value.path == info.path and exc.value.reason


def test_verify_detects_data_damage_behind_a_valid_trailer(store: SnapshotStore) -> None:
    """The logical data checksum, not only the byte hash, catches a changed value."""
    marker = b"MARKER-VALUE-0123456789-abcdef"
    info = store.write(3, 1, DIGEST, make_items(300) + [("marked", marker, 1, 1)])
    flip_byte(info.path, marker)
    reseal(info.path)
    with pytest.raises(SnapshotCorrupt, match="data checksum mismatch"):
        store.verify(info.path)
    _, stream = store.load(info.path)  # load checks the entries as it reads them: at the end of the pass
    with pytest.raises(SnapshotCorrupt, match="data checksum mismatch"):
        list(stream)
    store.verify_bytes(info.path)  # the bytes are intact (resealed): only the entries' checksum catches it
    _, unchecked = store.load(info.path, verify=False)
    assert len(list(unchecked)) == 301


def test_read_info_detects_damaged_meta(store: SnapshotStore) -> None:
    blob = b"META-BLOB-0123456789-abcdefghij"
    info = store.write(3, 1, DIGEST, make_items(10), meta=blob)
    flip_byte(info.path, blob)
    reseal(info.path)
    with pytest.raises(SnapshotCorrupt, match="meta checksum mismatch"):
        store.read_info(info.path)


@pytest.mark.parametrize("keep_fraction", [0.0, 0.01, 0.5, 0.999])
def test_verify_detects_truncation(store: SnapshotStore, keep_fraction: float) -> None:
    info = store.write(3, 1, DIGEST, make_items(2000))
    raw = info.path.read_bytes()
    info.path.write_bytes(raw[: int(len(raw) * keep_fraction)])
    with pytest.raises(SnapshotCorrupt, match="truncated|not an LMDB file") as exc:
        store.verify(info.path)
    assert "truncated" in exc.value.reason or "bytes" in exc.value.reason


def test_verify_detects_one_byte_truncation(store: SnapshotStore) -> None:
    info = store.write(3, 1, DIGEST, make_items(20))
    raw = info.path.read_bytes()
    info.path.write_bytes(raw[:-1])
    with pytest.raises(SnapshotCorrupt, match="trailer"):
        store.verify(info.path)
    with pytest.raises(SnapshotCorrupt):
        store.read_info(info.path)


@pytest.mark.parametrize("content", [b"hello, I am not a database\n" * 500, b"", os.urandom(8192)])
def test_verify_rejects_non_lmdb_files(tmp_path: Path, store: SnapshotStore, content: bytes) -> None:
    path = tmp_path / "other.mdb"
    path.write_bytes(content)
    with pytest.raises(SnapshotCorrupt, match="not an LMDB file") as exc:
        store.verify(path)
    assert exc.value.path == path


def test_zeroed_page_is_reported_not_fatal(store: SnapshotStore) -> None:
    """LMDB itself aborts the process on a zeroed B-tree page; the byte hash must catch it first."""
    info = store.write(3, 1, DIGEST, make_items(3000))
    raw = bytearray(info.path.read_bytes())
    pages = (len(raw) - TRAILER_BYTES) // 4096
    for page in range(2, pages):
        damaged = raw[:]
        damaged[page * 4096:(page + 1) * 4096] = bytes(4096)
        info.path.write_bytes(bytes(damaged))
        with pytest.raises(SnapshotCorrupt):
            store.verify(info.path)


def test_name_must_match_meta(store: SnapshotStore) -> None:
    info = store.write(3, 1, DIGEST, [])
    liar = store.path_for(4, 1)
    os.link(info.path, liar)
    with pytest.raises(SnapshotCorrupt, match="name says offset 4"):
        store.read_info(liar)


def test_newest_good_skips_and_moves_aside_corrupt(store: SnapshotStore,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    good = store.write(10, 1, DIGEST, make_items(100))
    bad = store.write(20, 2, DIGEST, make_items(100, seed=2) + [("m", b"MARKER-VALUE-XYZ-0123", 1, 1)])
    flip_byte(bad.path, b"MARKER-VALUE-XYZ-0123")

    with caplog.at_level(logging.ERROR, logger="snapshot"):
        assert store.newest_good() == good
    assert not bad.path.exists()
    aside = bad.path.with_name(bad.path.name + ".corrupt")
    assert aside.exists()
    assert any(bad.path.name in r.getMessage() for r in caplog.records)
    assert [i.offset for i in store.list()] == [10]

    # A second corrupt file of the same name does not overwrite the first one moved aside.
    bad.path.write_bytes(b"junk")
    assert store.newest_good() == good
    assert aside.exists() and aside.with_name(aside.name + ".2").exists()


def test_newest_good_none(store: SnapshotStore) -> None:
    assert store.newest_good() is None
    store.path_for(5, 1).write_bytes(b"garbage")
    assert store.newest_good() is None
    assert files(store.directory) == [snapshot_name(5, 1) + ".corrupt"]


def test_list_skips_unreadable(store: SnapshotStore) -> None:
    store.write(1, 1, DIGEST, [])
    store.path_for(2, 1).write_bytes(b"garbage")
    assert [i.offset for i in store.list()] == [1]


# ---- crashes and bad input -------------------------------------------------------------------------


def test_leftover_temp_files_are_ignored_and_cleaned(tmp_path: Path) -> None:
    first = SnapshotStore(tmp_path)
    info = first.write(1, 1, DIGEST, make_items(10))
    # What a writer killed mid-write leaves: a half-written temp (a plausible LMDB prefix) and a lock file.
    (tmp_path / ".tmp-work-deadbeef").write_bytes(info.path.read_bytes()[:8192])
    (tmp_path / ".tmp-work-deadbeef-lock").write_bytes(b"")
    (tmp_path / (info.path.name + "-lock")).write_bytes(b"")
    assert [i.offset for i in first.list()] == [1]

    second = SnapshotStore(tmp_path)
    assert files(tmp_path) == [info.path.name]
    assert second.newest_good() == info


def test_temp_of_a_live_writer_is_not_cleaned(tmp_path: Path) -> None:
    import fcntl

    live = tmp_path / ".tmp-work-live"
    fd = os.open(live, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        SnapshotStore(tmp_path)
        assert live.exists()
    finally:
        os.close(fd)
    SnapshotStore(tmp_path)
    assert not live.exists()


def test_crash_mid_write_leaves_no_snapshot(store: SnapshotStore) -> None:
    def exploding() -> Iterator[Item]:
        yield from make_items(1000, shuffle=False)
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        store.write(7, 1, DIGEST, exploding())
    assert files(store.directory) == []
    assert store.list() == [] and store.newest_good() is None


@pytest.mark.parametrize(("item", "message"), [
    (("k", "text", 1, 1), "item 1 \\(key 'k'\\): value must be bytes, got str"),
    ((5, b"v", 1, 1), "item 1: key must be a str, got int"),
    (("", b"v", 1, 1), "key must not be empty"),
    (("x" * 600, b"v", 1, 1), "key is 600 bytes in utf-8, the limit is 511"),
    (("k", b"v", -1, 1), "version must be in"),
    (("k", b"v", 1, 2**32), "type must be in"),
    (("k", b"v", 1.5, 1), "version must be an int, got float"),
    (("k", b"v", 1), "expected a \\(key, value, version, type\\) tuple"),
])
def test_bad_items_are_named(store: SnapshotStore, item: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        store.write(1, 1, DIGEST, [("a", b"ok", 1, 1), item])  # type: ignore[list-item]
    assert files(store.directory) == []


def test_duplicate_key_is_rejected(store: SnapshotStore) -> None:
    with pytest.raises(ValueError, match="duplicate key .a."):
        store.write(1, 1, DIGEST, [("a", b"1", 1, 1), ("b", b"2", 1, 1), ("a", b"3", 1, 1)])
    assert files(store.directory) == []


@pytest.mark.parametrize(("args", "message"), [
    ((-1, 1, DIGEST, b""), "offset must be in"),
    ((1, "1", DIGEST, b""), "term must be an int"),
    ((1, 1, b"00", b""), "digest must be a str"),
    ((1, 1, "ключ", b""), "digest must be printable ASCII"),
    ((1, 1, DIGEST, "meta"), "meta must be bytes"),
])
def test_bad_write_arguments_are_named(store: SnapshotStore, args: tuple, message: str) -> None:
    offset, term, digest, meta = args
    with pytest.raises((TypeError, ValueError), match=message):
        store.write(offset, term, digest, [], meta=meta)


# ---- import and link ---------------------------------------------------------------------------------


def test_import_file_installs_a_copy_under_its_canonical_name(tmp_path: Path, store: SnapshotStore) -> None:
    leader = SnapshotStore(tmp_path / "leader")
    items = make_items(200)
    sent = leader.write(77, 4, DIGEST, items, meta=b"m")
    received = tmp_path / "full_dump.bin"  # what the Raft library hands over: any name
    leader.link_to(sent, received)

    info = store.import_file(received)
    assert info.path == store.path_for(77, 4)
    assert (info.offset, info.term, info.digest, info.meta, info.count) == (77, 4, DIGEST, b"m", 200)
    assert received.exists()  # left untouched by default
    assert store.list() == [info]
    assert loaded(store, info) == by_key(items)

    moved = store.import_file(received, move=True)
    assert moved.path == info.path and not received.exists()


def test_import_of_a_held_snapshot_verifies_it_in_place(tmp_path: Path, store: SnapshotStore,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # a restarting node hands its own newest snapshot back through import_file: its Raft dump (and the
    # staged link of it) is another name of that file
    info = store.write(9, 2, DIGEST, make_items(50))
    before = files(store.directory)
    staged = tmp_path / "raft.dump.restore-9-1"
    store.link_to(info, staged)
    caplog.set_level(logging.INFO, logger="snapshot")
    got = store.import_file(staged, move=True, check_entries=False)
    assert got == info
    assert not staged.exists()
    assert files(store.directory) == before  # no temp name left behind
    assert info.path.stat().st_nlink == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loaded(store, got) == by_key(make_items(50))
    # a damaged held copy is found by the in-place check, as an import would find it
    flip_byte(info.path, b"topic/0000017")
    reseal(info.path)
    with pytest.raises(SnapshotCorrupt):
        store.import_file(info.path)
    # reopening the store finds nothing to clean up
    caplog.clear()
    SnapshotStore(store.directory)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_import_file_rejects_corrupt(tmp_path: Path, store: SnapshotStore) -> None:
    src = tmp_path / "incoming.mdb"
    src.write_bytes(b"definitely not a snapshot" * 100)
    with pytest.raises(SnapshotCorrupt, match="not an LMDB file"):
        store.import_file(src)
    assert files(store.directory) == [] and src.exists()
    with pytest.raises(FileNotFoundError, match="missing"):
        store.import_file(tmp_path / "missing")


def test_link_to_makes_an_atomic_hard_link(tmp_path: Path, store: SnapshotStore) -> None:
    info = store.write(5, 1, DIGEST, make_items(20))
    dest = tmp_path / "dump.bin"
    dest.write_bytes(b"previous dump")
    assert store.link_to(info, dest) == dest
    assert os.path.samefile(dest, info.path) and info.path.stat().st_nlink == 2
    assert files(tmp_path) == ["dump.bin", "snaps"]  # no temp left next to dest
    store.prune(1)
    store.write(6, 1, DIGEST, [])
    store.prune(1)
    assert not info.path.exists() and store.read_info(dest).offset == 5  # the link outlives pruning


def test_link_to_falls_back_to_copy(tmp_path: Path, store: SnapshotStore,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    info = store.write(5, 1, DIGEST, make_items(20))

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    dest = tmp_path / "dump.bin"
    store.link_to(info, dest)
    assert not os.path.samefile(dest, info.path)
    assert dest.read_bytes() == info.path.read_bytes()
    # import_file falls back to a copy as well
    other = SnapshotStore(tmp_path / "other")
    assert other.import_file(dest).count == 20


# ---- scale, size, threads --------------------------------------------------------------------------


def test_200k_items_round_trip(store: SnapshotStore) -> None:
    items = make_items(200_000, seed=3)
    info = store.write(200_000, 9, DIGEST, items)
    assert info.count == 200_000
    _, it = store.load(info.path)
    n = 0
    previous = b""
    expected = dict((k, (v, ver, t)) for k, v, ver, t in items)
    for key, value, version, rtype in it:
        assert key.encode() > previous
        previous = key.encode()
        assert expected[key] == (value, version, rtype)
        n += 1
    assert n == 200_000


@pytest.mark.parametrize("shuffle", [True, False], ids=["unordered", "sorted"])
def test_file_size_is_proportionate_to_data(tmp_path: Path, shuffle: bool) -> None:
    big_map = 1 << 40
    store = SnapshotStore(tmp_path, map_size=big_map, commit_every=5000)
    items = make_items(50_000, shuffle=shuffle)
    raw = sum(len(k.encode()) + len(v) + 12 for k, v, _, _ in items)
    info = store.write(1, 1, DIGEST, items)
    st = os.stat(info.path)
    assert st.st_size < 1.5 * raw + (256 << 10), (st.st_size, raw)
    assert st.st_blocks * 512 < 1.5 * raw + (1 << 20)  # not a sparse monster either
    assert files(tmp_path) == [info.path.name]  # work files are gone


def test_write_in_background_while_listing(store: SnapshotStore) -> None:
    store.write(1, 1, DIGEST, make_items(100))
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for offset in range(2, 8):
                store.write(offset, 1, DIGEST, make_items(5000, seed=offset))
                store.prune(2)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():
        for info in store.list():
            assert info.count in (100, 5000)
    thread.join()
    assert not errors
    assert [i.offset for i in store.list()] == [7, 6]
    assert store.newest_good() is not None
    assert not any(name.startswith(".tmp-") or name.endswith("-lock") for name in files(store.directory))


def test_entries_read_into_a_map_make_one_item_per_distinct_stored_entry(store: SnapshotStore) -> None:
    """Entries.into_map: every key to item(value, version, type), in key order; an entry stored as the same
    bytes as a recent one takes its item, item() called once for them; the file closed after."""
    items = [(f"k{i:03d}", b"same", 7, 1) for i in range(50)] + [("other", b"same", 8, 1), ("z", b"", 7, 2)]
    info = store.write(9, 1, DIGEST, items)
    calls: list[tuple[bytes, int, int]] = []

    def item(value: bytes, version: int, rtype: int) -> tuple[bytes, int, int]:
        calls.append((value, version, rtype))
        return value, version, rtype

    for verify in (False, True):  # unchecked, and through the checked stream
        calls.clear()
        _, entries = store.load(info.path, verify=verify)
        got = entries.into_map(item)
        assert list(got.items()) == [(k, (v, ver, t)) for k, v, ver, t in by_key(items)]
    _, entries = store.load(info.path, bytes_verified=True)
    calls.clear()
    got = entries.into_map(item)
    assert sorted(calls) == [(b"", 7, 2), (b"same", 7, 1), (b"same", 8, 1)]
    assert len({id(got[f"k{i:03d}"]) for i in range(50)}) == 1
    assert not any(name.endswith("-lock") for name in files(store.directory))
