"""One simulator run: start a cluster, run the fleet mode of the load generator against it, sample each node
window by window, merge both into the report (the shape docs/scaling.md describes)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from bench import loadgen
from bench.fleet import Fleet, scan_interval_s
from bench.load import proc_cpu_s
from bench.procs import LocalCluster, rss_bytes, with_descendants
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2

REPO = Path(__file__).resolve().parents[2]
FORWARD_INTERVAL_S = NodeConfig.forward_interval_ms / 1000  # the cluster runs with its default


@dataclass(frozen=True)
class Simulation:
    """How to run a fleet: `fleet` is the real one, run `time_scale` times faster (Fleet.scaled)."""

    fleet: Fleet
    time_scale: float = 1.0
    seconds: float = 60.0
    window_s: float = 5.0
    mass_expiry_at_s: float = -1.0      # negative: none
    mass_expiry_fraction: float = 0.1
    nodes: int = 3
    client_connections: int = 64        # clients' polls share this many connections (spread over the nodes)
    expiry_probe_brokers: int = 32      # silenced brokers whose routes the probe watches on every node
    seed: int = 1
    worker_processes: int = 0           # [node] worker_processes of every node (they hold its client ports)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass
class NodeSample:
    at: float  # unix seconds
    cpu_s: dict[str, float]       # the node's processes: its core and its worker processes
    rss_bytes: dict[str, int]
    core_cpu_s: dict[str, float]  # its core process alone
    raft_lag: dict[str, int]  # per follower: entries its log is behind the leader's end
    leader: str


def sample(cluster: LocalCluster) -> NodeSample:
    """Each node's CPU seconds and RSS (with its worker processes; its core's CPU alone beside them), and the
    leader's view of its followers."""
    at = time.time()
    cpu, rss, core = {}, {}, {}
    for n in cluster.nodes:
        pids = with_descendants([n.pid]) if n.pid else []
        cpu[n.name] = proc_cpu_s(pids)
        core[n.name] = proc_cpu_s([n.pid]) if n.pid else 0.0
        rss[n.name] = sum(_rss(p) for p in pids)
    lag: dict[str, int] = {}
    leader = cluster.leader()
    if leader is not None:
        names = {n.raft_addr: n.name for n in cluster.nodes}
        try:
            end = leader.require_status(1.0).end_offset
            members = leader.admin().Members(api_pb2.MembersRequest(), timeout=1.0).members
            lag = {names.get(m.node_id, m.node_id): max(0, end - m.match_offset) for m in members if not m.is_self}
        except (grpc.RpcError, RuntimeError):
            pass
    return NodeSample(at, cpu, rss, core, lag, leader.name if leader else "")


def _rss(pid: int) -> int:
    try:
        return rss_bytes(pid)
    except OSError:
        return 0


