"""bench/restore.py on a small state: the snapshot it builds holds what the recovery part fills, is kept and
reused, and each timed load runs on it. No speeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import restore
from snapshot import SnapshotStore


def test_the_snapshot_is_built_once_and_every_load_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    path = restore.snapshot_file(tmp_path, 2_500)
    info = SnapshotStore(path.parent).verify(path)
    state = restore.build(2_500)
    assert (info.count, info.digest) == (len(state.kv), state.digest_hex)
    assert info.count >= 2_500
    assert restore.snapshot_file(tmp_path, 2_500) == path  # reused, not built again
    assert restore.main(["--records", "2500", "--runs", "1", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for load in ("core", "worker", "read"):
        assert f"{load} wall" in out and f"{load}  CPU" in out
    assert "a loaded state holds" in out
