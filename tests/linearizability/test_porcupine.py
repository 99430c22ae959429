"""Our checker and porcupine (Go, the checker etcd's robustness tests use) agree: on a corpus of
known-bad histories that both must reject, known-good ones both must accept, and a few hundred random
histories of a simulated register (linearizable by construction) and of mutated copies of them.

Needs the Go toolchain (the test fails without it, it does not skip): porcupine comes from the Go module
proxy and is built once per source version (tests/linearizability/porcupine.py).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.linearizability.checker import INF, Op, check
from tests.linearizability.porcupine import check_with_porcupine
from tests.linearizability.test_checker import b, r, rel


def ours(history: list[Op]) -> str:
    results = check(history)
    if any(not res.ok and res.detail.startswith("inconclusive") for res in results):
        return "unknown"
    return "ok" if all(res.ok for res in results) else "illegal"


BAD = {
    "stale read after an acknowledged write": [
        b(1, 0, 1, "a", 0, version=5), b(1, 2, 3, "b", 5, version=9), r(2, 4, 5, True, "a", 5)],
    "lost acknowledged write": [b(1, 0, 1, "a", 0, version=5), r(2, 2, 3, False)],
    "two winners of a must-not-exist bind (duplicated CAS)": [
        b(1, 0, 2, "a", 0, version=5), b(2, 1, 3, "b", 0, version=6)],
    "a release that succeeds on a binding at another version": [
        b(1, 0, 1, "a", 0, version=5), rel(2, 2, 3, 4)],
    "versions that do not grow": [b(1, 0, 1, "a", 0, version=5), b(1, 2, 3, "b", 5, version=4)],
    "a refused CAS that had the right version": [
        b(1, 0, 1, "a", 0, version=5), b(2, 2, 3, "b", 5, status="fail")],
    "an unknown bind seen applied, then gone": [
        b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, True, "a", 7), r(2, 7, 8, False)],
    "stale read once a concurrent write completed": [
        b(1, 0, 1, "a", 0, version=5), b(1, 2, 6, "b", 5, version=9), r(2, 3, 4, True, "a", 5),
        r(3, 3, 5, True, "b", 9), r(2, 7, 8, True, "a", 5)],
    "one key's violation among good keys": [
        b(1, 0, 1, "a", 0, version=5, key="x"), b(2, 0, 1, "a", 0, version=6, key="y"),
        r(3, 2, 3, True, "a", 6, key="x")],
}

GOOD = {
    "sequential": [b(1, 0, 1, "a", 0, version=5), r(2, 2, 3, True, "a", 5), b(1, 4, 5, "b", 5, version=9),
                   rel(2, 6, 7, 9), r(1, 8, 9, False)],
    "a concurrent read sees either side of a write": [
        b(1, 0, 1, "a", 0, version=5), b(1, 2, 6, "b", 5, version=9), r(2, 3, 4, True, "a", 5),
        r(3, 3, 5, True, "b", 9)],
    "an unknown bind a later read pins": [b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, True, "a", 7)],
    "an unknown bind that never happened": [b(1, 0, INF, "a", 0, status="unknown"), r(2, 5, 6, False)],
    "an unknown bind pinned by a CAS": [
        b(1, 0, INF, "a", 0, status="unknown"), b(2, 5, 6, "b", 8, version=12), r(3, 7, 8, True, "b", 12)],
    "a refused CAS on another version": [b(1, 0, 1, "a", 0, version=5), b(2, 2, 3, "b", 4, status="fail")],
    "an unknown release": [b(1, 0, 1, "a", 0, version=5), rel(2, 2, INF, 5, status="unknown"),
                           r(3, 4, 5, True, "a", 5), r(3, 6, 7, False)],
}


def test_both_reject_every_known_bad_history() -> None:
    names = list(BAD)
    assert [ours(BAD[n]) for n in names] == ["illegal"] * len(names)
    assert dict(zip(names, check_with_porcupine([BAD[n] for n in names]), strict=True)) == \
        dict.fromkeys(names, "illegal")


def test_both_accept_every_known_good_history() -> None:
    names = list(GOOD)
    assert [ours(GOOD[n]) for n in names] == ["ok"] * len(names)
    assert dict(zip(names, check_with_porcupine([GOOD[n] for n in names]), strict=True)) == dict.fromkeys(names, "ok")


# ---- random histories --------------------------------------------------------------------------


def simulate(rng: random.Random, keys: int = 2, processes: int = 4, ops_per_process: int = 8) -> list[Op]:
    """A register of bindings that is linearizable by construction: each operation takes effect at a
    random point inside its interval (an unknown one: later, or never), in that order."""
    planned = []  # (effect time or None, process, key, kind, invoke, complete, expected/owner choice)
    for p in range(processes):
        t = rng.uniform(0, 1)
        for _ in range(ops_per_process):
            dur = rng.uniform(0.1, 2.0)
            unknown = rng.random() < 0.1
            kind = rng.choice(("bind", "bind", "read", "read", "release"))
            key = f"k{rng.randrange(keys)}"
            if unknown and kind != "read":
                at = t + rng.uniform(0, 3 * dur) if rng.random() < 0.6 else None
                planned.append((at, p, key, kind, t, INF))
            else:
                planned.append((t + rng.uniform(0, dur), p, key, kind, t, t + dur))
            t += dur + rng.uniform(0, 0.5)
    state: dict[str, tuple[str, int] | None] = {}
    version = 0
    history = []
    # Effects in time order; operations that never took effect are recorded with a plausible request.
    for at, p, key, kind, invoke, complete in sorted(planned, key=lambda x: (x[0] is None, x[0] or 0)):
        cur = state.get(key)
        cur_v = cur[1] if cur else 0
        expected = cur_v if rng.random() < 0.75 else rng.choice([0, max(0, cur_v - 3), cur_v + 2])
        owner = f"o{p}"
        status = "unknown" if complete == INF else "ok"
        if kind == "read":
            found = cur is not None
            history.append(Op(p, key, "read", invoke, complete, "ok", owner=cur[0] if cur else "",
                              version=cur_v if cur else 0, found=found))
            continue
        if at is None:  # never took effect
            history.append(Op(p, key, kind, invoke, complete, "unknown", owner=owner, expected=expected))
            continue
        if kind == "bind":
            applies = (cur is None and expected == 0) or (cur is not None and expected == cur_v and expected != 0)
            if applies:
                version += rng.randint(1, 3)
                state[key] = (owner, version)
                history.append(Op(p, key, "bind", invoke, complete, status, owner=owner, expected=expected,
                                  version=version if status == "ok" else 0))
            else:
                history.append(Op(p, key, "bind", invoke, complete, "fail" if status == "ok" else "unknown",
                                  owner=owner, expected=expected))
        else:
            applies = cur is not None and expected == cur_v
            if applies:
                state[key] = None
            history.append(Op(p, key, "release", invoke, complete,
                              ("ok" if applies else "fail") if status == "ok" else "unknown", expected=expected))
    return history


def mutate(rng: random.Random, history: list[Op]) -> list[Op]:
    """A copy with one observation changed: often (not always) no longer linearizable."""
    out = list(history)
    candidates = [i for i, o in enumerate(out) if o.status in ("ok", "fail")]
    i = rng.choice(candidates)
    o = out[i]
    if o.kind == "read":
        choice = rng.randrange(3)
        out[i] = (replace(o, version=o.version + 1) if choice == 0 and o.found else
                  replace(o, owner=o.owner + "x") if choice == 1 and o.found else
                  replace(o, found=not o.found, owner="o0" if not o.found else "", version=1 if not o.found else 0))
    elif o.status == "fail":
        out[i] = replace(o, status="ok", version=o.expected + 1)
    else:
        out[i] = replace(o, status="fail", version=0)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_both_agree_on_random_histories_and_their_mutations(seed: int) -> None:
    rng = random.Random(seed)
    histories = []
    for _ in range(50):
        good = simulate(rng)
        histories += [good, mutate(rng, good)]
    theirs = check_with_porcupine(histories)
    mine = [ours(h) for h in histories]
    for h, a, p in zip(histories, mine, theirs, strict=True):
        if "unknown" in (a, p):
            continue
        assert a == p, f"our checker says {a}, porcupine says {p}: {h}"
    assert all(m == "ok" for m in mine[0::2]), "a history linearizable by construction was refused"
    assert sum(m == "illegal" for m in mine[1::2]) >= 10, "the mutations should break many histories"
    assert sum("unknown" in (a, p) for a, p in zip(mine, theirs, strict=True)) <= 2
