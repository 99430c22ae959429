"""Controller-mode helpers shared by the fault suite and the interop tests: a broker set's replicated part as
one string (a read's BrokerSetView and the log's ControllerBrokerSet alike), and the epoch rules along
the log."""

from __future__ import annotations

import itertools
from typing import Any


def summary(s: Any) -> str:
    """The replicated part of a set (not liveness, which each node sees for itself)."""
    replicas = ",".join(f"{r.broker_id}@{r.address}" for r in s.replicas)
    return (f"m{s.master_id}/e{s.master_epoch}/s{'.'.join(map(str, s.sync_state_set))}"
            f"/se{s.sync_state_set_epoch}/{replicas}")


def masters_by_epoch(sets: Any) -> dict[int, set[int]]:
    masters: dict[int, set[int]] = {}
    for s in sets:
        masters.setdefault(s.master_epoch, set()).add(s.master_id)
    return masters


def epoch_problems(writes: list[tuple[int, Any]]) -> list[str]:
    """Along the log ((offset, set) of every write): one write per offset, the master epoch never goes
    back, moves by one with every change of master, and names one master."""
    writes = sorted(writes, key=lambda w: w[0])
    problems = []
    if len({offset for offset, _ in writes}) != len(writes):
        problems.append("two decisions at one offset")
    epochs = [s.master_epoch for _, s in writes]
    if epochs != sorted(epochs):
        problems.append(f"the master epoch went back: {epochs}")
    for (_, a), (_, b) in itertools.pairwise(writes):
        if b.master_id != a.master_id and b.master_epoch != a.master_epoch + 1:
            problems.append(f"master {a.master_id} -> {b.master_id} with epoch {a.master_epoch} -> {b.master_epoch}")
    several = {e: m for e, m in masters_by_epoch(s for _, s in writes).items() if len(m) > 1}
    if several:
        problems.append(f"several masters in one epoch: {several}")
    return problems
