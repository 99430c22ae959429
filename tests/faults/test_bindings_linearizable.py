"""Queue bindings stay linearizable while nodes are killed (-9) and paused (SIGSTOP).

CI runs one 10-second run; the long run (`make faults-consistency`: 20 runs of 60 s, each with its
own nemesis seed) is reported in docs/consistency.md. With FAULTS_WORKERS=N (`make faults-consistency-workers`)
each node runs N worker processes, and one of another node's is SIGKILLed during each fault (docs/faults.md).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.faults import workers
from tests.faults.harness import Nemesis, Workload
from tests.linearizability.checker import check, settle_inconclusive
from tests.linearizability.porcupine import check_with_porcupine

pytestmark = pytest.mark.cluster

# CI: 10 s, which still records thousands of operations and several kills and pauses; the checker's
# search stays small. make faults-consistency: 60.
RUN_SECONDS = float(os.environ.get("LIN_RUN_SECONDS", "10"))
MIN_OPS = int(os.environ.get("LIN_MIN_OPS", "1000"))


def run_once(fault_cluster, seed: int) -> tuple[int, list, list[str]]:
    c = fault_cluster()
    c.wait_ready()
    work = Workload(c, keys=8)
    nemesis = Nemesis(c, seed=seed)
    work.start()
    nemesis.start()
    time.sleep(RUN_SECONDS)
    nemesis.stop()
    work.stop()
    t0 = time.monotonic()
    results = settle_inconclusive(check(work.history.ops), work.history.ops)
    print(f"checked {len(work.history.ops)} ops in {time.monotonic() - t0:.2f}s, "
          f"explored {sum(r.explored for r in results)} states")
    t0 = time.monotonic()
    theirs = check_with_porcupine([work.history.ops], timeout_s=30)[0]
    print(f"porcupine: {theirs} in {time.monotonic() - t0:.2f}s")
    if theirs != "unknown":  # "unknown": porcupine ran out of time (printed above), not a verdict
        assert theirs == ("ok" if all(r.ok for r in results) else "illegal"), \
            f"porcupine says {theirs}, our checker {[(r.key, r.detail) for r in results if not r.ok]}"
    back_s = max(60.0, c.ready_timeout)  # a node restarted at the end starts its workers too (cluster.py)
    c.wait_converged(timeout=back_s)  # every node back, same digest
    workers.wait_serving(c, timeout=back_s)  # ... and every worker of it
    if nemesis.worker_kills:
        assert any(f == "worker-kill" for _, _, f, _ in nemesis.events), nemesis.log
    assert not work.unexpected, work.unexpected[:5]
    return len(work.history.ops), results, nemesis.log


RUNS = int(os.environ.get("LIN_RUNS", "1"))
SEED_BASE = int(os.environ.get("LIN_SEED_BASE", "7"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [SEED_BASE + i for i in range(RUNS)])
def test_bindings_linearizable_under_kills_and_pauses(fault_cluster, seed: int) -> None:
    n, results, faults = run_once(fault_cluster, seed=seed)
    bad = [r for r in results if not r.ok]
    print(f"\n{n} ops, {len(results)} keys, faults: {faults}")
    assert faults, "the nemesis injected no fault"
    assert n >= MIN_OPS, f"only {n} operations recorded"
    assert not bad, [(r.key, r.detail) for r in bad]
