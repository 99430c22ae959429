"""`python -m bench.restartab`: one node's restart at a million records, two code trees side by side.

Fills a one-node cluster once (bench/durability.py fill, then a snapshot; kept under --dir and reused), then
restarts a copy of its data directory again and again, alternating the code trees given (`--trees A,B`: each
node is spawned with its tree as the working directory, so `python -m` runs that tree's code). Each restart is
timed from the spawn to the node answering Status ready at the filled commit offset, with the CPU seconds the
node's process used by then (/proc: what the machine's other work moves least), the load average when it
started, and the phases its log shows (snapshot restored, ready; where the code builds indexes after ready,
"restore complete" and the CPU by then). Then the CPU once its use settled (from 3 s after ready, under 0.05 s
in a second): what the restart cost in all, the work it leaves for after ready included. The digest it reports
is checked against the fill's. A restart of a one-node cluster includes its own election (a follower hears
its leader instead).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.procs import BenchNode, LocalCluster, with_descendants

_SERVING = re.compile(rb"worker \d+ \(pid \d+\) serving gRPC")
_LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(restored snapshot|is ready|restore complete)",
                       re.M)


def filled(directory: Path, records: int) -> dict[str, Any]:
    """The kept one-node cluster of `records` records (its root, config, commit offset and digest)."""
    from bench.durability import fill
    from nameserver.pb import api_pb2
    root = directory / str(records)
    meta = root / "fill.json"
    if meta.exists():
        return dict(json.loads(meta.read_text()))
    shutil.rmtree(root, ignore_errors=True)
    print(f"filling a one-node cluster to {records} records in {root} ...", flush=True)
    with LocalCluster(str(root), size=1) as c:
        out = fill(c, records)
        node = c.nodes[0]
        node.admin().TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=300)
        st = node.require_status()
        out.update(commit=st.commit_offset, digest=st.digest, config=node.config_path, data_dir=node.data_dir,
                   grpc_addr=node.grpc_addr, raft_addr=node.raft_addr)
    meta.write_text(json.dumps(out))
    return out


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def restart(tree: str, kept: dict[str, Any], scratch: Path, workers: int = 0) -> dict[str, Any]:
    """One restart of a copy of the kept data directory with `tree`'s code (and `workers` worker processes:
    then also timed to the first and to every worker serving, as bench/durability.py node_with_workers)."""
    shutil.rmtree(scratch, ignore_errors=True)
    data = scratch / "data"
    shutil.copytree(kept["data_dir"], data)
    config = scratch / "node.toml"
    config.write_text(Path(kept["config"]).read_text().replace(kept["data_dir"], str(data))
                      .replace("worker_processes = 0", f"worker_processes = {workers}"))
    log_path = scratch / "node.log"
    node = BenchNode("n1", kept["raft_addr"], kept["grpc_addr"], str(config), str(log_path), str(data))
    load = os.getloadavg()[0]
    with open(log_path, "wb") as log:
        wall0, t0 = time.time(), time.monotonic()
        node.proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "serve", "--config", str(config)],
                                     cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            st = node.status(timeout=1.0)
            if st is not None and st.ready and st.apply_offset >= kept["commit"]:
                seconds, cpu = time.monotonic() - t0, cpu_s(node.pid)
                break
            if node.proc.poll() is not None or time.monotonic() - t0 > 300:
                raise RuntimeError(f"the node did not get ready; see {log_path}")
            time.sleep(0.01)
        if st.digest != kept["digest"]:
            raise RuntimeError(f"digest {st.digest} after the restart, {kept['digest']} filled")
        served: list[float] = []
        while len(served) < workers and time.monotonic() - t0 < 300:
            found = _SERVING.findall(log_path.read_bytes())
            if len(found) > len(served):
                served += [time.monotonic() - t0] * (len(found) - len(served))
            time.sleep(0.01)
        node_cpu = sum(cpu_s(pid) for pid in with_descendants([node.pid])) if workers else cpu
        done_cpu = None
        if b"restore complete" in (Path(tree) / "raftlog" / "applier.py").read_bytes():
            # this code builds the route index after ready: the CPU until it is built too
            while b"restore complete" not in log_path.read_bytes() and time.monotonic() - t0 < 300:
                time.sleep(0.02)
            done_cpu = round(cpu_s(node.pid), 2)
        phases: dict[str, float] = {}
        for stamp, what in _LOG_TIME.findall(log_path.read_bytes()):
            at = datetime.strptime(stamp.decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp() - wall0
            phases.setdefault(what.decode(), round(at, 2))
        # then until its CPU use settles (the work a restart leaves after ready: the digest check, an index)
        pids = with_descendants([node.pid])
        time.sleep(3.0)  # past the digest check's start (raftlog/applier.py DIGEST_CHECK_DELAY_S after the restore)
        settled, last = 0.0, -1.0
        while time.monotonic() - t0 < 300:
            settled = sum(cpu_s(pid) for pid in pids)
            if settled - last < 0.05:
                break
            last = settled
            time.sleep(1.0)
        phases["cpu_s_settled"] = round(settled, 2)
        if workers:
            phases.update(first_worker_s=round(max(seconds, served[0]), 2), every_worker_s=round(max(served), 2),
                          node_cpu_s=round(node_cpu, 2))
        return {"tree": tree, "ready_s": round(seconds, 2), "cpu_s": round(cpu, 2), "load": round(load, 1), **phases,
                **({} if done_cpu is None else {"cpu_s_complete": done_cpu})}
    finally:
        for pid in reversed(with_descendants([node.pid])):  # the workers too (they stop with their core anyway)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.proc.wait()
        if node.channel is not None:
            node.channel.close()
        shutil.copyfile(log_path, scratch.with_name("last-restart.log"))  # the last one kept, to look at
        shutil.rmtree(scratch, ignore_errors=True)


def followers(trees: list[str], rounds: int, records: int, root: str) -> list[dict[str, Any]]:
    """A 3-node cluster filled to `records` (bench/durability.py recovery's: a snapshot on every node), then
    one follower killed (SIGKILL) and started with each tree in turn, `rounds` times: timed to ready and
    caught up with the leader's commit offset, with its CPU by then (the other two nodes run this tree)."""
    from bench.durability import fill
    from nameserver.pb import api_pb2
    out: list[dict[str, Any]] = []
    with LocalCluster(root) as c:
        fill(c, records)
        leader = c.wait_ready()
        for n in c.nodes:
            n.admin().TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=300)
        target = leader.require_status().commit_offset
        digest = leader.require_status().digest
        node = next(n for n in c.nodes if n is not leader)
        for _ in range(rounds):
            for tree in trees:
                c.kill(node)
                load = os.getloadavg()[0]
                with open(node.log_path, "ab") as log:
                    t0 = time.monotonic()
                    node.proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "serve", "--config",
                                                  node.config_path], cwd=tree, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
                while True:
                    st = node.status(timeout=1.0)
                    if st is not None and st.ready and st.apply_offset >= target:
                        seconds, cpu = time.monotonic() - t0, cpu_s(node.pid)
                        break
                    if node.proc.poll() is not None or time.monotonic() - t0 > 300:
                        raise RuntimeError(f"the follower did not get ready; see {node.log_path}")
                    time.sleep(0.01)
                if st.digest != digest:
                    raise RuntimeError(f"digest {st.digest} after the restart, {digest} on the leader")
                got = {"tree": tree, "ready_s": round(seconds, 2), "cpu_s": round(cpu, 2), "load": round(load, 1)}
                print(json.dumps(got), flush=True)
                out.append(got)
                time.sleep(5)  # its work after ready (the digest check, an index) done before the next kill
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restartab", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--trees", default=".", help="code trees to alternate, comma-separated (default: this one)")
    p.add_argument("--rounds", type=int, default=3, help="restarts of each tree, interleaved")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "bench-restart"),
                   help="where the filled node is kept between runs")
    p.add_argument("--workers", type=int, default=0, help="[node] worker_processes of the restarted node")
    p.add_argument("--follower", action="store_true", help="a 3-node cluster's follower restarted instead "
                   "(the cluster filled by this run, not kept)")
    p.add_argument("--json", default="", help="write the results here too")
    args = p.parse_args(argv)
    trees = [os.path.abspath(t) for t in args.trees.split(",") if t]
    results: list[dict[str, Any]] = []
    if args.follower:
        results = followers(trees, args.rounds, args.records, tempfile.mkdtemp(prefix="restartab-"))
    kept = {} if args.follower else filled(Path(args.dir), args.records)
    for _ in range(0 if args.follower else args.rounds):
        for tree in trees:
            got = restart(tree, kept, Path(args.dir) / "scratch", args.workers)
            print(json.dumps(got), flush=True)
            results.append(got)
    for tree in trees:
        mine = [r for r in results if r["tree"] == tree]
        ready, cpu = [r["ready_s"] for r in mine], [r["cpu_s"] for r in mine]
        print(f"{tree}: ready median {statistics.median(ready):.2f} s (best {min(ready):.2f}), CPU median "
              f"{statistics.median(cpu):.2f} s (best {min(cpu):.2f}), load {', '.join(str(r['load']) for r in mine)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
