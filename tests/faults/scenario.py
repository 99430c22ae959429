"""What every fault scenario runs and checks, and the short (CI) / long (`make faults`) durations.

A scenario runs the binding Workload (linearizable reads, compare-and-set binds/releases) and the
AckLedger (unique KV writes) through random nodes while it injects its faults, heals, and then calls
`Run.verify`, which checks, in this order:

1. no node wedged: every node is alive (or the scenario restarted it) and reports ready within
   `ready_timeout` seconds of the heal, with all its worker processes listening (FAULTS_WORKERS), and
   then accepts a write through itself;
2. all digests equal: every node at the same apply offset with the same digest (Cluster.wait_converged);
3. no acknowledged write lost: every acknowledged ledger key is on every node with its value;
4. bindings linearizable: the binding history passes the checker (tests/linearizability/checker.py);
5. no unexpected errors: every failed call failed with a status that means "unknown outcome".

FAULTS_LONG=1 selects the long durations (see docs/faults.md); FAULTS_SEED picks the nemesis seeds.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from nameserver.pb import api_pb2
from tests.cluster import Cluster, NodeProc
from tests.faults import workers
from tests.faults.harness import Workload
from tests.faults.ledger import AckLedger
from tests.linearizability.checker import INF, Op, check, settle_inconclusive
from tests.linearizability.porcupine import check_with_porcupine

LONG = os.environ.get("FAULTS_LONG", "") not in ("", "0")
SEED = int(os.environ.get("FAULTS_SEED", "11"))
PORCUPINE_TIMEOUT_S = 15.0  # per history; most answer in well under a second


def pick(short: float, long: float) -> float:
    """A duration: `short` in `make test`, `long` under FAULTS_LONG=1 (`make faults`)."""
    return long if LONG else short


def timeout_for(short: float, long: float) -> float:
    """A pytest-timeout for a test whose fault phase lasts pick(short, long) seconds (generous)."""
    return pick(short, long) * 3 + 240


@dataclass
class Run:
    cluster: Cluster
    binding_clients: int = 4
    binding_keys: int = 6
    ledger_writers: int = 2
    seed: int = SEED
    # Every `segment_s` the binding workload moves to fresh keys (a new topic): the checker's search
    # grows with the length of one key's history, and 60 s per key is what the long consistency run
    # has validated (checked in seconds). Ledger keys are unique anyway.
    segment_s: float = 60.0
    work: Workload = field(init=False)
    ledger: AckLedger = field(init=False)
    segments: list[Workload] = field(default_factory=list)
    started: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _rotator: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.work = self._workload()
        self.ledger = AckLedger(self.cluster, writers=self.ledger_writers, seed=self.seed)

    def _workload(self) -> Workload:
        w = Workload(self.cluster, keys=self.binding_keys, clients=self.binding_clients,
                     topic=f"Lin{len(self.segments)}")
        self.segments.append(w)
        return w

    def start(self) -> None:
        self.started = time.monotonic()
        self.work.start()
        self.ledger.start()
        self._rotator = threading.Thread(target=self._rotate, daemon=True, name="segments")
        self._rotator.start()

    def _rotate(self) -> None:
        while not self._stop.wait(self.segment_s):
            old, self.work = self.work, self._workload()
            self.work.start()
            old.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._rotator is not None:
            self._rotator.join(timeout=30)
        self.work.stop()
        self.ledger.stop()

    def _ops_of(self, key: str) -> list[Op]:
        return [o for w in self.segments for o in w.history.ops if o.key == key]

    def _dump(self, keys: list[str]) -> list[str]:
        """Write each key's operations as JSON lines next to the cluster's logs (for offline analysis)."""
        paths = []
        for key in keys:
            path = os.path.join(self.cluster.root, f"history-{key.replace('/', '_')}.jsonl")
            with open(path, "w") as f:
                for o in self._ops_of(key):
                    f.write(json.dumps({**asdict(o), "complete": None if o.complete == INF else o.complete}) + "\n")
            paths.append(path)
        return paths

    def write_latencies_ms(self, t_from: float, t_to: float) -> list[float]:
        return [(w.complete - w.invoke) * 1000 for w in self.ledger.acked_between(t_from, t_to)]

    def verify(self, ready_timeout: float = 60.0, converge_timeout: float = 60.0,
               healed_at: float | None = None) -> dict[str, Any]:
        """Every check of the module docstring; raises AssertionError naming the first that fails."""
        c = self.cluster
        began = time.monotonic()
        healed_at = healed_at or began
        dead = [f"{n.name} exited with code {n.proc.returncode if n.proc else None}" for n in c.nodes
                if not n.alive]
        assert not dead, f"nodes down after healing: {dead}\n{c.logs()}"
        # 1. no node wedged: ready within ready_timeout of the heal (not of this call)
        c.wait_ready(nodes=c.nodes, timeout=max(5.0, ready_timeout - (began - healed_at)))
        # ... with every worker back on its port (restarted by its core after a kill)
        workers.wait_serving(c, timeout=max(5.0, ready_timeout - (time.monotonic() - healed_at)))
        ready_s = time.monotonic() - healed_at
        ready_wait_s = time.monotonic() - began  # how long verify itself waited for readiness
        for n in c.nodes:
            assert write_through(n, self.ledger), f"{n.name} is ready but accepts no write\n{c.logs()}"
        # 2. digests equal
        sts = c.wait_converged(nodes=c.nodes, timeout=converge_timeout)
        converged_s = time.monotonic() - healed_at
        # 3. no acknowledged write lost
        lost = {name: problems for name, problems in self.ledger.check(c.nodes).items() if problems}
        assert not lost, f"acknowledged writes lost: { {k: v[:5] for k, v in lost.items()} }"
        # 4. bindings linearizable (each segment has its own keys: checked separately)
        t0 = time.monotonic()
        results = [r for w in self.segments for r in settle_inconclusive(check(w.history.ops), w.history.ops)]
        check_s = time.monotonic() - t0
        bad = [(r.key, r.detail) for r in results if not r.ok]
        assert not bad, f"binding history not linearizable: {bad}; histories: {self._dump([k for k, _ in bad])}"
        # ... and porcupine, the checker etcd uses, never disagrees ("unknown": it ran out of time, which
        # histories with ~1,000 unknown outcomes, a full disk's, can make it do; reported, not a verdict)
        theirs = check_with_porcupine([w.history.ops for w in self.segments], timeout_s=PORCUPINE_TIMEOUT_S)
        assert "illegal" not in theirs, f"porcupine disagrees with our checker: {theirs}; " \
            f"histories: {self._dump(sorted({o.key for w in self.segments for o in w.history.ops}))}"
        # 5. nothing unexpected
        unexpected = [u for w in self.segments for u in w.unexpected]
        assert not unexpected, unexpected[:5]
        assert not self.ledger.unexpected, self.ledger.unexpected[:5]
        acked = self.ledger.acked()
        report = {
            "binding_ops": sum(len(w.history.ops) for w in self.segments),
            "binding_keys": len(results),
            "checker_states": sum(r.explored for r in results),
            "check_s": round(check_s, 2),
            "porcupine": ",".join(theirs),
            "ledger": self.ledger.summary(),
            "acked": len(acked),
            "ready_after_heal_s": round(ready_s, 1),
            "ready_wait_s": round(ready_wait_s, 1),
            "converged_after_heal_s": round(converged_s, 1),
            "apply_offset": sts[0].apply_offset,
            "digest": sts[0].digest[:16],
        }
        print(f"\nverified: {report}")
        return report


def status_or_none(node: NodeProc) -> api_pb2.NodeStatus | None:
    return node.status(timeout=1.0) if node.alive else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def wait_exit(node: NodeProc, timeout: float) -> int | None:
    """The node's exit code if it exits within `timeout`, else None."""
    assert node.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            return node.proc.returncode
        time.sleep(0.1)
    return None


def read_log(node: NodeProc) -> str:
    with open(node.log_path, errors="replace") as f:
        return f.read()


def write_through(node: NodeProc, ledger: AckLedger, timeout: float = 20.0) -> bool:
    """Whether a write through `node` is acknowledged within `timeout` (retrying unknown outcomes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ledger.put(node, f"probe-{node.name}-{time.monotonic_ns()}", "probe", timeout=2.0).status == "ok":
            return True
        time.sleep(0.2)
    return False


__all__ = ["LONG", "SEED", "Run", "pick", "timeout_for"]
