"""bench.durability.node_with_workers (the recovery part's --recovery-workers): one real node with worker
processes, filled, restarted; its core's and each worker's PSS, and the restart to every worker serving.
Slow (a node started three times): make test-slow."""

from __future__ import annotations

import pytest

from bench import durability

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_node_with_workers_is_measured_core_and_each_worker(tmp_path) -> None:
    out = durability.node_with_workers(str(tmp_path), 3000, workers=2, restarts=2)
    assert out["fill"]["records"] >= 3000
    for when in ("memory_after_fill", "memory_after_restart"):
        m = out[when]
        assert len(m["pss_workers_mib"]) == 2 and all(w > 0 for w in m["pss_workers_mib"]) and m["pss_core_mib"] > 0
        assert m["pss_total_mib"] == m["pss_core_mib"] + sum(m["pss_workers_mib"])
    assert len(out["restart_core_ready_s"]) == len(out["restart_node_serving_s"]) == len(
        out["restart_all_serving_s"]) == 2
    assert all(s >= n >= c > 0 for c, n, s in zip(out["restart_core_ready_s"], out["restart_node_serving_s"],
                                                  out["restart_all_serving_s"], strict=True))
    table = durability.nodes_markdown({"2": out})
    assert len(out["restart_cpu_s_core_then_workers"][0]) == 3  # the core, then each worker
    assert table[2].startswith("| 2 | ") and table[2].count("|") == 8
