"""The procedures of docs/operations.md, run as an operator would, on real multi-process clusters.

Each test follows one section of the runbook with the same commands (`nameserver serve`, `nsctl`,
`python -m nameserver.ops.restore`, kill/TERM, deleting a data directory, editing a node's TOML).
Membership changes (`nsctl member add|remove`) are exercised by the membership tests.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import pytest

from nameserver.pb import api_pb2
from tests.cluster import ROOT, Cluster, NodeProc, retry

pytestmark = pytest.mark.cluster

NS = "OPS"


def nsctl(nodes: list[NodeProc], *args: str, check: bool = True) -> Any:
    """Run nsctl --json against `nodes`; the parsed JSON output."""
    cmd = [sys.executable, "-m", "nameserver.cli.nsctl", "--endpoints", ",".join(n.grpc_addr for n in nodes),
           "--json", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=os.environ | {"PYTHONPATH": ROOT})
    if check:
        assert res.returncode == 0, f"nsctl {' '.join(args)}: {res.stderr}"
    return json.loads(res.stdout) if res.stdout.strip() else None


def healthy(nodes: list[NodeProc]) -> list[dict] | None:
    """`nsctl status`: every node answers and is ready, one leader, equal apply offsets and digests."""
    try:
        doc = nsctl(nodes, "status", check=False)
    except json.JSONDecodeError:
        return None
    if doc is None:
        return None
    sts = doc["nodes"]
    if any("error" in s or not s.get("ready") for s in sts):
        return None
    if sum(s["role"] == "leader" for s in sts) != 1:
        return None
    if len({int(s.get("apply_offset", 0)) for s in sts}) != 1 or len({s["digest"] for s in sts}) != 1:
        return None
    return sts


def wait_healthy(cluster: Cluster, what: str, nodes: list[NodeProc] | None = None, timeout: float = 60
                 ) -> list[dict]:
    """Until `healthy(nodes)`. Every `nsctl status` starts a Python process (1-3 s of CPU on a busy 2-core
    machine), so the nodes' own Status calls, polled cheaply, first say they are ready and converged."""
    nodes = nodes or cluster.nodes
    cluster.wait_converged(nodes, timeout=timeout)
    return cluster.wait_for(what, lambda: healthy(nodes), timeout=timeout)


def put(cluster: Cluster, key: str, value: str, nodes: list[NodeProc] | None = None) -> int:
    """One KV write through any live node, retried as a client library would."""
    live = [n for n in (nodes or cluster.nodes) if n.alive]
    node = live[hash(key) % len(live)]
    reply = retry(lambda: node.ns.PutKv(api_pb2.PutKvRequest(namespace=NS, key=key, value=value), timeout=5),
                  timeout=30)
    return reply.offset


def table(node: NodeProc, min_offset: int = 0) -> dict[str, str]:
    reply = retry(lambda: node.ns.ListKv(api_pb2.ListKvRequest(namespace=NS, min_offset=min_offset), timeout=10))
    return dict(reply.table)


def set_members(node: NodeProc, keep: list[NodeProc] | None) -> None:
    """Edit the node's TOML: keep only these [[cluster.members]] blocks (None: restore every one)."""
    with open(node.config_path) as f:
        blocks = f.read().split("\n\n")
    if not hasattr(node, "_full_config"):
        node._full_config = blocks  # type: ignore[attr-defined]
    blocks = list(node._full_config)  # type: ignore[attr-defined]
    if keep is not None:
        addrs = {n.raft_addr for n in keep}
        blocks = [b for b in blocks if not b.startswith("[[cluster.members]]")
                  or any(f'raft_addr = "{a}"' in b for a in addrs)]
    with open(node.config_path, "w") as f:
        f.write("\n\n".join(blocks))


def data_dir(node: NodeProc) -> str:
    return os.path.join(os.path.dirname(node.config_path), f"{node.name}-data")


# ---- bootstrap -----------------------------------------------------------------------------------