def _merge(sim: Simulation, run: Fleet, scan_s: float, gen: dict[str, Any], ready: NodeSample,
           samples: list[NodeSample]) -> dict[str, Any]:
    """The generator's windows with the nodes' figures beside them; window w's CPU is the difference of the
    samples at its two ends."""
    windows = gen["windows"]
    for w, win in enumerate(windows):
        if w + 1 < len(samples):
            a, b = samples[w], samples[w + 1]
            win["nodes"] = {n: {"cpu_s": round(b.cpu_s[n] - a.cpu_s.get(n, 0.0), 3),
                                "core_cpu_s": round(b.core_cpu_s[n] - a.core_cpu_s.get(n, 0.0), 3),
                                "rss_bytes": b.rss_bytes[n]} for n in b.cpu_s}
            win["raft_lag"], win["leader"] = b.raft_lag, b.leader
    first, last = samples[0], samples[-1]
    elapsed = max(1e-9, last.at - first.at)
    nodes = {n: {"cpu_s": round(last.cpu_s[n] - first.cpu_s[n], 3),
                 "cpu_per_s": round((last.cpu_s[n] - first.cpu_s[n]) / elapsed, 4),
                 "core_cpu_per_s": round((last.core_cpu_s[n] - first.core_cpu_s[n]) / elapsed, 4),
                 "rss_max_bytes": max(s.rss_bytes.get(n, 0) for s in samples), "rss_end_bytes": last.rss_bytes[n]}
             for n in first.cpu_s}
    lag_max: dict[str, int] = {}
    for s in samples:
        for n, v in s.raft_lag.items():
            lag_max[n] = max(lag_max.get(n, 0), v)
    leaders = [s.leader for s in samples]
    changes = sum(1 for a, b in zip(leaders, leaders[1:], strict=False) if a and b and a != b)
    expiry = gen.get("expiry")
    if expiry is not None:
        gone = [g for g in expiry["gone_after_s"] if g is not None]
        expiry["all_nodes_s"] = max(gone) if len(gone) == len(expiry["gone_after_s"]) else None
        # docs/architecture.md, "Liveness": a broker is gone at most its timeout plus one scan after its last
        # heartbeat reached the leader (a follower forwards it within forward_interval_ms), and not before
        # its timeout after the last one it sent (at most a heartbeat period before it fell silent)
        expiry["bound_s"] = round(run.heartbeat_timeout_s + scan_s + FORWARD_INTERVAL_S, 3)
        expiry["earliest_s"] = round(run.heartbeat_timeout_s - run.heartbeat_period_s, 3)
    setup = gen["setup"] | {"nodes_cpu_s": {n: round(first.cpu_s[n] - ready.cpu_s[n], 3) for n in first.cpu_s},
                            "rss_bytes": first.rss_bytes}
    return {
        "commit": _git_commit(), "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "time_scale": sim.time_scale, "fleet": run.as_dict(), "represents": sim.fleet.as_dict(),
        "cluster": {"nodes": sim.nodes, "scan_interval_s": scan_s, "fsync": True,
                    "worker_processes": sim.worker_processes},
        "simulation": {"seconds": sim.seconds, "window_s": sim.window_s, "mass_expiry_at_s": sim.mass_expiry_at_s,
                       "mass_expiry_fraction": sim.mass_expiry_fraction, "client_connections": sim.client_connections,
                       "expiry_probe_brokers": sim.expiry_probe_brokers, "registers_with": "every node"},
        "setup": setup, "windows": windows,
        "offered_per_s": {"heartbeat": round(run.brokers * sim.nodes / run.heartbeat_period_s, 1),
                          "route": round(run.clients * run.topics_per_client / run.route_poll_period_s, 1)},
        "totals": {"ops": gen["totals"], "nodes": nodes, "raft_lag_max": lag_max, "leader_changes": changes,
                   "samples_without_leader": leaders.count("")},
        "expiry": expiry, "final_check": gen["final_check"], "events": gen["events"],
        "first_errors": gen["first_errors"], "loadgen_cpu_s": gen["loadgen_cpu_s"],
    }


def simulate(sim: Simulation, root: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run `sim` against a fresh cluster under `root`; the report (JSON-ready)."""
    run = sim.fleet.scaled(sim.time_scale)
    scan_s = scan_interval_s(sim.time_scale)
    binary = loadgen.build()
    cluster = LocalCluster(root, sim.nodes, remoting=True,
                           sections={"liveness": {"scan_interval_ms": int(scan_s * 1000)},
                                     "node": {"worker_processes": sim.worker_processes}})
    config = {k: v for k, v in asdict(run).items()} | {
        "addrs": [n.remoting_addr for n in cluster.nodes], "prefix": "fleet",
        "seconds": sim.seconds, "window_s": sim.window_s, "mass_expiry_at_s": sim.mass_expiry_at_s,
        "mass_expiry_fraction": sim.mass_expiry_fraction, "client_connections": sim.client_connections,
        "expiry_probe_brokers": sim.expiry_probe_brokers, "seed": sim.seed}
    config_path = os.path.join(root, "fleet-config.json")
    with open(config_path, "w") as f:
        json.dump(config, f, indent=1)
    with cluster:
        cluster.wait_ready()  # a port that opens just after: the generator's first registrations retry
        ready = sample(cluster)
        log(f"cluster ready; registering {run.brokers} brokers with {run.topics} topics on {sim.nodes} nodes")
        proc = subprocess.Popen([binary, "fleet", "-config", config_path], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started = threading.Event()
        t0: list[float] = []
        stderr: list[str] = []

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("RUN ") and not t0:
                    t0.append(float(line.split()[1]))
                    started.set()
                else:
                    stderr.append(line)
            started.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        started.wait()
        samples: list[NodeSample] = []
        if t0:
            log(f"running {sim.seconds:g} s")
            windows = int((sim.seconds + sim.window_s - 1e-9) // sim.window_s)
            for w in range(windows + 1):
                time.sleep(max(0.0, t0[0] + w * sim.window_s - time.time()))
                samples.append(sample(cluster))
        assert proc.stdout is not None
        out = proc.stdout.read()  # the one JSON object, written once the run and its final check are over
        proc.wait(timeout=600)
        reader.join(timeout=10)
        if proc.returncode != 0 or not t0:
            raise RuntimeError(f"loadgen fleet failed ({proc.returncode}): {''.join(stderr)[-2000:]}")
    return _merge(sim, run, scan_s, json.loads(out), ready, samples)


__all__ = ["Simulation", "sample", "simulate"]
