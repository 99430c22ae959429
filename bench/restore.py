"""`python -m bench.restore`: a restart's load of a snapshot, in one process, without a cluster.

Builds once (kept under --dir, reused while its file verifies) the state bench.durability's recovery part
fills: brokers of TOPICS_PER_BROKER topics registered through translate.register_broker and applied by a
MetadataState, written as a snapshot file. Then times, `--runs` times, what a restarting node does with it:

- **core**: the core's load (raftlog/log.py _load_snapshot and raftlog/applier.py _restore): every byte
  hashed against the trailer (import_file of a file the store holds), the entries read unchecked and
  MetadataState.restore with the stamped digest in raftlog/applier.py frozen_load, then the copy the digest
  check reads and the young collection the apply thread's next allocations start (it walked the whole
  loaded state before the state was frozen);
- **worker**: a worker's replica seeded from the same file (nameserver/replica/seed.py, accounting off);
- **read**: the file's entries only (SnapshotFile.items, unchecked), what the two above spend reading.

Then the resident memory one loaded copy of the state holds (the core's, RSS before and after one more load).

Wall and CPU time of each (time.perf_counter, time.process_time), the best and the median; `--profile core`
(or worker, read) prints cProfile's top functions of one more run of it. On a shared machine the wall times
move by several times between runs and the CPU times by a tenth or more: compare runs made one after the other,
interleaved (run it from another checkout's directory to time that code: python -m puts the directory first).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from bench.durability import TOPICS_PER_BROKER, registration
from bench.procs import rss_bytes
from nameserver.replica import ReadReplica
from nameserver.replica.seed import seed_from_snapshots
from nameserver.state import MetadataState, translate
from raftlog.applier import frozen_load
from raftlog.kvstate import KVStateMachine
from raftlog.pb import entry_pb2
from snapshot import SnapshotCorrupt, SnapshotStore
from snapshot.format import SnapshotFile


def build(records: int) -> MetadataState:
    """The recovery part's state at `records` records (bench/durability.py fill), applied in-process."""
    state = MetadataState()
    written, broker, offset = 0, 0, 0
    while written < records:
        topics = min(TOPICS_PER_BROKER, max(1, records - written - 2))
        t = translate.register_broker(state, registration(broker, topics), 30_000)
        offset += 1
        entry = entry_pb2.Entry(term=1)
        entry.batches.append(t.batch)
        state.apply_entry(offset, entry)
        written += t.records
        broker += 1
    return state


def snapshot_file(directory: Path, records: int) -> Path:
    """The snapshot of `records` records under `directory`: the one there if it verifies, else built."""
    store = SnapshotStore(directory / f"{records}" / "snapshots", keep=1)
    found = store.newest_good()
    if found is not None:
        return found.path
    print(f"building a snapshot of {records} records in {store.directory} ...", flush=True)
    state = build(records)
    fsm = KVStateMachine(state.kv)
    return store.write(state.offset, 1, state.digest_hex, fsm.snapshot_items(fsm.freeze())).path


def core_load(path: Path) -> MetadataState:
    store = SnapshotStore(path.parent, keep=1)
    info = store.import_file(path, check_entries=False)  # the held file: verified in place (its bytes)
    info, items = store.load(info.path, bytes_verified=True)
    state = MetadataState()
    with frozen_load():  # as the applier restores
        state.restore(info.offset, items, info.digest)
    state.kv.freeze()
    gc.collect(0)  # the young collection the apply thread's next allocations start (none left after the freeze)
    return state


def state_mib(path: Path) -> float:
    """The resident memory one copy of the state loaded by the core holds (the freeze released), in MiB."""
    gc.collect()
    before = rss_bytes(os.getpid())
    state = core_load(path)
    gc.collect()
    held = rss_bytes(os.getpid()) - before
    state.release()
    return held / 2**20


def worker_load(path: Path) -> MetadataState:
    replica = ReadReplica("127.0.0.1:1", grpc.insecure_channel, accounting=False)  # never started
    if seed_from_snapshots(replica, str(path.parent.parent)) == 0:  # it reads <data_dir>/snapshots
        raise SnapshotCorrupt(path, "the worker's seed found no snapshot")
    return replica.state


def read_only(path: Path) -> None:
    with SnapshotFile(path) as f:
        for _ in f.items():
            pass


def timed(fn: Callable[[Path], object], path: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one load: the process's CPU moves much less than the wall time on a machine
    shared with other work."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    loaded = fn(path)
    seconds = time.perf_counter() - t0, time.process_time() - c0
    if isinstance(loaded, MetadataState):
        loaded.release()  # frozen with its load: freed by its counts, or held to the end (and the next load timed
        # with this one's memory still taken)
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restore", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "bench-restore"),
                   help="where the snapshot is kept between runs")
    p.add_argument("--only", default="core,worker,read", help="which loads to time, comma-separated")
    p.add_argument("--profile", choices=("core", "worker", "read"), help="cProfile one more run of this load")
    args = p.parse_args(argv)
    path = snapshot_file(Path(args.dir), args.records)
    loads = {"core": core_load, "worker": worker_load, "read": read_only}
    chosen = [name for name in args.only.split(",") if name]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    for _ in range(args.runs):
        for name in chosen:  # interleaved: a change in the machine's load hits every kind alike
            times[name].append(timed(loads[name], path))
    print(f"load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        for what, col in (("wall", 0), ("CPU", 1)):
            got = [t[col] for t in ts]
            print(f"{name:>6} {what:>4}: best {min(got):.2f} s, median {statistics.median(got):.2f} s "
                  f"({', '.join(f'{t:.2f}' for t in got)})")
    print(f"a loaded state holds {state_mib(path):.0f} MiB (resident, the core's copy)")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(loads[args.profile], path)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