def test_bootstrap_a_five_node_cluster(make_cluster) -> None:
    cluster = make_cluster(5)
    sts = wait_healthy(cluster, "nsctl status: 5 ready nodes, one leader", timeout=60)
    assert len(sts) == 5
    offset = put(cluster, "bootstrap", "ok")
    assert all(table(n, offset) == {"bootstrap": "ok"} for n in cluster.nodes)


# ---- rolling restart -----------------------------------------------------------------------------

def test_rolling_restart_keeps_every_acknowledged_write(make_cluster) -> None:
    cluster = make_cluster(3)
    wait_healthy(cluster, "a healthy cluster", timeout=60)
    acked: dict[str, str] = {}
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            key = f"k{i:05d}"
            try:
                put(cluster, key, str(i))
                acked[key] = str(i)
            except grpc.RpcError as exc:  # unknown outcome: the key may or may not be there
                errors.append(f"{key}: {exc.code().name}")
            i += 1
            time.sleep(0.02)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        # Followers first, the leader last: one leader change in all.
        leader = cluster.leader()
        order = [n for n in cluster.nodes if n is not leader] + [leader]
        for node in order:
            before = len(acked)
            cluster.kill(node, signal.SIGTERM)
            cluster.start(node)
            wait_healthy(cluster, f"{node.name} back and the cluster healthy", timeout=60)
            cluster.wait_for("writes to go on", lambda b=before: len(acked) > b + 5, timeout=30)
    finally:
        stop.set()
        t.join(timeout=60)
    assert len(errors) <= 3, errors  # at most the writes caught in flight by the leader's restart
    sts = cluster.wait_converged()
    offset = sts[0].apply_offset
    for node in cluster.nodes:
        got = table(node, offset)
        missing = {k for k in acked if got.get(k) != acked[k]}
        assert not missing, f"{node.name} lost acknowledged writes: {sorted(missing)[:10]}"


# ---- replace a dead node -------------------------------------------------------------------------

def test_replace_a_dead_node_with_an_empty_disk(make_cluster) -> None:
    cluster = make_cluster(3)
    wait_healthy(cluster, "a healthy cluster", timeout=60)
    for i in range(20):
        put(cluster, f"before{i}", "x")
    # A snapshot everywhere compacts the leader's log, so the new node must catch up from a snapshot.
    nsctl(cluster.nodes, "snapshot", "--all")
    dead = cluster.followers()[0]
    cluster.kill(dead)
    shutil.rmtree(data_dir(dead))                           # the disk is gone
    alive = [n for n in cluster.nodes if n is not dead]
    for i in range(20):
        put(cluster, f"during{i}", "y", alive)
    cluster.start(dead)                                     # same config, empty data directory
    wait_healthy(cluster, "the replacement caught up", timeout=60)
    offset = cluster.wait_converged()[0].apply_offset
    assert len(table(dead, offset)) == 40
    with open(dead.log_path) as f:
        assert "restored snapshot at offset" in f.read()


# ---- backup and restore from a snapshot ----------------------------------------------------------

def test_backup_then_restore_every_node_from_the_snapshot(make_cluster, tmp_path) -> None:
    cluster = make_cluster(3)
    wait_healthy(cluster, "a healthy cluster", timeout=60)
    for i in range(30):
        put(cluster, f"kept{i}", str(i))
    # Backup: a snapshot on one node, then copy its newest file off the node.
    source = cluster.nodes[1]
    snap = nsctl([source], "snapshot")
    files = sorted(glob.glob(os.path.join(data_dir(source), "snapshots", "snap-*.mdb")))
    backup_dir = tmp_path / "backup"
    backup_dir.mkdir()
    newest = max(files, key=lambda p: int(os.path.basename(p).split("-")[1]))
    assert int(os.path.basename(newest).split("-")[1]) == int(snap["offset"])
    backup = shutil.copy2(newest, backup_dir)
    backup_term = int(os.path.basename(newest).rsplit("-", 1)[1].split(".")[0])
    digest_at_backup = cluster.statuses([source])[0].digest
    for i in range(10):
        put(cluster, f"lost{i}", "after the backup")      # written after the backup: rolled back

    # Restore: stop every node, seed each from the same file, start them all.
    cluster.stop()
    for node in cluster.nodes:
        res = subprocess.run([sys.executable, "-m", "nameserver.ops.restore", "--config", node.config_path, "--force",
                              backup], capture_output=True, text=True, cwd=ROOT, timeout=120,
                             env=os.environ | {"PYTHONPATH": ROOT})
        assert res.returncode == 0, res.stderr
        assert f"to offset {snap['offset']}" in res.stdout
    cluster.start()
    sts = wait_healthy(cluster, "the restored cluster", timeout=60)
    assert all(int(s["term"]) > backup_term for s in sts)   # terms move on from the snapshot's, never back
    got = table(cluster.nodes[0])
    assert got == {f"kept{i}": str(i) for i in range(30)}
    # The restored state is the backup's, digest for digest, before any new write.
    assert {s["digest"] for s in sts} == {digest_at_backup}
    offset = put(cluster, "after-restore", "ok")
    assert all(table(n, offset)["after-restore"] == "ok" for n in cluster.nodes)


