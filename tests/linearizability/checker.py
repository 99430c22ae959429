"""A linearizability checker for queue-binding histories (Wing & Gong's search, Lowe's memoization).

Histories are checked per key (P-compositionality: a history is linearizable iff each key's
sub-history is). The model of one binding is `None` (unbound) or `(owner, version)`:

- bind(owner, expected) ok(version v): the binding was at `expected` (0 = unbound); it becomes (owner, v),
  and v must exceed the old version (versions are log offsets).
- bind/release fail (compare-and-set refused): the binding was NOT at `expected`; nothing changes.
- release(expected) ok: the binding was at `expected`; it becomes unbound.
- read ok(found, owner, version): the binding is exactly that.
- An operation whose outcome is unknown (timeout, leader change) may take effect at any point after
  its invocation, or never. A bind with unknown outcome sets an unknown version: the model keeps it
  symbolic (`UNKNOWN` with a lower bound) until a later read or compare-and-set pins it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

INF = math.inf


@dataclass(frozen=True)
class Op:
    process: int
    key: str
    kind: str                 # "bind" | "release" | "read"
    invoke: float
    complete: float           # INF when the outcome is unknown
    status: str               # "ok" | "fail" | "unknown"
    owner: str = ""           # bind: the owner asked for; read ok: the owner seen
    expected: int = 0         # bind/release: the expected version
    version: int = 0          # bind ok: the new version; read ok: the version seen
    found: bool = False       # read ok


@dataclass(frozen=True)
class Unknown:
    """A version nobody has seen yet: greater than `floor`."""

    floor: int


Version = int | Unknown
State = tuple[str, Version] | None


def _matches(version: Version, want: int) -> list[Version]:
    """Ways `version` can equal `want` (pinning an unknown one)."""
    if isinstance(version, Unknown):
        return [want] if want > version.floor else []
    return [want] if version == want else []


def _differs(version: Version, want: int) -> bool:
    # An unknown version can always differ from one particular value.
    return isinstance(version, Unknown) or version != want


def _floor(version: Version) -> int:
    return version.floor if isinstance(version, Unknown) else version


def step(state: State, op: Op) -> list[State]:
    """Every state the model can be in after `op` takes effect from `state` (empty: impossible)."""
    current: Version = 0 if state is None else state[1]
    if op.kind == "read":
        if op.status != "ok":
            return [state]
        if not op.found:
            return [state] if state is None else []
        if state is None or state[0] != op.owner:
            return []
        return [(op.owner, v) for v in _matches(current, op.version)]
    if op.kind == "bind":
        if op.status == "fail":
            return [state] if (state is not None and _differs(current, op.expected)) or (
                state is None and op.expected != 0) else []
        if op.expected == 0:
            if state is not None:
                return []
            base = 0
        else:
            if state is None or not _matches(current, op.expected):
                return []
            base = op.expected
        if op.status == "ok":
            return [(op.owner, op.version)] if op.version > base else []
        return [(op.owner, Unknown(base))]
    if op.kind == "release":
        if op.status == "fail":
            return [state] if state is None or _differs(current, op.expected) else []
        if state is None or not _matches(current, op.expected):
            return []
        return [None]
    raise ValueError(f"unknown op kind {op.kind}")


@dataclass
class Result:
    ok: bool
    key: str = ""
    ops: int = 0
    detail: str = ""
    explored: int = 0


def _dead(op: Op, maxv: int) -> bool:
    """An unknown compare-and-set on a version below the newest one linearized can never apply.

    Versions are log offsets: unique, and only growing along any linearization.
    """
    return op.status == "unknown" and op.expected > 0 and op.expected < maxv


def check_key(ops: list[Op], initial: State = None, budget: int = 300_000) -> Result:
    """Wing-Gong search with memoization over (linearized set, state, newest version).

    Completed operations are tried before unknown ones, earliest completion first, so a
    linearizable history is usually confirmed greedily; backtracking inserts an unknown
    operation only where a later observation needs it. Each step looks only at the window of
    operations that may go next (invoked before the earliest pending completion), so a step
    costs O(concurrency), not O(history).
    """
    completed = sorted((o for o in ops if o.status != "unknown"), key=lambda o: (o.complete, o.invoke))
    unknown = sorted((o for o in ops if o.status == "unknown"), key=lambda o: o.invoke)
    ops = completed + unknown
    key = ops[0].key if ops else ""
    n, nc = len(ops), len(completed)
    required = (1 << nc) - 1
    max_dur = max((o.complete - o.invoke for o in completed), default=0.0)
    seen: set[tuple[int, State, int]] = set()
    explored = 0
    start_v = 0 if initial is None or isinstance(initial[1], Unknown) else initial[1]
    stack: list[tuple[int, State, int]] = [(0, initial, start_v)]
    while stack:
        done, state, maxv = stack.pop()
        for j in range(nc, n):  # unknown operations that can no longer apply happened never
            if not done >> j & 1 and _dead(ops[j], maxv):
                done |= 1 << j
        memo = (done, state, maxv)
        if memo in seen:
            continue
        seen.add(memo)
        explored += 1
        if explored > budget:
            return Result(False, key, n, "inconclusive: search budget exhausted", explored)
        pending = ~done & required
        if not pending:
            return Result(True, key, n, "", explored)
        low = (pending & -pending).bit_length() - 1   # the earliest-completing pending operation
        horizon = ops[low].complete                    # nothing invoked after it may go before it
        children = []
        i = low
        while i < nc and ops[i].complete <= horizon + max_dur:
            o = ops[i]
            if not done >> i & 1 and o.invoke <= horizon:
                for nxt in step(state, o):
                    v = nxt[1] if nxt is not None and not isinstance(nxt[1], Unknown) else maxv
                    children.append((done | 1 << i, nxt, max(maxv, v)))
            i += 1
        for j in range(nc, n):
            o = ops[j]
            if o.invoke > horizon:
                break
            if not done >> j & 1:
                for nxt in step(state, o):
                    v = nxt[1] if nxt is not None and not isinstance(nxt[1], Unknown) else maxv
                    children.append((done | 1 << j, nxt, max(maxv, v)))
        stack.extend(reversed(children))  # explore in preference order
    return Result(False, key, n, f"no linearization of {n} operations on {key}", explored)


def check(history: Iterable[Op], initial: dict[str, State] | None = None) -> list[Result]:
    """Check every key's sub-history; returns one Result per key."""
    by_key: dict[str, list[Op]] = {}
    for op in history:
        by_key.setdefault(op.key, []).append(op)
    return [check_key(ops, (initial or {}).get(k)) for k, ops in sorted(by_key.items())]


RECHECK_BUDGET = 3_000_000  # states, for a key the default budget left inconclusive


def settle_inconclusive(results: list[Result], history: Iterable[Op],
                        budget: int = RECHECK_BUDGET) -> list[Result]:
    """Each key the search gave up on, searched again with a larger budget: a checker limit is not a
    violation (seen: seed 18 of make faults-consistency-workers, porcupine ok, ours out of budget)."""
    ops = list(history)
    settled = []
    for r in results:
        if r.detail.startswith("inconclusive"):
            again = check_key([o for o in ops if o.key == r.key], budget=budget)
            print(f"\n{r.key}: inconclusive after {r.explored} states; with {budget}: "
                  f"{'linearizable' if again.ok else again.detail} ({again.explored} states)")
            r = again
        settled.append(r)
    return settled


@dataclass
class History:
    """Thread-safe recorder of client operations (invoke, then ok / fail / unknown, with times)."""

    ops: list[Op] = field(default_factory=list)

    def add(self, op: Op) -> None:
        self.ops.append(op)  # list.append is atomic under the GIL