def test_restore_refuses_a_non_empty_data_dir_and_a_corrupt_file(make_cluster, tmp_path) -> None:
    cluster = make_cluster(3, start=False)
    node = cluster.nodes[0]
    os.makedirs(data_dir(node))
    with open(os.path.join(data_dir(node), "something"), "w") as f:
        f.write("x")
    bogus = tmp_path / "snap-00000000000000000010-2.mdb"
    bogus.write_bytes(b"not a snapshot" * 100)
    cmd = [sys.executable, "-m", "nameserver.ops.restore", "--config", node.config_path, str(bogus)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 1 and "not empty" in res.stderr
    res = subprocess.run(cmd + ["--force"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 1 and "not a valid snapshot" in res.stderr
    aside = glob.glob(data_dir(node) + ".before-restore-*")
    assert len(aside) == 1 and os.path.exists(os.path.join(aside[0], "something"))  # moved, never deleted


# ---- only one node survives ----------------------------------------------------------------------

def test_recover_from_a_single_surviving_node(make_cluster) -> None:
    cluster = make_cluster(3)
    wait_healthy(cluster, "a healthy cluster", timeout=60)
    for i in range(25):
        put(cluster, f"s{i}", str(i))
    survivor, lost = cluster.nodes[0], cluster.nodes[1:]
    for node in lost:                                       # two of three machines are gone for good
        cluster.kill(node)
        shutil.rmtree(data_dir(node))
    with pytest.raises(grpc.RpcError):                      # no quorum: writes cannot commit
        survivor.ns.PutKv(api_pb2.PutKvRequest(namespace=NS, key="maybe", value="x"), timeout=3)

    # 1. The survivor alone: stop it, make it the only member, start it. It elects itself.
    cluster.kill(survivor, signal.SIGTERM)
    set_members(survivor, [survivor])
    cluster.start(survivor)
    wait_healthy(cluster, "the survivor to lead alone", [survivor], timeout=60)
    offset = put(cluster, "alone", "yes", [survivor])
    # Every acknowledged write survives; the one attempted without a quorum had an unknown
    # outcome: the survivor had appended it, so it may commit once the survivor leads alone.
    alone = table(survivor, offset)
    assert {f"s{i}" for i in range(25)} | {"alone"} <= set(alone) <= {f"s{i}" for i in range(25)} | {"alone", "maybe"}

    # 2. Back to three: the survivor with the full member list again, two new empty nodes that join a
    # cluster with data (they never campaign before they hear its leader: the survivor).
    cluster.kill(survivor, signal.SIGTERM)
    set_members(survivor, None)
    for node in lost:
        with open(node.config_path, "a") as f:
            f.write('\n[cluster]\ninitial_state = "existing"\n')
    cluster.start()
    wait_healthy(cluster, "three healthy nodes", timeout=90)
    offset = put(cluster, "three-again", "yes")
    for node in cluster.nodes:
        got = table(node, offset)
        maybe = {"maybe": "x"} if "maybe" in alone else {}  # whatever the survivor decided, everyone holds
        assert got == {**{f"s{i}": str(i) for i in range(25)}, "alone": "yes", "three-again": "yes", **maybe}
